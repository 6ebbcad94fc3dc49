// What libcuda issues to the driver when a context ends (ours; built on the GPU machine with
// nvcc), and how it answers afterwards: run under gdrshim with GDRSHIM_CAPTURE, the capture of
// each phase is the fixture of context ends (RM frees, UVM unmaps and frees, or none).
//   ctx_end reset     allocations of every kind (cudaMalloc whole and carved, a pool block, a
//                     VMM handle mapped), then cudaDeviceReset; the same kinds again in the new
//                     primary context; cuMemGetHandleForAddressRange of the old pointers after
//   ctx_end destroy   the same with a context of cuCtxCreate, then cuCtxDestroy
//   ctx_end release   the primary context retained twice, released twice (the second ends it)
//   ctx_end two       allocations in the primary context that stay ("kept"), then a second
//                     context of cuCtxCreate with its own, destroyed: what libcuda sends when one
//                     of two contexts ends, and that the kept ones are still exported after it
// Each phase is marked in the capture (gdrshim_dl_mark) and printed as "phase NAME".
#include "common.h"
#include <cuda_runtime.h>
#include <string.h>
#include <unistd.h>

static const size_t MB2 = 2 << 20;

struct Kept { CUdeviceptr whole, carved, pool, vmm; };

static Kept allocate(void) {
  Kept k = {};
  CK(cuMemAlloc(&k.whole, 8 * MB2));
  CK(cuMemAlloc(&k.carved, 4096));
  CUstream st; CK(cuStreamCreate(&st, 0));
  CK(cuMemAllocAsync(&k.pool, MB2, st)); CK(cuStreamSynchronize(st));
  CUmemAllocationProp prop = {}; prop.type = CU_MEM_ALLOCATION_TYPE_PINNED; prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE; prop.location.id = 0;
  CUmemAccessDesc acc = {}; acc.location = prop.location; acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  CUmemGenericAllocationHandle h; CK(cuMemCreate(&h, MB2, &prop, 0));
  CK(cuMemAddressReserve(&k.vmm, MB2, MB2, 0, 0)); CK(cuMemMap(k.vmm, MB2, 0, h, 0)); CK(cuMemSetAccess(k.vmm, MB2, &acc, 1));
  return k;
}

static void ask(const char *what, CUdeviceptr p, size_t n) {
  int fd = -1;
  CUresult r = cuMemGetHandleForAddressRange(&fd, p, n, CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0);
  printf("ask %-20s [%#llx, +%#zx) r=%d\n", what, (unsigned long long)p, n, (int)r);
  if (r == CUDA_SUCCESS) close(fd);
}

static void asks(const char *when, const Kept &k) {
  char n[64];
  snprintf(n, sizeof n, "%s-whole", when); ask(n, k.whole, 8 * MB2);
  snprintf(n, sizeof n, "%s-carved", when); ask(n, k.carved, 4096);
  snprintf(n, sizeof n, "%s-pool", when); ask(n, k.pool, MB2);
  snprintf(n, sizeof n, "%s-vmm", when); ask(n, k.vmm, MB2);
}

static void phase(const char *name) {
  printf("phase %s\n", name);
  fflush(stdout);
  gdrshim_dl_mark(name);
}

static void create_context(CUcontext *ctx, CUdevice dev) {
#if CUDA_VERSION >= 13000
  CK(cuCtxCreate(ctx, nullptr, 0, dev));
#else
  CK(cuCtxCreate(ctx, 0, dev));
#endif
}

int main(int argc, char **argv) {
  const char *how = argc > 1 ? argv[1] : "";
  CK(cuInit(0));
  CUdevice dev; CK(cuDeviceGet(&dev, 0));
  CUcontext ctx = nullptr, primary = nullptr;
  Kept kept = {};
  const bool two = !strcmp(how, "two");
  if (two) {
    CK(cuDevicePrimaryCtxRetain(&primary, dev)); CK(cuCtxSetCurrent(primary));
    phase("allocate-kept");
    kept = allocate();
    asks("kept-live", kept);
  }
  if (!strcmp(how, "destroy") || two) create_context(&ctx, dev);
  else { CK(cuDevicePrimaryCtxRetain(&ctx, dev)); CK(cuCtxSetCurrent(ctx)); }
  if (!strcmp(how, "release")) { CUcontext again; CK(cuDevicePrimaryCtxRetain(&again, dev)); }
  phase("allocate");
  Kept old = allocate();
  asks("live", old);
  phase("end");
  if (!strcmp(how, "reset")) CKRT(cudaDeviceReset());
  else if (!strcmp(how, "destroy") || two) CK(cuCtxDestroy(ctx));
  else if (!strcmp(how, "release")) { CK(cuDevicePrimaryCtxRelease(dev)); phase("released-once"); CK(cuDevicePrimaryCtxRelease(dev)); }
  else { fprintf(stderr, "usage: ctx_end reset|destroy|release|two\n"); return 2; }
  phase("after");
  if (two) { CK(cuCtxSetCurrent(primary)); asks("kept-after", kept); }
  CK(cuDevicePrimaryCtxRetain(&ctx, dev)); CK(cuCtxSetCurrent(ctx));
  asks("old", old);
  phase("allocate-again");
  Kept fresh = allocate();
  asks("new", fresh);
  asks("old-again", old);
  if (two) asks("kept-again", kept);
  printf("ctx_end %s done\n", how);
  return 0;
}
