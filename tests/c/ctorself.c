// A library whose constructor (run by dlopen, which holds the loader's lock) makes the process's
// first NVIDIA call itself, on $FIRSTTOUCH_CTL (issue 29; ours): the front's wait for the loader's
// lock must not wait for this thread's own.
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/ioctl.h>

static int result = -1;

__attribute__((constructor)) static void start(void) {
  const char *ctl = getenv("FIRSTTOUCH_CTL");
  int fd = ctl ? open(ctl, O_RDWR) : -1;
  uint32_t a[12] = {0, 0, 0, 0x41};
  result = fd >= 0 && ioctl(fd, 0xC0000000u | (48u << 16) | (0x46u << 8) | 0x2b, a) == 0 && a[10] == 0;
}

int ctorthread_result(void) { return result; }
