// Do no harm to the fd table, under the real libgdrshim.so on the fake machine (ours). Each mode
// prints "fdharm MODE ok ..." and exits 0, or names what went wrong and exits 1:
//   fdharm vfork       an MR keeps a dma-buf; a vfork child runs CPython's closes before its exec
//                      (close_range(3, 3), close_range(5, ~0U), dup2 over the kept fd, closefrom):
//                      a child forked afterwards holds no dma-buf, and the dereg and free close it
//   fdharm unshare     the same with a thread's close_range(3, ~0U, CLOSE_RANGE_UNSHARE)
//   fdharm failed      close_range with bad flags, dup2(bad, kept) and dup2(kept, kept) fail or
//                      change nothing: the kept dma-buf is still gdrshim's (closed at the dereg)
//   fdharm range-race  one thread closes /dev/null fds of its own with close_range(f, f, 0) while
//                      others register and deregister: no dma-buf is left open at the end
//   fdharm window      one thread closes every number from the first free one up
//                      (close_range(lo, 511)) and opens a file of its own, while others register:
//                      gdrshim never takes, uses or closes the program's file
//   fdharm use         one thread closes gdrshim's numbers (close_range(lo, 511), dup2 of
//                      /dev/null onto each) and makes files of its own (memfds, its own opens
//                      of nvidia0) while others register, some over a buffer an MR keeps (the
//                      reuse of a kept dma-buf): the NIC is only ever handed the fake driver's
//                      buffers of the right memory, and no export is asked on a file of the
//                      program's
//   fdharm forklog     a prepare handler of the program's, installed before gdrshim's (so run
//                      after it, while gdrshim holds its fd lock for the fork), waits for another
//                      thread to have gdrshim log a line (a registration that misses): the line
//                      must not wait for the fork (a thread inside libcuda may hold what another
//                      fork handler waits for)
#include "rig.h"
#include <linux/close_range.h>

static int dmabufs_below_512(void) {
  char p[64], t[256]; int n = 0;
  for (int fd = 0; fd < 512; fd++) {
    snprintf(p, sizeof p, "/proc/self/fd/%d", fd);
    ssize_t k = readlink(p, t, sizeof t - 1);
    if (k <= 0) continue;
    t[k] = 0;
    n += strstr(t, "memfd:nv_dmabuf") != NULL;
  }
  return n;
}

// A child forked now: how many dma-bufs it holds (-1: no answer).
static int forked_child_dmabufs(void) {
  pid_t pid = fork();
  if (pid == 0) _exit(dmabufs_below_512());
  int st = 0;
  if (pid < 0 || waitpid(pid, &st, 0) != pid || !WIFEXITED(st)) return -1;
  return WEXITSTATUS(st);
}

// An MR keeping a dma-buf, `between` run, then the checks: a forked child holds none, and the
// dereg and free leave none open in the parent.
static int kept_across(const char *mode, void (*between)(int kept)) {
  uint32_t h = gpu_alloc(0, BASE, 64 * K64);
  struct ibv_mr *m = must_reg(vreg, BASE, 64 * K64, "an MR");
  int kept = -1; char p[64], t[256];
  for (int fd = 0; fd < 512 && kept < 0; fd++) {
    snprintf(p, sizeof p, "/proc/self/fd/%d", fd);
    ssize_t k = readlink(p, t, sizeof t - 1);
    if (k > 0 && (t[k] = 0, strstr(t, "memfd:nv_dmabuf"))) kept = fd;
  }
  if (kept < 0) { fprintf(stderr, "no kept dma-buf\n"); return 2; }
  between(kept);
  int child = forked_child_dmabufs();
  if (child != 0) fail("a child forked afterwards holds dma-bufs", child, kept);
  if (m && vdereg(m)) fail("dereg", kept, errno);
  gpu_free(0, BASE, 64 * K64, h);
  int left = dmabufs_below_512();
  if (left) fail("dma-bufs left open after the dereg and free", left, kept);
  printf("fdharm %s %s kept=%d child=%d left=%d\n", mode, failures ? "FAILED" : "ok", kept, child, left);
  return failures != 0;
}

static void vfork_children(int kept) {
  for (int how = 0; how < 3; how++) {
    pid_t pid = vfork();
    if (pid == 0) {
      if (how == 0) { // CPython's _posixsubprocess
        close_range(3, 3, 0);
        close_range(5, ~0U, 0);
      } else if (how == 1) {
        int nul = open("/dev/null", O_RDONLY);
        dup2(nul, kept);
      } else {
        closefrom(3);
      }
      char *argv[] = {"/bin/true", NULL};
      execv("/bin/true", argv);
      _exit(127);
    }
    int st = 0;
    if (pid < 0 || waitpid(pid, &st, 0) != pid || !WIFEXITED(st) || WEXITSTATUS(st)) fail("the vfork child", how, st);
  }
}

static void *unsharing(void *arg) {
  (void)arg;
  if (close_range(3, ~0U, CLOSE_RANGE_UNSHARE)) fail("close_range unshare", 0, errno);
  return NULL;
}
static void unshare_thread(int kept) {
  (void)kept;
  pthread_t t;
  pthread_create(&t, NULL, unsharing, NULL);
  pthread_join(t, NULL);
}

static void failing_calls(int kept) {
  errno = 0;
  if (close_range(kept, kept, 0x40000000) == 0 || errno != EINVAL) fail("close_range with a bad flag", kept, errno);
  if (dup2(10000, kept) != -1 || errno != EBADF) fail("dup2 from a bad fd", kept, errno);
  if (dup2(kept, kept) != kept) fail("dup2 onto itself", kept, errno);
  if (close_range(kept, kept, CLOSE_RANGE_CLOEXEC)) fail("close_range cloexec", kept, errno);
}

static volatile int stop;
static void *reg_loop(void *arg) {
  uint64_t at = BASE + (uint64_t)(uintptr_t)arg * 16 * K64;
  while (!stop) {
    struct ibv_mr *m = vreg(rig_pd, (void *)(uintptr_t)at, K64, 0xf);
    if (m) vdereg(m);
  }
  return NULL;
}

static int lo; // the first number free after setup
static long checks, lost;
static void *closer(void *arg) {
  int range = arg != NULL;
  while (!stop) {
    if (range) {
      // every number from lo up, gdrshim's fds among them, then a file of the program's own
      close_range(lo, 511, 0);
      int f = memfd_create("program-file", MFD_CLOEXEC);
      if (f < 0) continue;
      if (write(f, "mine", 4) != 4) fail("write", f, errno);
      for (int i = 0; i < 50; i++) sched_yield();
      char b[8] = {0}; char p[64], t[256];
      snprintf(p, sizeof p, "/proc/self/fd/%d", f);
      ssize_t k = readlink(p, t, sizeof t - 1);
      checks++;
      if (k <= 0 || (t[k] = 0, !strstr(t, "program-file")) || pread(f, b, 4, 0) != 4 || strcmp(b, "mine")) lost++;
    } else {
      int f = open("/dev/null", O_RDONLY | O_CLOEXEC);
      if (f >= 0) close_range(f, f, 0);
    }
  }
  return NULL;
}

static int race(const char *mode, int range, int seconds) {
  for (int i = 1; i <= 3; i++) gpu_alloc(0, BASE + (uint64_t)i * 16 * K64, K64);
  lo = open("/dev/null", O_RDONLY); close(lo);
  pthread_t t[4];
  pthread_create(&t[0], NULL, closer, range ? (void *)1 : NULL);
  for (int i = 1; i <= 3; i++) pthread_create(&t[i], NULL, reg_loop, (void *)(uintptr_t)i);
  sleep(seconds);
  stop = 1;
  for (int i = 0; i < 4; i++) pthread_join(t[i], NULL);
  int left = dmabufs_below_512();
  if (left) fail("dma-bufs left open with no MR", left, 0);
  if (lost) fail("the program's own file was taken by gdrshim", lost, checks);
  printf("fdharm %s %s left=%d lost=%ld checks=%ld\n", mode, failures ? "FAILED" : "ok", left, lost, checks);
  return failures != 0;
}

static int nul; // the program's /dev/null, below lo
static long mrs_made;
static void *reg_many(void *arg) {
  uint64_t at = BASE + (uint64_t)(uintptr_t)arg * 16 * K64;
  while (!stop) {
    struct ibv_mr *m = vreg(rig_pd, (void *)(uintptr_t)at, K64, 0xf);
    if (m) { __atomic_add_fetch(&mrs_made, m->lkey == 9, __ATOMIC_RELAXED); vdereg(m); }
  }
  return NULL;
}
static void *takes_numbers(void *arg) {
  (void)arg;
  char node[4096]; snprintf(node, sizeof node, "%s/nvidia0", getenv("GDRSHIM_TEST_DEV_DIR"));
  for (long round = 0; !stop; round++) {
    // gdrshim's kept dma-bufs and its nvidia0 fd among them
    if (round % 2 == 0) close_range(lo, 511, 0);
    else for (int n = lo; n < lo + 24; n++) dup2(nul, n);
    for (int i = 0; i < 8; i++) {
      // the program's own files take the numbers freed (its own node marked O_NONBLOCK)
      if (i % 4 == 3) open(node, O_RDWR | O_NONBLOCK | O_CLOEXEC);
      else memfd_create("program-file", MFD_CLOEXEC);
    }
    for (int i = 0; i < 50; i++) sched_yield();
  }
  return NULL;
}

static unsigned long count_of(const char *name) {
  unsigned long *c = (unsigned long *)dlsym(RTLD_DEFAULT, name);
  if (!c) { fprintf(stderr, "no %s in the fakes\n", name); exit(2); }
  return __atomic_load_n(c, __ATOMIC_RELAXED);
}

static int use_race(int seconds) {
  for (int i = 1; i <= 3; i++) gpu_alloc(0, BASE + (uint64_t)i * 16 * K64, K64);
  nul = open("/dev/null", O_RDONLY | O_CLOEXEC);
  lo = open("/dev/null", O_RDONLY); close(lo);
  // MRs that keep the buffers of two of the ranges (the others' registrations reuse them); they
  // and gdrshim's nvidia0 fd take numbers from lo up
  struct ibv_mr *kept[2];
  for (int i = 0; i < 2; i++) kept[i] = must_reg(vreg, BASE + (uint64_t)(i + 1) * 16 * K64, K64, "a kept MR");
  pthread_t t[4];
  pthread_create(&t[0], NULL, takes_numbers, NULL);
  for (int i = 1; i <= 3; i++) pthread_create(&t[i], NULL, reg_many, (void *)(uintptr_t)i);
  sleep(seconds);
  stop = 1;
  for (int i = 0; i < 4; i++) pthread_join(t[i], NULL);
  for (int i = 0; i < 2; i++) if (kept[i] && vdereg(kept[i])) fail("dereg", i, errno);
  unsigned long foreign = count_of("fakeverbs_dmabuf_foreign"), wrong = count_of("fakeverbs_dmabuf_wrong");
  unsigned long elsewhere = count_of("fakenv_escapes_elsewhere"), on_program = count_of("fakenv_exports_on_program_nodes");
  if (foreign) fail("the NIC was handed a file of the program's for gdrshim's buffer", (long)foreign, 0);
  if (wrong) fail("the NIC was handed a buffer of other memory", (long)wrong, 0);
  if (elsewhere) fail("an NVIDIA escape was issued on a file of the program's", (long)elsewhere, 0);
  if (on_program) fail("an export was asked on the program's own GPU node", (long)on_program, 0);
  if (mrs_made < 100) fail("too few dma-buf MRs to judge", mrs_made, 0);
  int left = dmabufs_below_512();
  if (left) fail("dma-bufs left open with no MR", left, 0);
  printf("fdharm use %s mrs=%ld foreign=%lu wrong=%lu elsewhere=%lu on_program_nodes=%lu left=%d\n",
         failures ? "FAILED" : "ok", mrs_made, foreign, wrong, elsewhere, on_program, left);
  return failures != 0;
}

static volatile int forklog_armed, forklog_in_prepare, forklog_logged, forklog_logged_in_prepare;
static void forklog_prepare(void) {
  if (!forklog_armed) return;
  forklog_in_prepare = 1;
  for (int i = 0; i < 5000 && !forklog_logged; i++) usleep(1000);
  forklog_logged_in_prepare = forklog_logged;
}
static void *forklog_logger(void *arg) {
  (void)arg;
  while (!forklog_in_prepare) usleep(100);
  must_miss(BASE, 2 * 64 * K64, 0xf, "a registration past its allocation");
  forklog_logged = 1;
  return NULL;
}
static int forklog(void) {
  uint32_t h = gpu_alloc(0, BASE, 64 * K64);
  pthread_t t;
  pthread_create(&t, NULL, forklog_logger, NULL);
  forklog_armed = 1;
  struct timespec a, b;
  clock_gettime(CLOCK_MONOTONIC, &a);
  pid_t pid = fork();
  if (pid == 0) _exit(0);
  clock_gettime(CLOCK_MONOTONIC, &b);
  int st = 0;
  if (pid < 0 || waitpid(pid, &st, 0) != pid) fail("fork", pid, errno);
  forklog_armed = 0;
  pthread_join(t, NULL);
  if (!forklog_logged_in_prepare) fail("the logging thread waited for the fork", 0, 0);
  gpu_free(0, BASE, 64 * K64, h);
  double ms = (b.tv_sec - a.tv_sec) * 1e3 + (b.tv_nsec - a.tv_nsec) / 1e6;
  printf("fdharm forklog %s logged_in_prepare=%d fork_ms=%.0f\n", failures ? "FAILED" : "ok",
         forklog_logged_in_prepare, ms);
  return failures != 0;
}

int main(int argc, char **argv) {
  if (argc < 2) { fprintf(stderr, "usage: fdharm MODE [SECONDS]\n"); return 2; }
  // before gdrshim starts (setup's first driver call): the program's handler runs after gdrshim's
  if (!strcmp(argv[1], "forklog")) pthread_atfork(forklog_prepare, NULL, NULL);
  setup();
  const char *mode = argv[1];
  int seconds = argc > 2 ? atoi(argv[2]) : 2;
  if (!strcmp(mode, "vfork")) return kept_across(mode, vfork_children);
  if (!strcmp(mode, "unshare")) return kept_across(mode, unshare_thread);
  if (!strcmp(mode, "failed")) return kept_across(mode, failing_calls);
  if (!strcmp(mode, "range-race")) return race(mode, 0, seconds);
  if (!strcmp(mode, "window")) return race(mode, 1, seconds);
  if (!strcmp(mode, "use")) return use_race(seconds);
  if (!strcmp(mode, "forklog")) return forklog();
  fprintf(stderr, "fdharm: unknown mode %s\n", mode);
  return 2;
}
