// The stress test's ground truth and its oracle (tests/c/stress.c includes it once).
//
// The truth: which bytes are the program's own live allocations at every instant, as libcuda
// counts them (an allocation carved from a longer mapping reaches to that mapping's end; a range
// must start in an allocation's own bytes; an import or a cuMemMap counts exactly), per VA and
// per memory (RM handle and its generation: the program reuses handle numbers). It is written by
// the program around its own calls: an allocation is the program's from just before the CUDA
// call that hands it over (so the truth never lags gdrshim), and ends just after the call that
// ends it returns (a program release, an RM free, other memory mapped over it, the last GPU's
// unmap). A registration or export is judged against every allocation live at some instant
// between the start of the program's call that caused it and the check (a release in flight
// meanwhile is the program's own race, not gdrshim's).
//
// The oracle runs in the fake driver (fakerm.c's fakerm_oracle, under its lock) at each export
// piece, REGISTER_VIDMEM, NIC registration and release. A violation is an export piece or an MR
// over bytes that are not the program's, a REGISTER_VIDMEM not for the registration being made,
// an MR given a buffer that is not the memory at its address, and a REGISTER_VIDMEM or a dma-buf
// fd of gdrshim's still holding memory or a mapping the driver is about to release.
#pragma once
#include <stdarg.h>

#define REGIONS 48
#define RSIZE 0x800000ull // a region: 8 MiB of VA, used by one thread at a time
#define RBASE (BASE + 0x100000000ull)
#define MB2 0x200000ull
#define MAXREC 64
#define H_PROG(r, s) (0xbe000000u | ((uint32_t)(r) << 8) | (uint32_t)(s))

enum {
  ORACLE_EXPORT = 1,
  ORACLE_VIDMEM,
  ORACLE_NIC_VA,
  ORACLE_NIC_DMABUF,
  ORACLE_OUTLIVED_REG,
  ORACLE_OUTLIVED_BUF,
  ORACLE_RELEASE
};
// how often the oracle was asked: export pieces, REGISTER_VIDMEMs, NIC registrations, releases
static unsigned long asked[4];

typedef struct {
  uint64_t va, end, reach; // own bytes [va, end); libcuda counts it on to reach
  uint64_t moff; // offset of va in its memory
  uint64_t ended; // 0 live, else the truth's sequence number when it ended
  uint32_t h, gen;
  int whole; // its mapping as it was made (0: part of one other memory was mapped over)
  int settled; // the CUDA call that made it has returned (gdrshim has been told)
} rec_t;
typedef struct {
  rec_t r[MAXREC];
  int n;
  uint32_t gen[256]; // per handle slot: the generation RM has now
} treg_t;
static treg_t truth[REGIONS];
static pthread_mutex_t tmu = PTHREAD_MUTEX_INITIALIZER;
static uint64_t tseq = 1;
static uint32_t prog_client;
static long violations;
static unsigned char prog_fd[4096]; // numbers that are the program's own files now

// This thread's call in progress (the oracle's window) and its last operations (for a report).
typedef struct {
  const char *what;
  uint64_t va, len;
  long rc;
} opl_t;
static __thread int op_on, tid_no;
static __thread uint64_t op_s, op_va, op_len;
static opl_t rings[258][24]; // per thread (workers, the churn, main): read by a report on another
static unsigned ring_ats[258];
#define ring rings[tid_no]
#define ring_at ring_ats[tid_no]

static void op_begin(const char *what, uint64_t va, uint64_t len) {
  ring[ring_at++ % 24] = (opl_t){what, va, len, -999};
  op_va = va, op_len = len, op_s = __atomic_load_n(&tseq, __ATOMIC_SEQ_CST), op_on = 1;
}
// A call of the program's that is no registration, in the ring only.
static void note(const char *what, uint64_t va, uint64_t len, long rc) {
  ring[ring_at++ % 24] = (opl_t){what, va, len, rc};
}
static void op_end(long rc) {
  op_on = 0;
  ring[(ring_at - 1) % 24].rc = rc;
}
// A line to stderr by write(2) (safe under the fake driver's lock).
static void say(const char *fmt, ...) {
  char b[512];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(b, sizeof b, fmt, ap);
  va_end(ap);
  if (n > (int)sizeof b - 1) n = sizeof b - 1;
  if (n > 0 && write(2, b, (size_t)n) < 0) {}
}
// Thread t's last `n` operations.
static void say_ring_of(int t, unsigned n) {
  unsigned at = ring_ats[t];
  for (unsigned i = at > n ? at - n : 0; i < at; i++) {
    opl_t *o = &rings[t][i % 24];
    say("  thread %d op %u: %s [%#lx, +%#lx) -> %ld\n", t, i, o->what, (unsigned long)o->va,
        (unsigned long)o->len, o->rc);
  }
}
static void say_ring(unsigned n) { say_ring_of(tid_no, n); }
// Violations by kind (the first 16 kinds), for the run's last lines.
static const char *vkinds[16];
static long vcounts[16];
static long count_kind(const char *what) { // this kind's count, with this one
  for (int i = 0; i < 16; i++) {
    const char *k = __atomic_load_n(&vkinds[i], __ATOMIC_ACQUIRE);
    if (!k) {
      const char *none = NULL;
      if (!__atomic_compare_exchange_n(&vkinds[i], &none, what, 0, __ATOMIC_ACQ_REL,
                                       __ATOMIC_ACQUIRE) &&
          none != what)
        continue;
      k = what;
    }
    if (k == what) return __atomic_add_fetch(&vcounts[i], 1, __ATOMIC_RELAXED);
  }
  return 1;
}
// Counted; the first three of each kind are shown with the thread's last operations.
static void violation(const char *what, uint64_t a, uint64_t b) {
  long k = count_kind(what);
  __atomic_add_fetch(&violations, 1, __ATOMIC_SEQ_CST);
  if (k > 3) return;
  say("VIOLATION %s: %#lx %#lx (thread %d, in %s [%#lx, +%#lx))\n", what, (unsigned long)a,
      (unsigned long)b, tid_no, op_on ? ring[(ring_at - 1) % 24].what : "no call",
      (unsigned long)op_va, (unsigned long)op_len);
  say_ring(24);
}

static int region_of(uint64_t va) {
  return va < RBASE || va >= RBASE + REGIONS * RSIZE ? -1 : (int)((va - RBASE) / RSIZE);
}
static int live_in(const rec_t *r, uint64_t s) { return !r->ended || r->ended > s; }

// ---- the program writes the truth (each under tmu) ----
static uint64_t tick(void) { return __atomic_add_fetch(&tseq, 1, __ATOMIC_SEQ_CST); }
static void truth_gen(int reg, int slot) {
  pthread_mutex_lock(&tmu);
  truth[reg].gen[slot]++;
  pthread_mutex_unlock(&tmu);
}
// [va, va+len) is the program's from now, carved from memory (reg, slot) at moff, counted to reach.
static void truth_begin(uint64_t va, uint64_t len, uint64_t reach, int slot, uint64_t moff) {
  int reg = region_of(va);
  pthread_mutex_lock(&tmu);
  treg_t *t = &truth[reg];
  if (t->n ==
      MAXREC) { // the oldest ended record goes (no call of another thread can be in its window)
    int k = 0;
    for (; k < t->n && !t->r[k].ended; k++) {}
    if (k == t->n) {
      pthread_mutex_unlock(&tmu);
      say("truth full\n");
      abort();
    }
    t->r[k] = t->r[--t->n];
  }
  t->r[t->n++] = (rec_t){va,           va + len, reach > va + len ? reach : va + len,
                         moff,         0,        H_PROG(reg, slot),
                         t->gen[slot], 1,        0};
  pthread_mutex_unlock(&tmu);
}
// The CUDA call that made the allocation at va returned.
static void truth_settled(uint64_t va) {
  int reg = region_of(va);
  pthread_mutex_lock(&tmu);
  for (int i = 0; i < truth[reg].n; i++)
    if (!truth[reg].r[i].ended && truth[reg].r[i].va == va) truth[reg].r[i].settled = 1;
  pthread_mutex_unlock(&tmu);
}
// The allocation that starts at va ends (cuMemFree).
static void truth_free_at(uint64_t va) {
  int reg = region_of(va);
  uint64_t s = tick();
  pthread_mutex_lock(&tmu);
  for (int i = 0; i < truth[reg].n; i++)
    if (!truth[reg].r[i].ended && truth[reg].r[i].va == va) truth[reg].r[i].ended = s;
  pthread_mutex_unlock(&tmu);
}
// [va, end) is the program's no longer (cuMemUnmap, memory mapped over it, the last GPU's unmap):
// an allocation in it ends, one across either end keeps its part outside (a part below reaches
// no further than its new end), and a reach into it stops at va.
static void truth_end_range(uint64_t va, uint64_t end) {
  uint64_t s = tick();
  pthread_mutex_lock(&tmu);
  for (int reg = 0; reg < REGIONS; reg++) {
    if (RBASE + (uint64_t)(reg + 1) * RSIZE <= va || RBASE + (uint64_t)reg * RSIZE >= end) continue;
    treg_t *t = &truth[reg];
    for (int i = 0, n = t->n; i < n; i++) {
      rec_t r = t->r[i];
      if (r.ended) continue;
      if (r.va < va && r.reach > va) t->r[i].reach = va > r.end ? va : r.end;
      if (!(r.va < end && va < r.end)) continue;
      t->r[i].ended = s;
      if (r.va < va && t->n < MAXREC)
        t->r[t->n++] = (rec_t){r.va, va, va, r.moff, 0, r.h, r.gen, 0, 1};
      if (r.end > end && t->n < MAXREC)
        t->r[t->n++] = (rec_t){end, r.end, r.reach, r.moff + (end - r.va), 0, r.h, r.gen, 0, 1};
    }
  }
  pthread_mutex_unlock(&tmu);
}
// Memory (reg, slot) is freed by RM: every allocation over it ends.
static void truth_end_mem(int reg, int slot) {
  uint64_t s = tick();
  uint32_t h = H_PROG(reg, slot);
  pthread_mutex_lock(&tmu);
  for (int i = 0; i < truth[reg].n; i++)
    if (!truth[reg].r[i].ended && truth[reg].r[i].h == h) truth[reg].r[i].ended = s;
  pthread_mutex_unlock(&tmu);
}
static void truth_clear(int reg) {
  pthread_mutex_lock(&tmu);
  truth[reg].n = 0;
  pthread_mutex_unlock(&tmu);
}

// ---- the oracle's judgements (tmu held) ----
// Every byte of memory h's [off, off+size) lies in allocations of the program's over that memory
// as RM has it now (its current generation), live in the window from s.
static int mem_covered(uint32_t h, uint64_t off, uint64_t size, uint64_t s) {
  if ((h & 0xffff0000u) != 0xbe000000u || ((h >> 8) & 0xff) >= REGIONS) return 0;
  treg_t *t = &truth[(h >> 8) & 0xff];
  uint32_t g = t->gen[h & 0xff];
  for (uint64_t at = off, end = off + size; at < end;) {
    uint64_t next = at;
    for (int i = 0; i < t->n; i++) {
      rec_t *r = &t->r[i];
      if (r->h == h && r->gen == g && live_in(r, s) && r->moff <= at &&
          at < r->moff + (r->reach - r->va) && r->moff + (r->reach - r->va) > next)
        next = r->moff + (r->reach - r->va);
    }
    if (next == at) return 0;
    at = next;
  }
  return 1;
}
// Some byte of memory h's [off, off+size) is the program's own (live in the window from s).
static int mem_touched(uint32_t h, uint64_t off, uint64_t size, uint64_t s) {
  if ((h & 0xffff0000u) != 0xbe000000u || ((h >> 8) & 0xff) >= REGIONS) return 0;
  treg_t *t = &truth[(h >> 8) & 0xff];
  uint32_t g = t->gen[h & 0xff];
  for (int i = 0; i < t->n; i++) {
    rec_t *r = &t->r[i];
    if (r->h == h && r->gen == g && live_in(r, s) && r->moff < off + size &&
        off < r->moff + (r->end - r->va))
      return 1;
  }
  return 0;
}
// [va, va+len) as libcuda counts it: it starts in an allocation's own bytes, and each allocation
// it reaches (to its reach) ends where another's own bytes start, to the end.
static int va_covered(uint64_t va, uint64_t len, uint64_t s) {
  for (uint64_t at = va, end = va + len; at < end;) {
    int reg = region_of(at);
    uint64_t next = at;
    for (int i = 0; reg >= 0 && i < truth[reg].n; i++) {
      rec_t *r = &truth[reg].r[i];
      if (live_in(r, s) && r->va <= at && at < r->end && r->reach > next) next = r->reach;
    }
    if (next == at) return 0;
    at = next;
  }
  return 1;
}

// fakerm_oracle: called by the fake driver under its lock, on the thread whose call caused it.
static void oracle(int kind, uint32_t c, uint32_t h, uint64_t x, uint64_t y, uint64_t z) {
  int e = errno;
  pthread_mutex_lock(&tmu);
  uint64_t s = op_on ? op_s : __atomic_load_n(&tseq, __ATOMIC_SEQ_CST);
  int which = kind == ORACLE_EXPORT       ? 0
              : kind == ORACLE_VIDMEM     ? 1
              : kind <= ORACLE_NIC_DMABUF ? 2
                                          : 3;
  asked[which]++;
  switch (kind) {
  case ORACLE_EXPORT:
    if (c != prog_client || !mem_covered(h, x, y, s))
      violation("an export piece over memory that is not the program's", h, x);
    break;
  case ORACLE_VIDMEM:
    if (!op_on) violation("REGISTER_VIDMEM outside any registration call", x, y);
    else if (c != prog_client || !mem_touched(h, z, y, s))
      violation("REGISTER_VIDMEM over memory with no allocation of the program's", h, x);
    else if (op_va >= x + y || x >= op_va + op_len)
      violation("REGISTER_VIDMEM not over the range being registered", x, y);
    break;
  case ORACLE_NIC_VA:
    if (!va_covered(x, y, s))
      violation("the NIC registered bytes that are not the program's", x, y);
    break;
  case ORACLE_NIC_DMABUF:
    if (z) violation("an MR given a buffer that is not the memory at its address", x, z);
    else if (!va_covered(x, y, s))
      violation("a dma-buf MR over bytes that are not the program's", x, y);
    break;
  case ORACLE_RELEASE: break; // (the fake's checks of what outlives it follow)
  case ORACLE_OUTLIVED_REG:
    violation("a REGISTER_VIDMEM outlives the memory or mapping the driver releases", x, y);
    break;
  case ORACLE_OUTLIVED_BUF:
    if (x >= 4096 || !__atomic_load_n(&prog_fd[x], __ATOMIC_SEQ_CST))
      violation("a dma-buf fd of gdrshim's holds memory RM frees", h, x);
    break;
  default: violation("unknown oracle call", (uint64_t)kind, 0);
  }
  pthread_mutex_unlock(&tmu);
  errno = e;
}
