// The DMA-BUF route on the GPU machine (ours; built there with nvcc).
//   dmabuf exports        cuMemGetHandleForAddressRange(DMA_BUF_FD) of every allocation kind:
//                         cudaMalloc whole and sub-range, a sub-allocated small cuMemAlloc, a VMM
//                         range over two chunks, 1000 page-aligned pieces of one buffer; each fd
//                         checked (fdinfo exp_name nv_dmabuf, size) and closed. Run natively
//                         (libcuda exports; shadow oracle) and in GeForce emulation (gdrshim serves)
//   dmabuf cycles N       N times: cuMemAlloc 2 MiB, ibv_reg_mr (stub NIC, through dlvsym), free the
//                         memory first or deregister first; device memory and fds counted before
//                         and after: the memory comes back after the last release, no fd is left
//   dmabuf bench N        N first registrations of fresh 2 MiB allocations: `shim` (ibv_reg_mr,
//                         which gdrshim turns into export + ibv_reg_dmabuf_mr) or `native`
//                         (libcuda's export + ibv_reg_dmabuf_mr): median ns per registration
//   dmabuf bench-ab N     the same three ways in one process under gdrshim (register mode, the
//                         DMA-BUF route; libcuda's export left as it is), in an order that
//                         rotates per allocation: `native` as above, `shim` as above, `export`
//                         (gdrshim_export_dmabuf + ibv_reg_dmabuf_mr: the export without the verbs
//                         hook). Separate processes, as in `bench`, see different machine states;
//                         here all three see the same. Median and p90 ns of each, and the median
//                         of the per-allocation differences shim - native and export - native
#include "common.h"
#include <algorithm>
#include <cuda_runtime.h>
#include <dirent.h>
#include <string.h>
#include <unistd.h>
#include <vector>

struct ibv_mr { void *context, *pd, *addr; size_t length; uint32_t handle, lkey, rkey; };
typedef struct ibv_mr *(*reg_t)(void *, void *, size_t, int);
typedef struct ibv_mr *(*regdb_t)(void *, uint64_t, size_t, uint64_t, int, int);
typedef int (*dereg_t)(struct ibv_mr *);
static int fails;
static void expect(bool ok, const char *what, long a = 0) { if (!ok) { fails++; printf("FAIL %s %#lx\n", what, a); } }
#include <time.h>
static double now() { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }

// fdinfo of a dma-buf: its exporter's name and size
static bool fdinfo(int fd, char *exp, size_t n, long *size) {
  char p[64], line[256]; snprintf(p, sizeof p, "/proc/self/fdinfo/%d", fd);
  FILE *f = fopen(p, "r"); if (!f) return false;
  exp[0] = 0; *size = -1;
  while (fgets(line, sizeof line, f)) {
    if (!strncmp(line, "exp_name:", 9)) sscanf(line + 9, "%63s", exp);
    if (!strncmp(line, "size:", 5)) *size = atol(line + 5);
  }
  fclose(f); (void)n;
  return exp[0] != 0;
}
static int dmabufs_open() {
  int n = 0; DIR *d = opendir("/proc/self/fd"); struct dirent *e;
  while ((e = readdir(d))) { char exp[64]; long s; int fd = atoi(e->d_name); if (fd > 2 && fdinfo(fd, exp, sizeof exp, &s) && !strcmp(exp, "nv_dmabuf")) n++; }
  closedir(d); return n;
}

static int one(const char *kind, CUdeviceptr p, size_t n, bool quiet = false) {
  int fd = -1; CUresult r = cuMemGetHandleForAddressRange(&fd, p, n, CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0);
  char exp[64] = "?"; long size = -1;
  if (r == CUDA_SUCCESS) fdinfo(fd, exp, sizeof exp, &size);
  bool ok = r == CUDA_SUCCESS && !strcmp(exp, "nv_dmabuf") && size == (long)n;
  if (!quiet || !ok) printf("export %s [%#llx, +%#zx) r=%d fd=%d exp_name=%s size=%#lx %s\n", kind, (unsigned long long)p, n, (int)r, fd, exp, size, ok ? "ok" : "WRONG");
  expect(ok, kind, (long)p);
  if (fd >= 0) close(fd);
  return ok;
}

static int exports() {
  CKRT(cudaFree(0));
  int attr = -1; CK(cuDeviceGetAttribute(&attr, CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED, 0));
  printf("attr DMA_BUF_SUPPORTED=%d\n", attr);
  int fds0 = dmabufs_open();
  void *big; CKRT(cudaMalloc(&big, 64 << 20));
  one("cudaMalloc64M", (CUdeviceptr)big, 64 << 20);
  one("cudaMalloc-sub+2M", (CUdeviceptr)big + (2 << 20), 4 << 20);
  one("cudaMalloc-sub-4K", (CUdeviceptr)big + 4096, 8192);
  CUdeviceptr s1, s2; CK(cuMemAlloc(&s1, 4096)); CK(cuMemAlloc(&s2, 4096));
  one("cuMemAlloc4K-suballocated", s2, 4096);
  CUmemAllocationProp prop = {}; prop.type = CU_MEM_ALLOCATION_TYPE_PINNED; prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE; prop.allocFlags.gpuDirectRDMACapable = 1;
  size_t gran; CK(cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
  CUmemGenericAllocationHandle h[2]; CUdeviceptr v;
  CK(cuMemAddressReserve(&v, 4 * gran, 0, 0, 0));
  for (int i = 0; i < 2; i++) { CK(cuMemCreate(&h[i], 2 * gran, &prop, 0)); CK(cuMemMap(v + i * 2 * gran, 2 * gran, 0, h[i], 0)); }
  CUmemAccessDesc ad = {}; ad.location = prop.location; ad.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE; CK(cuMemSetAccess(v, 4 * gran, &ad, 1));
  one("vmm-two-chunks", v, 4 * gran);
  one("vmm-across-the-seam", v + gran, 2 * gran);
  uint64_t seed = 0x9e3779b97f4a7c15ull; int ok = 0;
  for (int i = 0; i < 1000; i++) {
    seed ^= seed << 13; seed ^= seed >> 7; seed ^= seed << 17;
    size_t off = (seed % (16 << 8)) << 12, len = (1 + (seed >> 32) % 256) << 12;
    ok += one("piece", (CUdeviceptr)big + off, len, true);
  }
  printf("export pieces ok=%d of 1000\n", ok);
  for (int i = 0; i < 2; i++) CK(cuMemUnmap(v + i * 2 * gran, 2 * gran));
  for (int i = 0; i < 2; i++) CK(cuMemRelease(h[i]));
  CK(cuMemAddressFree(v, 4 * gran)); CK(cuMemFree(s1)); CK(cuMemFree(s2)); CKRT(cudaFree(big));
  int fds1 = dmabufs_open();
  printf("dmabuf exports failures=%d dmabuf_fds_left=%d\n", fails, fds1 - fds0);
  return fails || fds1 != fds0;
}

static void *verbs() {
  void *h = dlopen("libibverbs.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!h) { printf("FAIL dlopen stub verbs: %s\n", dlerror()); exit(1); }
  return h;
}

static int cycles(int n) {
  CKRT(cudaFree(0));
  void *h = verbs();
  reg_t reg = (reg_t)dlvsym(h, "ibv_reg_mr", "IBVERBS_1.1");
  dereg_t dereg = (dereg_t)dlvsym(h, "ibv_dereg_mr", "IBVERBS_1.1");
  size_t free0, free1, free2, total; CK(cuMemGetInfo(&free0, &total));
  int fds0 = dmabufs_open();
  // the memory stays with a live MR after its free, and comes back with the deregistration
  CUdeviceptr q; CK(cuMemAlloc(&q, 256 << 20));
  struct ibv_mr *qm = reg(0, (void *)q, 256 << 20, 0xf);
  expect(qm && qm->addr == (void *)q && qm->length == (256u << 20), "MR reads as the caller's", (long)q);
  CK(cuMemFree(q));
  CK(cuMemGetInfo(&free1, &total));
  if (qm) dereg(qm);
  CK(cuMemGetInfo(&free2, &total));
  printf("memory held_after_free_mib=%ld back_after_dereg_mib=%ld\n", (long)((long)free0 - (long)free1) >> 20, (long)((long)free0 - (long)free2) >> 20);
  expect(free0 - free1 >= (200u << 20), "the dma-buf holds freed memory while the MR lives");
  expect(free0 - free2 < (64u << 20) || free2 >= free0, "the memory comes back after the last release");
  double t0 = now();
  for (int i = 0; i < n; i++) {
    CUdeviceptr p; CK(cuMemAlloc(&p, 2 << 20));
    struct ibv_mr *m = reg(0, (void *)p, 2 << 20, 0xf);
    if (!m) { fails++; printf("FAIL cycle %d\n", i); break; }
    if (i % 10 == 9) { CK(cuMemFree(p)); dereg(m); } else { dereg(m); CK(cuMemFree(p)); }
  }
  double dt = now() - t0;
  int fds1 = dmabufs_open();
  size_t free3; CK(cuMemGetInfo(&free3, &total));
  printf("dmabuf cycles=%d failures=%d dmabuf_fds_left=%d free_mib_before=%zu after=%zu us_per_cycle=%.1f\n", n, fails, fds1 - fds0, free0 >> 20, free3 >> 20, dt * 1e6 / n);
  return fails || fds1 != fds0;
}

// The three ways a fresh 2 MiB allocation gets its first registration (see the usage above).
enum Way { NATIVE, SHIM, EXPORT };
static const char *way_names[3] = {"native", "shim", "export"};
struct Ways {
  reg_t reg;
  regdb_t regdb;
  dereg_t dereg;
  int (*gexport)(uint64_t, uint64_t); // gdrshim's, where it is loaded
};

static Ways ways() {
  CKRT(cudaFree(0));
  void *h = verbs();
  Ways w;
  w.reg = (reg_t)dlvsym(h, "ibv_reg_mr", "IBVERBS_1.1");
  w.regdb = (regdb_t)dlvsym(h, "ibv_reg_dmabuf_mr", "IBVERBS_1.12");
  w.dereg = (dereg_t)dlvsym(h, "ibv_dereg_mr", "IBVERBS_1.1");
  w.gexport = (int (*)(uint64_t, uint64_t))dlsym(RTLD_DEFAULT, "gdrshim_export_dmabuf");
  return w;
}

// The first registration of the 2 MiB at p, one way; *ns is its time. Null if it failed.
static struct ibv_mr *first_registration(const Ways &w, Way way, CUdeviceptr p, double *ns) {
  double t0 = now();
  struct ibv_mr *m = nullptr;
  if (way == SHIM) {
    m = w.reg(0, (void *)p, 2 << 20, 0xf);
  } else {
    int fd = -1;
    if (way == NATIVE) CK(cuMemGetHandleForAddressRange(&fd, p, 2 << 20, CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0));
    else fd = w.gexport(p, 2 << 20);
    if (fd >= 0) { m = w.regdb(0, 0, 2 << 20, p, fd, 0xf); close(fd); }
  }
  *ns = (now() - t0) * 1e9;
  return m;
}

static int bench(int n, bool shim) {
  Ways w = ways();
  std::vector<double> t;
  for (int i = 0; i < n; i++) {
    CUdeviceptr p; CK(cuMemAlloc(&p, 2 << 20));
    double ns;
    struct ibv_mr *m = first_registration(w, shim ? SHIM : NATIVE, p, &ns);
    t.push_back(ns);
    if (!m) { fails++; break; }
    w.dereg(m); CK(cuMemFree(p));
  }
  std::sort(t.begin(), t.end());
  printf("bench first_registration %s n=%zu median_ns=%.0f p90_ns=%.0f\n", shim ? "shim" : "native", t.size(), t.empty() ? 0 : t[t.size() / 2], t.empty() ? 0 : t[t.size() * 9 / 10]);
  return fails != 0;
}

static double pct(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[(size_t)(q * (v.size() - 1))];
}

static int bench_ab(int n) {
  Ways w = ways();
  if (!w.reg || !w.regdb || !w.dereg || !w.gexport) { printf("FAIL bench-ab needs the stub NIC and gdrshim\n"); return 1; }
  std::vector<double> t[3], d_shim, d_exp;
  for (int i = 0; i < n && !fails; i++) {
    double ti[3];
    for (int j = 0; j < 3; j++) {
      Way way = (Way)((i + j) % 3);
      CUdeviceptr p; CK(cuMemAlloc(&p, 2 << 20));
      struct ibv_mr *m = first_registration(w, way, p, &ti[way]);
      expect(m != nullptr, way_names[way], i);
      if (m) w.dereg(m);
      CK(cuMemFree(p));
    }
    for (int k = 0; k < 3; k++) t[k].push_back(ti[k]);
    d_shim.push_back(ti[SHIM] - ti[NATIVE]);
    d_exp.push_back(ti[EXPORT] - ti[NATIVE]);
  }
  for (int k = 0; k < 3; k++)
    printf("bench-ab first_registration %s n=%zu median_ns=%.0f p90_ns=%.0f\n", way_names[k], t[k].size(), pct(t[k], 0.5), pct(t[k], 0.9));
  printf("bench-ab per-allocation difference shim-native median_ns=%.0f [p25 %.0f, p75 %.0f]  export-native median_ns=%.0f [p25 %.0f, p75 %.0f]\n",
         pct(d_shim, 0.5), pct(d_shim, 0.25), pct(d_shim, 0.75), pct(d_exp, 0.5), pct(d_exp, 0.25), pct(d_exp, 0.75));
  return fails != 0;
}

int main(int argc, char **argv) {
  if (argc < 2) return 2;
  if (!strcmp(argv[1], "exports")) return exports();
  if (!strcmp(argv[1], "cycles")) return cycles(argc > 2 ? atoi(argv[2]) : 10000);
  if (!strcmp(argv[1], "bench-ab")) return bench_ab(argc > 2 ? atoi(argv[2]) : 500);
  if (!strcmp(argv[1], "bench")) return bench(argc > 2 ? atoi(argv[2]) : 500, argc > 3 && !strcmp(argv[3], "shim"));
  return 2;
}
