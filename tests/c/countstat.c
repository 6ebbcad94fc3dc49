// Counts fstat-family calls per fd (ours), for tests/asleep.rs: preloaded after the shim, so the
// shim's own fstat reaches it. fds from 2^20 up are counted together in the last slot. Also counts
// the mmap calls made from libgdrshim.so's own code (the fd table's pages).
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#define SLOTS (1 << 20)
static long counts[SLOTS];
static void count(int fd) { if (fd >= 0) __atomic_add_fetch(&counts[fd < SLOTS ? fd : SLOTS - 1], 1, __ATOMIC_RELAXED); }
long countstat_of(int fd) { return fd >= 0 && fd < SLOTS ? counts[fd] : -1; }
#define NEXT(fn) static __typeof__(&fn) real; if (!real) real = (__typeof__(&fn))dlsym(RTLD_NEXT, #fn)
int fstat(int fd, struct stat *st) { NEXT(fstat); count(fd); return real(fd, st); }
int fstat64(int fd, struct stat64 *st) { NEXT(fstat64); count(fd); return real(fd, st); }
int __fxstat(int v, int fd, struct stat *st) { NEXT(__fxstat); count(fd); return real(v, fd, st); }
int __fxstat64(int v, int fd, struct stat64 *st) { NEXT(__fxstat64); count(fd); return real(v, fd, st); }
int fstatat(int fd, const char *p, struct stat *st, int fl) { NEXT(fstatat); if (!*p) count(fd); return real(fd, p, st, fl); }
int fstatat64(int fd, const char *p, struct stat64 *st, int fl) { NEXT(fstatat64); if (!*p) count(fd); return real(fd, p, st, fl); }
int statx(int fd, const char *p, int fl, unsigned int mask, struct statx *st) { NEXT(statx); if (!*p) count(fd); return real(fd, p, fl, mask, st); }
static long shim_maps;
long countstat_shim_maps(void) { return shim_maps; }
void *mmap(void *addr, size_t len, int prot, int flags, int fd, off_t off) {
  NEXT(mmap);
  Dl_info i;
  if (dladdr(__builtin_return_address(0), &i) && i.dli_fname && strstr(i.dli_fname, "libgdrshim")) __atomic_add_fetch(&shim_maps, 1, __ATOMIC_RELAXED);
  return real(addr, len, prot, flags, fd, off);
}
