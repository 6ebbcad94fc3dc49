// A fake NVIDIA driver for gdrshim's integration tests (ours). Preloaded *after* libgdrshim.so,
// so the shim's real ioctl is this one. For fds on the files of GDRSHIM_TEST_DEV_DIR it plays
// the kernel from a gdrshim capture (FAKENV_CAPTURE): each call takes the next recorded ioctl,
// checks the request word, writes the recorded result bytes back into the caller's argument
// (keeping the caller's own parameter pointer) and the recorded parameter bytes behind that
// pointer, and returns the recorded rc. Any other fd goes to libc.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

typedef struct { unsigned long req; int rc; size_t n; uint8_t *arg; long poff; size_t pn; uint8_t *params; } rec_t;
static rec_t *recs; static size_t nrec, next_rec;
static int loaded;
static int emulate_p2p; // only for GeForce-style captures, which carry no 503C traffic of their own
unsigned long fakenv_mismatches;

static int hexval(int c) { return c <= '9' ? c - '0' : (c | 32) - 'a' + 10; }
static uint8_t *unhex(const char *s, size_t *n) {
  size_t l = strcspn(s, " \n"); *n = l / 2; uint8_t *b = malloc(*n + 1);
  for (size_t i = 0; i < *n; i++) b[i] = hexval(s[2 * i]) << 4 | hexval(s[2 * i + 1]);
  return b;
}
static void load(void) {
  loaded = 1;
  const char *p = getenv("FAKENV_CAPTURE"); if (!p) return;
  FILE *f = fopen(p, "r"); if (!f) return;
  size_t cap = 0; char *line = NULL; ssize_t len;
  while ((len = getline(&line, &cap, f)) > 0) {
    if (line[0] != 'I') continue;
    char dev[8]; int fd, rc, off = 0; unsigned long req;
    if (sscanf(line, "I %7s %d %lx %d %n", dev, &fd, &req, &rc, &off) < 4) continue;
    recs = realloc(recs, (nrec + 1) * sizeof *recs);
    rec_t *r = &recs[nrec++]; memset(r, 0, sizeof *r); r->req = req; r->rc = rc; r->poff = -1;
    r->arg = unhex(line + off, &r->n);
    char *pp = strstr(line + off, " P ");
    if (pp) { long po; int o2; if (sscanf(pp, " P %ld %n", &po, &o2) == 1) { r->poff = po; r->params = unhex(pp + o2, &r->pn); } }
    if ((req & 0xff) == 0x2b && r->n >= 16 && *(uint32_t *)(r->arg + 12) == 0x503c) emulate_p2p = -1;
  }
  emulate_p2p = emulate_p2p == 0;
  free(line); fclose(f);
}
static int is_fake(int fd) {
  const char *d = getenv("GDRSHIM_TEST_DEV_DIR"); if (!d) return 0;
  struct stat a, b; char path[4096];
  if (fstat(fd, &a)) return 0;
  const char *names[] = {"nvidiactl", "nvidia-uvm", "nvidia0"};
  for (int i = 0; i < 3; i++) { snprintf(path, sizeof path, "%s/%s", d, names[i]); if (!stat(path, &b) && a.st_dev == b.st_dev && a.st_ino == b.st_ino) return 1; }
  return 0;
}
// ---- The kernel side of third-party P2P, for gdrshim's own 503C calls (nvidia-abi.md S3) ----
// Vidmem objects and UVM mappings are learned from the replayed records; 503C objects and their
// registrations follow RM's rules; fakenv_check() answers what nvidia_p2p_get_pages would.
typedef struct { uint32_t client, h; int vidmem; } memobj_t;
typedef struct { uint64_t base, len, off; uint32_t client, h; } map_t;
typedef struct { uint32_t client, parent, h, vaspaces; } p2p_t;
typedef struct { uint32_t client, p2p, h; uint64_t addr, size, off; } reg_t;
static memobj_t mems[8192]; static int nmems;
static map_t maps[8192]; static int nmaps;
static p2p_t p2ps[16]; static int np2p;
static reg_t regs[4096]; static int nregs;
unsigned long fakenv_p2p_calls, fakenv_p2p_errors;

static int mem_is_vidmem(uint32_t c, uint32_t h) { for (int i = 0; i < nmems; i++) if (mems[i].client == c && mems[i].h == h) return mems[i].vidmem; return 0; }
static p2p_t *find_p2p(uint32_t c, uint32_t h) { for (int i = 0; i < np2p; i++) if (p2ps[i].client == c && p2ps[i].h == h) return &p2ps[i]; return NULL; }
static void drop_regs(uint32_t c, uint32_t h) { for (int i = 0; i < nregs; i++) if (regs[i].client == c && regs[i].h == h) regs[i--] = regs[--nregs]; }

// What the replayed (libcuda) traffic did, once the kernel accepted it.
static void learn(unsigned long req, uint8_t *a) {
  uint32_t *w = (uint32_t *)a;
  if ((req & 0xff) == 0x2b && ((req >> 16) & 0x3fff) == 48 && !w[10] && nmems < 8192) mems[nmems++] = (memobj_t){w[0], w[2], w[3] == 0x40};
  if ((req & 0xff) == 0x29 && ((req >> 16) & 0x3fff) == 16 && !w[3]) {
    drop_regs(w[0], w[2]); // RM unregisters freed vidmem from every 503C of its client
  }
  if (req == 33 && nmaps < 8192) { uint64_t *q = (uint64_t *)a; maps[nmaps++] = (map_t){q[0], q[1], q[2], *(uint32_t *)(a + 9252), *(uint32_t *)(a + 9256)}; }
  if (req == 34 || req == 66) { uint64_t base = *(uint64_t *)a; for (int i = 0; i < nmaps; i++) if (maps[i].base == base) maps[i--] = maps[--nmaps]; }
}

// Emulates one of gdrshim's own 503C calls; returns 1 if it was one.
static int p2p_call(unsigned long req, uint8_t *a) {
  uint32_t *w = (uint32_t *)a;
  if ((req & 0xff) == 0x2b && ((req >> 16) & 0x3fff) == 32 && w[3] == 0x503c) {
    fakenv_p2p_calls++;
    for (int i = 0; i < np2p; i++) if (p2ps[i].client == w[0] && p2ps[i].parent == w[1]) { w[7] = 0x63; fakenv_p2p_errors++; return 1; }
    w[2] = 0xcaf00000 + np2p; p2ps[np2p++] = (p2p_t){w[0], w[1], w[2], 0}; w[7] = 0; return 1;
  }
  if ((req & 0xff) == 0x2a && ((req >> 16) & 0x3fff) == 32 && (w[2] >> 16) == 0x503c) {
    fakenv_p2p_calls++;
    p2p_t *o = find_p2p(w[0], w[1]); uint8_t *p = (uint8_t *)(uintptr_t)(*(uint64_t *)(w + 4));
    if (!o) { w[7] = 0x57; fakenv_p2p_errors++; return 1; }
    uint32_t st = 0;
    if (w[2] == 0x503c0102) { if (o->vaspaces) st = 0x19; else { o->vaspaces++; *(uint64_t *)(p + 8) = 0xfe00; } }
    else if (w[2] == 0x503c0104) {
      uint32_t h = *(uint32_t *)p; uint64_t ad = *(uint64_t *)(p + 8), sz = *(uint64_t *)(p + 16), of = *(uint64_t *)(p + 24);
      if (!mem_is_vidmem(w[0], h)) st = 0x57;
      else if (!sz || (ad | sz | of) & 0xffff) st = 0x1f;
      else for (int i = 0; i < nregs; i++) if (regs[i].p2p == w[1] && (regs[i].h == h || (ad < regs[i].addr + regs[i].size && regs[i].addr < ad + sz))) st = 0x19;
      if (!st) regs[nregs++] = (reg_t){w[0], w[1], h, ad, sz, of};
    } else if (w[2] == 0x503c0105) {
      uint32_t h = *(uint32_t *)p; int found = 0;
      for (int i = 0; i < nregs; i++) if (regs[i].p2p == w[1] && regs[i].h == h) { regs[i--] = regs[--nregs]; found = 1; }
      if (!found) st = 0x57;
    } else st = 0x24;
    if (st) fakenv_p2p_errors++;
    w[7] = st; return 1;
  }
  if ((req & 0xff) == 0x29 && ((req >> 16) & 0x3fff) == 16 && find_p2p(w[0], w[2])) {
    fakenv_p2p_calls++;
    for (int i = 0; i < nregs; i++) if (regs[i].p2p == w[2]) regs[i--] = regs[--nregs];
    for (int i = 0; i < np2p; i++) if (p2ps[i].h == w[2]) p2ps[i--] = p2ps[--np2p];
    w[3] = 0; return 1;
  }
  return 0;
}

// nvidia_p2p_get_pages for [va, va+len) of this process: 1 host memory, 0 registered exactly
// right, -1 not (EFAULT at ibv_reg_mr).
int fakenv_check(uint64_t va, uint64_t len) {
  uint64_t lo = va & ~0xffffull, hi = (va + len + 0xffff) & ~0xffffull;
  map_t *m = NULL;
  for (int i = 0; i < nmaps; i++) if (va >= maps[i].base && va < maps[i].base + maps[i].len) m = &maps[i];
  if (!m) return 1;
  int hits = 0; reg_t *hit = NULL;
  for (int i = 0; i < nregs; i++) {
    p2p_t *o = find_p2p(regs[i].client, regs[i].p2p);
    if (o && o->vaspaces == 1 && lo >= regs[i].addr && hi <= regs[i].addr + regs[i].size) { hits++; hit = &regs[i]; }
  }
  if (hits != 1) return -1;
  // the right memory at the right offset, for every byte of the range
  if (hit->client != m->client || hit->h != m->h) return -1;
  if (hit->off + (va - hit->addr) != m->off + (va - m->base)) return -1;
  if (va + len > m->base + m->len) return -1;
  return 0;
}
int fakenv_live_registrations(void) { return nregs; }
int fakenv_p2p_objects(void) { return np2p; }

int ioctl(int fd, unsigned long req, void *arg) {
  static int (*real)(int, unsigned long, void *);
  if (!real) real = (int (*)(int, unsigned long, void *))dlsym(RTLD_NEXT, "ioctl");
  if (!is_fake(fd)) return real(fd, req, arg);
  if (!loaded) load();
  if (arg && emulate_p2p && p2p_call(req, arg)) return 0;
  if (next_rec >= nrec) { errno = EINVAL; return -1; }
  rec_t *r = &recs[next_rec++];
  if (r->req != req) { fakenv_mismatches++; errno = EINVAL; return -1; }
  uint8_t *a = arg; uint64_t keep = 0;
  if (r->poff >= 0) memcpy(&keep, a + r->poff, 8);
  memcpy(a, r->arg, r->n);
  if (r->poff >= 0) { memcpy(a + r->poff, &keep, 8); if (keep && r->params) memcpy((void *)(uintptr_t)keep, r->params, r->pn); }
  if (r->rc == 0) learn(req, a);
  return r->rc;
}
