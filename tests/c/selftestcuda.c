// A libcuda.so.1 stand-in for gdrshim-tool selftest's tests (ours): a GeForce (no native
// GPUDirect RDMA, cuMemGetHandleForAddressRange answers 801) whose memory is host pages. cuInit
// sets up RM and UVM as libcuda does (client, device, subdevice, VA space, UVM GPU VA space) on
// the fake driver of GDRSHIM_TEST_DEV_DIR (fakerm.c, preloaded after the shim), so the shim sees
// it; cuMemAlloc maps anonymous pages at the returned address and makes the RM memory and the UVM
// mapping for it; the copies are memcpy (cuPointerGetAttribute tells its memory from host memory,
// for tests/gpu/stubverbs.c's copies). SELFTESTCUDA_FAIL_ALLOC=1: cuMemAlloc is out of memory.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <unistd.h>
typedef int CUresult;
#define NV_IOCTL(nr, size) (0xC0000000u | ((size) << 16) | (0x46u << 8) | (nr))
static int ctl = -1, uvm = -1;
static uint32_t client, dev, sub, vas;
static uint64_t next_va = 0x7e0000000000ull;
typedef struct { uint64_t va, size; uint32_t h; } alloc_t;
static alloc_t allocs[64];

static uint32_t rm_alloc(uint32_t parent, uint32_t cls, void *params) {
  uint32_t a[12] = {client, parent, 0, cls}; uint64_t p = (uintptr_t)params; memcpy(&a[4], &p, 8);
  if (cls == 0x41) a[0] = a[1] = 0;
  if (ioctl(ctl, NV_IOCTL(0x2b, 48), a) || a[10]) return 0;
  return a[2];
}
static int uvm_call(unsigned long cmd, void *a, size_t status_at) {
  uint32_t st = 0;
  if (ioctl(uvm, cmd, a)) return -1;
  memcpy(&st, (uint8_t *)a + status_at, 4);
  return st ? -1 : 0;
}
CUresult cuInit(unsigned flags) {
  (void)flags;
  if (ctl >= 0) return 0;
  const char *d = getenv("GDRSHIM_TEST_DEV_DIR"); char p[4096];
  uint8_t (*uuid)[16] = (uint8_t (*)[16])dlsym(RTLD_DEFAULT, "fakerm_uuid");
  if (!d || !uuid) return 100; // CUDA_ERROR_NO_DEVICE
  snprintf(p, sizeof p, "%s/nvidiactl", d); ctl = open(p, O_RDWR | O_CLOEXEC);
  snprintf(p, sizeof p, "%s/nvidia-uvm", d); uvm = open(p, O_RDWR | O_CLOEXEC);
  if (ctl < 0 || uvm < 0) return 100;
  client = rm_alloc(0, 0x41, NULL);
  uint8_t dp[56] = {0}; dev = rm_alloc(client, 0x80, dp);
  uint32_t sp = 0; sub = rm_alloc(dev, 0x2080, &sp);
  uint8_t vp[56] = {0}; vas = rm_alloc(dev, 0x90f1, vp);
  uint8_t r[32] = {0}; memcpy(r, uuid[0], 16); memcpy(r + 16, &ctl, 4); memcpy(r + 20, &client, 4); memcpy(r + 24, &vas, 4);
  if (!client || !dev || !sub || !vas || uvm_call(25, r, 28)) return 999;
  return 0;
}
CUresult cuDeviceGet(int *d, int ordinal) { if (ordinal != 0) return 101; *d = 0; return 0; }
CUresult cuDeviceGetName(char *name, int len, int d) { (void)d; snprintf(name, (size_t)len, "Fake GeForce RTX 4090 (selftestcuda)"); return 0; }
// A GeForce: no GPUDirect RDMA (116), no dma-buf (124); compute capability 8.9.
CUresult cuDeviceGetAttribute(int *v, int attr, int d) { (void)d; *v = attr == 75 ? 8 : attr == 76 ? 9 : 0; return 0; }
CUresult cuDevicePrimaryCtxRetain(void **ctx, int d) { (void)d; *ctx = (void *)0x1; return 0; }
CUresult cuDevicePrimaryCtxRelease_v2(int d) { (void)d; return 0; }
CUresult cuCtxSetCurrent(void *ctx) { (void)ctx; return 0; }
CUresult cuMemAlloc_v2(uint64_t *dptr, size_t n) {
  const char *f = getenv("SELFTESTCUDA_FAIL_ALLOC");
  if (ctl < 0) return 3; // CUDA_ERROR_NOT_INITIALIZED
  if (f && !strcmp(f, "1")) return 2;
  uint64_t size = (n + 0x1fffff) & ~0x1fffffull, va = next_va;
  int i; for (i = 0; i < 64 && allocs[i].size; i++) {}
  if (i == 64) return 2;
  void *m = mmap((void *)(uintptr_t)va, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
  if (m == MAP_FAILED || m != (void *)(uintptr_t)va) return 2;
  next_va += size + 0x200000;
  uint8_t p[128] = {0}; memcpy(p + 64, &size, 8);
  uint32_t h = rm_alloc(dev, 0x40, p);
  uint64_t r[3] = {va, size, 0};
  static uint8_t a[9264];
  uint8_t (*uuid)[16] = (uint8_t (*)[16])dlsym(RTLD_DEFAULT, "fakerm_uuid");
  memset(a, 0, sizeof a); memcpy(a, &va, 8); memcpy(a + 8, &size, 8); memcpy(a + 24, uuid[0], 16);
  uint64_t count = 1; memcpy(a + 9240, &count, 8); memcpy(a + 9248, &ctl, 4); memcpy(a + 9252, &client, 4); memcpy(a + 9256, &h, 4);
  if (!h || uvm_call(73, r, 16) || uvm_call(33, a, 9260)) { munmap(m, size); return 999; }
  allocs[i] = (alloc_t){va, size, h};
  *dptr = va;
  return 0;
}
CUresult cuMemFree_v2(uint64_t p) {
  for (int i = 0; i < 64; i++) {
    if (allocs[i].va != p || !allocs[i].size) continue;
    uint64_t f[3] = {p, allocs[i].size, 0}; uvm_call(34, f, 16);
    uint32_t a[4] = {client, dev, allocs[i].h, 0}; ioctl(ctl, NV_IOCTL(0x29, 16), a);
    munmap((void *)(uintptr_t)p, allocs[i].size);
    allocs[i].size = 0;
    return 0;
  }
  return 1; // CUDA_ERROR_INVALID_VALUE
}
CUresult cuMemcpyHtoD_v2(uint64_t d, const void *s, size_t n) { memcpy((void *)(uintptr_t)d, s, n); return 0; }
CUresult cuMemcpyDtoH_v2(void *d, uint64_t s, size_t n) { memcpy(d, (const void *)(uintptr_t)s, n); return 0; }
CUresult cuMemcpyDtoD_v2(uint64_t d, uint64_t s, size_t n) { memcpy((void *)(uintptr_t)d, (const void *)(uintptr_t)s, n); return 0; }
CUresult cuCtxSynchronize(void) { return 0; }
// CU_POINTER_ATTRIBUTE_MEMORY_TYPE (2): CU_MEMORYTYPE_DEVICE (2) inside an allocation; other
// memory is unknown to CUDA (CUDA_ERROR_INVALID_VALUE), as pageable host memory is
CUresult cuPointerGetAttribute(void *data, int attr, uint64_t p) {
  if (attr != 2) return 1;
  for (int i = 0; i < 64; i++) if (allocs[i].size && p >= allocs[i].va && p < allocs[i].va + allocs[i].size) { *(unsigned *)data = 2; return 0; }
  return 1;
}
// A GeForce refuses dma-bufs: CUDA_ERROR_NOT_SUPPORTED (gdrshim serves them on its DMA-BUF route).
CUresult cuMemGetHandleForAddressRange(void *h, uint64_t p, size_t n, int type, unsigned long long flags) { (void)h; (void)p; (void)n; (void)type; (void)flags; return 801; }
CUresult cuGetErrorName(CUresult r, const char **s) {
  switch (r) {
    case 0: *s = "CUDA_SUCCESS"; return 0;
    case 2: *s = "CUDA_ERROR_OUT_OF_MEMORY"; return 0;
    case 3: *s = "CUDA_ERROR_NOT_INITIALIZED"; return 0;
    case 100: *s = "CUDA_ERROR_NO_DEVICE"; return 0;
    case 101: *s = "CUDA_ERROR_INVALID_DEVICE"; return 0;
    case 801: *s = "CUDA_ERROR_NOT_SUPPORTED"; return 0;
    default: *s = "CUDA_ERROR_UNKNOWN"; return 0;
  }
}
CUresult cuGetProcAddress_v2(const char *sym, void **pfn, int ver, uint64_t flags, int *status) {
  (void)ver; (void)flags;
  void *f = NULL;
  if (!strcmp(sym, "cuMemAlloc")) f = (void *)cuMemAlloc_v2;
  else if (!strcmp(sym, "cuMemFree")) f = (void *)cuMemFree_v2;
  else if (!strcmp(sym, "cuDeviceGetAttribute")) f = (void *)cuDeviceGetAttribute;
  else if (!strcmp(sym, "cuMemGetHandleForAddressRange")) f = (void *)cuMemGetHandleForAddressRange;
  if (status) *status = f ? 0 : 1;
  *pfn = f;
  return f ? 0 : 500;
}
