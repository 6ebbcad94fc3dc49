// The lab's hosts and faults (ours, test only): see fakelab.h. Compiled into the fake
// libibverbs.so.1 and into fakesys.so; nothing here calls through a hook of fakesys (the fault
// file is read with syscall-level calls), so fakesys may use it from inside its own hooks.
#define _GNU_SOURCE
#include "fakelab.h"
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

const int fw_gid_type[FW_NGIDS] = {1, 2, 1, 2};

void fw_host_of(int n, fw_host *h) {
  memset(h, 0, sizeof *h);
  h->n = n;
  unsigned low = 0x4455u + (unsigned)n, ip = (unsigned)n + 1;
  snprintf(h->dev, sizeof h->dev, "fwroce_%d", n);
  snprintf(h->ndev, sizeof h->ndev, "fwnet%d", n);
  snprintf(h->pci, sizeof h->pci, "0000:%02x:00.0", 0x40 + n);
  snprintf(h->name, sizeof h->name, "labhost%d", n);
  const uint8_t eui[8] = {0x02, 0x11, 0x22, 0xff, 0xfe, 0x33, (uint8_t)(low >> 8), (uint8_t)low};
  memcpy(h->guid, eui, 8);
  for (int i = 0; i < 2; i++) { // link-local: fe80::<EUI-64>
    h->gid[i][0] = 0xfe;
    h->gid[i][1] = 0x80;
    memcpy(h->gid[i] + 8, eui, 8);
  }
  for (int i = 2; i < 4; i++) { // IPv4-mapped ::ffff:10.0.a.b
    h->gid[i][10] = 0xff;
    h->gid[i][11] = 0xff;
    h->gid[i][12] = 10;
    h->gid[i][14] = (uint8_t)(ip >> 8);
    h->gid[i][15] = (uint8_t)ip;
  }
}

static fw_host me;
static pthread_once_t me_once = PTHREAD_ONCE_INIT;
static int me_env;
static void me_init(void) {
  const char *v = getenv("FAKEWIRE_HOST");
  int n = 0;
  if (v && *v) {
    char *end;
    long x = strtol(v, &end, 10);
    if (*end || x < 0 || x >= FW_MAXHOSTS) {
      fprintf(stderr, "fakewire: FAKEWIRE_HOST=%s is no host number 0..%d\n", v, FW_MAXHOSTS - 1);
      abort();
    }
    n = (int)x;
    me_env = 1;
  }
  fw_host_of(n, &me);
}
const fw_host *fw_me(void) {
  pthread_once(&me_once, me_init);
  return &me;
}
int fw_host_env(void) {
  pthread_once(&me_once, me_init);
  return me_env;
}

int fw_gid_host(const uint8_t g[16]) {
  static const uint8_t ll[14] = {0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0x02, 0x11, 0x22, 0xff, 0xfe, 0x33};
  static const uint8_t v4[13] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10};
  int n = -1;
  if (!memcmp(g, ll, sizeof ll)) n = (g[14] << 8 | g[15]) - 0x4455;
  else if (!memcmp(g, v4, sizeof v4) && g[13] == 0) n = (g[14] << 8 | g[15]) - 1;
  return n >= 0 && n < FW_MAXHOSTS ? n : -1;
}

const char *fw_lab_dir(void) {
  const char *d = getenv("FAKEWIRE_LAB");
  return d && *d ? d : NULL;
}

// ---- the fault file ----
enum { F_DOWN = 1, F_CORRUPT = 2, F_NO_DMABUF = 4, F_PEERMEM = 8 };
#define FW_MAXLINKS 512
typedef struct {
  int a, b, flags;
  double cap;
} fault; // b < 0: every link of host a
static struct {
  fault f[FW_MAXLINKS];
  int n;
  dev_t dev;
  ino_t ino;
  off_t size;
  struct timespec mtime;
  int seen;
  int gate, gate_ms; // "gate N [MS]": the lab's whole wire, no host or link
} ft;
static pthread_mutex_t ft_mu = PTHREAD_MUTEX_INITIALIZER;

static void parse(char *text) {
  ft.n = 0;
  ft.gate = 0;
  for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
    char *hash = strchr(line, '#');
    if (hash) *hash = 0;
    char word[32], target[32];
    double mbps = 0;
    int k = sscanf(line, "%31s %31s %lf", word, target, &mbps);
    if (k < 2) continue;
    if (!strcmp(word, "gate")) { // not a host's or a link's: the whole lab
      ft.gate = atoi(target);
      ft.gate_ms = k == 3 ? (int)mbps : 0;
      continue;
    }
    fault x = {.b = -1};
    if (sscanf(target, "%d-%d", &x.a, &x.b) < 1 || x.a < 0 || x.a >= FW_MAXHOSTS ||
        x.b >= FW_MAXHOSTS) {
      fprintf(stderr, "fakewire: fault target '%s' is neither a host N nor a link A-B\n", target);
      continue;
    }
    if (!strcmp(word, "down")) x.flags = F_DOWN;
    else if (!strcmp(word, "corrupt")) x.flags = F_CORRUPT;
    else if (!strcmp(word, "no-dmabuf") && x.b < 0) x.flags = F_NO_DMABUF;
    else if (!strcmp(word, "peermem") && x.b < 0) x.flags = F_PEERMEM;
    else if (!strcmp(word, "cap") && k == 3 && mbps > 0) x.cap = mbps * 1e6;
    else {
      fprintf(stderr, "fakewire: unknown fault line '%s'\n", line);
      continue;
    }
    if (ft.n < FW_MAXLINKS) ft.f[ft.n++] = x;
  }
}
// Reads the file again when it is another file, or changed (size, mtime).
static void refresh(void) {
  char path[512];
  const char *f = getenv("FAKEWIRE_FAULTS"), *lab = fw_lab_dir();
  if (f && *f) snprintf(path, sizeof path, "%s", f);
  else if (lab) snprintf(path, sizeof path, "%s/faults", lab);
  else {
    ft.n = 0;
    ft.gate = 0;
    return;
  }
  struct stat st;
  if (syscall(SYS_newfstatat, AT_FDCWD, path, &st, 0)) {
    ft.n = 0;
    ft.gate = 0;
    ft.seen = 0;
    return;
  }
  if (ft.seen && st.st_dev == ft.dev && st.st_ino == ft.ino && st.st_size == ft.size &&
      st.st_mtim.tv_sec == ft.mtime.tv_sec && st.st_mtim.tv_nsec == ft.mtime.tv_nsec)
    return;
  int fd = (int)syscall(SYS_openat, AT_FDCWD, path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    ft.n = 0;
    ft.gate = 0;
    ft.seen = 0;
    return;
  }
  char buf[16384];
  ssize_t n = 0, k;
  while (n < (ssize_t)sizeof buf - 1 && (k = read(fd, buf + n, sizeof buf - 1 - (size_t)n)) > 0)
    n += k;
  close(fd);
  buf[n > 0 ? n : 0] = 0;
  parse(buf);
  ft.dev = st.st_dev;
  ft.ino = st.st_ino;
  ft.size = st.st_size;
  ft.mtime = st.st_mtim;
  ft.seen = 1;
}
static int touches(const fault *x, int a, int b) { // the fault applies to link a-b (b < 0: host a)
  if (x->b < 0) return x->a == a || (b >= 0 && x->a == b);
  return b >= 0 && ((x->a == a && x->b == b) || (x->a == b && x->b == a));
}
static int any(int a, int b, int flag) {
  pthread_mutex_lock(&ft_mu);
  refresh();
  int hit = 0;
  for (int i = 0; i < ft.n && !hit; i++) hit = (ft.f[i].flags & flag) && touches(&ft.f[i], a, b);
  pthread_mutex_unlock(&ft_mu);
  return hit;
}
static int host_only(int h, int flag) { // a host fault, not one of its links
  pthread_mutex_lock(&ft_mu);
  refresh();
  int hit = 0;
  for (int i = 0; i < ft.n && !hit; i++)
    hit = (ft.f[i].flags & flag) && ft.f[i].b < 0 && ft.f[i].a == h;
  pthread_mutex_unlock(&ft_mu);
  return hit;
}
int fw_fault_port_down(int h) { return host_only(h, F_DOWN); }
int fw_fault_link_down(int a, int b) { return any(a, b, F_DOWN); }
int fw_fault_corrupt(int a, int b) { return any(a, b, F_CORRUPT); }
int fw_fault_no_dmabuf(int h) { return host_only(h, F_NO_DMABUF); }
int fw_fault_peermem(int h) {
  const char *v = getenv("FAKEWIRE_PEERMEM");
  if (v && !strcmp(v, "1") && h == fw_me()->n) return 1;
  return host_only(h, F_PEERMEM);
}
double fw_fault_cap(int a, int b) {
  pthread_mutex_lock(&ft_mu);
  refresh();
  double cap = 0;
  for (int i = 0; i < ft.n; i++)
    if (ft.f[i].cap > 0 && touches(&ft.f[i], a, b) && (cap == 0 || ft.f[i].cap < cap))
      cap = ft.f[i].cap;
  pthread_mutex_unlock(&ft_mu);
  return cap;
}
int fw_fault_gate(int *ms) {
  pthread_mutex_lock(&ft_mu);
  refresh();
  int n = ft.gate;
  *ms = ft.gate_ms > 0 ? ft.gate_ms : 20000;
  pthread_mutex_unlock(&ft_mu);
  return n;
}
