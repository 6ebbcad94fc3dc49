// A library whose constructor (run by dlopen, which holds the loader's lock) makes an NVIDIA call
// just after another thread filled the 512th event of the shim's batch, which starts the shim's
// helper thread (issue 29; ours). firsttouch's "batch" scenario loads it: the constructor calls
// firsttouch_batch_kick() (exported by the program) to have that thread make its call and to wait
// until the thread has finished or is blocked, then makes its own call.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/ioctl.h>
#include <time.h>
#include <unistd.h>

static int result = -1;
static long took_ms = -1;

__attribute__((constructor)) static void start(void) {
  void (*kick)(void) = (void (*)(void))dlsym(RTLD_DEFAULT, "firsttouch_batch_kick");
  const char *ctl = getenv("FIRSTTOUCH_CTL");
  if (!kick || !ctl) return;
  int fd = open(ctl, O_RDWR);
  kick();
  struct timespec a, b;
  clock_gettime(CLOCK_MONOTONIC, &a);
  uint32_t w[12] = {0, 0, 0, 0x41};
  result = fd >= 0 && ioctl(fd, 0xC0000000u | (48u << 16) | (0x46u << 8) | 0x2b, w) == 0 && w[10] == 0;
  clock_gettime(CLOCK_MONOTONIC, &b);
  took_ms = (b.tv_sec - a.tv_sec) * 1000 + (b.tv_nsec - a.tv_nsec) / 1000000;
}

int ctorbatch_result(void) { return result; }
long ctorbatch_took_ms(void) { return took_ms; }
