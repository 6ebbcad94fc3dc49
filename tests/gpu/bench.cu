// Benchmark (not a test): cuMemAlloc/cuMemFree loops and an ioctl loop on a non-NVIDIA fd.
// Run once without and once with the shim; the driver script computes the ratios.
#include "common.h"
#include <cuda_runtime.h>
#include <fcntl.h>
#include <sys/ioctl.h>
#include <termios.h>
#include <time.h>
#include <unistd.h>

static double now() { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }

int main() {
  CKRT(cudaFree(0));
  size_t sizes[] = {4096, 2 << 20, 64 << 20};
  int iters[] = {20000, 2000, 1000};
  for (int k = 0; k < 3; k++) {
    CUdeviceptr p;
    for (int i = 0; i < 50; i++) { CK(cuMemAlloc(&p, sizes[k])); CK(cuMemFree(p)); }
    double t0 = now();
    for (int i = 0; i < iters[k]; i++) { CK(cuMemAlloc(&p, sizes[k])); CK(cuMemFree(p)); }
    printf("bench alloc_free size=%zu ns_per_iter=%.1f\n", sizes[k], (now() - t0) * 1e9 / iters[k]);
  }
  int fd = open("/dev/null", O_RDWR);
  struct termios t;
  for (int i = 0; i < 10000; i++) ioctl(fd, TCGETS, &t);
  const int N = 2000000;
  double t0 = now();
  for (int i = 0; i < N; i++) ioctl(fd, TCGETS, &t);
  printf("bench ioctl_devnull ns_per_call=%.2f\n", (now() - t0) * 1e9 / N);
  return 0;
}
