// Benchmark (not a test): cuMemAlloc/cuMemFree loops and an ioctl loop on a non-NVIDIA fd.
// Run once without and once with the shim; the driver script computes the ratios.
#include "common.h"
#include <cuda_runtime.h>
#include <fcntl.h>
#include <sys/ioctl.h>
#include <termios.h>
#include <time.h>
#include <unistd.h>
#include <string.h>

static double median(double *v, int n) {
  for (int i = 1; i < n; i++) for (int j = i; j > 0 && v[j] < v[j - 1]; j--) { double t = v[j]; v[j] = v[j - 1]; v[j - 1] = t; }
  return v[n / 2];
}
static double now() { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }

// bench alloc SIZE ITERS: one alloc/free loop, 9 batches of ITERS/9, the median ns per iteration.
// bench alloc-ab SIZE ITERS PAIRS: the loop with and without the shim in one process (below).
// bench ioctl N: the /dev/null ioctl loop alone. (No arguments: every loop, as before.)
static int one(int argc, char **argv) {
  if (!strcmp(argv[1], "alloc") && argc > 3) {
    CKRT(cudaFree(0));
    size_t size = strtoull(argv[2], 0, 0); int iters = atoi(argv[3]);
    CUdeviceptr p; double b[9];
    for (int i = 0; i < 50; i++) { CK(cuMemAlloc(&p, size)); CK(cuMemFree(p)); }
    for (int j = 0; j < 9; j++) {
      double t0 = now();
      for (int i = 0; i < iters / 9; i++) { CK(cuMemAlloc(&p, size)); CK(cuMemFree(p)); }
      b[j] = (now() - t0) * 1e9 / (iters / 9);
    }
    printf("bench alloc_free size=%zu ns_per_iter=%.1f\n", size, median(b, 9));
    return 0;
  }
  if (!strcmp(argv[1], "alloc-ab") && argc > 4) {
    // PAIRS pairs of ITERS-iteration batches in one process, one with the shim working and one
    // with it paused (gdrshim_bench_pause: GDRSHIM_BENCH_PAUSE=1, shadow mode), the order
    // alternating pair by pair (on off, off on, ...) against drift: one line per pair.
    int (*pause)(int) = (int (*)(int))dlsym(RTLD_DEFAULT, "gdrshim_bench_pause");
    if (!pause) { fprintf(stderr, "bench alloc-ab: the shim is not loaded\n"); return 2; }
    CKRT(cudaFree(0));
    size_t size = strtoull(argv[2], 0, 0); int iters = atoi(argv[3]), pairs = atoi(argv[4]);
    CUdeviceptr p;
    for (int i = 0; i < 200; i++) { CK(cuMemAlloc(&p, size)); CK(cuMemFree(p)); }
    int rc = pause(1);
    if (rc) { fprintf(stderr, "bench alloc-ab: gdrshim_bench_pause refused (%d)\n", rc); return 2; }
    pause(0);
    for (int k = 0; k < pairs; k++) {
      double ns[2];
      for (int half = 0; half < 2; half++) {
        int paused = half ^ (k & 1);
        if (paused) pause(1);
        double t0 = now();
        for (int i = 0; i < iters; i++) { CK(cuMemAlloc(&p, size)); CK(cuMemFree(p)); }
        ns[paused] = (now() - t0) * 1e9 / iters;
        if (paused) pause(0);
      }
      printf("bench alloc_ab size=%zu pair=%d on=%.1f off=%.1f\n", size, k, ns[0], ns[1]);
    }
    return 0;
  }
  if (!strcmp(argv[1], "ioctl") && argc > 2) {
    int fd = open("/dev/null", O_RDWR), n = atoi(argv[2]); struct termios t; double b[9];
    for (int i = 0; i < 10000; i++) ioctl(fd, TCGETS, &t);
    for (int j = 0; j < 9; j++) { double t0 = now(); for (int i = 0; i < n; i++) ioctl(fd, TCGETS, &t); b[j] = (now() - t0) * 1e9 / n; }
    printf("bench ioctl_devnull ns_per_call=%.2f\n", median(b, 9));
    return 0;
  }
  fprintf(stderr, "usage: bench [alloc SIZE ITERS | alloc-ab SIZE ITERS PAIRS | ioctl N]\n");
  return 2;
}

int main(int argc, char **argv) {
  if (argc > 1) return one(argc, argv);
  CKRT(cudaFree(0));
  size_t sizes[] = {4096, 2 << 20, 64 << 20};
  int iters[] = {20000, 2000, 1000};
  for (int k = 0; k < 3; k++) {
    CUdeviceptr p;
    for (int i = 0; i < 50; i++) { CK(cuMemAlloc(&p, sizes[k])); CK(cuMemFree(p)); }
    double b[9];
    for (int j = 0; j < 9; j++) {
      double t0 = now();
      for (int i = 0; i < iters[k] / 9; i++) { CK(cuMemAlloc(&p, sizes[k])); CK(cuMemFree(p)); }
      b[j] = (now() - t0) * 1e9 / (iters[k] / 9);
    }
    printf("bench alloc_free size=%zu ns_per_iter=%.1f\n", sizes[k], median(b, 9));
  }
  int fd = open("/dev/null", O_RDWR);
  struct termios t;
  for (int i = 0; i < 10000; i++) ioctl(fd, TCGETS, &t);
  const int N = 300000;
  double b[9];
  for (int j = 0; j < 9; j++) {
    double t0 = now();
    for (int i = 0; i < N; i++) ioctl(fd, TCGETS, &t);
    b[j] = (now() - t0) * 1e9 / N;
  }
  printf("bench ioctl_devnull ns_per_call=%.2f\n", median(b, 9));
  return 0;
}
