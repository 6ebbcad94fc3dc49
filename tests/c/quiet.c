// What a process that never touches a GPU does under gdrshim (ours): ioctls on a pipe, a socket,
// /dev/null, an fd above 4096 and the highest one RLIMIT_NOFILE allows, dup/close, a child that does the same. Prints its thread
// count and how many fstat calls (counted by countstat.c, preloaded after the shim) each fd got.
// Each line ends with core=1 when the front (src/front) has loaded libgdrshim-core.so by then.
//   quiet plain          no NVIDIA node is touched
//   quiet nvidia DEVDIR  the fake driver's nvidiactl, moved to fd 5000, gets 1000 ioctls
//   quiet files          opens, dups, reads and closes files, no ioctl: prints how many mappings
//                        the shim made (none: a file opened by its path needs no fd table)
//   quiet query          gdrshim's own queries (gdrshim_mode, _gdr_active, _gdr_route, _counters,
//                        _lookup) through dlsym, as a launcher or tool asks them: prints their
//                        answers (unknown=: the counters' fields that read all ones)
//   quiet errno          a dup2 to fd 5000 that works while the fd table cannot map its directory
//                        (RLIMIT_AS): prints the dup2's result and errno (0: the shim kept it)
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

static int threads(void) {
  FILE *f = fopen("/proc/self/status", "r"); char line[256]; int n = -1;
  while (f && fgets(line, sizeof line, f)) if (!strncmp(line, "Threads:", 8)) n = atoi(line + 8);
  if (f) fclose(f);
  return n;
}

// whether libgdrshim-core.so is mapped in this process
static int core_loaded(void) {
  FILE *f = fopen("/proc/self/maps", "r"); char line[4096]; int n = 0;
  while (f && fgets(line, sizeof line, f)) n |= strstr(line, "/libgdrshim-core.so") != NULL;
  if (f) fclose(f);
  return n;
}

int main(int argc, char **argv) {
  long (*stats_of)(int) = (long (*)(int))dlsym(RTLD_DEFAULT, "countstat_of");
  if (!stats_of || argc < 2) { fprintf(stderr, "quiet: countstat.c not preloaded\n"); return 2; }
  // the highest fd this process may have, for an fd on a page of the fd table of its own
  struct rlimit r; getrlimit(RLIMIT_NOFILE, &r);
  if (r.rlim_max > 1 << 20) r.rlim_max = 1 << 20;
  r.rlim_cur = r.rlim_max; setrlimit(RLIMIT_NOFILE, &r);
  int top_fd = (int)r.rlim_cur - 1;
  int v, p[2];
  if (!strcmp(argv[1], "files")) {
    long (*shim_maps)(void) = (long (*)(void))dlsym(RTLD_DEFAULT, "countstat_shim_maps");
    char buf[256]; long got = 0;
    for (int i = 0; i < 100; i++) {
      int f = open("/proc/self/cmdline", O_RDONLY | O_CLOEXEC), g = dup(f), h = dup2(f, 6000);
      got += read(g, buf, sizeof buf) > 0;
      close(f); close(g); close(h);
    }
    printf("quiet files reads=%ld shim_maps=%ld\n", got, shim_maps ? shim_maps() : -1);
    return 0;
  }
  if (!strcmp(argv[1], "query")) {
    int (*mode)(void) = (int (*)(void))dlsym(RTLD_DEFAULT, "gdrshim_mode");
    int (*active)(void) = (int (*)(void))dlsym(RTLD_DEFAULT, "gdrshim_gdr_active");
    int (*route)(void) = (int (*)(void))dlsym(RTLD_DEFAULT, "gdrshim_gdr_route");
    int (*counters)(void *, size_t) = (int (*)(void *, size_t))dlsym(RTLD_DEFAULT, "gdrshim_counters");
    int (*lookup)(uint64_t, uint64_t, void *) = (int (*)(uint64_t, uint64_t, void *))dlsym(RTLD_DEFAULT, "gdrshim_lookup");
    if (!mode || !active || !route || !counters || !lookup) { fprintf(stderr, "quiet: gdrshim's queries not found\n"); return 2; }
    uint64_t c[32], b[8];
    memset(c, 0x55, sizeof c);
    errno = 1234;
    int m = mode(), a = active(), r = route(), n = counters(c, sizeof c), l = lookup(0x7f0000000000ull, 4096, b);
    int kept = errno == 1234;
    char unknown[128] = "-", *u = unknown;
    for (int i = 0; n > 0 && i < n / 8; i++)
      if (c[i] == UINT64_MAX) u += snprintf(u, unknown + sizeof unknown - u, "%s%d", u == unknown ? "" : ",", i);
      else if (c[i] != 0) u += snprintf(u, unknown + sizeof unknown - u, "%sbad%d", u == unknown ? "" : ",", i);
    printf("quiet query mode=%d active=%d route=%d counters=%d lookup=%d errno_kept=%d threads=%d core=%d unknown=%s\n", m, a, r, n, l,
           kept, threads(), core_loaded(), unknown);
    return 0;
  }
  if (pipe(p)) return 2;
  if (!strcmp(argv[1], "errno")) {
    for (int i = 0; i < 10; i++) ioctl(p[0], FIONREAD, &v); // the pipe's byte: known, not NVIDIA
    FILE *f = fopen("/proc/self/status", "r"); char line[256]; long vm_kb = 0;
    while (f && fgets(line, sizeof line, f)) if (!strncmp(line, "VmSize:", 7)) vm_kb = atol(line + 7);
    if (f) fclose(f);
    struct rlimit as = {(rlim_t)(vm_kb + 512) * 1024, (rlim_t)(vm_kb + 512) * 1024};
    if (!vm_kb || setrlimit(RLIMIT_AS, &as)) return 2;
    errno = 0;
    int d = dup2(p[0], 5000);
    int e = errno;
    printf("quiet errno dup2=%d errno=%d\n", d, e);
    return 0;
  }
  if (!strcmp(argv[1], "nvidia") && argc > 2) {
    char path[4096]; snprintf(path, sizeof path, "%s/nvidiactl", argv[2]);
    int ctl = open(path, O_RDWR | O_CLOEXEC);
    if (ctl < 0 || dup2(ctl, 5000) != 5000) return 2;
    close(ctl);
    uint32_t c[8] = {0}; // an RM_ALLOC of a client: the fake driver answers it
    int ok = 0, kept = 0;
    for (int i = 0; i < 1000; i++) {
      uint32_t a[12] = {0, 0, 0, 0x41}; (void)c;
      errno = 1234; // a call that works leaves errno as it was, the first (which wakes the shim) too
      ok += ioctl(5000, 0xC0000000u | (48u << 16) | (0x46u << 8) | 0x2b, a) == 0 && a[10] == 0;
      kept += errno == 1234;
    }
    printf("quiet nvidia ok=%d stat_5000=%ld core=%d errno_kept=%d\n", ok, stats_of(5000), core_loaded(), kept);
    return 0;
  }
  for (int i = 0; i < 1000; i++) ioctl(p[0], FIONREAD, &v);
  int s = socket(AF_UNIX, SOCK_STREAM, 0);
  for (int i = 0; i < 1000; i++) ioctl(s, FIONREAD, &v);
  int n = open("/dev/null", O_RDWR);
  for (int i = 0; i < 1000; i++) ioctl(n, FIONREAD, &v);
  // fds first seen above the first page of the table (not copies of known ones)
  int fresh = open("/dev/null", O_RDWR);
  int hi = dup2(fresh, 5000), top = top_fd > 5000 ? dup2(fresh, top_fd) : -1;
  close(fresh);
  for (int i = 0; i < 1000; i++) { ioctl(hi, FIONREAD, &v); if (top > 0) ioctl(top, FIONREAD, &v); }
  int d = dup(s); close(d);
  pid_t child = fork();
  if (child == 0) { ioctl(p[0], FIONREAD, &v); _exit(0); }
  int st = 0; waitpid(child, &st, 0);
  void *sym = dlsym(RTLD_DEFAULT, "printf"); // a lookup of a name the core does not wrap
  printf("quiet plain threads=%d stat_pipe=%ld stat_socket=%ld stat_null=%ld stat_5000=%ld stat_top=%ld top=%d core=%d\n", threads(),
         stats_of(p[0]), stats_of(s), stats_of(n), stats_of(5000), top > 0 ? stats_of(top) : -1, top, sym ? core_loaded() : -1);
  return 0;
}
