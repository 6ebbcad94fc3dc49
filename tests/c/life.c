// Process-life and concurrency scenarios for gdrshim (ours), run under the real libgdrshim.so
// with the live fake driver (fakerm.c) and the fake NIC (fakeverbs.c: the NIC plus peermem,
// EFAULT unless the fake kernel holds exactly the right registration), the provider of
// rdma-core's own libibverbs (rignic.h); in "dlclose" the libibverbs itself: rdma-core's, once a
// device is listed, is never unloaded (the providers it opens need it and stay).
//   life threads N ITERS  N threads allocate, map, remap, register, deregister, free at once
//   life signals ITERS    the same on 4 threads with SIGALRM every 50 us, whose handler issues
//                         hooked calls (NVIDIA and other ioctls, dup, close)
//   life forkexec         fork + exec of a fresh shim user while the parent's MR stays live
//   life exitlive         exit() with live registrations and another thread inside the hooks
//   life threadexit       a thread ends inside ibv_reg_mr; a thread cancelled inside open()
//   life dlclose DIR      libibverbs unloaded with the plugin that uses it, loaded elsewhere
//   life wheel DIR        a plugin whose libibverbs is a wheel's renamed copy (auditwheel), in its
//                         RTLD_LOCAL scope only: its ibv_reg_mr reaches that copy through gdrshim
//   life interpose        another interposer of ibv_reg_mr finds its next with RTLD_NEXT
//   life misses N         N registrations of GPU memory that has been freed (each a pass0 miss)
//   life racefree ROUNDS  one thread registers memory over and over while another frees it (with
//                         FAKERM_FREE_DELAY_US, the free spends that long in the driver)
// Prints "life MODE ok ..." and exits 0, or names what went wrong and exits 1.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>
#include "../../include/gdrshim.h"
#include "program_owns.h"
#include "rignic.h"

#define NV_IOCTL(nr, size) (0xC0000000u | ((size) << 16) | (0x46u << 8) | (nr))
#define K64 0x10000ull
static int ctl, uvm;
static uint32_t client, dev[2], sub[2], vas[2];
static long failures;
static void fail(const char *what, uint64_t a, uint64_t b) { __atomic_add_fetch(&failures, 1, __ATOMIC_RELAXED); fprintf(stderr, "FAIL %s %#lx %#lx\n", what, (unsigned long)a, (unsigned long)b); }

typedef void *(*reg_t)(void *, void *, size_t, int);
typedef int (*dereg_t)(void *);
static reg_t vreg; static dereg_t vdereg;     // through dlvsym, as NCCL
static reg_t direct; // gdrshim's exported ibv_reg_mr, as a program linked against libibverbs calls it
static void *verbs_pd, *verbs_ctx; // the NIC's under rdma-core (rignic.h); none under fakeverbs.c
static int (*check)(uint64_t, uint64_t);      // the fake kernel's view of a registration
static int (*kernel_regs)(void);
static uint8_t (*uuid)[16];

static uint32_t rm_alloc(uint32_t parent, uint32_t cls, void *params, uint32_t psize) {
  uint32_t a[12] = {client, parent, 0, cls}; uint64_t p = (uintptr_t)params; memcpy(&a[4], &p, 8); a[8] = psize;
  if (cls == 0x41) a[0] = a[1] = 0;
  if (ioctl(ctl, NV_IOCTL(0x2b, 48), a) || a[10]) { fail("RM_ALLOC", cls, a[10]); return 0; }
  return a[2];
}
static void rm_free(uint32_t parent, uint32_t h) {
  uint32_t a[4] = {client, parent, h, 0};
  if (ioctl(ctl, NV_IOCTL(0x29, 16), a) || a[3]) fail("RM_FREE", h, a[3]);
}
static uint32_t alloc_mem(int g, uint64_t size) {
  uint8_t p[128] = {0}; memcpy(p + 64, &size, 8);
  return rm_alloc(dev[g], 0x40, p, sizeof p);
}
static void uvm_call(unsigned long cmd, void *a, size_t status_at) {
  uint32_t st = 0;
  if (ioctl(uvm, cmd, a) || (memcpy(&st, (uint8_t *)a + status_at, 4), st)) fail("UVM", cmd, st);
}
static void create_range(uint64_t base, uint64_t len) { uint64_t a[3] = {base, len, 0}; uvm_call(73, a, 16); }
static void map(uint64_t base, uint64_t len, uint64_t off, int g, uint32_t h) {
  static __thread uint8_t a[9264];
  memset(a, 0, sizeof a); memcpy(a, &base, 8); memcpy(a + 8, &len, 8); memcpy(a + 16, &off, 8); memcpy(a + 24, uuid[g], 16);
  uint64_t count = 1; int fd = ctl; memcpy(a + 9240, &count, 8); memcpy(a + 9248, &fd, 4); memcpy(a + 9252, &client, 4); memcpy(a + 9256, &h, 4);
  uvm_call(33, a, 9260);
  program_owns(base, len);
}
static void uvm_free(uint64_t base, uint64_t len) { uint64_t a[3] = {base, len, 0}; uvm_call(34, a, 16); }

static void setup(void) {
  const char *d = getenv("GDRSHIM_TEST_DEV_DIR"); char p[4096];
  snprintf(p, sizeof p, "%s/nvidiactl", d); ctl = open(p, O_RDWR | O_CLOEXEC);
  snprintf(p, sizeof p, "%s/nvidia-uvm", d); uvm = open(p, O_RDWR | O_CLOEXEC);
  check = (int (*)(uint64_t, uint64_t))dlsym(RTLD_DEFAULT, "fakenv_check");
  kernel_regs = (int (*)(void))dlsym(RTLD_DEFAULT, "fakenv_live_registrations");
  uuid = (uint8_t (*)[16])dlsym(RTLD_DEFAULT, "fakerm_uuid");
  if (ctl < 0 || uvm < 0 || !check || !kernel_regs || !uuid) { fprintf(stderr, "no fake driver\n"); exit(2); }
  client = rm_alloc(0, 0x41, NULL, 0);
  for (int g = 0; g < 2; g++) {
    uint8_t dp[56] = {0}; uint32_t id = g; memcpy(dp, &id, 4);
    dev[g] = rm_alloc(client, 0x80, dp, sizeof dp);
    uint32_t sp = 0; sub[g] = rm_alloc(dev[g], 0x2080, &sp, 4);
    uint8_t vp[56] = {0}; vas[g] = rm_alloc(dev[g], 0x90f1, vp, sizeof vp);
    uint8_t r[32] = {0}; memcpy(r, uuid[g], 16); memcpy(r + 16, &ctl, 4); memcpy(r + 20, &client, 4); memcpy(r + 24, &vas[g], 4);
    uvm_call(25, r, 28);
  }
}
static void open_verbs(void) {
  void *vh = dlopen("libibverbs.so.1", RTLD_NOW | RTLD_GLOBAL);
  if (!vh) { fprintf(stderr, "dlopen libibverbs.so.1: %s\n", dlerror()); exit(2); }
  vreg = (reg_t)dlvsym(vh, "ibv_reg_mr", "IBVERBS_1.1");
  vdereg = (dereg_t)dlvsym(vh, "ibv_dereg_mr", "IBVERBS_1.1");
  direct = (reg_t)dlsym(RTLD_DEFAULT, "ibv_reg_mr");
  if (!vreg || !vdereg || !direct) { fprintf(stderr, "verbs symbols missing\n"); exit(2); }
  verbs_pd = rig_nic_pd(vh, &verbs_ctx, NULL);
}
static int counters_ok(const char *mode, long extra_live) {
  struct gdrshim_counters c = {0};
  int n = gdrshim_dl_counters(&c, sizeof c), k = kernel_regs();
  if (n < 0) { fprintf(stderr, "no shim\n"); return 0; }
  int ok = !failures && c.rm_errors == 0 && (long)c.live_registrations == extra_live && k == extra_live && c.registered == c.unregistered + extra_live;
  printf("life %s %s registered=%llu unregistered=%llu live=%llu kernel_registrations=%d rm_errors=%llu pass0_hits=%llu pass0_misses=%llu failures=%ld\n", mode, ok ? "ok" : "FAILED",
         (unsigned long long)c.registered, (unsigned long long)c.unregistered, (unsigned long long)c.live_registrations, k, (unsigned long long)c.rm_errors,
         (unsigned long long)c.pass0_hits, (unsigned long long)c.pass0_misses, failures);
  return ok;
}

static uint64_t rnd(uint64_t *s) { *s ^= *s << 13; *s ^= *s >> 7; *s ^= *s << 17; return *s; }

static void *ibv_reg_mr_direct(void *addr, size_t len) { return direct(verbs_pd, addr, len, 0xf); }

// One allocation's life: map, MRs, sometimes the same map again or other memory over half of it.
static void one_life(uint64_t *seed, uint64_t base, int g, long *mrs_made) {
  uint64_t size = (2 + rnd(seed) % 31) * K64;
  uint32_t h = alloc_mem(g, size);
  create_range(base, size);
  map(base, size, 0, g, h);
  void *mr[8]; uint64_t at[8], len[8]; int n = 1 + rnd(seed) % 6;
  for (int i = 0; i < n; i++) {
    at[i] = base + (rnd(seed) % (size / 4096)) * 4096;
    len[i] = 4096 * (1 + rnd(seed) % 16); if (at[i] + len[i] > base + size) len[i] = base + size - at[i];
    mr[i] = (i & 1) ? vreg(verbs_pd, (void *)(uintptr_t)at[i], len[i], 0xf) : ibv_reg_mr_direct((void *)(uintptr_t)at[i], len[i]);
    if (!mr[i]) fail("GPU MR refused", at[i], len[i]);
    __atomic_add_fetch(mrs_made, 1, __ATOMIC_RELAXED);
  }
  uint32_t h2 = 0; int what = rnd(seed) % 4;
  if (what == 0) {
    // cuMemSetAccess: the same mapping again; every MR stays exactly right
    map(base, size, 0, g, h);
    for (int i = 0; i < n; i++) if (mr[i] && check(at[i], len[i]) != 0) fail("MR lost by an identical remap", at[i], len[i]);
  } else if (what == 1) {
    // other memory over the upper half: no registration may still claim it
    uint64_t half = (size / 2) & ~(K64 - 1);
    h2 = alloc_mem(g, half);
    map(base + size - half, half, 0, g, h2);
    for (int i = 0; i < n; i++) if (mr[i] && check(at[i], len[i]) == 0 && at[i] + len[i] > base + size - half) fail("stale registration over remapped VA", at[i], len[i]);
    void *m2 = vreg(verbs_pd, (void *)(uintptr_t)(base + size - half), 4096, 0xf);
    if (!m2) fail("MR on the new memory refused", base + size - half, 4096);
    else vdereg(m2);
  }
  for (int i = 0; i < n; i += 2) if (mr[i] && vdereg(mr[i])) fail("dereg", at[i], 0);
  uvm_free(base, size);
  rm_free(dev[g], h);
  if (h2) rm_free(dev[g], h2);
  for (int i = 1; i < n; i += 2) if (mr[i] && vdereg(mr[i])) fail("dereg after free", at[i], 0); // stale MRs: no-ops for RM
}


static int iters; static long mrs_made;
static void *worker(void *p) {
  long t = (long)p; uint64_t seed = 0x9e3779b97f4a7c15ull ^ (uint64_t)(t + 1) * 0x2545f4914f6cdd1dull;
  for (int i = 0; i < iters; i++) one_life(&seed, 0x7f0000000000ull + (uint64_t)t * (256ull << 20) + (uint64_t)(i % 4) * (64ull << 20), (int)(t % 2), &mrs_made);
  return NULL;
}
static int run_threads(int n) {
  pthread_t th[256]; if (n > 256) n = 256;
  for (long t = 0; t < n; t++) pthread_create(&th[t], NULL, worker, (void *)t);
  for (int t = 0; t < n; t++) pthread_join(th[t], NULL);
  return n;
}

static volatile sig_atomic_t handled; static int devnull;
static void on_alarm(int sig) {
  (void)sig; int e = errno;
  errno = 4242;
  uint32_t c[8] = {client, client, 0x00000101, 0, 0, 0, 0, 0}; // a control gdrshim does not decode
  ioctl(ctl, NV_IOCTL(0x2a, 32), c);
  int v; ioctl(devnull, FIONREAD, &v);
  int d = dup(ctl); if (d >= 0) close(d);
  if (errno != 4242 && errno != ENOTTY) { static const char m[] = "FAIL errno changed in handler\n"; write(2, m, sizeof m - 1); __atomic_add_fetch(&failures, 1, __ATOMIC_RELAXED); }
  handled++;
  errno = e;
}

static void *canceled_open(void *p) { int fd = open((const char *)p, O_RDONLY); if (fd >= 0) close(fd); return NULL; }
static void *exits_inside_reg(void *p) { uint64_t base = *(uint64_t *)p; vreg(verbs_pd, (void *)(uintptr_t)base, 4096, 0xf); return NULL; }
static volatile int spin = 1;
static void *busy(void *p) { (void)p; uint64_t seed = 77; long m = 0; while (spin) one_life(&seed, 0x7e0000000000ull, 1, &m); return NULL; }

// The address ranges /proc/self/maps shows for a library.
static int ranges_of(const char *lib, uint64_t lo[], uint64_t hi[], int max) {
  FILE *f = fopen("/proc/self/maps", "r"); char line[512]; int n = 0;
  while (f && fgets(line, sizeof line, f)) if (strstr(line, lib) && n < max) { unsigned long a, b; if (sscanf(line, "%lx-%lx", &a, &b) == 2) { lo[n] = a; hi[n] = b; n++; } }
  if (f) fclose(f);
  return n;
}

// racefree: registrations of a memory while it is being freed.
struct race { uint64_t base; volatile int done; long made; };
static void *racer(void *p) {
  struct race *r = p;
  while (!__atomic_load_n(&r->done, __ATOMIC_ACQUIRE)) {
    void *m = vreg(verbs_pd, (void *)(uintptr_t)r->base, 4 * 4096, 0xf);
    if (m) { r->made++; if (vdereg(m)) fail("dereg", r->base, 0); }
  }
  return NULL;
}
static int run_racefree(int rounds) {
  long *violations = (long *)dlsym(RTLD_DEFAULT, "fakenv_race_violations");
  if (!violations) { fprintf(stderr, "no fakenv_race_violations\n"); return 1; }
  long made = 0;
  for (int i = 0; i < rounds; i++) {
    uint64_t base = 0x7d0000000000ull, len = 4 * K64;
    uint32_t h = alloc_mem(0, len);
    create_range(base, len);
    map(base, len, 0, 0, h);
    struct race r = {base, 0, 0};
    pthread_t t; pthread_create(&t, NULL, racer, &r);
    while (!__atomic_load_n(&r.made, __ATOMIC_RELAXED) && !failures) usleep(50);
    rm_free(dev[0], h);
    __atomic_store_n(&r.done, 1, __ATOMIC_RELEASE);
    pthread_join(t, NULL);
    uvm_free(base, len);
    made += r.made;
  }
  printf("life racefree rounds=%d mrs=%ld race_violations=%ld\n", rounds, made, *violations);
  if (*violations) fail("registered or exported memory while the driver was freeing it", (uint64_t)*violations, 0);
  return counters_ok("racefree", 0) ? 0 : 1;
}

int main(int argc, char **argv) {
  if (argc < 2) return 2;
  const char *mode = argv[1];
  setvbuf(stdout, NULL, _IONBF, 0);
  if (!strcmp(mode, "badparams")) {
    // RM answers rc 0 and an error status when it cannot read a call's parameters: nothing may
    // read them after it (the capture did, and crashed the program)
    setup();
    uint32_t c[8] = {client, sub[0], 0x20800101, 0, 0x10, 0, 64, 0};
    int rc = ioctl(ctl, NV_IOCTL(0x2a, 32), c);
    uint32_t a[12] = {client, dev[0], 0, 0x40, 0x20, 0, 0, 0, 0, 0, 0, 0};
    int rc2 = ioctl(ctl, NV_IOCTL(0x2b, 48), a);
    printf("life badparams %s control rc=%d status=%#x alloc rc=%d status=%#x\n", rc == 0 && c[7] && rc2 == 0 && a[10] ? "ok" : "FAILED", rc, c[7], rc2, a[10]);
    return 0;
  }
  if (!strcmp(mode, "wheel")) {
    // a Python wheel's plugin (NIXL's UCX): its libibverbs is a renamed copy (auditwheel),
    // loaded only in the plugin's RTLD_LOCAL scope; RTLD_NEXT from gdrshim cannot see it
    setup();
    uint64_t base = 0x7f1000000000ull; uint32_t h = alloc_mem(0, 1 << 20); create_range(base, 1 << 20); map(base, 1 << 20, 0, 0, h);
    char path[4096]; snprintf(path, sizeof path, "%s/libplugwheel.so", argv[2]);
    void *plug = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!plug) { fprintf(stderr, "dlopen %s: %s\n", path, dlerror()); return 2; }
    void *(*plug_reg)(void *, void *, size_t) = (void *(*)(void *, void *, size_t))dlsym(plug, "plug_reg");
    int (*plug_dereg)(void *) = (int (*)(void *))dlsym(plug, "plug_dereg");
    void *(*plug_pd)(void) = (void *(*)(void))dlsym(plug, "plug_pd");
    void *pd = plug_pd(); // the NIC's, through the wheel's copy (and its own provider)
    if (!pd) { fprintf(stderr, "no PD through the wheel's libibverbs\n"); return 2; }
    errno = 0;
    void *mr = plug_reg(pd, (void *)(uintptr_t)(base + 0x10000), 8192);
    int e = errno, registered = mr && check(base + 0x10000, 8192) == 0;
    if (!registered) fail("wheel plugin MR", e, 0);
    if (mr && plug_dereg(mr)) fail("wheel plugin dereg", 0, 0);
    uvm_free(base, 1 << 20); rm_free(dev[0], h);
    printf("life wheel mr=%s errno=%d\n", mr ? "yes" : "no", mr ? 0 : e);
    return counters_ok("wheel", 0) ? 0 : 1;
  }
  if (!strcmp(mode, "dlclose")) {
    setup();
    uint64_t base = 0x7f1000000000ull; uint32_t h = alloc_mem(0, 1 << 20); create_range(base, 1 << 20); map(base, 1 << 20, 0, 0, h);
    char path[4096]; snprintf(path, sizeof path, "%s/libplug.so", argv[2]);
    uint64_t old_lo[16], old_hi[16]; int rounds = 0, moved = 0;
    for (int round = 0; round < 3; round++) {
      void *plug = dlopen(path, RTLD_NOW | RTLD_LOCAL);
      if (!plug) { fprintf(stderr, "dlopen %s: %s\n", path, dlerror()); return 2; }
      void *(*plug_reg)(void *, void *, size_t) = (void *(*)(void *, void *, size_t))dlsym(plug, "plug_reg");
      int (*plug_dereg)(void *) = (int (*)(void *))dlsym(plug, "plug_dereg");
      uint64_t lo[16], hi[16]; int n = ranges_of("libibverbs.so.1", lo, hi, 16);
      if (round > 0 && n && lo[0] != old_lo[0]) moved++;
      // the plugin binds ibv_reg_mr to gdrshim's export; fakeverbs.c needs no PD
      void *mr = plug_reg(NULL, (void *)(uintptr_t)(base + 0x10000), 8192);
      if (!mr || check(base + 0x10000, 8192) != 0) fail("plugin MR", round, 0);
      if (mr && plug_dereg(mr)) fail("plugin dereg", round, 0);
      void *vh = dlopen("libibverbs.so.1", RTLD_NOW | RTLD_LOCAL);
      reg_t r = (reg_t)dlvsym(vh, "ibv_reg_mr", "IBVERBS_1.1"); dereg_t dr = (dereg_t)dlvsym(vh, "ibv_dereg_mr", "IBVERBS_1.1");
      void *mr2 = r ? r(0, (void *)(uintptr_t)base, 4096, 0xf) : NULL;
      if (!mr2) fail("dlvsym MR", round, 0); else if (dr(mr2)) fail("dlvsym dereg", round, 0);
      dlclose(vh); dlclose(plug);
      if (ranges_of("libibverbs.so.1", old_lo, old_hi, 16)) { fprintf(stderr, "libibverbs.so.1 still loaded after dlclose\n"); return 2; }
      // keep the old place taken, so the next load must go elsewhere
      for (int i = 0; i < n; i++) mmap((void *)(uintptr_t)lo[i], hi[i] - lo[i], PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
      memcpy(old_lo, lo, sizeof lo); memcpy(old_hi, hi, sizeof hi);
      rounds++;
    }
    uvm_free(base, 1 << 20); rm_free(dev[0], h);
    if (moved < 2) fail("libibverbs did not move", moved, 0);
    printf("life dlclose rounds=%d moved=%d\n", rounds, moved);
    return counters_ok("dlclose", 0) ? 0 : 1;
  }
  setup();
  open_verbs();
  if (!strcmp(mode, "misses")) {
    setup(); open_verbs();
    uint64_t base = 0x7c0000000000ull; uint32_t h = alloc_mem(0, K64); create_range(base, K64); map(base, K64, 0, 0, h);
    uvm_free(base, K64); rm_free(dev[0], h);
    int n = argc > 2 ? atoi(argv[2]) : 1000, refused = 0;
    for (int i = 0; i < n; i++) { void *m = vreg(verbs_pd, (void *)(uintptr_t)base, 4096, 0xf); if (m) vdereg(m); else refused++; }
    printf("life misses n=%d refused=%d\n", n, refused);
    return counters_ok("misses", 0) ? 0 : 1;
  }
  if (!strcmp(mode, "sparse")) {
    // a sparse map over registered memory unmaps it first: the registration goes before the
    // driver call, and to a later MR the VA is no longer that memory
    uint64_t base = 0x7c4000000000ull, len = 0x200000ull; uint32_t h = alloc_mem(0, len);
    create_range(base, len); map(base, len, 0, 0, h);
    void *m = vreg(verbs_pd, (void *)(uintptr_t)base, 4096, 0xf);
    if (!m || kernel_regs() != 1) fail("registered before the sparse map", (uintptr_t)m, (uint64_t)kernel_regs());
    uint64_t a[5] = {base, len, 0, 0, 0}; memcpy(&a[2], uuid[0], 16); uvm_call(74, a, 32);
    if (kernel_regs() != 0) fail("a registration left over the sparse map", (uint64_t)kernel_regs(), 0);
    // (gdrshim registers nothing and delegates; the fake NIC takes unmapped VA for host memory)
    void *again = vreg(verbs_pd, (void *)(uintptr_t)base, 4096, 0xf);
    if (kernel_regs() != 0) fail("a registration of sparse VA", (uint64_t)kernel_regs(), 0);
    if (again) vdereg(again);
    if (m) vdereg(m);
    uvm_free(base, len); rm_free(dev[0], h);
    printf("life sparse\n");
    return counters_ok("sparse", 0) ? 0 : 1;
  }
  if (!strcmp(mode, "racefree")) {
    setup(); open_verbs();
    return run_racefree(argc > 2 ? atoi(argv[2]) : 20);
  }
  if (!strcmp(mode, "threads")) {
    int n = argc > 2 ? atoi(argv[2]) : 64; iters = argc > 3 ? atoi(argv[3]) : 200;
    n = run_threads(n);
    printf("life threads n=%d iters=%d mrs=%ld\n", n, iters, mrs_made);
    return counters_ok("threads", 0) ? 0 : 1;
  }
  if (!strcmp(mode, "signals")) {
    iters = argc > 2 ? atoi(argv[2]) : 300;
    devnull = open("/dev/null", O_RDONLY);
    struct sigaction sa = {0}; sa.sa_handler = on_alarm; sa.sa_flags = SA_RESTART; sigaction(SIGALRM, &sa, NULL);
    struct itimerval it = {{0, 50}, {0, 50}}; setitimer(ITIMER_REAL, &it, NULL);
    // rounds until enough signals landed inside the work (a loaded machine merges pending ones)
    int rounds = 0;
    do { run_threads(4); rounds++; } while (handled < 200 && rounds < 50);
    struct itimerval off = {{0, 0}, {0, 0}}; setitimer(ITIMER_REAL, &off, NULL);
    printf("life signals handled=%d rounds=%d mrs=%ld\n", (int)handled, rounds, mrs_made);
    if (handled < 200) fail("too few signals", handled, 0);
    return counters_ok("signals", 0) ? 0 : 1;
  }
  if (!strcmp(mode, "forkexec") || !strcmp(mode, "child")) {
    uint64_t base = 0x7f2000000000ull; uint32_t h = alloc_mem(1, 2 << 20); create_range(base, 2 << 20); map(base, 2 << 20, 0, 1, h);
    void *mr = vreg(verbs_pd, (void *)(uintptr_t)(base + 4096), 65536, 0xf);
    if (!mr) fail("MR before fork", base, 0);
    if (!strcmp(mode, "forkexec")) {
      pid_t pid = fork();
      if (pid == 0) { execl("/proc/self/exe", "life", "child", (char *)NULL); _exit(127); }
      int st = 0; waitpid(pid, &st, 0);
      if (!WIFEXITED(st) || WEXITSTATUS(st)) fail("exec'd child", st, 0);
      if (check(base + 4096, 65536) != 0) fail("parent MR after the child", base, 0);
    }
    if (mr && vdereg(mr)) fail("dereg", base, 0);
    uvm_free(base, 2 << 20); rm_free(dev[1], h);
    return counters_ok(mode, 0) ? 0 : 1;
  }
  if (!strcmp(mode, "exitlive")) {
    uint64_t base = 0x7f3000000000ull; uint32_t h = alloc_mem(0, 4 << 20); create_range(base, 4 << 20); map(base, 4 << 20, 0, 0, h);
    for (int i = 0; i < 3; i++) {
      uint64_t b2 = base + (uint64_t)i * (1 << 20); uint32_t h2 = alloc_mem(0, 1 << 20);
      (void)h; create_range(b2 + (64ull << 20), 1 << 20); map(b2 + (64ull << 20), 1 << 20, 0, 0, h2);
      if (!vreg(verbs_pd, (void *)(uintptr_t)(b2 + (64ull << 20)), 4096, 0xf)) fail("MR", i, 0);
    }
    if (!counters_ok("exitlive", 3)) return 1;
    pthread_t t; pthread_create(&t, NULL, busy, NULL);
    usleep(50000);
    exit(3); // with registrations live and the other thread inside the hooks
  }
  if (!strcmp(mode, "threadexit")) {
    uint64_t base = 0x7f4000000000ull; uint32_t h = alloc_mem(0, 1 << 20); create_range(base, 1 << 20); map(base, 1 << 20, 0, 0, h);
    int *flag = (int *)dlsym(RTLD_DEFAULT, "fakeverbs_exit_in_reg");
    if (!flag) { fprintf(stderr, "fake verbs without fakeverbs_exit_in_reg\n"); return 2; }
    __atomic_store_n(flag, 1, __ATOMIC_RELEASE);
    pthread_t t; void *ret = NULL;
    pthread_create(&t, NULL, exits_inside_reg, &base); pthread_join(t, &ret);
    __atomic_store_n(flag, 0, __ATOMIC_RELEASE);
    if (ret != (void *)42) fail("thread did not end inside ibv_reg_mr", (uint64_t)(uintptr_t)ret, 0);
    // the shim is not wedged: the same memory registers again, and other memory too
    void *mr = vreg(verbs_pd, (void *)(uintptr_t)base, 4096, 0xf);
    if (!mr || check(base, 4096) != 0) fail("MR after the thread ended", base, 0);
    if (mr) vdereg(mr);
    // a thread cancelled while blocked in open() (a cancellation point gdrshim hooks)
    char fifo[] = "/tmp/gdrshim-life-fifo-XXXXXX"; int tfd = mkstemp(fifo); close(tfd); unlink(fifo); mkfifo(fifo, 0600);
    pthread_create(&t, NULL, canceled_open, fifo); usleep(100000); pthread_cancel(t); pthread_join(t, &ret); unlink(fifo);
    if (ret != PTHREAD_CANCELED) fail("cancel in open", 0, 0);
    // the reference the ended thread never handed back goes with the memory
    uvm_free(base, 1 << 20); rm_free(dev[0], h);
    printf("life threadexit ended_inside_reg=1 canceled_in_open=1\n");
    return counters_ok("threadexit", 0) ? 0 : 1;
  }
  if (!strcmp(mode, "interpose")) {
    uint64_t base = 0x7f5000000000ull; uint32_t h = alloc_mem(0, 1 << 20); create_range(base, 1 << 20); map(base, 1 << 20, 0, 0, h);
    reg_t r = direct;
    long *calls = (long *)dlsym(RTLD_DEFAULT, "interpose_calls");
    void *mr = r(verbs_pd, (void *)(uintptr_t)base, 4096, 0xf);
    if (!mr || check(base, 4096) != 0) fail("MR through the other interposer", base, 0);
    if (!calls || *calls != 1) fail("other interposer calls", calls ? *calls : -1, 1);
    if (mr) vdereg(mr);
    uvm_free(base, 1 << 20); rm_free(dev[0], h);
    printf("life interpose interposer_calls=%ld\n", calls ? *calls : -1);
    return counters_ok("interpose", 0) ? 0 : 1;
  }
  fprintf(stderr, "unknown mode %s\n", mode);
  return 2;
}
