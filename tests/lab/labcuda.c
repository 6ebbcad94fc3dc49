// A stand-in libcuda.so.1 for the fake wire's CI test (ours): host memory that labcuda_gpu()
// marks answers CU_MEMORYTYPE_DEVICE to cuPointerGetAttribute, as GPU memory would through UVA;
// cuMemcpy copies with memcpy and counts its calls. Enough for the fake wire's GPU paths (the
// refusal of a plain MR over GPU memory, the peermem emulation, copies through libcuda).
#include <stdint.h>
#include <string.h>

static uintptr_t gpu_lo, gpu_hi;
static void *ctx;
static int primary;
unsigned long labcuda_copies;
void labcuda_gpu(void *p, size_t n) { gpu_lo = (uintptr_t)p; gpu_hi = gpu_lo + n; }
int cuPointerGetAttribute(void *out, int attr, uint64_t p) {
  int dev = p >= gpu_lo && p < gpu_hi;
  if (attr == 2) { if (!dev) return 1; *(unsigned *)out = 2; return 0; } // MEMORY_TYPE: unknown host memory is an error
  if (!dev) return 1;
  if (attr == 11) { *(uint64_t *)out = gpu_lo; return 0; }             // RANGE_START_ADDR
  if (attr == 12) { *(size_t *)out = gpu_hi - gpu_lo; return 0; }      // RANGE_SIZE
  return 1;
}
int cuMemcpy(uint64_t dst, uint64_t src, size_t n) {
  if (!ctx) return 201; // CUDA_ERROR_INVALID_CONTEXT: the fake must make one current first
  memcpy((void *)(uintptr_t)dst, (const void *)(uintptr_t)src, n);
  labcuda_copies++;
  return 0;
}
int cuCtxSynchronize(void) { return ctx ? 0 : 201; }
int cuCtxGetCurrent(void **c) { *c = ctx; return 0; }
int cuCtxSetCurrent(void *c) { ctx = c; return 0; }
int cuDevicePrimaryCtxRetain(void **c, int dev) { if (dev) return 101; *c = &primary; return 0; }
