// Registration figures of issue 30 on the GPU machine (ours; built there with nvcc), with the stub
// NIC (tests/gpu/stubverbs.c) as libibverbs.so.1:
//   bar1_figures shim N MIB     N fresh buffers of MIB MiB (allocated before the clock runs): per
//                               buffer the first ibv_reg_mr (gdrshim: export + ibv_reg_dmabuf_mr)
//                               and, while that MR lives, the same buffer again on a second PD (a
//                               second NIC or a relaxed-ordering twin: gdrshim reuses the buffer);
//                               then gdrshim's counters (dmabuf_reused, exported_peak_bytes, BAR1)
//   bar1_figures native N MIB   the same buffers the way libcuda offers: cuMemGetHandleForAddressRange
//                               + ibv_reg_dmabuf_mr + close (no shim)
//   bar1_figures mixed N MIB    both in one process, gdrshim preloaded in register mode with
//                               libcuda's own dma-buf left on: per pair of fresh buffers, libcuda's
//                               export + ibv_reg_dmabuf_mr + close on one and gdrshim's first
//                               ibv_reg_mr on the other, in turn first; with syscount.c preloaded
//                               last, the export ioctl's own time of each ("libcuda_ioctl",
//                               "first_ioctl"): per-process machine states cancel out
//   bar1_figures mixed N MIB live  the same with every MR kept until the end (N live buffers
//                               each way, as a program's registered pool), max_ns reported too
// Prints "bar1 WAY MIB first|repeat|libcuda n=N median_ns=M p90_ns=P". With tests/gpu/syscount.c
// preloaded last, 20 more buffers are registered the same way with the system calls counted and
// timed: "bar1 calls WAY MIB first|repeat|libcuda ioctl=CALLS/NSns ... all=CALLS/NSns" per buffer.
#include "common.h"
#include <algorithm>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <vector>

struct ibv_mr { void *context, *pd, *addr; size_t length; uint32_t handle, lkey, rkey; };
typedef struct ibv_mr *(*reg_t)(void *, void *, size_t, int);
typedef struct ibv_mr *(*regdb_t)(void *, uint64_t, size_t, uint64_t, int, int);
typedef int (*dereg_t)(struct ibv_mr *);

static double now() { timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
static void report(const char *way, int mib, const char *what, std::vector<double> t) {
  std::sort(t.begin(), t.end());
  double sum = 0;
  for (double x : t) sum += x;
  printf("bar1 %s %d %s n=%zu median_ns=%.0f p90_ns=%.0f mean_ns=%.0f max_ns=%.0f\n", way, mib, what, t.size(), t.empty() ? 0 : t[t.size() / 2],
         t.empty() ? 0 : t[(t.size() * 9) / 10], t.empty() ? 0 : sum / t.size(), t.empty() ? 0 : t.back());
}

int main(int argc, char **argv) {
  if (argc < 4) { fprintf(stderr, "usage: bar1_figures shim|native N MIB\n"); return 2; }
  bool mixed = !strcmp(argv[1], "mixed");
  bool live = argc > 4 && !strcmp(argv[4], "live");
  bool shim = !strcmp(argv[1], "shim") || mixed;
  int n = atoi(argv[2]), mib = atoi(argv[3]);
  size_t len = (size_t)mib << 20;
  CK(cuInit(0));
  CUdevice dev; CK(cuDeviceGet(&dev, 0));
  CUcontext ctx; CK(cuDevicePrimaryCtxRetain(&ctx, dev)); CK(cuCtxSetCurrent(ctx));
  void *h = dlopen("libibverbs.so.1", RTLD_NOW | RTLD_GLOBAL);
  if (!h) { fprintf(stderr, "FAIL no libibverbs.so.1 (the stub NIC): %s\n", dlerror()); return 1; }
  reg_t reg = (reg_t)dlvsym(h, "ibv_reg_mr", "IBVERBS_1.1");
  regdb_t regdb = (regdb_t)dlvsym(h, "ibv_reg_dmabuf_mr", "IBVERBS_1.12");
  dereg_t dereg = (dereg_t)dlvsym(h, "ibv_dereg_mr", "IBVERBS_1.1");
  if (!reg || !regdb || !dereg) { fprintf(stderr, "FAIL verbs symbols\n"); return 1; }
  const int counted = 20;
  std::vector<CUdeviceptr> bufs(n + counted);
  for (auto &p : bufs) CK(cuMemAlloc(&p, len));
  std::vector<double> first, repeat;
  int fails = 0;
  int *count_on = (int *)dlsym(RTLD_DEFAULT, "syscount_on");
  unsigned long (*count_ns)(int, unsigned long *) = (unsigned long (*)(int, unsigned long *))dlsym(RTLD_DEFAULT, "syscount_ns");
  void (*count_clear)(void) = (void (*)(void))dlsym(RTLD_DEFAULT, "syscount_clear");
  if (mixed) {
    std::vector<CUdeviceptr> more(n);
    for (auto &p : more) CK(cuMemAlloc(&p, len));
    std::vector<double> lib, lib_io, ours, ours_io;
    std::vector<struct ibv_mr *> kept;
    for (int i = 0; i < n; i++) {
      for (int k = 0; k < 2; k++) {
        bool native_now = (k ^ (i & 1)) == 0;
        if (count_clear) count_clear();
        if (count_on) *count_on = 1;
        double t0 = now();
        struct ibv_mr *a = nullptr;
        if (native_now) {
          int fd = -1;
          CK(cuMemGetHandleForAddressRange(&fd, more[i], len, CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0));
          a = regdb((void *)0x1, 0, len, more[i], fd, 0xf);
          close(fd);
        } else {
          a = reg((void *)0x1, (void *)bufs[i], len, 0xf);
        }
        double t = (now() - t0) * 1e9;
        if (count_on) *count_on = 0;
        unsigned long io = count_ns ? count_ns(0, nullptr) : 0;
        (native_now ? lib : ours).push_back(t);
        (native_now ? lib_io : ours_io).push_back((double)io);
        if (!a) { fprintf(stderr, "FAIL %s registration %d of %d MiB\n", native_now ? "libcuda" : "gdrshim", i, mib); fails++; }
        else if (live) kept.push_back(a);
        else dereg(a); // both ways alike: gdrshim's buffer is closed with its MR, libcuda's fd was closed above
      }
    }
    for (auto m : kept) dereg(m);
    const char *way = live ? "mixed-live" : "mixed";
    report(way, mib, "libcuda", lib);
    report(way, mib, "first", ours);
    if (count_ns) { report(way, mib, "libcuda_ioctl", lib_io); report(way, mib, "first_ioctl", ours_io); }
    for (auto p : more) CK(cuMemFree(p));
    for (auto p : bufs) CK(cuMemFree(p));
    return fails != 0;
  }
  for (int i = 0; i < n; i++) {
    CUdeviceptr p = bufs[i];
    double t0 = now();
    struct ibv_mr *a = nullptr, *b = nullptr;
    if (shim) {
      a = reg((void *)0x1, (void *)p, len, 0xf);
      double t1 = now();
      b = a ? reg((void *)0x2, (void *)p, len, 0xf | 0x100000) : nullptr; // a second PD, IBV_ACCESS_RELAXED_ORDERING (1 << 20): NIXL-style twin
      repeat.push_back((now() - t1) * 1e9);
      first.push_back((t1 - t0) * 1e9);
    } else {
      int fd = -1;
      CK(cuMemGetHandleForAddressRange(&fd, p, len, CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0));
      a = regdb((void *)0x1, 0, len, p, fd, 0xf);
      close(fd);
      first.push_back((now() - t0) * 1e9);
    }
    if (!a || (shim && !b)) { fprintf(stderr, "FAIL registration %d of %d MiB\n", i, mib); fails++; }
    if (b) dereg(b);
    if (a) dereg(a);
  }
  report(shim ? "shim" : "native", mib, shim ? "first" : "libcuda", first);
  if (shim) report("shim", mib, "repeat", repeat);
  void (*count_report)(const char *, int) = (void (*)(const char *, int))dlsym(RTLD_DEFAULT, "syscount_report");
  if (count_on && count_report) {
    char what[64];
    for (int phase = 0; phase < (shim ? 2 : 1); phase++) {
      std::vector<struct ibv_mr *> firsts, mrs;
      for (int i = n; i < n + counted; i++) {
        CUdeviceptr p = bufs[i];
        struct ibv_mr *a = nullptr;
        if (shim) {
          if (phase == 1) {
            a = reg((void *)0x1, (void *)p, len, 0xf);
            firsts.push_back(a);
          }
          *count_on = 1;
          struct ibv_mr *m = reg((void *)(uintptr_t)(phase + 1), (void *)p, len, 0xf);
          *count_on = 0;
          mrs.push_back(m);
        } else {
          int fd = -1;
          *count_on = 1;
          CK(cuMemGetHandleForAddressRange(&fd, p, len, CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0));
          a = regdb((void *)0x1, 0, len, p, fd, 0xf);
          close(fd);
          *count_on = 0;
          mrs.push_back(a);
        }
      }
      for (auto m : mrs) if (m) dereg(m); else fails++;
      for (auto m : firsts) if (m) dereg(m); else fails++;
      snprintf(what, sizeof what, "bar1 calls %s %d %s", shim ? "shim" : "native", mib, shim ? (phase ? "repeat" : "first") : "libcuda");
      count_report(what, counted);
    }
  }
  int (*counters)(struct gdrshim_counters *, size_t) = (int (*)(struct gdrshim_counters *, size_t))dlsym(RTLD_DEFAULT, "gdrshim_counters");
  if (counters) {
    struct gdrshim_counters c; memset(&c, 0xff, sizeof c);
    int got = counters(&c, sizeof c);
    printf("bar1 counters got=%d dmabuf_exports=%llu dmabuf_reused=%llu exported_peak_bytes=%llu registered_peak_bytes=%llu bar1_bytes=%llu bar1_static=%llu\n", got,
           (unsigned long long)c.dmabuf_exports, (unsigned long long)c.dmabuf_reused, (unsigned long long)c.exported_peak_bytes,
           (unsigned long long)c.registered_peak_bytes, (unsigned long long)c.bar1_bytes, (unsigned long long)c.bar1_static);
  }
  for (auto p : bufs) CK(cuMemFree(p));
  return fails != 0;
}
