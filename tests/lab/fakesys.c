// The consumer lab's sysfs for the fake wire (ours, test only; LD_PRELOAD): consumers read the
// HCA's sysfs files beside the verbs calls (UCX: the GID types and net devices of a RoCE port;
// Mooncake: the device list and PCI path; UCX: /dev/infiniband/uverbs0), and /sys cannot be
// written here. Any path under /sys/ or /dev/infiniband/ that exists in the tree $FAKEWIRE_SYSFS (default /tmp/fakewire-sys) is opened from there
// instead; the rest of /sys is untouched. The tree is made at start-up when missing: one RoCE v2
// port of FW_DEV_NAME (as fakewire.c answers it) on a fake PCI function 0000:00:1f.0, and, with
// FAKEWIRE_PEERMEM=1, the file by which consumers see nvidia-peermem loaded.
#define _GNU_SOURCE
#include "fakewire.h"
#include <dirent.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

static char root[256];
static int exists(const char *p) { return syscall(SYS_faccessat, AT_FDCWD, p, F_OK, 0) == 0; }
// The tree's path for p (in buf), or p itself.
static const char *map(const char *p, char *buf, size_t n) {
  if (!p || (strncmp(p, "/sys/", 5) && strncmp(p, "/dev/infiniband/", 16)) || !root[0]) return p;
  snprintf(buf, n, "%s%s", root, p);
  return exists(buf) ? buf : p;
}
static void put(const char *rel, const char *text) {
  char p[512]; snprintf(p, sizeof p, "%s/%s", root, rel);
  for (char *s = p + strlen(root) + 1; (s = strchr(s, '/')); s++) { *s = 0; mkdir(p, 0755); *s = '/'; }
  FILE *f = fopen(p, "w"); if (f) { fputs(text, f); fclose(f); }
}
static void link_(const char *target, const char *rel) {
  char p[512]; snprintf(p, sizeof p, "%s/%s", root, rel);
  for (char *s = p + strlen(root) + 1; (s = strchr(s, '/')); s++) { *s = 0; mkdir(p, 0755); *s = '/'; }
  if (symlink(target, p)) { /* made by an earlier process */ }
}
__attribute__((constructor)) static void make_tree(void) {
  const char *r = getenv("FAKEWIRE_SYSFS");
  int peermem = getenv("FAKEWIRE_PEERMEM") && !strcmp(getenv("FAKEWIRE_PEERMEM"), "1");
  snprintf(root, sizeof root, "%s", r && *r ? r : peermem ? "/tmp/fakewire-sys-peermem" : "/tmp/fakewire-sys");
  char ready[300]; snprintf(ready, sizeof ready, "%s/.ready", root);
  if (exists(ready)) return;
  mkdir(root, 0755);
  const char *dev = "sys/devices/pci0000:00/0000:00:1f.0";
  char p[512], v[512];
  snprintf(p, sizeof p, "%s/numa_node", dev); put(p, "0\n");
  snprintf(p, sizeof p, "%s/vendor", dev); put(p, "0x1d1d\n");
  snprintf(p, sizeof p, "%s/device", dev); put(p, "0xfa4e\n");
  // what NCCL's topology reads of a NIC's PCI function (a network controller on a Gen4 x16 link)
  snprintf(p, sizeof p, "%s/class", dev); put(p, "0x020000\n");
  snprintf(p, sizeof p, "%s/subsystem_vendor", dev); put(p, "0x1d1d\n");
  snprintf(p, sizeof p, "%s/subsystem_device", dev); put(p, "0x0001\n");
  const char *link[][2] = {{"max_link_speed", "16.0 GT/s PCIe\n"}, {"current_link_speed", "16.0 GT/s PCIe\n"}, {"max_link_width", "16\n"}, {"current_link_width", "16\n"}};
  for (unsigned i = 0; i < sizeof link / sizeof *link; i++) snprintf(p, sizeof p, "%s/%s", dev, link[i][0]), put(p, link[i][1]);
  snprintf(p, sizeof p, "%s/net/" FW_NDEV "/operstate", dev); put(p, "up\n");
  snprintf(p, sizeof p, "%s/net/" FW_NDEV "/mtu", dev); put(p, "9000\n");
  snprintf(p, sizeof p, "%s/infiniband/" FW_DEV_NAME "/node_type", dev); put(p, "1: CA\n");
  snprintf(p, sizeof p, "%s/infiniband/" FW_DEV_NAME "/ports/1/state", dev); put(p, "4: ACTIVE\n");
  snprintf(p, sizeof p, "%s/infiniband/" FW_DEV_NAME "/ports/1/link_layer", dev); put(p, "Ethernet\n");
  snprintf(p, sizeof p, "%s/infiniband/" FW_DEV_NAME "/ports/1/rate", dev); put(p, "200 Gb/sec (4X HDR)\n");
  for (int i = 0; i < FW_NGIDS; i++) {
    const uint8_t *g = fw_gids[i].raw;
    snprintf(p, sizeof p, "%s/infiniband/" FW_DEV_NAME "/ports/1/gid_attrs/types/%d", dev, i); put(p, fw_gid_type[i] == 2 ? "RoCE v2\n" : "IB/RoCE v1\n");
    snprintf(p, sizeof p, "%s/infiniband/" FW_DEV_NAME "/ports/1/gid_attrs/ndevs/%d", dev, i); put(p, FW_NDEV "\n");
    snprintf(p, sizeof p, "%s/infiniband/" FW_DEV_NAME "/ports/1/gids/%d", dev, i);
    char t[64]; snprintf(t, sizeof t, "%02x%02x:%02x%02x:%02x%02x:%02x%02x:%02x%02x:%02x%02x:%02x%02x:%02x%02x\n", g[0], g[1], g[2], g[3], g[4], g[5], g[6], g[7], g[8], g[9], g[10], g[11], g[12], g[13], g[14], g[15]);
    put(p, t);
  }
  snprintf(v, sizeof v, "%s/%s", root, dev);
  snprintf(p, sizeof p, "%s/sys/devices/pci0000:00/0000:00:1f.0/infiniband/" FW_DEV_NAME, root);
  char dpath[600]; snprintf(dpath, sizeof dpath, "%s/device", p); if (symlink(v, dpath)) {}
  link_(p, "sys/class/infiniband/" FW_DEV_NAME);
  link_(v, "sys/bus/pci/devices/0000:00:1f.0");
  link_("/dev/null", "dev/infiniband/uverbs0"); // consumers check that the device's char file exists (UCX: a readable, writable char device)
  if (peermem) put("sys/kernel/mm/memory_peers/nv_mem/version", "1.0-fakewire\n"), put("sys/module/nvidia_peermem/version", "1.0-fakewire\n");
  put(".ready", "");
}

#define NEXT(ret, name, ...) static ret (*next)(__VA_ARGS__); if (!next) next = (ret (*)(__VA_ARGS__))dlsym(RTLD_NEXT, name)
int open(const char *p, int fl, ...) {
  va_list ap; va_start(ap, fl); mode_t m = va_arg(ap, mode_t); va_end(ap);
  NEXT(int, "open", const char *, int, ...); char b[512]; return next(map(p, b, sizeof b), fl, m);
}
int open64(const char *p, int fl, ...) {
  va_list ap; va_start(ap, fl); mode_t m = va_arg(ap, mode_t); va_end(ap);
  NEXT(int, "open64", const char *, int, ...); char b[512]; return next(map(p, b, sizeof b), fl, m);
}
int openat(int d, const char *p, int fl, ...) {
  va_list ap; va_start(ap, fl); mode_t m = va_arg(ap, mode_t); va_end(ap);
  NEXT(int, "openat", int, const char *, int, ...); char b[512]; return next(d, map(p, b, sizeof b), fl, m);
}
int openat64(int d, const char *p, int fl, ...) {
  va_list ap; va_start(ap, fl); mode_t m = va_arg(ap, mode_t); va_end(ap);
  NEXT(int, "openat64", int, const char *, int, ...); char b[512]; return next(d, map(p, b, sizeof b), fl, m);
}
FILE *fopen(const char *p, const char *m) { NEXT(FILE *, "fopen", const char *, const char *); char b[512]; return next(map(p, b, sizeof b), m); }
FILE *fopen64(const char *p, const char *m) { NEXT(FILE *, "fopen64", const char *, const char *); char b[512]; return next(map(p, b, sizeof b), m); }
DIR *opendir(const char *p) { NEXT(DIR *, "opendir", const char *); char b[512]; return next(map(p, b, sizeof b)); }
int stat(const char *p, struct stat *s) { NEXT(int, "stat", const char *, struct stat *); char b[512]; return next(map(p, b, sizeof b), s); }
int lstat(const char *p, struct stat *s) { NEXT(int, "lstat", const char *, struct stat *); char b[512]; return next(map(p, b, sizeof b), s); }
int stat64(const char *p, struct stat64 *s) { NEXT(int, "stat64", const char *, struct stat64 *); char b[512]; return next(map(p, b, sizeof b), s); }
// consumers built against glibc < 2.33 call stat through these
int __xstat(int v, const char *p, struct stat *s) { NEXT(int, "__xstat", int, const char *, struct stat *); char b[512]; return next(v, map(p, b, sizeof b), s); }
int __xstat64(int v, const char *p, struct stat64 *s) { NEXT(int, "__xstat64", int, const char *, struct stat64 *); char b[512]; return next(v, map(p, b, sizeof b), s); }
int __lxstat(int v, const char *p, struct stat *s) { NEXT(int, "__lxstat", int, const char *, struct stat *); char b[512]; return next(v, map(p, b, sizeof b), s); }
int __lxstat64(int v, const char *p, struct stat64 *s) { NEXT(int, "__lxstat64", int, const char *, struct stat64 *); char b[512]; return next(v, map(p, b, sizeof b), s); }
int access(const char *p, int m) { NEXT(int, "access", const char *, int); char b[512]; return next(map(p, b, sizeof b), m); }
char *realpath(const char *p, char *out) { NEXT(char *, "realpath", const char *, char *); char b[512]; return next(map(p, b, sizeof b), out); }
ssize_t readlink(const char *p, char *out, size_t n) { NEXT(ssize_t, "readlink", const char *, char *, size_t); char b[512]; return next(map(p, b, sizeof b), out, n); }
int scandir(const char *p, struct dirent ***l, int (*f)(const struct dirent *), int (*c)(const struct dirent **, const struct dirent **)) {
  NEXT(int, "scandir", const char *, struct dirent ***, int (*)(const struct dirent *), int (*)(const struct dirent **, const struct dirent **));
  char b[512]; return next(map(p, b, sizeof b), l, f, c);
}
