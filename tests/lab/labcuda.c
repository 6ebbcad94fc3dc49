// A stand-in libcuda.so.1 for the lab (ours, CI only): one GPU whose memory is host pages. Its
// memory answers CU_MEMORYTYPE_DEVICE to cuPointerGetAttribute (with the allocation's start and
// size), as GPU memory does through UVA; the fake wire moves bytes into it through cuMemcpy.
// - labcuda_gpu(p, n) marks memory the program made itself (the lab's own verbs programs);
//   cuMemAlloc_v2 / cuMemFree_v2 make and free allocations of their own, 2 MiB-aligned, as many
//   as a program needs (the fleet check, the self-test): pages of a memfd, mapped shared, so that
//   cuIpcGetMemHandle / cuIpcOpenMemHandle_v2 give another process (the wire's copier) the same
//   pages (the handle names the memfd as /proc/PID/fd/FD). No VMM (cuMemCreate) here.
// - While a thread is blocked in a synchronous copy behind a legacy stream's wait
//   (cuStreamWaitValue32_v2), every other CUDA call of the process waits for it, as on the GPU. The copies (cuMemcpy*, HtoD, DtoH, DtoD,
//   cuMemcpyAsync on a stream of cuStreamCreate) are memcpy, counted in labcuda_copies, and need
//   a current context, as libcuda's do.
// - Its dma-buf: a memfd named "labcuda-dmabuf:<GPU address at offset 0>" whose size is the
//   range's; the fake wire takes it for nv_dmabuf in a process whose libcuda this is, and judges
//   it as it judges the driver's. cuMemGetHandleForAddressRange exports one from any range of
//   its memory (a GPU with dma-buf in libcuda).
// - With the fake NVIDIA driver (tests/c/fakerm.c preloaded after gdrshim, GDRSHIM_TEST_DEV_DIR
//   its device folder) it is a GeForce as gdrshim meets one: cuInit opens the driver's nodes and
//   makes libcuda's RM and UVM objects (client, device, subdevice, VA space, the GPU's UVM VA
//   space), cuMemAlloc_v2 makes each allocation's vidmem and maps it in UVM at its address (so
//   gdrshim maps GPU address to memory exactly), cuMemFree_v2 undoes both;
//   cuMemGetHandleForAddressRange answers 801 as libcuda does on a GeForce (gdrshim serves it),
//   and the driver's dma-buf export (NV_ESC_EXPORT_TO_DMABUF_FD, gdrshim's) makes this libcuda's
//   dma-buf of the memory exported (fakerm_dmabuf_maker): the wire judges it as the driver's.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <unistd.h>

typedef int CUresult;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
#define MAXA 256
typedef struct {
  uint64_t va, size;
  uint32_t h; // the RM memory's handle, with the driver
  int fd, ipc; // its memfd; ipc: another process's, mapped by cuIpcOpenMemHandle
} alloc_t;
static alloc_t allocs[MAXA];
static uint64_t marked_lo, marked_hi; // labcuda_gpu's range
static void *ctx;
static int primary, stream;
unsigned long labcuda_copies;
void labcuda_gpu(void *p, size_t n) {
  marked_lo = (uintptr_t)p;
  marked_hi = marked_lo + n;
}
// The range of this libcuda's memory that holds p: its start and size, 0 if none.
static uint64_t range_of(uint64_t p, uint64_t *size) {
  if (p >= marked_lo && p < marked_hi) {
    *size = marked_hi - marked_lo;
    return marked_lo;
  }
  pthread_mutex_lock(&mu);
  uint64_t base = 0;
  for (int i = 0; i < MAXA; i++)
    if (allocs[i].size && p >= allocs[i].va && p < allocs[i].va + allocs[i].size) {
      base = allocs[i].va;
      *size = allocs[i].size;
    }
  pthread_mutex_unlock(&mu);
  return base;
}

// While a thread is blocked in a synchronous copy whose legacy stream waits, every other CUDA call
// of the process waits too, as on the GPU (tests/gpu/blocked_copy.cu: no copy of the process, on
// a stream or a context of its own, finished; one from another process did). The synchronous
// copies hold the gate for their whole length; every other entry point passes through it.
static pthread_mutex_t gate = PTHREAD_MUTEX_INITIALIZER;
static void pass_gate(void) {
  pthread_mutex_lock(&gate);
  pthread_mutex_unlock(&gate);
}
#define GATE pass_gate()
// size bytes of the memfd fd, shared (another process may map the same pages: CUDA IPC), at a
// 2 MiB-aligned address; 0 if not
static uint64_t map_aligned(int fd, uint64_t size) {
  const uint64_t g = 2 << 20;
  uint8_t *m = mmap(NULL, size + g, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (m == MAP_FAILED) return 0;
  uint64_t va = ((uintptr_t)m + g - 1) & ~(g - 1);
  if (mmap((void *)(uintptr_t)va, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0) ==
      MAP_FAILED) {
    munmap(m, size + g);
    return 0;
  }
  if (va > (uintptr_t)m) munmap(m, va - (uintptr_t)m);
  if ((uintptr_t)m + g > va) munmap((void *)(uintptr_t)(va + size), (uintptr_t)m + g - va);
  return va;
}
static int add_alloc(alloc_t a) {
  pthread_mutex_lock(&mu);
  int i;
  for (i = 0; i < MAXA && allocs[i].size; i++) {
  }
  if (i < MAXA) allocs[i] = a;
  pthread_mutex_unlock(&mu);
  return i < MAXA;
}
// The record that starts at p, of an IPC import or not (`ipc`); `take`: the record goes. A
// zero size: none.
static alloc_t find_alloc(uint64_t p, int ipc, int take) {
  alloc_t a = {0};
  pthread_mutex_lock(&mu);
  for (int i = 0; i < MAXA; i++)
    if (allocs[i].size && allocs[i].va == p && allocs[i].ipc == ipc) {
      a = allocs[i];
      if (take) allocs[i].size = 0;
    }
  pthread_mutex_unlock(&mu);
  return a;
}

// ---- the fake NVIDIA driver (fakerm.c), where it answers ----
#define NV_IOCTL(nr, size) (0xC0000000u | ((size) << 16) | (0x46u << 8) | (nr))
static int ctl = -1, uvm = -1, inited;
static uint32_t client, dev, sub, vas;
static uint8_t (*uuid)[16]; // fakerm_uuid: GPU 0's UUID first
static uint32_t rm_alloc(uint32_t parent, uint32_t cls, void *params) {
  uint32_t a[12] = {client, parent, 0, cls};
  uint64_t p = (uintptr_t)params;
  memcpy(&a[4], &p, 8);
  if (cls == 0x41) a[0] = a[1] = 0;
  if (ioctl(ctl, NV_IOCTL(0x2b, 48), a) || a[10]) return 0;
  return a[2];
}
static void rm_free(uint32_t h) {
  uint32_t a[4] = {client, dev, h, 0};
  ioctl(ctl, NV_IOCTL(0x29, 16), a);
}
static int uvm_call(unsigned long cmd, void *a, size_t status_at) {
  uint32_t st = 0;
  if (ioctl(uvm, cmd, a)) return -1;
  memcpy(&st, (uint8_t *)a + status_at, 4);
  return st ? -1 : 0;
}
// UVM_MAP_EXTERNAL_ALLOCATION of the vidmem h at va on GPU 0 (driver 580's layout)
static int uvm_map(uint64_t va, uint64_t size, uint32_t h) {
  static uint8_t a[9264];
  static pthread_mutex_t amu = PTHREAD_MUTEX_INITIALIZER;
  uint64_t count = 1;
  pthread_mutex_lock(&amu);
  memset(a, 0, sizeof a);
  memcpy(a, &va, 8);
  memcpy(a + 8, &size, 8);
  memcpy(a + 24, uuid[0], 16);
  memcpy(a + 9240, &count, 8);
  memcpy(a + 9248, &ctl, 4);
  memcpy(a + 9252, &client, 4);
  memcpy(a + 9256, &h, 4);
  int r = uvm_call(33, a, 9260);
  pthread_mutex_unlock(&amu);
  return r;
}
// The driver's export of [va, va+size) of this libcuda's memory: this libcuda's dma-buf.
static int make_dmabuf(uint64_t va, uint64_t size) {
  char name[64];
  snprintf(name, sizeof name, "labcuda-dmabuf:%lx", (unsigned long)va);
  int fd = memfd_create(name, MFD_CLOEXEC);
  if (fd >= 0 && ftruncate(fd, (off_t)size)) {
    close(fd);
    return -1;
  }
  return fd;
}
static int driver(void) { return ctl >= 0; }
// cuInit: the driver's objects where fakerm answers on GDRSHIM_TEST_DEV_DIR, else memory only.
static CUresult open_driver(void) {
  const char *d = getenv("GDRSHIM_TEST_DEV_DIR");
  uuid = (uint8_t(*)[16])dlsym(RTLD_DEFAULT, "fakerm_uuid");
  int (**maker)(uint64_t, uint64_t) = dlsym(RTLD_DEFAULT, "fakerm_dmabuf_maker");
  if (!d || !uuid || !maker) return 0;
  char p[4096];
  snprintf(p, sizeof p, "%s/nvidiactl", d);
  ctl = open(p, O_RDWR | O_CLOEXEC);
  snprintf(p, sizeof p, "%s/nvidia-uvm", d);
  uvm = open(p, O_RDWR | O_CLOEXEC);
  if (ctl < 0 || uvm < 0) return 100; // CUDA_ERROR_NO_DEVICE
  client = rm_alloc(0, 0x41, NULL);
  uint8_t dp[56] = {0}, vp[56] = {0}, r[32] = {0};
  uint32_t sp = 0;
  dev = rm_alloc(client, 0x80, dp);
  sub = rm_alloc(dev, 0x2080, &sp);
  vas = rm_alloc(dev, 0x90f1, vp);
  memcpy(r, uuid[0], 16);
  memcpy(r + 16, &ctl, 4);
  memcpy(r + 20, &client, 4);
  memcpy(r + 24, &vas, 4);
  if (!client || !dev || !sub || !vas || uvm_call(25, r, 28)) return 999; // UNKNOWN
  *maker = make_dmabuf;
  return 0;
}
CUresult cuInit(unsigned flags) {
  GATE;
  if (flags) return 1; // CUDA_ERROR_INVALID_VALUE
  pthread_mutex_lock(&mu);
  CUresult r = inited ? 0 : open_driver();
  inited = !r;
  pthread_mutex_unlock(&mu);
  return r;
}
CUresult cuDriverGetVersion(int *v) {
  GATE;
  *v = 12080;
  return 0;
}
CUresult cuDeviceGetCount(int *n) {
  GATE;
  if (!inited) return 3; // CUDA_ERROR_NOT_INITIALIZED
  *n = 1;
  return 0;
}
CUresult cuDeviceGet(int *d, int ordinal) {
  GATE;
  if (!inited) return 3;
  if (ordinal) return 101; // CUDA_ERROR_INVALID_DEVICE
  *d = 0;
  return 0;
}
CUresult cuDeviceGetName(char *name, int len, int d) {
  GATE;
  if (d) return 101;
  snprintf(name, (size_t)len, "Lab GeForce (labcuda)");
  return 0;
}
CUresult cuDeviceGetUuid_v2(void *out, int d) {
  GATE;
  if (d || !uuid) return d ? 101 : 999;
  memcpy(out, uuid[0], 16);
  return 0;
}
// Compute capability 8.9 (75, 76). GPUDirect RDMA (116) and dma-buf (124) as libcuda says them:
// off on a GeForce (the driver), on where this libcuda exports its own dma-bufs.
CUresult cuDeviceGetAttribute(int *v, int attr, int d) {
  GATE;
  if (d) return 101;
  *v = attr == 75 ? 8 : attr == 76 ? 9 : (attr == 116 || attr == 124) ? !driver() : 0;
  return 0;
}
CUresult cuDevicePrimaryCtxRetain(void **c, int d) {
  GATE;
  if (d) return 101;
  *c = &primary;
  return 0;
}
CUresult cuDevicePrimaryCtxRelease_v2(int d) { GATE; return d ? 101 : 0; }
CUresult cuCtxGetCurrent(void **c) {
  GATE;
  *c = ctx;
  return 0;
}
CUresult cuCtxSetCurrent(void *c) {
  GATE;
  ctx = c;
  return 0;
}
CUresult cuCtxSynchronize(void) { GATE; return ctx ? 0 : 201; } // CUDA_ERROR_INVALID_CONTEXT

CUresult cuMemAlloc_v2(uint64_t *dptr, size_t n) {
  GATE;
  if (!inited) return 3;
  if (!ctx) return 201;
  if (!n) return 1;
  const uint64_t g = 2 << 20, size = (n + g - 1) & ~(g - 1);
  // host pages of a memfd, shared, so that cuIpcOpenMemHandle in another process maps them too
  int fd = memfd_create("labcuda-mem", MFD_CLOEXEC);
  uint64_t va = fd < 0 || ftruncate(fd, (off_t)size) ? 0 : map_aligned(fd, size);
  if (!va) {
    if (fd >= 0) close(fd);
    return 2; // CUDA_ERROR_OUT_OF_MEMORY
  }
  uint32_t h = 0;
  if (driver()) {
    uint8_t p[128] = {0};
    uint64_t r[3] = {va, size, 0};
    memcpy(p + 64, &size, 8);
    h = rm_alloc(dev, 0x40, p);
    if (!h || uvm_call(73, r, 16) || uvm_map(va, size, h)) {
      if (h) rm_free(h);
      munmap((void *)(uintptr_t)va, size);
      close(fd);
      return 999;
    }
  }
  if (!add_alloc((alloc_t){va, size, h, fd, 0})) {
    munmap((void *)(uintptr_t)va, size);
    close(fd);
    return 2;
  }
  *dptr = va;
  return 0;
}
CUresult cuMemFree_v2(uint64_t p) {
  GATE;
  alloc_t a = find_alloc(p, 0, 1);
  if (!a.size) return 1;
  if (driver()) {
    uint64_t f[3] = {a.va, a.size, 0};
    uvm_call(34, f, 16); // UVM_FREE
    rm_free(a.h);
  }
  munmap((void *)(uintptr_t)a.va, a.size);
  close(a.fd);
  return 0;
}
// CUDA IPC: the handle names the allocation's memfd by this process's pid and fd; another
// process of the user opens it (/proc/PID/fd/FD) and maps the same pages.
typedef struct {
  char magic[8];
  int32_t pid, fd;
  uint64_t va, size;
  char pad[32];
} ipc_handle; // CUipcMemHandle: 64 bytes, passed by value to cuIpcOpenMemHandle
_Static_assert(sizeof(ipc_handle) == 64, "CUipcMemHandle is 64 bytes");
CUresult cuIpcGetMemHandle(ipc_handle *h, uint64_t p) {
  GATE;
  alloc_t a = find_alloc(p, 0, 0);
  if (!a.size) return 1; // not the start of an allocation of cuMemAlloc: CUDA_ERROR_INVALID_VALUE
  *h = (ipc_handle){"labcuda", getpid(), a.fd, a.va, a.size, {0}};
  return 0;
}
CUresult cuIpcOpenMemHandle_v2(uint64_t *p, ipc_handle h, unsigned flags) {
  GATE;
  (void)flags;
  char path[64];
  snprintf(path, sizeof path, "/proc/%d/fd/%d", h.pid, h.fd);
  int fd = memcmp(h.magic, "labcuda", 8) || h.pid == getpid() ? -1 : open(path, O_RDWR | O_CLOEXEC);
  uint64_t va = fd < 0 ? 0 : map_aligned(fd, h.size);
  if (!va || !add_alloc((alloc_t){va, h.size, 0, fd, 1})) {
    if (va) munmap((void *)(uintptr_t)va, h.size);
    if (fd >= 0) close(fd);
    return 1;
  }
  *p = va;
  return 0;
}
CUresult cuIpcCloseMemHandle(uint64_t p) {
  GATE;
  alloc_t a = find_alloc(p, 1, 1);
  if (!a.size) return 1;
  munmap((void *)(uintptr_t)a.va, a.size);
  close(a.fd);
  return 0;
}
// The copies. CU_POINTER_ATTRIBUTE_MEMORY_TYPE (2): DEVICE (2) in this libcuda's memory, else an
// error (pageable host memory is unknown to CUDA); RANGE_START_ADDR (11), RANGE_SIZE (12).
CUresult cuPointerGetAttribute(void *out, int attr, uint64_t p) {
  GATE;
  uint64_t size = 0, base = range_of(p, &size);
  if (!size || (attr != 2 && attr != 11 && attr != 12)) return 1;
  if (attr == 2) *(unsigned *)out = 2;
  if (attr == 11) *(uint64_t *)out = base;
  if (attr == 12) *(size_t *)out = size;
  return 0;
}
CUresult cuMemGetAddressRange_v2(uint64_t *base, size_t *size, uint64_t p) {
  GATE;
  uint64_t n = 0, b = range_of(p, &n);
  if (!n) return 1;
  if (base) *base = b;
  if (size) *size = n;
  return 0;
}
// Pinned host memory (cuMemHostAlloc) is reached by the copy engines directly; any other host
// memory is pageable, and a copy from or to it is staged, as libcuda stages it: through one
// staging buffer of the context's, held for the whole copy, and a synchronous copy first waits
// for the work before it on the legacy stream. So a thread blocked in a pageable copy whose
// stream waits for bytes another thread must copy in (cuStreamWaitValue32 here; NCCL's kernel on
// a GPU) holds the staging buffer: the other thread's copy must not be pageable too.
#define MAXP 64
static struct {
  uint64_t p, n;
} pinned[MAXP];
static pthread_mutex_t staging = PTHREAD_MUTEX_INITIALIZER;
static uint32_t *legacy_wait_at, legacy_wait_value, legacy_wait_eq; // the legacy stream's one pending wait
unsigned long labcuda_waited; // pageable copies that found their stream's wait not yet met
static int is_pinned(uint64_t p) {
  int hit = 0;
  pthread_mutex_lock(&mu);
  for (int i = 0; i < MAXP; i++) hit |= pinned[i].n && p >= pinned[i].p && p < pinned[i].p + pinned[i].n;
  pthread_mutex_unlock(&mu);
  return hit;
}
static int pageable(uint64_t p) {
  uint64_t n = 0;
  range_of(p, &n);
  return !n && !is_pinned(p);
}
static int pin(void *m, size_t n) {
  pthread_mutex_lock(&mu);
  int i;
  for (i = 0; i < MAXP && pinned[i].n; i++) {
  }
  if (i < MAXP) {
    pinned[i].p = (uintptr_t)m;
    pinned[i].n = n;
  }
  pthread_mutex_unlock(&mu);
  return i < MAXP;
}
CUresult cuMemHostAlloc(void **pp, size_t n, unsigned flags) {
  GATE;
  (void)flags;
  if (!ctx) return 201;
  void *m = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED) return 2;
  if (!pin(m, n)) {
    munmap(m, n);
    return 2;
  }
  *pp = m;
  return 0;
}
// host memory of the caller's, pinned (the copier's staging area)
CUresult cuMemHostRegister_v2(void *p, size_t n, unsigned flags) {
  GATE;
  (void)flags;
  return !ctx ? 201 : pin(p, n) ? 0 : 2;
}
static uint64_t unpin(void *p) {
  uint64_t n = 0;
  pthread_mutex_lock(&mu);
  for (int i = 0; i < MAXP; i++)
    if (pinned[i].n && pinned[i].p == (uintptr_t)p) {
      n = pinned[i].n;
      pinned[i].n = 0;
    }
  pthread_mutex_unlock(&mu);
  return n;
}
CUresult cuMemHostUnregister(void *p) {
  GATE;
  return unpin(p) ? 0 : 1;
}
CUresult cuMemFreeHost(void *p) {
  GATE;
  uint64_t n = unpin(p);
  if (!n) return 1;
  munmap(p, n);
  return 0;
}
// CU_STREAM_WAIT_VALUE_GEQ (0) and _EQ (1) on the legacy stream (NULL): the stream's later work
// waits until the 32-bit word at addr, in this libcuda's memory, meets value.
CUresult cuStreamWaitValue32_v2(void *s, uint64_t addr, uint32_t value, unsigned flags) {
  GATE;
  uint64_t n = 0;
  if (s || flags > 1 || (addr & 3) || !range_of(addr, &n)) return 1;
  pthread_mutex_lock(&mu);
  legacy_wait_at = (uint32_t *)(uintptr_t)addr;
  legacy_wait_value = value;
  legacy_wait_eq = flags;
  pthread_mutex_unlock(&mu);
  return 0;
}
static int legacy_wait_met(void) {
  pthread_mutex_lock(&mu);
  uint32_t *at = legacy_wait_at, v = legacy_wait_value, eq = legacy_wait_eq;
  pthread_mutex_unlock(&mu);
  if (!at) return 1;
  uint32_t now = __atomic_load_n(at, __ATOMIC_ACQUIRE);
  return eq ? now == v : (int32_t)(now - v) >= 0;
}
// The legacy stream's work before a synchronous copy: LABCUDA_SYNC_TIMEOUT_MS (20 s) at most,
// then CUDA_ERROR_LAUNCH_TIMEOUT
static CUresult legacy_sync(void) {
  const char *t = getenv("LABCUDA_SYNC_TIMEOUT_MS");
  long limit = t && atol(t) > 0 ? atol(t) : 20000;
  for (long i = 0; !legacy_wait_met(); i++) {
    if (i == 0) __atomic_fetch_add(&labcuda_waited, 1, __ATOMIC_RELAXED);
    if (i == limit) return 702;
    usleep(1000);
  }
  pthread_mutex_lock(&mu);
  legacy_wait_at = NULL;
  pthread_mutex_unlock(&mu);
  return 0;
}
static CUresult copy(uint64_t dst, uint64_t src, size_t n, int legacy) {
  if (legacy) pthread_mutex_lock(&gate);
  else pass_gate();
  CUresult r = ctx ? 0 : 201; // a context must be current
  int staged = !r && (pageable(dst) || pageable(src));
  if (staged) pthread_mutex_lock(&staging);
  if (!r && legacy) r = legacy_sync();
  if (!r) {
    memcpy((void *)(uintptr_t)dst, (const void *)(uintptr_t)src, n);
    __atomic_fetch_add(&labcuda_copies, 1, __ATOMIC_RELAXED);
  }
  if (staged) pthread_mutex_unlock(&staging);
  if (legacy) pthread_mutex_unlock(&gate);
  return r;
}
CUresult cuMemcpy(uint64_t dst, uint64_t src, size_t n) { return copy(dst, src, n, 1); }
CUresult cuMemcpyHtoD_v2(uint64_t d, const void *s, size_t n) {
  return copy(d, (uintptr_t)s, n, 1);
}
CUresult cuMemcpyDtoH_v2(void *d, uint64_t s, size_t n) { return copy((uintptr_t)d, s, n, 1); }
CUresult cuMemcpyDtoD_v2(uint64_t d, uint64_t s, size_t n) { return copy(d, s, n, 1); }
CUresult cuStreamCreate(void **s, unsigned flags) {
  GATE;
  (void)flags;
  if (!ctx) return 201;
  *s = &stream;
  return 0;
}
// on a stream of cuStreamCreate (non-blocking: it never waits for the legacy stream)
CUresult cuMemcpyAsync(uint64_t dst, uint64_t src, size_t n, void *s) {
  return s == &stream ? copy(dst, src, n, 0) : 400;
}
CUresult cuStreamSynchronize(void *s) { GATE; return s == &stream ? 0 : 400; } // INVALID_HANDLE
// CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD = 1; a page-aligned range of one range of its memory
CUresult cuMemGetHandleForAddressRange(void *handle, uint64_t dptr, size_t size, int type,
                                       unsigned long long flags) {
  GATE;
  if (driver()) return 801; // a GeForce: CUDA_ERROR_NOT_SUPPORTED
  uint64_t n = 0, base = range_of(dptr, &n);
  if (type != 1 || flags || !n || size > base + n - dptr || (dptr | size) & 0xfff) return 1;
  int fd = make_dmabuf(dptr, size);
  if (fd < 0) return 2;
  *(int *)handle = fd;
  return 0;
}
CUresult cuGetErrorName(CUresult r, const char **s) {
  GATE;
  static const struct {
    CUresult r;
    const char *name;
  } t[] = {{0, "CUDA_SUCCESS"},
           {1, "CUDA_ERROR_INVALID_VALUE"},
           {2, "CUDA_ERROR_OUT_OF_MEMORY"},
           {3, "CUDA_ERROR_NOT_INITIALIZED"},
           {100, "CUDA_ERROR_NO_DEVICE"},
           {101, "CUDA_ERROR_INVALID_DEVICE"},
           {201, "CUDA_ERROR_INVALID_CONTEXT"},
           {400, "CUDA_ERROR_INVALID_HANDLE"},
           {801, "CUDA_ERROR_NOT_SUPPORTED"}};
  *s = "CUDA_ERROR_UNKNOWN";
  for (size_t i = 0; i < sizeof t / sizeof t[0]; i++)
    if (t[i].r == r) *s = t[i].name;
  return 0;
}
CUresult cuGetProcAddress_v2(const char *sym, void **pfn, int ver, uint64_t flags, int *status) {
  GATE;
  (void)ver;
  (void)flags;
  static const struct {
    const char *name;
    void *f;
  } t[] = {{"cuMemAlloc", (void *)cuMemAlloc_v2},
           {"cuMemFree", (void *)cuMemFree_v2},
           {"cuDeviceGetAttribute", (void *)cuDeviceGetAttribute},
           {"cuMemGetHandleForAddressRange", (void *)cuMemGetHandleForAddressRange},
           {"cuPointerGetAttribute", (void *)cuPointerGetAttribute}};
  void *f = NULL;
  for (size_t i = 0; i < sizeof t / sizeof t[0]; i++)
    if (!strcmp(sym, t[i].name)) f = t[i].f;
  if (status) *status = f ? 0 : 1;
  *pfn = f;
  return f ? 0 : 500; // CUDA_ERROR_NOT_FOUND
}
