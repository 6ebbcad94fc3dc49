// The shim at scale (ours): live allocations grow to each checkpoint (2 MiB each, 2 MiB apart,
// as a caching allocator's segments), and at each one the benchmark times, one call at a time,
// an allocation (RM_ALLOC + UVM_CREATE_EXTERNAL_RANGE + UVM_MAP_EXTERNAL_ALLOCATION), its free
// (UVM_FREE + RM_FREE), ibv_reg_mr and ibv_dereg_mr of GPU memory and of host memory,
// gdrshim_lookup, and frees, registrations and deregistrations while min(N/2, 10^5) registrations
// are live. In "heap" mode it only grows, and prints the heap in use (mallinfo2) at each
// checkpoint. In "touch" mode (a knobs build of the shim, GDRSHIM_APPLY_THREAD=0) it counts
// instead of timing: what the map and the registrar read for each call (gdrshim_test_touches),
// the work the call queued applied with it, by a host registration before and after (so each
// count holds one such registration: its own op, "flush"). In "export" mode (the shim on the
// DMA-BUF route, GDRSHIM_ROUTE=dmabuf) it times only gdrshim_export_dmabuf of a whole allocation
// at random, against, without the shim, what the fake driver does for one (a dup of a memfd).
// Run against scalefake.c and fakeverbs.c, with and without the shim (benches/scale.rs compares
// the two).
//   scalebench ops SAMPLES N1 N2 ...     prints "scale N=.. op=.. p50=..ns p99=..ns"
//   scalebench export SAMPLES N1 N2 ...  the same, op=export_dmabuf
//   scalebench touch SAMPLES N1 N2 ...   prints "scale N=.. op=.. p50=.. p99=.. touches"
//   scalebench heap N1 N2 ...            prints "scale N=.. heap=..B"
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <malloc.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>
#include "../../include/gdrshim.h"
#include "program_owns.h"
#define NV_IOCTL(nr, size) (0xC0000000u | ((size) << 16) | (0x46u << 8) | (nr))
#define SEG (2ull << 20)
#define BASE 0x100000000000ull
static int ctl, uvm; static uint32_t client, dev, sub, vas; static uint8_t uuid[16] = {0xa0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
typedef void *(*reg_t)(void *, void *, size_t, int);
typedef int (*dereg_t)(void *);
static reg_t vreg; static dereg_t vdereg;

static void die(const char *what, unsigned long v) { fprintf(stderr, "scalebench: %s %#lx\n", what, v); exit(1); }
static uint32_t rm_alloc(uint32_t parent, uint32_t cls, void *params, uint32_t psize) {
  uint32_t a[12] = {client, parent, 0, cls}; uint64_t p = (uintptr_t)params; memcpy(&a[4], &p, 8); a[8] = psize;
  if (cls == 0x41) a[0] = a[1] = 0;
  if (ioctl(ctl, NV_IOCTL(0x2b, 48), a) || a[10]) die("RM_ALLOC", cls);
  return a[2];
}
static void uvm_call(unsigned long cmd, void *a) { if (ioctl(uvm, cmd, a)) die("UVM", cmd); }
static uint32_t *handles;
static void alloc_one(uint64_t i) {
  uint8_t p[128] = {0}; uint64_t size = SEG; memcpy(p + 64, &size, 8);
  uint32_t h = rm_alloc(dev, 0x40, p, sizeof p);
  handles[i] = h;
  uint64_t va = BASE + i * SEG;
  uint64_t r[3] = {va, SEG, 0}; uvm_call(73, r);
  // on the stack, as libcuda's parameters are: the shim reads a call's parameters before the
  // driver does only where they lie in its callers' frames without a system call
  uint8_t m[9264];
  memset(m, 0, 64); memset(m + 9232, 0, 32);
  memcpy(m, &va, 8); memcpy(m + 8, &size, 8); memcpy(m + 24, uuid, 16);
  uint64_t count = 1; memcpy(m + 9240, &count, 8); memcpy(m + 9248, &ctl, 4); memcpy(m + 9252, &client, 4); memcpy(m + 9256, &h, 4);
  uvm_call(33, m);
  program_owns(va, SEG);
}
static void free_one(uint64_t i) {
  uint64_t f[3] = {BASE + i * SEG, SEG, 0}; uvm_call(34, f);
  uint32_t a[4] = {client, dev, handles[i], 0};
  if (ioctl(ctl, NV_IOCTL(0x29, 16), a) || a[3]) die("RM_FREE", handles[i]);
}

static int64_t (*touches)(void);
static char *host;
// a host registration: the shim applies the work queued so far before it decides
static void flush(void) { void *mr = vreg(0, host, 1 << 16, 0xf); if (!mr) die("host MR refused", 0); vdereg(mr); }
static uint64_t now(void) {
  if (touches) { flush(); return (uint64_t)touches(); }
  struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}
// without the shim, what a call of gdrshim_lookup is compared with: a call that answers at once
static int no_lookup(uint64_t va, uint64_t len, struct gdrshim_backing *out) { (void)va; (void)len; (void)out; return -ENOSYS; }
// without the shim, what an export is compared with: the fake driver's part of one (a dup)
static int stand_in_buffer = -1;
static int no_export(uint64_t va, uint64_t len) {
  (void)va; (void)len;
  if (stand_in_buffer < 0) stand_in_buffer = memfd_create("nv_dmabuf", MFD_CLOEXEC);
  return fcntl(stand_in_buffer, F_DUPFD_CLOEXEC, 0);
}
static int cmp(const void *a, const void *b) { uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b; return (x > y) - (x < y); }
static void report(uint64_t n, const char *op, uint64_t *t, int k) {
  qsort(t, (size_t)k, sizeof *t, cmp);
  printf("scale N=%lu op=%s p50=%lu%s p99=%lu%s\n", (unsigned long)n, op, (unsigned long)t[k / 2], touches ? "" : "ns", (unsigned long)t[k * 99 / 100], touches ? " touches" : "ns");
}
static uint64_t rnd(uint64_t *s) { *s ^= *s << 13; *s ^= *s >> 7; *s ^= *s << 17; return *s; }

int main(int argc, char **argv) {
  if (argc < 3) return 2;
  int heap_only = !strcmp(argv[1], "heap"), export_only = !strcmp(argv[1], "export");
  int (*export_dmabuf)(uint64_t, uint64_t) = (int (*)(uint64_t, uint64_t))dlsym(RTLD_DEFAULT, "gdrshim_export_dmabuf");
  if (!export_dmabuf) export_dmabuf = no_export;
  if (!strcmp(argv[1], "touch") && !(touches = (int64_t (*)(void))dlsym(RTLD_DEFAULT, "gdrshim_test_touches")))
    die("touch mode needs a knobs build of the shim", 0);
  int (*lookup)(uint64_t, uint64_t, struct gdrshim_backing *) = (int (*)(uint64_t, uint64_t, struct gdrshim_backing *))dlsym(RTLD_DEFAULT, "gdrshim_lookup");
  if (!lookup) lookup = no_lookup;
  const char *d = getenv("GDRSHIM_TEST_DEV_DIR"); char p[4096];
  snprintf(p, sizeof p, "%s/nvidiactl", d); ctl = open(p, O_RDWR | O_CLOEXEC);
  snprintf(p, sizeof p, "%s/nvidia-uvm", d); uvm = open(p, O_RDWR | O_CLOEXEC);
  if (ctl < 0 || uvm < 0) die("no fake driver", 0);
  client = rm_alloc(0, 0x41, NULL, 0);
  uint8_t dp[56] = {0}; dev = rm_alloc(client, 0x80, dp, sizeof dp);
  uint32_t sp = 0; sub = rm_alloc(dev, 0x2080, &sp, 4);
  uint8_t vp[56] = {0}; vas = rm_alloc(dev, 0x90f1, vp, sizeof vp);
  uint8_t r[32] = {0}; memcpy(r, uuid, 16); memcpy(r + 16, &ctl, 4); memcpy(r + 20, &client, 4); memcpy(r + 24, &vas, 4); uvm_call(25, r);
  void *vh = dlopen("libibverbs.so.1", RTLD_NOW | RTLD_GLOBAL);
  if (!vh) die("no libibverbs.so.1", 0);
  vreg = (reg_t)dlvsym(vh, "ibv_reg_mr", "IBVERBS_1.1"); vdereg = (dereg_t)dlvsym(vh, "ibv_dereg_mr", "IBVERBS_1.1");
  int samples = heap_only ? 0 : atoi(argv[2]);
  int first = heap_only ? 2 : 3;
  uint64_t maxn = 0; for (int a = first; a < argc; a++) if ((uint64_t)atol(argv[a]) > maxn) maxn = (uint64_t)atol(argv[a]);
  handles = calloc(maxn + (uint64_t)samples + 1, sizeof *handles);
  uint64_t *t = calloc((size_t)samples + 1, sizeof *t), *t2 = calloc((size_t)samples + 1, sizeof *t2);
  void **held = calloc(100000, sizeof *held);
  host = aligned_alloc(4096, 1 << 20); memset(host, 1, 1 << 20);
  uint64_t live = 0, seed = 0x9e3779b97f4a7c15ull;
  for (int a = first; a < argc; a++) {
    uint64_t n = (uint64_t)atol(argv[a]);
    while (live < n) alloc_one(live++);
    if (heap_only) {
      struct mallinfo2 mi = mallinfo2();
      printf("scale N=%lu heap=%luB\n", (unsigned long)n, (unsigned long)(mi.uordblks + mi.hblkhd));
      continue;
    }
    if (export_only) {
      for (int s = 0; s < samples; s++) {
        uint64_t i = rnd(&seed) % n;
        uint64_t t0 = now(); int fd = export_dmabuf(BASE + i * SEG, SEG); t[s] = now() - t0;
        if (fd < 0) die("export refused", (unsigned long)-fd);
        close(fd);
      }
      report(n, "export_dmabuf", t, samples);
      continue;
    }
    for (int s = 0; s < samples; s++) { uint64_t t0 = now(); alloc_one(n); uint64_t t1 = now(); free_one(n); t2[s] = now() - t1; t[s] = t1 - t0; }
    report(n, "alloc", t, samples); report(n, "free", t2, samples);
    for (int s = 0; s < samples; s++) {
      uint64_t i = rnd(&seed) % n, off = (rnd(&seed) % 31) << 16;
      uint64_t t0 = now(); void *mr = vreg(0, (void *)(uintptr_t)(BASE + i * SEG + off), 1 << 16, 0xf); uint64_t t1 = now();
      if (!mr) die("GPU MR refused", i);
      vdereg(mr); t2[s] = now() - t1; t[s] = t1 - t0;
    }
    report(n, "reg_gpu", t, samples); report(n, "dereg_gpu", t2, samples);
    for (int s = 0; s < samples; s++) {
      // the same memory again and again: what the path costs with its data in the cache
      uint64_t t0 = now(); void *mr = vreg(0, (void *)(uintptr_t)(BASE + (n / 2) * SEG), 1 << 16, 0xf); uint64_t t1 = now();
      if (!mr) die("GPU MR refused", n / 2);
      vdereg(mr); t[s] = t1 - t0;
    }
    report(n, "reg_gpu_again", t, samples);
    for (int s = 0; s < samples; s++) {
      uint64_t t0 = now(); void *mr = vreg(0, host + ((rnd(&seed) % 15) << 16), 1 << 16, 0xf); uint64_t t1 = now();
      if (!mr) die("host MR refused", 0);
      vdereg(mr); t2[s] = now() - t1; t[s] = t1 - t0;
    }
    report(n, "reg_host", t, samples); report(n, "dereg_host", t2, samples);
    for (int s = 0; s < samples; s++) { uint64_t t0 = now(); t[s] = now() - t0; }
    if (touches) report(n, "flush", t, samples);
    for (int s = 0; s < samples; s++) {
      uint64_t i = rnd(&seed) % n, off = (rnd(&seed) % 31) << 16; struct gdrshim_backing b = {.struct_version = GDRSHIM_QUERY_ABI};
      uint64_t t0 = now(); int rc = lookup(BASE + i * SEG + off, 1 << 16, &b); t[s] = now() - t0;
      if (rc != 0 && lookup != no_lookup) die("gdrshim_lookup missed", i);
    }
    report(n, "gdrshim_lookup", t, samples);
    // of every other allocation, so that the registrations timed beside them are new ones
    uint64_t regs = n / 2 < 100000 ? n / 2 : 100000;
    for (uint64_t i = 0; i < regs; i++) if (!(held[i] = vreg(0, (void *)(uintptr_t)(BASE + 2 * i * SEG), 1 << 16, 0xf))) die("GPU MR refused", i);
    // an allocation and its free while registrations are live: both ask whether the call
    // releases or maps over registered memory, which the map must be up to date to answer
    for (int s = 0; s < samples; s++) { uint64_t t0 = now(); alloc_one(n); uint64_t t1 = now(); free_one(n); t[s] = now() - t1; t2[s] = t1 - t0; }
    char op[64]; snprintf(op, sizeof op, "free_with_%lu_regs", (unsigned long)regs); report(n, op, t, samples);
    snprintf(op, sizeof op, "alloc_with_%lu_regs", (unsigned long)regs); report(n, op, t2, samples);
    // new registrations beside them, of the allocations in between
    for (int s = 0; s < samples; s++) {
      uint64_t i = 2 * (rnd(&seed) % (n / 2)) + 1, off = (rnd(&seed) % 31) << 16;
      uint64_t t0 = now(); void *mr = vreg(0, (void *)(uintptr_t)(BASE + i * SEG + off), 1 << 16, 0xf); uint64_t t1 = now();
      if (!mr) die("GPU MR refused", i);
      vdereg(mr); t2[s] = now() - t1; t[s] = t1 - t0;
    }
    snprintf(op, sizeof op, "reg_gpu_with_%lu_regs", (unsigned long)regs); report(n, op, t, samples);
    snprintf(op, sizeof op, "dereg_gpu_with_%lu_regs", (unsigned long)regs); report(n, op, t2, samples);
    for (uint64_t i = 0; i < regs; i++) vdereg(held[i]);
  }
  return 0;
}
