// BAR1 read-back (fact sheet S8): for many pieces of different allocations, map the
// (client, memory, offset) that gdrshim's map gives through RM, and compare the bytes with what a
// kernel wrote at the VA. A wrong map entry shows up as different bytes.
#include "common.h"
#include <cuda_runtime.h>
#include <fcntl.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <unistd.h>
#include <vector>

struct nvos33_fd { uint32_t hClient, hDevice, hMemory, pad0; uint64_t offset, length, pLinearAddress; uint32_t status, flags; int32_t fd; uint32_t pad1; };
struct nvos34 { uint32_t hClient, hDevice, hMemory, pad0; uint64_t pLinearAddress; uint32_t status, flags; };
static_assert(sizeof(nvos33_fd) == 56, "NVOS33 with fd");
static_assert(sizeof(nvos34) == 32, "NVOS34");

__global__ void pattern(uint32_t *p, size_t n) {
  size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
  if (i < n) { uint64_t a = (uint64_t)(p + i); p[i] = (uint32_t)(a * 0x9E3779B97F4A7C15ull >> 32); }
}

struct Alloc { CUdeviceptr p; size_t n; const char *kind; };

int main(int argc, char **argv) {
  int want = argc > 1 ? atoi(argv[1]) : 120;
  int (*lookup)(uint64_t, uint64_t, gdrshim_backing *) = (int (*)(uint64_t, uint64_t, gdrshim_backing *))dlsym(RTLD_DEFAULT, "gdrshim_lookup");
  if (!lookup) { fprintf(stderr, "FAIL gdrshim not loaded\n"); return 1; }
  CKRT(cudaFree(0));
  std::vector<Alloc> allocs;
  srand(12345);
  for (int i = 0; i < 40; i++) { void *p; size_t n = ((size_t)(1 + rand() % 64)) << 20; CKRT(cudaMalloc(&p, n)); allocs.push_back({(CUdeviceptr)p, n, "cudaMalloc"}); }
  for (int i = 0; i < 40; i++) { CUdeviceptr p; size_t n = 4096 * (1 + rand() % 32); CK(cuMemAlloc(&p, n)); allocs.push_back({p, n, "cuMemAlloc-small"}); }
  CUmemAllocationProp prop = {};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED; prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE; prop.location.id = 0;
  prop.allocFlags.gpuDirectRDMACapable = 1;
  size_t gran = 0; CK(cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
  for (int i = 0; i < 40; i++) {
    size_t n = gran * (1 + rand() % 8); CUmemGenericAllocationHandle h; CUdeviceptr v;
    CK(cuMemCreate(&h, n, &prop, 0)); CK(cuMemAddressReserve(&v, n, 0, 0, 0)); CK(cuMemMap(v, n, 0, h, 0));
    CUmemAccessDesc ad = {}; ad.location = prop.location; ad.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE; CK(cuMemSetAccess(v, n, &ad, 1));
    allocs.push_back({v, n, "vmm"});
  }
  for (auto &a : allocs) pattern<<<(a.n / 4 + 255) / 256, 256>>>((uint32_t *)a.p, a.n / 4);
  CKRT(cudaDeviceSynchronize());
  const size_t W = 64 << 10;
  int checked = 0, equal = 0, misses = 0, rmfail = 0;
  std::vector<uint8_t> dev(W);
  for (size_t i = 0; i < allocs.size() && checked < want; i++) {
    Alloc &a = allocs[i];
    // a window inside the allocation: a random 64 KiB-aligned VA, or the allocation itself if smaller
    uint64_t w = a.p & ~(uint64_t)(W - 1);
    if (a.n > W) w = (a.p + (rand() % (a.n / W)) * W + W - 1) & ~(uint64_t)(W - 1);
    if (w + W > a.p + a.n && a.n > W) w -= W;
    uint64_t lo = w > a.p ? w : a.p, hi = (w + W < a.p + a.n) ? w + W : a.p + a.n;
    gdrshim_backing b = {};
    int r = lookup(w, W, &b);
    if (r) { misses++; printf("MISS %s va=%#lx r=%d\n", a.kind, (unsigned long)w, r); continue; }
    int gfd = open("/dev/nvidia0", O_RDWR | O_CLOEXEC);
    nvos33_fd m = {}; m.hClient = b.h_client; m.hDevice = b.h_device; m.hMemory = b.h_memory; m.offset = b.offset; m.length = W; m.fd = gfd;
    int rc = ioctl(b.ctl_fd, 0xC038464E, &m);
    if (rc || m.status) { rmfail++; printf("RMFAIL %s rc=%d status=%#x\n", a.kind, rc, m.status); close(gfd); continue; }
    void *cpu = mmap(NULL, W, PROT_READ | PROT_WRITE, MAP_SHARED, gfd, 0);
    if (cpu == MAP_FAILED) { rmfail++; printf("MMAPFAIL %s\n", a.kind); close(gfd); continue; }
    CK(cuMemcpyDtoH(dev.data(), lo, hi - lo));
    bool same = memcmp((uint8_t *)cpu + (lo - w), dev.data(), hi - lo) == 0;
    checked++; equal += same;
    if (!same) printf("DIFF %s va=%#lx client=%#x mem=%#x off=%#lx\n", a.kind, (unsigned long)w, b.h_client, b.h_memory, (unsigned long)b.offset);
    munmap(cpu, W);
    nvos34 u = {}; u.hClient = b.h_client; u.hDevice = b.h_device; u.hMemory = b.h_memory; u.pLinearAddress = m.pLinearAddress;
    ioctl(b.ctl_fd, 0xC020464F, &u);
    close(gfd);
  }
  printf("bar1_readback pieces_checked=%d equal=%d different=%d lookup_misses=%d rm_failures=%d allocations=%zu\n", checked, equal, checked - equal, misses, rmfail, allocs.size());
  return (checked >= 100 && equal == checked && misses == 0 && rmfail == 0) ? 0 : 1;
}
