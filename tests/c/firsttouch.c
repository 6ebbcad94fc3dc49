// The process's first GPU touch in awkward places (issue 29; ours). Preload: the shim, then
// libparkdup.so (for "straddle"), then the fake driver (fakerm.c). Each scenario prints one line
// with seen=N: the NVIDIA ioctls the shim's core counted (gdrshim_counters' nv_ioctls).
//   firsttouch fortify DEVDIR   nvidiactl opened by each fortified open (__open_2, __open64_2,
//                               __openat_2, __openat64_2) on a number the shim knew as
//                               /dev/null, closed behind its back; 10 RM calls on each
//   firsttouch cancel DEVDIR    a thread with a deferred cancellation pending makes the first
//                               NVIDIA call (no cancellation point), then pthread_testcancel
//   firsttouch straddle DEVDIR  a dup2(nvidiactl, 100) held inside libc (libparkdup.so) while
//                               the core is loaded and looks at fd 100 (/dev/null then); then
//                               10 RM calls on fd 100
//   firsttouch batch DEVDIR LIB a thread makes 511 RM calls (each one event of the shim's batch
//                               of 512); dlopen(LIB), whose constructor has that thread make
//                               the 512th and then makes one itself (ctorbatch.c)
//   firsttouch open DEVDIR      opens nvidiactl and makes no call on it
//   firsttouch plain DEVDIR     10 RM calls on nvidiactl
// Before the scenario, with FIRSTTOUCH_CHDIR set, the process changes folder; with
// FIRSTTOUCH_RELINK=LINK and FIRSTTOUCH_RELINK_TO=TARGET, it points the symlink LINK at TARGET
// (a deploy's switch of `current` between the process's start and its first GPU touch).
//   firsttouch ctor DEVDIR LIB  dlopen(LIB), whose constructor starts a thread that makes the
//                               process's first NVIDIA call and joins it (ctorthread.c)
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <semaphore.h>
#include <sys/syscall.h>
#include <unistd.h>

extern int __open_2(const char *, int);
extern int __open64_2(const char *, int);
extern int __openat_2(int, const char *, int);
extern int __openat64_2(int, const char *, int);

static char ctl[4096];

// an RM_ALLOC of a client: the fake driver answers it
static int rm_call(int fd) {
  uint32_t a[12] = {0, 0, 0, 0x41};
  return ioctl(fd, 0xC0000000u | (48u << 16) | (0x46u << 8) | 0x2b, a) == 0 && a[10] == 0;
}

static long seen(void) {
  uint64_t c[16] = {0};
  int (*counters)(void *, size_t) = (int (*)(void *, size_t))dlsym(RTLD_DEFAULT, "gdrshim_counters");
  if (!counters || counters(c, sizeof c) < 0) return -1;
  return (long)c[0];
}

// a number the shim's fd table knows as a pipe's (a dup2 of one it classified), closed without
// telling it
static int known_not_nvidia(void) {
  int v, p[2], n = open("/dev/null", O_RDWR);
  if (pipe(p)) exit(2);
  ioctl(p[0], FIONREAD, &v);
  dup2(p[0], n);
  close(p[0]); close(p[1]);
  syscall(SYS_close, n);
  return n;
}

static void *canceller(void *p) {
  int *reached = p, fd = open(ctl, O_RDWR);
  pthread_cancel(pthread_self()); // deferred: acted on at the next cancellation point
  *reached = 1 + rm_call(fd);     // ioctl is none; the shim's start-up must not be one either
  pthread_testcancel();
  *reached = 100;
  return NULL;
}

static int ctl_fd;
static void *dup_to_100(void *p) {
  (void)p;
  return (void *)(intptr_t)dup2(ctl_fd, 100);
}

// "batch": the thread that fills the batch, and the constructor's kick
static sem_t batch_ready, batch_go;
static int batch_tid, batch_done, batch_ok;
static void *batch_filler(void *p) {
  (void)p;
  int fd = open(ctl, O_RDWR);
  __atomic_store_n(&batch_tid, (int)syscall(SYS_gettid), __ATOMIC_SEQ_CST);
  for (int i = 0; i < 511; i++) batch_ok += rm_call(fd);
  sem_post(&batch_ready);
  while (sem_wait(&batch_go)) {}
  batch_ok += rm_call(fd); // the 512th: the shim starts its helper thread here
  __atomic_store_n(&batch_done, 1, __ATOMIC_SEQ_CST);
  return NULL;
}
// this thread's state letter in /proc ('S': asleep, here: blocked)
static char state_of(int tid) {
  char p[64], b[512]; snprintf(p, sizeof p, "/proc/self/task/%d/stat", tid);
  FILE *f = fopen(p, "r"); size_t n = f ? fread(b, 1, sizeof b - 1, f) : 0;
  if (f) fclose(f);
  b[n] = 0;
  char *c = strrchr(b, ')');
  return c && c[1] == ' ' ? c[2] : '?';
}
void firsttouch_batch_kick(void) {
  sem_post(&batch_go);
  // until the filler finished its call or waits inside it (for the loader's lock the constructor
  // holds, when the shim starts its helper thread there)
  while (!__atomic_load_n(&batch_done, __ATOMIC_SEQ_CST) && state_of(batch_tid) != 'S') sched_yield();
}

int main(int argc, char **argv) {
  if (argc < 3) return 2;
  snprintf(ctl, sizeof ctl, "%s/nvidiactl", argv[2]);
  const char *link = getenv("FIRSTTOUCH_RELINK"), *to = getenv("FIRSTTOUCH_RELINK_TO"), *dir = getenv("FIRSTTOUCH_CHDIR");
  if (link && to) {
    char tmp[4096]; snprintf(tmp, sizeof tmp, "%s.new", link);
    unlink(tmp);
    if (symlink(to, tmp) || rename(tmp, link)) return 4;
  }
  if (dir && chdir(dir)) return 4;
  if (!strcmp(argv[1], "open")) {
    int fd = open(ctl, O_RDWR);
    printf("open fd_ok=%d\n", fd >= 0);
    return 0;
  }
  if (!strcmp(argv[1], "plain")) {
    int fd = open(ctl, O_RDWR), ok = 0;
    for (int i = 0; i < 10; i++) ok += rm_call(fd);
    printf("plain driver=%d seen=%ld\n", ok, seen());
    return 0;
  }
  if (!strcmp(argv[1], "fortify")) {
    int ok = 0, same = 0;
    for (int k = 0; k < 4; k++) {
      int n = known_not_nvidia(), fd = -1;
      if (k == 0) fd = __open_2(ctl, O_RDWR);
      if (k == 1) fd = __open64_2(ctl, O_RDWR);
      if (k == 2) fd = __openat_2(AT_FDCWD, ctl, O_RDWR);
      if (k == 3) fd = __openat64_2(AT_FDCWD, ctl, O_RDWR);
      same += fd == n;
      for (int i = 0; i < 10; i++) ok += rm_call(fd);
      close(fd);
    }
    printf("fortify same_number=%d driver=%d seen=%ld\n", same, ok, seen());
    return 0;
  }
  if (!strcmp(argv[1], "cancel")) {
    pthread_t t; void *ret = NULL; int reached = 0;
    pthread_create(&t, NULL, canceller, &reached);
    pthread_join(t, &ret);
    int fd = open(ctl, O_RDWR);
    int ok = rm_call(fd);
    printf("cancel cancelled=%d reached=%d after=%d seen=%ld\n", ret == PTHREAD_CANCELED, reached, ok, seen());
    return 0;
  }
  if (!strcmp(argv[1], "straddle")) {
    void (*arm)(void) = (void (*)(void))dlsym(RTLD_DEFAULT, "parkdup_arm");
    void (*wait_parked)(void) = (void (*)(void))dlsym(RTLD_DEFAULT, "parkdup_wait_parked");
    void (*go)(void) = (void (*)(void))dlsym(RTLD_DEFAULT, "parkdup_go");
    if (!arm || !wait_parked || !go) { fprintf(stderr, "firsttouch: libparkdup.so not preloaded\n"); return 2; }
    int v, nul = open("/dev/null", O_RDWR);
    if (dup2(nul, 100) != 100) return 2;
    ctl_fd = open(ctl, O_RDWR);
    pthread_t t; void *r;
    arm(); // the next dup2 waits inside libc's place until go
    pthread_create(&t, NULL, dup_to_100, NULL);
    wait_parked();
    int first = rm_call(ctl_fd);       // the first GPU touch: the core is loaded now
    ioctl(100, FIONREAD, &v);          // and looks at fd 100, /dev/null still
    go();
    pthread_join(t, &r);
    if ((intptr_t)r != 100) return 3;
    long before = seen();
    int ok = 0;
    for (int i = 0; i < 10; i++) ok += rm_call(100);
    printf("straddle first=%d driver=%d seen=%ld\n", first, ok, seen() - before);
    return 0;
  }
  if (!strcmp(argv[1], "batch") && argc > 3) {
    setenv("FIRSTTOUCH_CTL", ctl, 1);
    sem_init(&batch_ready, 0, 0); sem_init(&batch_go, 0, 0);
    pthread_t t;
    pthread_create(&t, NULL, batch_filler, NULL);
    while (sem_wait(&batch_ready)) {}
    void *h = dlopen(argv[3], RTLD_NOW);
    int (*result)(void) = h ? (int (*)(void))dlsym(h, "ctorbatch_result") : NULL;
    long (*took)(void) = h ? (long (*)(void))dlsym(h, "ctorbatch_took_ms") : NULL;
    pthread_join(t, NULL);
    long ms = took ? took() : -1;
    printf("batch filler=%d ctor=%d ctor_fast=%d seen=%ld\n", batch_ok, result ? result() : -1, ms >= 0 && ms < 2000, seen());
    return 0;
  }
  if (!strcmp(argv[1], "ctor") && argc > 3) {
    setenv("FIRSTTOUCH_CTL", ctl, 1);
    void *h = dlopen(argv[3], RTLD_NOW);
    int (*result)(void) = h ? (int (*)(void))dlsym(h, "ctorthread_result") : NULL;
    printf("ctor loaded=%d result=%d seen=%ld\n", h != NULL, result ? result() : -1, seen());
    return 0;
  }
  return 2;
}
