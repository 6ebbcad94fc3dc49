// Registration through the real RM with libcuda's native 503C suppressed (GeForce emulation):
// verbs registrations (stub NIC) over every allocation kind, reached both directly and the way
// NCCL does it (dlopen + dlvsym), then 10^4 register/deregister/free cycles.
#include "common.h"
#include <cuda_runtime.h>
#include <string.h>
#include <unistd.h>

struct ibv_mr { void *context, *pd, *addr; size_t length; uint32_t handle, lkey, rkey; };
extern "C" struct ibv_mr *ibv_reg_mr(void *pd, void *addr, size_t len, int access); // direct link
extern "C" int ibv_dereg_mr(struct ibv_mr *mr);
typedef struct ibv_mr *(*reg_t)(void *, void *, size_t, int);
typedef struct ibv_mr *(*reg2_t)(void *, void *, size_t, uint64_t, unsigned);
typedef int (*dereg_t)(struct ibv_mr *);

static int fails;
static void expect(bool ok, const char *what) { if (!ok) { fails++; printf("FAIL %s\n", what); } }

#include <time.h>
static double now() { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }

// Added latency of registrations (stub NIC): a repeated registration of a GPU buffer that is
// already registered, a first registration (fresh NV503C registration each time) and host memory.
static int bench(reg_t reg, dereg_t dereg) {
  void *g; CKRT(cudaMalloc(&g, 64 << 20));
  void *host = aligned_alloc(4096, 1 << 20);
  const int N = 20000;
  struct ibv_mr *keep = reg(0, g, 64 << 20, 0xf); // holds the registration for the repeated case
  double t0 = now();
  for (int i = 0; i < N; i++) dereg(reg(0, (char *)g + 4096, 1 << 20, 0xf));
  double rep = (now() - t0) * 1e9 / N;
  dereg(keep);
  t0 = now();
  for (int i = 0; i < 2000; i++) dereg(reg(0, g, 64 << 20, 0xf));
  double first = (now() - t0) * 1e9 / 2000;
  t0 = now();
  for (int i = 0; i < N; i++) dereg(reg(0, host, 1 << 20, 0xf));
  double hst = (now() - t0) * 1e9 / N;
  printf("bench reg_dereg repeated_gpu_ns=%.1f first_gpu_ns=%.1f host_ns=%.1f\n", rep, first, hst);
  return 0;
}

int main(int argc, char **argv) {
  int cycles = argc > 1 ? atoi(argv[1]) : 10000;
  CKRT(cudaFree(0));
  void *h = dlopen("libibverbs.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!h) { printf("FAIL dlopen stub verbs: %s\n", dlerror()); return 1; }
  reg_t nreg = (reg_t)dlvsym(h, "ibv_reg_mr", "IBVERBS_1.1");
  reg2_t nreg2 = (reg2_t)dlvsym(h, "ibv_reg_mr_iova2", "IBVERBS_1.8");
  dereg_t ndereg = (dereg_t)dlvsym(h, "ibv_dereg_mr", "IBVERBS_1.1");
  if (argc > 2 && !strcmp(argv[2], "bench")) return bench(nreg, ndereg);
  Dl_info di; dladdr((void *)nreg2, &di);
  printf("dlvsym ibv_reg_mr_iova2@IBVERBS_1.8 resolved into %s\n", di.dli_fname);
  size_t page = 4096;
  auto round = [&](uint64_t p, size_t n, uint64_t *a, size_t *l) { *a = p & ~(page - 1); *l = ((p + n + page - 1) & ~(page - 1)) - *a; };
  // every allocation kind
  void *big; CKRT(cudaMalloc(&big, 64 << 20));
  void *mid; CKRT(cudaMalloc(&mid, 3 << 20));
  CUdeviceptr s1, s2; CK(cuMemAlloc(&s1, 4096)); CK(cuMemAlloc(&s2, 4096));
  CUmemAllocationProp prop = {}; prop.type = CU_MEM_ALLOCATION_TYPE_PINNED; prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE; prop.allocFlags.gpuDirectRDMACapable = 1;
  size_t gran; CK(cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
  CUmemGenericAllocationHandle vh; CUdeviceptr v; CK(cuMemCreate(&vh, 4 * gran, &prop, 0)); CK(cuMemAddressReserve(&v, 4 * gran, 0, 0, 0)); CK(cuMemMap(v, 4 * gran, 0, vh, 0));
  CUmemAccessDesc ad = {}; ad.location = prop.location; ad.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE; CK(cuMemSetAccess(v, 4 * gran, &ad, 1));
  struct { uint64_t p; size_t n; const char *k; } bufs[] = {{(uint64_t)big, 64 << 20, "cudaMalloc64M"}, {(uint64_t)big + (5 << 20) + 4096, 1 << 20, "cudaMalloc-sub-range"}, {(uint64_t)mid, 3 << 20, "cudaMalloc3M"}, {s1, 4096, "cuMemAlloc4K-a"}, {s2, 4096, "cuMemAlloc4K-b"}, {v, 4 * gran, "vmm"}};
  for (auto &b : bufs) {
    uint64_t a; size_t l; round(b.p, b.n, &a, &l);
    struct ibv_mr *m1 = nreg2(0, (void *)a, l, a, 0x10000f);   // NCCL's default path
    struct ibv_mr *m2 = ibv_reg_mr(0, (void *)a, l, 0xf);       // a directly linked consumer
    expect(m1 && m2, b.k);
    printf("registered %s addr=%lx len=%zx\n", b.k, (unsigned long)a, l);
    if (m2) ibv_dereg_mr(m2);
    if (m1) ndereg(m1);
  }
  // host memory: untouched
  void *host = aligned_alloc(4096, 1 << 20); struct ibv_mr *hm = nreg(0, host, 1 << 20, 0xf); expect(hm != 0, "host"); ndereg(hm);
  // free while registered (the shim must unregister before the memory goes)
  CUdeviceptr f; CK(cuMemAlloc(&f, 2 << 20)); struct ibv_mr *fm = nreg(0, (void *)f, 2 << 20, 0xf); expect(fm != 0, "free-while-registered reg");
  CK(cuMemFree(f)); ndereg(fm);
  // VMM unmap while registered
  struct ibv_mr *vm = nreg(0, (void *)v, 4 * gran, 0xf); expect(vm != 0, "vmm reg");
  // access granted again while registered: libcuda maps the range again (same memory, same
  // offsets); the registration must stay, not be taken down and not be doubled
  struct gdrshim_counters c0 = {}, c1 = {};
  int have = gdrshim_dl_counters(&c0, sizeof c0) > 0;
  CK(cuMemSetAccess(v, 4 * gran, &ad, 1));
  if (have) {
    gdrshim_dl_counters(&c1, sizeof c1);
    printf("setaccess-again live_before=%llu live_after=%llu unregistered_delta=%llu\n", (unsigned long long)c0.live_registrations, (unsigned long long)c1.live_registrations, (unsigned long long)(c1.unregistered - c0.unregistered));
    expect(c1.live_registrations == c0.live_registrations && c1.unregistered == c0.unregistered, "registration kept across cuMemSetAccess");
  }
  CK(cuMemUnmap(v, 4 * gran)); ndereg(vm); CK(cuMemRelease(vh)); CK(cuMemAddressFree(v, 4 * gran));
  // cycles
  for (int i = 0; i < cycles; i++) {
    CUdeviceptr p; CK(cuMemAlloc(&p, 2 << 20));
    struct ibv_mr *m = nreg(0, (void *)p, 2 << 20, 0xf);
    if (!m) { fails++; break; }
    if (i % 10 == 9) { CK(cuMemFree(p)); ndereg(m); } else { ndereg(m); CK(cuMemFree(p)); }
  }
  CKRT(cudaFree(big)); CKRT(cudaFree(mid)); CK(cuMemFree(s1)); CK(cuMemFree(s2));
  printf("reg_cycle cycles=%d failures=%d\n", cycles, fails);
  return fails ? 1 : 0;
}
