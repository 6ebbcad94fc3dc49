// The smallest useful LD_PRELOAD library (ours): an ioctl wrapper that forwards. The start-up
// benchmark's yardstick for what any preload costs a process.
#define _GNU_SOURCE
#include <dlfcn.h>
int ioctl(int fd, unsigned long req, void *arg) {
  static int (*real)(int, unsigned long, void *);
  if (!real) real = (int (*)(int, unsigned long, void *))dlsym(RTLD_NEXT, "ioctl");
  return real(fd, req, arg);
}
