// One allocation of each kind, with marks in gdrshim's capture: the fixture source for CI.
#include "common.h"
#include <cuda_runtime.h>

__global__ void fill(unsigned *p, size_t n, unsigned seed) {
  size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
  if (i < n) p[i] = seed ^ (unsigned)i;
}

int main() {
  mark("start");
  CKRT(cudaFree(0));
  mark("context");
  void *a = 0;
  CKRT(cudaMalloc(&a, 64 << 20));
  mark("cudaMalloc 64M");
  CUdeviceptr b = 0, small = 0, small2 = 0;
  CK(cuMemAlloc(&b, 3 << 20));
  mark("cuMemAlloc 3M");
  CK(cuMemAlloc(&small, 4096));
  CK(cuMemAlloc(&small2, 4096));
  mark("cuMemAlloc 4K x2");
  CUmemAllocationProp prop = {};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = 0;
  prop.allocFlags.gpuDirectRDMACapable = 1;
  size_t gran = 0;
  CK(cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
  size_t sz = 4 * gran;
  CUmemGenericAllocationHandle h;
  CK(cuMemCreate(&h, sz, &prop, 0));
  CUdeviceptr v = 0;
  CK(cuMemAddressReserve(&v, 2 * sz, 0, 0, 0));
  CK(cuMemMap(v, sz, 0, h, 0));
  CUmemAccessDesc ad = {};
  ad.location = prop.location;
  ad.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  CK(cuMemSetAccess(v, sz, &ad, 1));
  mark("vmm map");
  fill<<<(sz / 4 + 255) / 256, 256>>>((unsigned *)v, sz / 4, 0xabcd);
  CKRT(cudaDeviceSynchronize());
  CK(cuMemUnmap(v, sz));
  // remap the same handle at the second half of the reservation
  CK(cuMemMap(v + sz, sz, 0, h, 0));
  CK(cuMemSetAccess(v + sz, sz, &ad, 1));
  mark("vmm remap");
  CK(cuMemUnmap(v + sz, sz));
  CK(cuMemRelease(h));
  CK(cuMemAddressFree(v, 2 * sz));
  mark("vmm free");
  CK(cuMemFree(b));
  CK(cuMemFree(small));
  CK(cuMemFree(small2));
  CKRT(cudaFree(a));
  mark("frees");
  void *c = 0;
  cudaStream_t s;
  CKRT(cudaStreamCreate(&s));
  CKRT(cudaMallocAsync(&c, 8 << 20, s));
  CKRT(cudaStreamSynchronize(s));
  mark("mallocAsync");
  CKRT(cudaFreeAsync(c, s));
  CKRT(cudaStreamSynchronize(s));
  void *pitched = 0; size_t pitch = 0;
  CKRT(cudaMallocPitch(&pitched, &pitch, 1000, 300));
  mark("mallocPitch");
  CKRT(cudaFree(pitched));
  mark("end");
  printf("alloc_probe ok\n");
  return 0;
}
