// Counts and times the system calls a registration makes (ours; issue 30's first-registration
// figure), preloaded last: libcuda's ioctls, gdrshim's own (its real ioctl is the next definition
// after it: this one), its fstat64 identity checks, the stub NIC's /proc reads and dup, closes.
// Only while syscount_on is set (bar1_figures sets it around one registration at a time).
// syscount_report(prefix, n) prints "PREFIX class=calls/ns ..." per registration and clears the
// counts; syscount_ns(class, &calls) reads one class, syscount_clear clears.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

int syscount_on;
enum { IOCTL, CLOSE, FSTAT, OPEN, READ, FCNTL, WRITE, NCLASS };
static const char *names[NCLASS] = {"ioctl", "close", "fstat", "open", "read", "fcntl", "write"};
static unsigned long calls[NCLASS], ns[NCLASS];
static uint64_t now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return (uint64_t)t.tv_sec * 1000000000u + t.tv_nsec; }
#define NEXT(fn) static __typeof__(&fn) real; if (!real) real = (__typeof__(&fn))dlsym(RTLD_NEXT, #fn)
#define TIMED(cls, call) do { if (!__atomic_load_n(&syscount_on, __ATOMIC_RELAXED)) return call; \
  uint64_t t0 = now(); __typeof__(call) r_ = call; ns[cls] += now() - t0; calls[cls]++; return r_; } while (0)

int ioctl(int fd, unsigned long req, ...) { va_list a; va_start(a, req); void *arg = va_arg(a, void *); va_end(a); NEXT(ioctl); TIMED(IOCTL, real(fd, req, arg)); }
int close(int fd) { NEXT(close); TIMED(CLOSE, real(fd)); }
int fstat(int fd, struct stat *st) { NEXT(fstat); TIMED(FSTAT, real(fd, st)); }
int fstat64(int fd, struct stat64 *st) { NEXT(fstat64); TIMED(FSTAT, real(fd, st)); }
int open(const char *p, int fl, ...) { va_list a; va_start(a, fl); int m = va_arg(a, int); va_end(a); NEXT(open); TIMED(OPEN, real(p, fl, m)); }
int open64(const char *p, int fl, ...) { va_list a; va_start(a, fl); int m = va_arg(a, int); va_end(a); NEXT(open64); TIMED(OPEN, real(p, fl, m)); }
int openat(int d, const char *p, int fl, ...) { va_list a; va_start(a, fl); int m = va_arg(a, int); va_end(a); NEXT(openat); TIMED(OPEN, real(d, p, fl, m)); }
ssize_t read(int fd, void *b, size_t n) { NEXT(read); TIMED(READ, real(fd, b, n)); }
ssize_t write(int fd, const void *b, size_t n) { NEXT(write); TIMED(WRITE, real(fd, b, n)); }
int fcntl(int fd, int cmd, ...) { va_list a; va_start(a, cmd); long x = va_arg(a, long); va_end(a); NEXT(fcntl); TIMED(FCNTL, real(fd, cmd, x)); }
int fcntl64(int fd, int cmd, ...) { va_list a; va_start(a, cmd); long x = va_arg(a, long); va_end(a); NEXT(fcntl64); TIMED(FCNTL, real(fd, cmd, x)); }

// The calls and ns of class cls since the last syscount_clear (cls: 0 ioctl, 1 close, 2 fstat, ...).
unsigned long syscount_ns(int cls, unsigned long *ncalls) { if (ncalls) *ncalls = calls[cls]; return ns[cls]; }
void syscount_clear(void) { memset(calls, 0, sizeof calls); memset(ns, 0, sizeof ns); }

// n registrations were counted: per registration, calls and ns of each class that occurred
void syscount_report(const char *prefix, int n) {
  char line[512]; int k = snprintf(line, sizeof line, "%s", prefix);
  unsigned long all_calls = 0, all_ns = 0;
  for (int i = 0; i < NCLASS; i++) {
    if (calls[i]) k += snprintf(line + k, sizeof line - k, " %s=%.1f/%luns", names[i], (double)calls[i] / n, ns[i] / n);
    all_calls += calls[i]; all_ns += ns[i];
  }
  snprintf(line + k, sizeof line - k, " all=%.1f/%luns\n", (double)all_calls / n, all_ns / n);
  memset(calls, 0, sizeof calls); memset(ns, 0, sizeof ns);
  fputs(line, stdout);
}
