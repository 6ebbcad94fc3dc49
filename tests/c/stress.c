// A concurrency stress of gdrshim with a ground-truth oracle (ours; issue 42 item 3), under the
// real library on the fake machine (fakerm.c, fakeverbs.c, fakemlx5.c, fakecuda.c):
//   stress SEED THREADS SECONDS ROUTE [nochurn] [nofork] [nospawn] [nocloses] [ctx] [sabotage]
// ROUTE (dmabuf or nv503c) names the route the machine gives; the program uses the entry points
// that route has. THREADS workers, for SECONDS, each take a region of VA at a time and in it
// allocate (RM memory, UVM ranges and mappings, CUDA's 2 MiB chunks carved into the program's
// allocations through every hooked allocation entry point, exact allocations, imports by
// cuMemMap, VMM-like remaps and memory mapped over), register by every entry point (legitimate
// ranges, and probes over freed neighbours, holes, bytes past an end, CUDA's own memory and other
// regions), deregister, re-register, export (gdrshim_export_dmabuf, cuMemGetHandleForAddressRange)
// and register the program's own dma-bufs, free in CUDA's order and in odd ones (RM free before
// the unmap, one GPU at a time with CUDA's memory mapped between, MRs left over freed memory),
// fork (the child checks it holds no fd of gdrshim's and _exits), start children as CPython's
// subprocess and posix_spawn do (vfork, the child's own closes before its exec, then a check
// that it holds no fd of gdrshim's), close files of the program's own by close_range and
// closefrom, retain and release a GPU's primary context the program holds (a library's
// short-lived context; `ctx`: create contexts too, allocate in them and destroy them, which
// frees what they hold), and register over other threads' live memory. A churn thread closes
// fd numbers gdrshim keeps (close, close_range, dup2, dup3) and puts files of the program's own
// there, which must stay intact. The oracle
// (stress_truth.h) judges every export piece, REGISTER_VIDMEM, NIC registration and release;
// a watchdog ends a hang. At the end: nothing registered or exported is left, no fd of
// gdrshim's but its GPU nodes. Prints "stress SEED ... ok|FAILED ..."; exit 0 only when ok.
// `sabotage` tests the oracle itself: now and then the truth is told an allocation ended while
// the program keeps it and registers it (every such registration is a violation to report).
#include "rig.h"
#include "stress_truth.h"
#include "stress_ops.h"
#include <dirent.h>
#include <sched.h>
#include <signal.h>
#include <spawn.h>
#include <sys/resource.h>
#include <time.h>

static int ctx_created_on;
static int threads, seconds, dmabuf_route, churn_on = 1, fork_on = 1, spawn_on = 1, closes_on = 1,
                                                                 sabotage;
static unsigned long seed;
static double deadline;
static int (*gdr_active)(void);
static pthread_rwlock_t
    fdlock; // read: a call that may make fds (ours or gdrshim's); write: churn, fork
static int rstate[REGIONS], rowner[REGIONS], rborrow[REGIONS], rfreeing[REGIONS];
static pthread_mutex_t bmu = PTHREAD_MUTEX_INITIALIZER;
static __thread unsigned long rng;
static double beats[256];
static int stop_churn;

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + t.tv_nsec / 1e9;
}
static unsigned rnd(unsigned n) {
  rng ^= rng << 13;
  rng ^= rng >> 7;
  rng ^= rng << 17;
  return n ? (unsigned)(rng % n) : 0;
}
static void alive(void) { beats[tid_no] = now(); }

// ---- what the worker knows of its region ----
typedef struct {
  uint64_t va, len;
  int slot, gmask, gmem, live, cuda;
} chunk_t;
typedef struct {
  uint64_t va, len, reach;
  int live, chunk, import;
} pal_t;
typedef struct {
  int reg, nc, na, slots, nr, vmm, nh;
  chunk_t c[10];
  pal_t a[32];
  held_t held[12];
  uint64_t rg[12][2];
} lay_t;

static uint64_t page(uint64_t n) { return n * 0x1000ull; }
// Memory of `len` mapped at va on the GPUs of gmask (in a UVM range of its own where `range`);
// `cuda`: CUDA's own memory, never the program's.
static int new_chunk(lay_t *l, uint64_t va, uint64_t len, int gmask, int cuda, int range) {
  if (l->nc == 10 || l->nr == 12) return -1;
  int gmem = gmask == 2 ? 1 : 0, slot = l->slots++;
  if (t_mem(gmem, len, l->reg, slot)) return -1;
  if (range) {
    t_range(va, len);
    l->rg[l->nr][0] = va;
    l->rg[l->nr++][1] = len;
  }
  t_map(va, len, 0, gmask, slot);
  l->c[l->nc] = (chunk_t){va, len, slot, gmask, gmem, 1, cuda};
  return l->nc++;
}
static void new_alloc(lay_t *l, int ci, uint64_t off, uint64_t len, int how, int import) {
  chunk_t *c = &l->c[ci];
  if (l->na == 32 || cu_own(how, c->va + off, len, c->va + c->len, c->slot, off)) return;
  l->a[l->na++] =
      (pal_t){c->va + off, len, how >= 6 ? c->va + off + len : c->va + c->len, 1, ci, import};
}
// A free stretch of a live chunk of the program's (4 KiB pages), carved into an allocation.
static void carve(lay_t *l) {
  int ci = (int)rnd((unsigned)l->nc);
  chunk_t *c = &l->c[ci];
  if (!c->live || c->cuda || c->len != MB2) return;
  uint64_t off = page(rnd(480)), len = page(1 + rnd(32));
  for (int i = 0; i < l->na; i++) {
    pal_t *a = &l->a[i];
    if (a->live && a->va < c->va + off + len && c->va + off < a->va + a->len) return;
  }
  new_alloc(l, ci, off, len, (int)rnd(6), 0);
}

// Before the owner releases anything of its region: no other thread registers there meanwhile.
static void freeing(int reg, int on) {
  pthread_mutex_lock(&bmu);
  rfreeing[reg] = on;
  pthread_mutex_unlock(&bmu);
  while (on && __atomic_load_n(&rborrow[reg], __ATOMIC_ACQUIRE)) sched_yield();
}

// A registration of [va, va+len): `expect` 1 when the range is the program's (one allocation
// of a live chunk: it must work), 0 for a probe (the oracle judges what the NIC got).
static void reg_range(lay_t *l, uint64_t va, uint64_t len, int expect) {
  int how = (int)rnd(7), umem;
  if (l && l->nh == 12) { unreg(&l->held[--l->nh]); }
  count(expect ? K_REG : K_PROBE);
  if (how >= 5) count(K_UMEM);
  pthread_rwlock_rdlock(&fdlock);
  op_begin(reg_names[how], va, len);
  errno = SENT;
  void *o = reg_by(how, va, len, &umem);
  op_end(o ? 0 : errno);
  if (o) errno_kept("errno changed by a working registration", (long)va);
  pthread_rwlock_unlock(&fdlock);
  if (o && how >= 5) count(K_UMEM_OK);
  if (o) count(expect ? K_REG_OK : K_PROBE_OK);
  else if (expect) failed(reg_names[how], (long)va, errno);
  if (!o) return;
  if (!umem && ((struct ibv_mr *)o)->addr != (void *)(uintptr_t)va)
    violation("an MR reads another address", va, (uint64_t)(uintptr_t)((struct ibv_mr *)o)->addr);
  held_t h = {o, va, len, umem};
  if (l) l->held[l->nh++] = h;
  else unreg(&h);
}
// An export of [va, va+len) the program asks for (gdrshim_export_dmabuf or
// cuMemGetHandleForAddressRange), sometimes registered as the program's own dma-buf MR.
static void export_range(lay_t *l, uint64_t va, uint64_t len, int expect) {
  int fd = -1, by_cuda = rnd(2), r;
  count(K_EXPORT);
  pthread_rwlock_rdlock(&fdlock);
  op_begin(by_cuda ? "cuMemGetHandleForAddressRange" : "gdrshim_export_dmabuf", va, len);
  errno = SENT;
  if (by_cuda) {
    r = cu_handle(&fd, va, len, 1, 0);
    if (r) fd = -1;
  } else r = fd = gdrshim_dl_export_dmabuf(va, len);
  op_end(r);
  if (fd >= 0 && fd < 4096) {
    errno_kept("errno changed by a working export", (long)va);
    __atomic_store_n(&prog_fd[fd], 1, __ATOMIC_SEQ_CST);
    count(K_EXPORT_OK);
    if (rnd(2) && l && l->nh < 12) {
      op_begin("ibv_reg_dmabuf_mr (the program's)", va, len);
      errno = SENT;
      struct ibv_mr *m = e_dmabuf(rig_pd, 0, len, va, fd, 0xf);
      op_end(m ? 0 : errno);
      if (m) {
        errno_kept("errno changed by ibv_reg_dmabuf_mr", (long)va);
        l->held[l->nh++] = (held_t){m, va, len, 0};
        count(K_OWN_DMABUF);
      } else failed("ibv_reg_dmabuf_mr of the program's export", (long)va, errno);
    }
    __atomic_store_n(&prog_fd[fd], 0, __ATOMIC_SEQ_CST);
    errno = SENT;
    if (close(fd)) failed("close of the program's export", fd, errno);
    else errno_kept("errno changed by close", fd);
  } else if (expect) failed("an export of the program's memory", (long)va, r);
  pthread_rwlock_unlock(&fdlock);
}
// Drops the held MRs over [va, va+len) (or all).
static void unreg_over(lay_t *l, uint64_t va, uint64_t len) {
  for (int i = l->nh - 1; i >= 0; i--)
    if (!len || (l->held[i].va < va + len && va < l->held[i].va + l->held[i].len)) {
      unreg(&l->held[i]);
      l->held[i] = l->held[--l->nh];
    }
}
static void rereg(lay_t *l, uint64_t va, uint64_t len) {
  for (int i = 0; i < l->nh; i++) {
    if (l->held[i].umem) continue;
    count(K_REREG);
    pthread_rwlock_rdlock(&fdlock);
    op_begin("ibv_rereg_mr", va, len);
    errno = SENT;
    int r = e_rereg(l->held[i].obj, 1, rig_pd, (void *)(uintptr_t)va, len, 0xf);
    op_end(r);
    pthread_rwlock_unlock(&fdlock);
    if (!r) {
      errno_kept("errno changed by a working rereg", (long)va);
      l->held[i].va = va, l->held[i].len = len;
      count(K_REREG_OK);
    }
    return;
  }
}

// A range that is the program's own (expect 1), or a probe: where the program has nothing.
static int pick(lay_t *l, uint64_t *va, uint64_t *len) {
  int live[32], n = 0;
  for (int i = 0; i < l->na; i++)
    if (l->a[i].live) live[n++] = i;
  if (n && rnd(3)) {
    pal_t *a = &l->a[live[rnd((unsigned)n)]];
    if (sabotage && !rnd(20))
      truth_free_at(a->va); // (the program keeps it: its MRs are violations)
    uint64_t pages = a->len / 0x1000, first = rnd((unsigned)pages),
             reach = (a->reach - a->va) / 0x1000;
    *va = a->va + page(first);
    uint64_t last = rnd(4) ? first + 1 + rnd((unsigned)(pages - first))
                           : first + 1 + rnd((unsigned)(reach - first));
    *len = page(last - first);
    return 1;
  }
  uint64_t base = RBASE + (uint64_t)l->reg * RSIZE;
  switch (rnd(4)) {
  case 0:
    *va = base + page(rnd(2048));
    *len = page(1 + rnd(16));
    break; // anywhere in the region
  case 1:
    if (n) {
      pal_t *a = &l->a[live[rnd((unsigned)n)]];
      *va = a->reach - 0x1000;
      *len = 0x2000;
      break;
    } // across a reach's end
    /* fallthrough */
  case 2:
    *va = base + RSIZE - 0x1000;
    *len = 0x2000;
    break; // into the next region
  default:
    *va = base + page(rnd(512));
    *len = MB2 - (*va - base);
    break; // to the first chunk's end
  }
  return 0;
}

// A child's end (20 s at most): 0 exited 0, else its wait status (-1 when it hung and was killed).
static int reap(pid_t pid) {
  int st = 0;
  double t0 = now();
  while (waitpid(pid, &st, WNOHANG) == 0) {
    if (now() - t0 > 20) {
      kill(pid, SIGKILL);
      waitpid(pid, &st, 0);
      return -1;
    }
    usleep(1000);
  }
  return WIFEXITED(st) && !WEXITSTATUS(st) ? 0 : st;
}

static void fork_op(void) {
  count(K_FORK);
  pthread_rwlock_wrlock(
      &fdlock); // no fd of anyone's is being made: the child's copy of prog_fd is exact
  pid_t pid = fork();
  if (pid == 0) {
    char p[64], t[512];
    int bad = 0;
    for (int fd = 3; fd < 512; fd++) {
      snprintf(p, sizeof p, "/proc/self/fd/%d", fd);
      ssize_t k = readlink(p, t, sizeof t - 1);
      if (k <= 0) continue;
      t[k] = 0;
      if ((strstr(t, "memfd:nv_dmabuf") && !prog_fd[fd]) || strstr(t, "/nvidia0") ||
          strstr(t, "/nvidia1")) {
        say("a forked child holds fd %d: %s\n", fd, t);
        bad = fd;
      }
    }
    if (gdr_active()) _exit(4);
    closefrom(3);
    _exit(bad ? 3 : 0);
  }
  pthread_rwlock_unlock(&fdlock);
  if (pid < 0) {
    failed("fork", 0, errno);
    return;
  }
  int st = reap(pid);
  if (st == -1) violation("a forked child hung", (uint64_t)pid, 0);
  else if (st)
    violation("a forked child held an fd of gdrshim's, was active, or died", (uint64_t)pid,
              (uint64_t)st);
}

// A child started as CPython's subprocess and posix_spawn start theirs, while other threads
// register: posix_spawn (CLONE_VM|CLONE_VFORK) with nothing or closefrom(3) as its file
// actions, vfork with CPython's closes before the exec (close_range(3, 3), close_range(5, ~0U))
// or closefrom(3). The vfork child shares this memory, gdrshim's marks included: its closes act
// on its own fd table only. It execs this program's `fdcheck` (as /bin/true, and it says
// whether it holds an fd of gdrshim's: its dma-bufs and GPU nodes are close-on-exec). A mark
// the child's closes cleared shows later: a dma-buf never closed (final_checks) and held by a
// forked child (fork_op).
static char self_exe[4096];
extern char **environ;
static const char *spawn_names[4] = {"posix_spawn", "posix_spawn closefrom(3)",
                                     "vfork close_range(3, 3) close_range(5, ~0U)",
                                     "vfork closefrom(3)"};
static void spawn_op(void) {
  char *argv[] = {self_exe, "fdcheck", NULL};
  int how = (int)rnd(4), r = 0;
  pid_t pid = -1;
  count(K_SPAWN);
  pthread_rwlock_rdlock(&fdlock);
  op_begin(spawn_names[how], 0, 0);
  if (how < 2) {
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    if (how == 1) posix_spawn_file_actions_addclosefrom_np(&fa, 3);
    r = posix_spawn(&pid, self_exe, &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
  } else {
    pid = vfork();
    if (pid == 0) {
      if (how == 2) {
        close_range(3, 3, 0);
        close_range(5, ~0U, 0);
      } else closefrom(3);
      execve(self_exe, argv, environ);
      _exit(127);
    }
    r = pid < 0 ? errno : 0;
  }
  op_end(r);
  pthread_rwlock_unlock(&fdlock);
  if (r || pid < 0) {
    failed(spawn_names[how], 0, r);
    return;
  }
  int st = reap(pid);
  if (st == -1) violation("a spawned child hung", (uint64_t)pid, 0);
  else if (st) violation("a spawned child held an fd of gdrshim's, or died", (uint64_t)how, (uint64_t)st);
}

// The program closes files of its own while other threads register: /dev/null fds at the lowest
// free numbers (where gdrshim's next fds go) by close_range of each or of a run, and fds above
// every other file's (3000 and up) by closefrom or close_range(n, ~0U) (one thread at a time
// there). A number gdrshim takes meanwhile stays its own: a mark cleared shows as a dma-buf
// never closed and held by forked children.
#define HIGH_FDS 3000
static pthread_mutex_t high_mu = PTHREAD_MUTEX_INITIALIZER;
static void own_closes_once(int how);
static void own_closes(void) {
  int how = (int)rnd(4);
  pthread_rwlock_rdlock(&fdlock);
  // (a burst, as a daemon closes: the race with gdrshim's next fd is narrow)
  for (int i = 0; i < 16; i++) own_closes_once(how);
  pthread_rwlock_unlock(&fdlock);
}
static void own_closes_once(int how) {
  int f[4], n = 1 + (int)rnd(4), r = 0;
  count(K_OWN_CLOSE);
  if (how >= 2) pthread_mutex_lock(&high_mu);
  int nul = open("/dev/null", O_RDONLY | O_CLOEXEC);
  if (nul < 0) failed("open /dev/null", 0, errno);
  // (the churn and fork_op, which read prog_fd, wait for this thread's read lock)
  for (int i = 0; i < n; i++)
    f[i] = nul < 0 ? -1 : how >= 2 ? fcntl(nul, F_DUPFD_CLOEXEC, HIGH_FDS + (int)rnd(64)) : i ? dup(nul) : nul;
  if (how >= 2 && nul >= 0) close(nul);
  int lo = 4096, hi = -1;
  for (int i = 0; i < n; i++) {
    if (f[i] < 0) continue;
    lo = f[i] < lo ? f[i] : lo;
    hi = f[i] > hi ? f[i] : hi;
  }
  op_begin("the program closes its own", (uint64_t)lo, (uint64_t)how);
  errno = SENT;
  if (how == 0) { // each by itself
    for (int i = 0; i < n; i++)
      if (f[i] >= 0 && close_range((unsigned)f[i], (unsigned)f[i], 0)) r = errno;
  } else if (how == 1) { // a run of its own numbers (other threads' may lie between: one by one)
    int run = hi - lo + 1 == n;
    for (int i = 0; run && i < n; i++) run = f[i] >= 0;
    if (run && close_range((unsigned)lo, (unsigned)hi, 0)) r = errno;
    for (int i = 0; !run && i < n; i++)
      if (f[i] >= 0 && close_range((unsigned)f[i], (unsigned)f[i], 0)) r = errno;
  } else if (lo < 4096) {
    if (how == 2) closefrom(lo);
    else if (close_range((unsigned)lo, ~0U, 0)) r = errno;
  }
  if (!r) errno_kept("errno changed by the program's close_range/closefrom", lo);
  op_end(r);
  if (r) failed("the program's close_range", lo, r);
  for (int i = 0; how >= 2 && i < n; i++)
    if (f[i] >= 0 && fcntl(f[i], F_GETFD) >= 0) failed("a number closefrom left open", f[i], 0);
  if (how >= 2) pthread_mutex_unlock(&high_mu);
}

// Short-lived contexts as a library beside the program makes them (the program holds each GPU's
// primary context from the start, and each worker's current context is one of them): the primary
// context retained and released by a second holder, which ends nothing; with `ctx`, a context
// created (current while it lives), an allocation made in it at R+5M (CUDA's chunk of 256 KiB,
// in a range of its own) and registered, then the context destroyed: the fake libcuda frees the
// chunk as CUDA does (UVM and RM frees), the truth ends it, and registrations over it from then
// on are violations. Either way the program's allocations of other contexts live on:
// registrations of them keep working.
typedef struct {
  lay_t *l;
  int ci, ai;
} ctx_chunk_t;
static void ctx_chunk_ends(void *arg) {
  ctx_chunk_t *k = arg;
  chunk_t *c = &k->l->c[k->ci];
  t_uvm_free(c->va, c->len);
  truth_end_range(c->va, c->va + c->len);
  t_free_mem(c->gmem, k->l->reg, c->slot);
  c->live = 0;
  if (k->ai >= 0) k->l->a[k->ai].live = 0;
}
static void ctx_op(lay_t *l) {
  void *c = NULL;
  int g = (int)rnd(2), r;
  count(K_CTX);
  errno = SENT;
  if (!ctx_created_on || rnd(2)) {
    note("cuDevicePrimaryCtxRetain+Release", (uint64_t)g, 0, 0);
    r = ctx_retain(&c, g);
    if (!r) r = ctx_release(g);
  } else {
    note("cuCtxCreate+Destroy", (uint64_t)g, 0, 0);
    r = ctx_create(&c, 0, g);
    uint64_t va = RBASE + (uint64_t)l->reg * RSIZE + 0x500000ull, len = 4 * K64;
    int taken = 0;
    for (int i = 0; i < l->nc; i++) taken |= l->c[i].live && l->c[i].va == va;
    ctx_chunk_t k = {l, -1, -1};
    if (!r && !taken && l->nc < 10) {
      t_range(va, len);
      if ((k.ci = new_chunk(l, va, len, 1 << g, 1, 0)) < 0) t_uvm_free(va, len);
    }
    if (k.ci >= 0) {
      if (ctx_at_end(c, ctx_chunk_ends, &k)) failed("fakecuda_at_end", (long)va, 0);
      int na = l->na;
      new_alloc(l, k.ci, 0, page(1 + rnd(16)), (int)rnd(2), 0);
      if (l->na > na) {
        count(K_CTX_ALLOC);
        k.ai = na;
        reg_range(l, va, l->a[na].len, 1);
      }
    }
    if (!r) {
      freeing(l->reg, 1);
      if (k.ci >= 0) unreg_over(l, va, len);
      r = ctx_destroy(c);
      freeing(l->reg, 0);
      if (k.ci >= 0) reg_range(l, va, page(1), 0);
    }
  }
  if (r) failed("a short-lived context", g, r);
  else errno_kept("errno changed by a context call", g);
}

// Registers over another thread's live allocation (not while its owner releases anything there).
static void borrow(void) {
  int reg = (int)rnd(REGIONS);
  uint64_t va = 0, len = 0;
  pthread_mutex_lock(&bmu);
  int ok = __atomic_load_n(&rstate[reg], __ATOMIC_ACQUIRE) == 1 && !rfreeing[reg];
  if (ok) rborrow[reg]++;
  pthread_mutex_unlock(&bmu);
  if (!ok) return;
  pthread_mutex_lock(&tmu);
  for (int i = 0; i < truth[reg].n; i++)
    if (!truth[reg].r[i].ended && truth[reg].r[i].whole && truth[reg].r[i].settled &&
        (!va || rnd(2)))
      va = truth[reg].r[i].va, len = truth[reg].r[i].end - va;
  pthread_mutex_unlock(&tmu);
  if (va) {
    count(K_BORROW);
    long f = fails;
    if (dmabuf_route && rnd(2)) export_range(NULL, va, len, 1);
    else reg_range(NULL, va, len, 1);
    if (fails != f && fails <= 20) {
      say("  (region %d's owner, thread %d:)\n", reg, rowner[reg]);
      say_ring_of(rowner[reg], 24);
    }
  }
  __atomic_sub_fetch(&rborrow[reg], 1, __ATOMIC_RELEASE);
}
#include "stress_cycle.h"
#include "stress_main.h"
