// A stand-in libcuda.so.1 for the fake wire's CI tests (ours): host memory that labcuda_gpu()
// marks answers CU_MEMORYTYPE_DEVICE to cuPointerGetAttribute, as GPU memory would through UVA;
// cuMemcpy / cuMemcpyAsync copy with memcpy and count their calls; cuMemGetHandleForAddressRange
// exports a marked range as a dma-buf stand-in: a memfd named "labcuda-dmabuf:<address>" whose
// size is the range's (the fake wire takes it for nv_dmabuf only in a process whose libcuda this
// is, and judges it as it judges the driver's). Enough for the fake wire's GPU paths (a plain MR
// over GPU memory refused, peermem played, dma-buf MRs, copies through libcuda).
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

static uintptr_t gpu_lo, gpu_hi;
static void *ctx;
static int primary, stream;
unsigned long labcuda_copies;
void labcuda_gpu(void *p, size_t n) {
  gpu_lo = (uintptr_t)p;
  gpu_hi = gpu_lo + n;
}
int cuPointerGetAttribute(void *out, int attr, uint64_t p) {
  int dev = p >= gpu_lo && p < gpu_hi;
  if (attr == 2) {
    if (!dev) return 1;
    *(unsigned *)out = 2;
    return 0;
  } // MEMORY_TYPE: unknown host memory is an error
  if (!dev) return 1;
  if (attr == 11) {
    *(uint64_t *)out = gpu_lo;
    return 0;
  } // RANGE_START_ADDR
  if (attr == 12) {
    *(size_t *)out = gpu_hi - gpu_lo;
    return 0;
  } // RANGE_SIZE
  return 1;
}
int cuMemcpy(uint64_t dst, uint64_t src, size_t n) {
  if (!ctx) return 201; // CUDA_ERROR_INVALID_CONTEXT: the fake must make one current first
  memcpy((void *)(uintptr_t)dst, (const void *)(uintptr_t)src, n);
  __atomic_fetch_add(&labcuda_copies, 1, __ATOMIC_RELAXED);
  return 0;
}
int cuStreamCreate(void **s, unsigned flags) {
  (void)flags;
  if (!ctx) return 201;
  *s = &stream;
  return 0;
}
int cuMemcpyAsync(uint64_t dst, uint64_t src, size_t n, void *s) {
  return s == &stream ? cuMemcpy(dst, src, n) : 400;
}
int cuStreamSynchronize(void *s) { return s == &stream ? 0 : 400; } // CUDA_ERROR_INVALID_HANDLE
int cuCtxSynchronize(void) { return ctx ? 0 : 201; }
int cuCtxGetCurrent(void **c) {
  *c = ctx;
  return 0;
}
int cuCtxSetCurrent(void *c) {
  ctx = c;
  return 0;
}
int cuDevicePrimaryCtxRetain(void **c, int dev) {
  if (dev) return 101;
  *c = &primary;
  return 0;
}
// CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD = 1; a range inside the marked memory, page-aligned
int cuMemGetHandleForAddressRange(void *handle, uint64_t dptr, size_t size, int type,
                                  unsigned long long flags) {
  if (type != 1 || flags || dptr < gpu_lo || size > gpu_hi - dptr || (dptr | size) & 0xfff)
    return 1; // INVALID_VALUE
  char name[64];
  snprintf(name, sizeof name, "labcuda-dmabuf:%lx", (unsigned long)dptr);
  int fd = memfd_create(name, MFD_CLOEXEC);
  if (fd < 0 || ftruncate(fd, (off_t)size)) {
    if (fd >= 0) close(fd);
    return 2;
  } // OUT_OF_MEMORY
  *(int *)handle = fd;
  return 0;
}
