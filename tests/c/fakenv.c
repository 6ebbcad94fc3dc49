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
  }
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
int ioctl(int fd, unsigned long req, void *arg) {
  static int (*real)(int, unsigned long, void *);
  if (!real) real = (int (*)(int, unsigned long, void *))dlsym(RTLD_NEXT, "ioctl");
  if (!is_fake(fd)) return real(fd, req, arg);
  if (!loaded) load();
  if (next_rec >= nrec) { errno = EINVAL; return -1; }
  rec_t *r = &recs[next_rec++];
  if (r->req != req) { fakenv_mismatches++; errno = EINVAL; return -1; }
  uint8_t *a = arg; uint64_t keep = 0;
  if (r->poff >= 0) memcpy(&keep, a + r->poff, 8);
  memcpy(a, r->arg, r->n);
  if (r->poff >= 0) { memcpy(a + r->poff, &keep, 8); if (keep && r->params) memcpy((void *)(uintptr_t)keep, r->params, r->pn); }
  return r->rc;
}
