// Do no harm, under the real libgdrshim.so with the live fake driver and NIC (ours). Each mode
// is one sequence a program may run; each names what must hold, prints "harm MODE ok ..." and
// exits 0, or names what went wrong and exits 1:
//   harm closed HOW    DMA-BUF route: the program closes gdrshim's kept dma-buf fd (HOW: close,
//                      close_range, closefrom, dup2 over it) and has a file of its own at that
//                      number; the MR's dereg, the memory's free and a new MR of the same memory
//                      leave that file alone, and the new MR gets a new export
//   harm gpunode       the same with gdrshim's /dev/nvidia0 fd: the next export opens its own
//   harm logfile       the same with GDRSHIM_LOG_FILE's fd: no line of gdrshim's reaches the
//                      program's file (they go to stderr, said once)
//   harm fork          a child forked while an MR lives holds none of gdrshim's fds, and every
//                      other fd of the parent's; the parent's dereg and free release the buffer
//   harm stale-free    a 4 KiB allocation carved from CUDA's 2 MiB chunk; the chunk's memory freed
//                      by RM with no UVM unmap; CUDA's own memory mapped there: no MR or export
//   harm stale-gpus    the chunk mapped on two GPUs, unmapped from one, CUDA's memory mapped on it,
//                      then unmapped from the other: no MR or export
//   harm ctx MODE      allocations of each GPU's primary context and of an unknown context, then
//                      a context's end (library: a library's own context created, allocated in,
//                      destroyed; reset; release: GPU 0's primary context released by its last
//                      holder; release-held: by one of two holders, which ends nothing): what the
//                      ended context held is refused, every other context's memory registered
//   harm dereg-queued  (with GDRSHIM_TEST_DEREG_QUEUED=1: every dereg begins as when the core's
//                      lock is not had in time) an MR's dereg is settled by the lock's next
//                      holder: its buffer stays open until then, and closes then
//   harm fork-race     threads register (never while a fork runs) and deregister (at any time)
//                      MRs; a child forked while gdrshim closes a kept dma-buf fd for a dereg
//                      holds no dma-buf below 512 (the kernel copies the fd table before the
//                      memory: a number closed in between was open in the child, unmarked)
//   harm fork-export   the same with the registrations not kept out of the forks: a child forked
//                      while gdrshim exports for an MR (the driver made the fd, gdrshim has not
//                      yet taken it as its own) holds no dma-buf either (fails today)
//   harm nv503c-miss   NV503C route with nvidia-peermem: one MR over an allocation registers the
//                      whole 2 MiB mapping with RM; an MR over the same mapping's bytes that no
//                      allocation owns fails with EFAULT and never reaches the NIC's driver
#include "rig.h"
#include <dirent.h>

#define MB2 0x200000ull

// The lowest fd below 512 whose link names `needle` (the fake NIC keeps its own references at
// 512 and up, as the kernel keeps its own): -1 if none.
// (the open numbers from the fd folder: a forked child's check costs a few calls, not 512)
static int fd_named(const char *needle) {
  char p[300], t[512];
  int found = -1;
  DIR *d = opendir("/proc/self/fd");
  if (!d) return -1;
  for (struct dirent *e; (e = readdir(d));) {
    int fd = atoi(e->d_name);
    if (e->d_name[0] < '0' || e->d_name[0] > '9' || fd >= 512 || (found >= 0 && fd > found)) continue;
    snprintf(p, sizeof p, "/proc/self/fd/%s", e->d_name);
    ssize_t k = readlink(p, t, sizeof t - 1);
    if (k <= 0) continue;
    t[k] = 0;
    if (strstr(t, needle)) found = fd;
  }
  closedir(d);
  return found;
}

// A file of the program's own, at exactly `fd` (opened, and moved there where the lowest free
// number was another), holding `text`.
static void own_file_at(int fd, const char *text) {
  int mine = memfd_create("program-file", MFD_CLOEXEC);
  if (mine != fd) {
    if (dup2(mine, fd) != fd) fail("dup2 of the program's file", fd, errno);
    close(mine);
  }
  if (write(fd, text, strlen(text)) != (ssize_t)strlen(text)) fail("write to the program's file", fd, errno);
}

// Whether `fd` is still the program's file with exactly `text` in it.
static void still_own_file(int fd, const char *text, const char *what) {
  char buf[256] = {0};
  ssize_t n = pread(fd, buf, sizeof buf - 1, 0);
  if (n < 0) fail(what, fd, errno);
  else if (strcmp(buf, text)) { fprintf(stderr, "the program's file holds: %s\n", buf); fail(what, fd, n); }
}

static int closed(const char *how) {
  unsigned long *exports = (unsigned long *)dlsym(RTLD_DEFAULT, "fakenv_exports");
  uint32_t h = gpu_alloc(0, BASE, 64 * K64);
  struct ibv_mr *m = must_reg(vreg, BASE, 64 * K64, "first MR");
  int k = fd_named("memfd:nv_dmabuf");
  if (k < 0) { fprintf(stderr, "no kept dma-buf fd\n"); return 2; }
  if (!strcmp(how, "close")) close(k);
  else if (!strcmp(how, "close_range")) { if (close_range(k, k, 0)) fail("close_range", k, errno); }
  else if (!strcmp(how, "closefrom")) closefrom(k);
  else if (!strcmp(how, "dup2")) { int nul = open("/dev/null", O_RDONLY); if (dup2(nul, k) != k) fail("dup2", k, errno); close(nul); }
  else { fprintf(stderr, "harm closed: close, close_range, closefrom or dup2\n"); return 2; }
  own_file_at(k, "the program's");
  if (m && vdereg(m)) fail("dereg", k, errno);
  still_own_file(k, "the program's", "after the dereg, the program's file at gdrshim's old number");
  unsigned long e0 = *exports;
  struct ibv_mr *again = must_reg(vreg, BASE, 64 * K64, "an MR of the same memory");
  if (*exports == e0) fail("the new MR used no new export", k, 0);
  gpu_free(0, BASE, 64 * K64, h);
  if (again && vdereg(again)) fail("dereg", k, errno);
  still_own_file(k, "the program's", "after the free, the program's file at gdrshim's old number");
  if (write(k, "!", 1) != 1) fail("the program writes its file", k, errno);
  printf("harm closed %s %s fd=%d new_exports=%lu\n", how, failures ? "FAILED" : "ok", k, *exports - e0);
  return failures != 0;
}

static int gpunode(void) {
  gpu_alloc(0, BASE, 64 * K64);
  struct ibv_mr *m = must_reg(vreg, BASE, 64 * K64, "first MR");
  if (m) vdereg(m);
  int g = fd_named("/nvidia0");
  if (g < 0) { fprintf(stderr, "no /dev/nvidia0 fd of gdrshim's\n"); return 2; }
  if (close_range(g, g, 0)) fail("close_range", g, errno);
  own_file_at(g, "the program's");
  m = must_reg(vreg, BASE, 64 * K64, "an MR after the program closed gdrshim's node");
  if (m) vdereg(m);
  still_own_file(g, "the program's", "the program's file at gdrshim's old node number");
  int again = fd_named("/nvidia0");
  printf("harm gpunode %s old=%d new=%d\n", failures ? "FAILED" : "ok", g, again);
  return failures != 0 || again < 0;
}

static int logfile(void) {
  gpu_alloc(0, BASE, 64 * K64);
  const char *path = getenv("GDRSHIM_LOG_FILE");
  int l = path ? fd_named(path) : -1;
  if (l < 0) { fprintf(stderr, "no log file fd\n"); return 2; }
  if (close_range(l, l, 0)) fail("close_range", l, errno);
  own_file_at(l, "the program's");
  must_miss(BASE + 60 * K64, 8 * K64, 0xf, "an MR past the allocation: a line of gdrshim's");
  struct ibv_mr *m = must_reg(vreg, BASE, 64 * K64, "an MR: more lines");
  if (m) vdereg(m);
  still_own_file(l, "the program's", "the program's file at the log's old number");
  printf("harm logfile %s fd=%d\n", failures ? "FAILED" : "ok", l);
  return failures != 0;
}

// The fds below 512 and what each is ("dmabuf" for a fake dma-buf), as one line.
static void fd_list(char *out, size_t size) {
  char p[64], t[256]; size_t at = 0;
  out[0] = 0;
  for (int fd = 0; fd < 512 && at < size; fd++) {
    snprintf(p, sizeof p, "/proc/self/fd/%d", fd);
    ssize_t k = readlink(p, t, sizeof t - 1);
    if (k <= 0) continue;
    t[k] = 0;
    at += snprintf(out + at, size - at, "%d=%s ", fd, strstr(t, "nv_dmabuf") ? "dmabuf" : strstr(t, "nvidia0") ? "node" : "file");
  }
}

static int forked(void) {
  uint32_t h = gpu_alloc(0, BASE, 64 * K64);
  struct ibv_mr *m = must_reg(vreg, BASE, 64 * K64, "an MR");
  int go[2], back[2];
  if (pipe(go) || pipe(back)) return 2;
  char parent[4096], child[4096];
  fd_list(parent, sizeof parent);
  pid_t pid = fork();
  if (pid == 0) {
    char b;
    if (read(go[0], &b, 1) != 1) _exit(3);
    fd_list(child, sizeof child);
    ssize_t n = write(back[1], child, strlen(child) + 1);
    _exit(n > 0 ? 0 : 4);
  }
  if (m && vdereg(m)) fail("dereg", 0, errno);
  gpu_free(0, BASE, 64 * K64, h);
  if (write(go[1], "g", 1) != 1) fail("pipe", 0, errno);
  ssize_t n = read(back[0], child, sizeof child - 1);
  int st = 0;
  waitpid(pid, &st, 0);
  if (n <= 0) { fprintf(stderr, "no answer from the child\n"); return 2; }
  child[n] = 0;
  // the child's fds: the parent's at the fork, less gdrshim's own (its dma-buf and node)
  char want[4096] = {0}, *save = NULL;
  for (char *tok = strtok_r(parent, " ", &save); tok; tok = strtok_r(NULL, " ", &save))
    if (!strstr(tok, "=dmabuf") && !strstr(tok, "=node")) { strcat(want, tok); strcat(want, " "); }
  if (strcmp(want, child)) { fprintf(stderr, "child's fds: %s\nwanted:      %s\n", child, want); fail("the child's fds", 0, 0); }
  printf("harm fork %s child=[%s]\n", failures ? "FAILED" : "ok", child);
  return failures != 0;
}

// UVM_UNMAP_EXTERNAL of [base, base+len) on GPU g.
static void unmap_on(int g, uint64_t base, uint64_t len) {
  uint8_t a[40] = {0};
  memcpy(a, &base, 8); memcpy(a + 8, &len, 8); memcpy(a + 16, uuid[g], 16);
  uvm_call(66, a, 32);
}

// CUDA's 2 MiB chunk at BASE on the GPUs of `gpus` (a bit each), and a 4 KiB allocation of the
// program's carved from it (its record reaches the chunk's end, as libcuda counts it).
static uint32_t carved_chunk(int gpus, uint64_t at) {
  uint32_t h = alloc_mem(0, MB2);
  uint64_t r[3] = {at, MB2, 0};
  uvm_call(73, r, 16);
  cuda_internal = 1;
  for (int g = 0; g < 2; g++) if (gpus & (1 << g)) map(at, MB2, 0, g, h);
  cuda_internal = 0;
  program_owns(at, 0x1000);
  return h;
}

// CUDA's own memory mapped at [at, at+2 MiB) on GPU g.
static void cuda_memory_at(int g, uint64_t at) {
  uint32_t h = alloc_mem(g, MB2);
  cuda_internal = 1;
  map(at, MB2, 0, g, h);
  cuda_internal = 0;
}

// Nothing over [at, at+len) is registered or exported: every path refuses.
static void nothing_over(uint64_t at, uint64_t len, const char *what) {
  must_miss(at, len, 0xf, what);
  int fd = gdrshim_dl_export_dmabuf(at, len);
  if (fd >= 0) { close(fd); fail(what, at, fd); }
}

static int stale(const char *mode) {
  if (!strcmp(mode, "stale-free")) {
    uint32_t h = carved_chunk(1, BASE);
    must_reg_dereg(BASE, 0x1000, "the allocation, while it lives");
    rm_free(dev[0], h);
    cuda_memory_at(0, BASE);
  } else {
    carved_chunk(3, BASE);
    unmap_on(0, BASE, MB2);
    cuda_memory_at(0, BASE);
    unmap_on(1, BASE, MB2);
  }
  nothing_over(BASE, MB2, "the chunk: CUDA's memory now");
  nothing_over(BASE, 0x1000, "the old allocation's bytes: CUDA's memory now");
  printf("harm %s %s\n", mode, failures ? "FAILED" : "ok");
  return failures != 0;
}

// CUDA as the fake libcuda plays it (dlopened local, as cudart does), reached through gdrshim.
typedef int (*getproc_t)(const char *, void **, int, uint64_t, int *);
static int (*cu_alloc)(uint64_t *, size_t), (*cu_free)(uint64_t), (*set_current)(void *);
static void (*set_next)(uint64_t);
static int (*at_end)(void *, void (*)(void *), void *);

// An allocation as libcuda makes one in the current context: its memory on GPU g (a 2 MiB chunk
// at va, mapped on the other GPU too where `peer`), CUDA's own until cuMemAlloc hands the
// program [va, va+len) of it. The fake libcuda frees the chunk at context `ends_with`'s end (RM
// and UVM frees, as CUDA does); NULL: the program frees it.
typedef struct { uint64_t va; uint32_t h; int g; } chunk_t;
static chunk_t chunks[8];
static int nchunks;
static void chunk_ends(void *arg) { chunk_t *c = arg; gpu_free(c->g, c->va, MB2, c->h); }
// CUDA's own memory where a chunk was freed, in a range of its own.
static void cuda_memory_anew(int g, uint64_t at) {
  uint64_t r[3] = {at, MB2, 0};
  uvm_call(73, r, 16);
  cuda_memory_at(g, at);
}
static chunk_t *allocated(void *ends_with, int g, uint64_t va, uint64_t len, int peer) {
  chunk_t *c = &chunks[nchunks++];
  *c = (chunk_t){va, alloc_mem(g, MB2), g};
  uint64_t r[3] = {va, MB2, 0};
  uvm_call(73, r, 16);
  cuda_internal = 1;
  map(va, MB2, 0, g, c->h);
  if (peer) map(va, MB2, 0, 1 - g, c->h);
  cuda_internal = 0;
  uint64_t d = 0;
  set_next(va);
  if (cu_alloc(&d, len) || d != va) fail("cuMemAlloc", (long)va, (long)d);
  if (ends_with && at_end(ends_with, chunk_ends, c)) fail("fakecuda_at_end", (long)va, 0);
  return c;
}

// Each GPU's primary context holds an allocation (GPU 1's mapped on GPU 0 too), and one more is
// made where the hook cannot learn the context (none current). Then a context ends: a library's
// own (`library`: created, one allocation freed, one kept, destroyed), GPU 0's primary context
// (`reset`; `release` by its last holder), or nothing (`release-held`: one of two holders). What
// the ended context held is refused; every other context's allocation is registered; the one
// of an unknown context goes with any end on its GPU (fail safe).
static int ctx(const char *how) {
  void *lib = dlopen(getenv("FAKE_LIBCUDA"), RTLD_NOW | RTLD_LOCAL);
  getproc_t gp = lib ? (getproc_t)dlsym(lib, "cuGetProcAddress_v2") : NULL;
  if (!gp) { fprintf(stderr, "no fake libcuda\n"); return 2; }
  int (*retain)(void **, int) = NULL, (*release)(int) = NULL, (*reset)(int) = NULL, (*destroy)(void *) = NULL;
  int (*create)(void **, unsigned, int) = NULL;
  gp("cuDevicePrimaryCtxRetain", (void **)&retain, 12080, 0, NULL);
  gp("cuDevicePrimaryCtxRelease", (void **)&release, 12080, 0, NULL);
  gp("cuDevicePrimaryCtxReset", (void **)&reset, 12080, 0, NULL);
  gp("cuCtxDestroy", (void **)&destroy, 12080, 0, NULL);
  gp("cuCtxCreate", (void **)&create, 3020, 0, NULL);
  gp("cuCtxSetCurrent", (void **)&set_current, 12080, 0, NULL);
  gp("cuMemAlloc", (void **)&cu_alloc, 12080, 0, NULL);
  gp("cuMemFree", (void **)&cu_free, 12080, 0, NULL);
  set_next = (void (*)(uint64_t))dlsym(lib, "fakecuda_set_next");
  at_end = (int (*)(void *, void (*)(void *), void *))dlsym(lib, "fakecuda_at_end");
  if (!retain || !release || !reset || !destroy || !create || !set_current || !cu_alloc || !cu_free ||
      !set_next || !at_end) {
    fprintf(stderr, "context functions missing\n");
    return 2;
  }
  void *c0 = NULL, *c1 = NULL;
  retain(&c0, 0);
  retain(&c1, 1);
  if (!strcmp(how, "release-held")) retain(&c0, 0);
  const uint64_t own0 = BASE, own1 = BASE + 16 * MB2, unknown = BASE + 32 * MB2;
  set_current(c0);
  allocated(c0, 0, own0, 0x1000, 0);
  set_current(c1);
  allocated(c1, 1, own1, MB2, 1);
  set_current(NULL);
  allocated(NULL, 0, unknown, MB2, 0);
  set_current(c0);
  must_reg_dereg(own0, 0x1000, "GPU 0's primary context's allocation, while it lives");
  must_reg_dereg(own1, MB2, "GPU 1's, peer-mapped on GPU 0");
  must_reg_dereg(unknown, MB2, "an allocation of an unknown context");
  int rc = 0, ended0 = strcmp(how, "library") && strcmp(how, "release-held");
  if (!strcmp(how, "library")) {
    void *mine = NULL;
    const uint64_t kept = BASE + 48 * MB2, freed = BASE + 50 * MB2;
    rc = create(&mine, 0, 0);
    chunk_t *f = allocated(NULL, 0, freed, 0x1000, 0);
    allocated(mine, 0, kept, 0x1000, 0);
    must_reg_dereg(kept, 0x1000, "the library context's allocation, while it lives");
    if (cu_free(freed)) fail("cuMemFree", (long)freed, 0);
    gpu_free(0, freed, MB2, f->h);
    if (!rc) rc = destroy(mine);
    cuda_memory_anew(0, kept);
    nothing_over(kept, 0x1000, "the destroyed context's allocation it never freed");
  } else if (!strcmp(how, "reset")) rc = reset(0);
  else rc = release(0);
  if (rc) fail("the context call", rc, 0);
  if (ended0) {
    cuda_memory_anew(0, own0);
    nothing_over(own0, 0x1000, "an allocation of the ended context");
  } else must_reg_dereg(own0, 0x1000, "GPU 0's primary context's allocation lives on");
  must_reg_dereg(own1, MB2, "GPU 1's primary context's allocation lives on (mapped on GPU 0 too)");
  if (!strcmp(how, "release-held")) must_reg_dereg(unknown, MB2, "nothing ended: every allocation lives");
  else nothing_over(unknown, MB2, "an allocation of an unknown context goes with any end on its GPU");
  printf("harm ctx %s %s\n", how, failures ? "FAILED" : "ok");
  return failures != 0;
}

static int dereg_queued(void) {
  gpu_alloc(0, BASE, 64 * K64);
  gpu_alloc(0, BASE + 64 * K64, 64 * K64);
  int fds0 = distinct_bufs();
  struct ibv_mr *m = must_reg(vreg, BASE, 64 * K64, "an MR");
  if (m && vdereg(m)) fail("dereg", 0, errno);
  int owed = distinct_bufs() - fds0;
  // the next registration holds the core's lock: it takes the queued dereg in first
  struct ibv_mr *n = must_reg(vreg, BASE + 64 * K64, 64 * K64, "the next MR");
  int after = distinct_bufs() - fds0;
  if (n && vdereg(n)) fail("dereg", 1, errno);
  printf("harm dereg-queued %s owed=%d after=%d\n", failures ? "FAILED" : "ok", owed, after);
  return failures != 0;
}

static int nv503c_miss(void) {
  unsigned long *calls = (unsigned long *)dlsym(RTLD_DEFAULT, "fakeverbs_reg_calls");
  if (!calls) { fprintf(stderr, "no fakeverbs_reg_calls\n"); return 2; }
  carved_chunk(1, BASE);
  struct ibv_mr *m = must_reg(vreg, BASE, 0x1000, "an MR over the allocation: RM holds the whole mapping");
  unsigned long before = *calls;
  must_miss(BASE + 0x100000, 0x1000, 0xf, "the mapping's bytes no allocation owns");
  must_miss(BASE + 0x1000, 0x100000, 0xf, "an MR that starts in no allocation's bytes");
  unsigned long reached = *calls - before;
  if (reached) fail("misses reached the NIC's driver", reached, 0);
  if (m) vdereg(m);
  static char host[1 << 16];
  struct ibv_mr *hm = vreg(rig_pd, host, sizeof host, 0xf);
  if (!hm) fail("host memory is the provider's, untouched", 0, errno); else vdereg(hm);
  printf("harm nv503c-miss %s reached=%lu\n", failures ? "FAILED" : "ok", reached);
  return failures != 0;
}

static pthread_rwlock_t forking;
static int race_stop, race_exports; // fork-export: registrations are not kept out of forks
static void *reg_dereg(void *arg) {
  uint64_t at = BASE + (uint64_t)(uintptr_t)arg * 16 * K64;
  struct ibv_mr *held[4] = {0};
  for (unsigned k = 0; !__atomic_load_n(&race_stop, __ATOMIC_ACQUIRE); k++) {
    unsigned i = k % 4;
    if (held[i] && vdereg(held[i])) fail("dereg", (long)at, errno);
    if (!race_exports) pthread_rwlock_rdlock(&forking);
    held[i] = vreg(rig_pd, (void *)(uintptr_t)(at + i * K64), K64, 0xf);
    if (!race_exports) pthread_rwlock_unlock(&forking);
    if (!held[i]) fail("an MR", (long)at, errno);
  }
  for (int i = 0; i < 4; i++) if (held[i]) vdereg(held[i]);
  return NULL;
}
static int fork_race(int exports) {
  race_exports = exports;
  pthread_rwlockattr_t ra;
  pthread_rwlockattr_init(&ra);
  pthread_rwlockattr_setkind_np(&ra, PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
  pthread_rwlock_init(&forking, &ra);
  pthread_t t[3];
  for (int i = 0; i < 3; i++) { gpu_alloc(0, BASE + (uint64_t)(i + 1) * 16 * K64, 4 * K64); pthread_create(&t[i], NULL, reg_dereg, (void *)(uintptr_t)(i + 1)); }
  int forks = 0, leaks = 0;
  for (; forks < 2000 && !failures; forks++) {
    pthread_rwlock_wrlock(&forking);
    pid_t pid = fork();
    if (pid == 0) _exit(fd_named("memfd:nv_dmabuf") >= 0 ? 3 : 0);
    pthread_rwlock_unlock(&forking);
    int st = 0;
    if (pid < 0 || waitpid(pid, &st, 0) != pid) { fail("fork", pid, errno); break; }
    leaks += WIFEXITED(st) && WEXITSTATUS(st) == 3;
  }
  __atomic_store_n(&race_stop, 1, __ATOMIC_RELEASE);
  for (int i = 0; i < 3; i++) pthread_join(t[i], NULL);
  if (leaks) fail("children kept a dma-buf of gdrshim's", leaks, forks);
  printf("harm fork-%s %s forks=%d leaks=%d\n", exports ? "export" : "race", failures ? "FAILED" : "ok", forks, leaks);
  return failures != 0;
}

int main(int argc, char **argv) {
  if (argc < 2) { fprintf(stderr, "usage: harm MODE [ARG]\n"); return 2; }
  setup();
  const char *mode = argv[1], *arg = argc > 2 ? argv[2] : "";
  if (!strcmp(mode, "closed")) return closed(arg);
  if (!strcmp(mode, "gpunode")) return gpunode();
  if (!strcmp(mode, "logfile")) return logfile();
  if (!strcmp(mode, "fork")) return forked();
  if (!strcmp(mode, "fork-race")) return fork_race(0);
  if (!strcmp(mode, "fork-export")) return fork_race(1);
  if (!strncmp(mode, "stale-", 6)) return stale(mode);
  if (!strcmp(mode, "ctx")) return ctx(arg);
  if (!strcmp(mode, "nv503c-miss")) return nv503c_miss();
  if (!strcmp(mode, "dereg-queued")) return dereg_queued();
  fprintf(stderr, "harm: unknown mode %s\n", mode);
  return 2;
}
