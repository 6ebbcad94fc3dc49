// The cuMemAlloc/cuMemFree loop of the H200 benchmark, without a GPU (ours): per iteration the
// NVIDIA calls libcuda issued there for one allocation (RM_ALLOC of the memory, its native
// REGISTER_VIDMEM, UVM_CREATE_EXTERNAL_RANGE, UVM_MAP_EXTERNAL_ALLOCATION; then UNREGISTER_VIDMEM,
// UVM_FREE, RM_FREE) against the live fake driver, and cuMemAlloc/cuMemFree through a fake
// libcuda's cuGetProcAddress, as cudart reaches them. Prints ns per iteration (median of 9).
// With "ab": 10 batches that alternate between the shim working and the shim paused
// (gdrshim_bench_pause; GDRSHIM_BENCH_PAUSE=1, shadow mode), and the ratio of their medians.
//   allocbench FAKE_LIBCUDA ITERS [ab]
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <time.h>
#include <unistd.h>
#define NV_IOCTL(nr, size) (0xC0000000u | ((size) << 16) | (0x46u << 8) | (nr))
static int ctl, uvm; static uint32_t client, dev, sub, vas, p2p;
static uint32_t rm_alloc(uint32_t parent, uint32_t cls, void *params, uint32_t psize) {
  uint32_t a[12] = {client, parent, 0, cls}; uint64_t p = (uintptr_t)params; memcpy(&a[4], &p, 8); a[8] = psize;
  if (cls == 0x41) a[0] = a[1] = 0;
  if (ioctl(ctl, NV_IOCTL(0x2b, 48), a) || a[10]) { fprintf(stderr, "RM_ALLOC %#x: %#x\n", cls, a[10]); exit(1); }
  return a[2];
}
static void control(uint32_t cmd, void *p, uint32_t n) {
  uint32_t a[8] = {client, p2p, cmd, 0}; uint64_t pp = (uintptr_t)p; memcpy(&a[4], &pp, 8); a[6] = n;
  if (ioctl(ctl, NV_IOCTL(0x2a, 32), a) || a[7]) { fprintf(stderr, "control %#x: %#x\n", cmd, a[7]); exit(1); }
}
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
static int cmp(const void *a, const void *b) { double x = *(const double *)a, y = *(const double *)b; return (x > y) - (x < y); }
int main(int argc, char **argv) {
  const char *d = getenv("GDRSHIM_TEST_DEV_DIR"); char p[4096];
  snprintf(p, sizeof p, "%s/nvidiactl", d); ctl = open(p, O_RDWR);
  snprintf(p, sizeof p, "%s/nvidia-uvm", d); uvm = open(p, O_RDWR);
  uint8_t (*uuid)[16] = (uint8_t (*)[16])dlsym(RTLD_DEFAULT, "fakerm_uuid");
  void *cu = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  int (*gpa)(const char *, void **, int, uint64_t, int *) = (int (*)(const char *, void **, int, uint64_t, int *))dlsym(cu, "cuGetProcAddress_v2");
  void (*set_next)(uint64_t) = (void (*)(uint64_t))dlsym(cu, "fakecuda_set_next");
  int (*alloc)(uint64_t *, size_t) = NULL; int (*release)(uint64_t) = NULL; int st;
  gpa("cuMemAlloc", (void **)&alloc, 13000, 0, &st); gpa("cuMemFree", (void **)&release, 13000, 0, &st);
  int iters = atoi(argv[2]);
  client = rm_alloc(0, 0x41, NULL, 0);
  uint8_t dp[56] = {0}; dev = rm_alloc(client, 0x80, dp, sizeof dp);
  uint32_t sp = 0; sub = rm_alloc(dev, 0x2080, &sp, 4);
  uint8_t vp[56] = {0}; vas = rm_alloc(dev, 0x90f1, vp, sizeof vp);
  uint8_t r[32] = {0}; memcpy(r, uuid[0], 16); memcpy(r + 16, &ctl, 4); memcpy(r + 20, &client, 4); memcpy(r + 24, &vas, 4); ioctl(uvm, 25, r);
  uint32_t pf = 1; p2p = rm_alloc(sub, 0x503c, &pf, 4); // libcuda's own 503C, as on the H200
  uint64_t rv[2] = {vas, 0}; control(0x503c0102, rv, 16);
  static uint8_t m[9264]; uint64_t base = 0x7f0000000000ull, size = 2 << 20, zero = 0, one = 1;
  int ab = argc > 3 && !strcmp(argv[3], "ab");
  int (*pause)(int) = ab ? (int (*)(int))dlsym(RTLD_DEFAULT, "gdrshim_bench_pause") : NULL;
  if (ab && !pause) { fprintf(stderr, "allocbench: no gdrshim_bench_pause (shim not loaded)\n"); return 2; }
  double v[10], on[5], off[5]; int pause_rc = 0;
  for (int rep = -1; rep < (ab ? 10 : 9); rep++) {
    // ab: the order within each pair of batches alternates (on off, off on, ...) against drift
    int paused = ab && rep >= 0 && ((rep & 1) ^ ((rep >> 1) & 1));
    if (paused && (pause_rc = pause(1)) != 0) break;
    double t0 = now();
    for (int i = 0; i < iters; i++) {
      uint8_t mp[128] = {0}; memcpy(mp + 64, &size, 8);
      uint32_t h = rm_alloc(dev, 0x40, mp, sizeof mp);
      uint64_t reg[4] = {h, base, size, 0}; control(0x503c0104, reg, 32);
      uint64_t cr[3] = {base, size, 0}; ioctl(uvm, 73, cr);
      memcpy(m, &base, 8); memcpy(m + 8, &size, 8); memcpy(m + 16, &zero, 8); memcpy(m + 24, uuid[0], 16);
      memcpy(m + 9240, &one, 8); memcpy(m + 9248, &ctl, 4); memcpy(m + 9252, &client, 4); memcpy(m + 9256, &h, 4);
      ioctl(uvm, 33, m);
      uint64_t dptr; set_next(base); alloc(&dptr, size);
      release(dptr);
      uint32_t un[1] = {h}; control(0x503c0105, un, 4);
      uint64_t fr[3] = {base, size, 0}; ioctl(uvm, 34, fr);
      uint32_t f[4] = {client, dev, h, 0}; ioctl(ctl, NV_IOCTL(0x29, 16), f);
    }
    double ns = (now() - t0) * 1e9 / iters;
    if (paused) pause(0);
    if (rep < 0) continue;
    if (!ab) v[rep] = ns;
    else if (paused) off[rep / 2] = ns;
    else on[rep / 2] = ns;
  }
  if (ab) {
    if (pause_rc) { printf("allocbench ab pause_rc=%d\n", pause_rc); return 0; }
    qsort(on, 5, sizeof *on, cmp); qsort(off, 5, sizeof *off, cmp);
    printf("allocbench ab shim_ns_per_iter=%.1f paused_ns_per_iter=%.1f ratio=%.4f\n", on[2], off[2], on[2] / off[2]);
    return 0;
  }
  qsort(v, 9, sizeof *v, cmp);
  printf("allocbench ns_per_iter=%.1f\n", v[4]);
  return 0;
}
