// The process's first NVIDIA call from a signal handler that interrupted malloc (issue 29; ours):
// main opens nvidiactl, then loops on malloc/free while a timer's SIGALRM handler makes the first
// RM call. Prints "sigfirst ok=1" when the handler's call worked and the process went on.
#define _GNU_SOURCE
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/time.h>
#include <unistd.h>

static int ctl = -1;
static volatile sig_atomic_t done, ok;

static void on_alarm(int sig) {
  (void)sig;
  if (done) return;
  uint32_t a[12] = {0, 0, 0, 0x41};
  ok = ioctl(ctl, 0xC0000000u | (48u << 16) | (0x46u << 8) | 0x2b, a) == 0 && a[10] == 0;
  done = 1;
}

int main(int argc, char **argv) {
  if (argc < 2) return 2;
  char path[4096]; snprintf(path, sizeof path, "%s/nvidiactl", argv[1]);
  ctl = open(path, O_RDWR);
  if (ctl < 0) return 2;
  signal(SIGALRM, on_alarm);
  struct itimerval t = {{0, 200}, {0, 200}};
  setitimer(ITIMER_REAL, &t, NULL);
  volatile char *keep[64] = {0};
  for (unsigned long i = 0; !done; i++) {
    unsigned k = i % 64;
    free((void *)keep[k]);
    keep[k] = malloc(16 + (i * 37) % 4000);
    if (keep[k]) keep[k][0] = 1;
  }
  struct itimerval off = {{0, 0}, {0, 0}};
  setitimer(ITIMER_REAL, &off, NULL);
  printf("sigfirst ok=%d\n", (int)ok);
  return 0;
}
