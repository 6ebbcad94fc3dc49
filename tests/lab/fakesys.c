// The consumer lab's sysfs and host name for the fake wire (ours, test only; LD_PRELOAD):
// consumers read the HCA's sysfs files beside the verbs calls (UCX: the GID types and net devices
// of a RoCE port; Mooncake: the device list and PCI path; NCCL: the PCI path, GID types; UCX:
// /dev/infiniband/uverbs0), and /sys cannot be written here. Any path under /sys/ or
// /dev/infiniband/ that exists in the tree $FAKEWIRE_SYSFS (default /tmp/fakewire-sys) is opened
// from there instead; the rest of /sys is untouched. The tree is made at start-up when missing:
// this lab host's HCA (fakelab.h: fwroce_N on PCI function 0000:NN:00.0, net device fwnetN, one
// RoCE v2 port) as fakewire.c answers it. Read on every call, from the lab's fault file: the
// port's state ("down N"), and nvidia-peermem's files ("peermem N", or FAKEWIRE_PEERMEM=1):
// present only then, absent otherwise whatever the machine has. A lab host (FAKEWIRE_HOST set)
// is also named labhostN to uname, gethostname and /proc/sys/kernel/hostname. For rdma-core's
// libibverbs (fwprovider.c is its provider) the tree also holds the uverbs class, /etc/libibverbs.d
// is an empty folder, RDMA netlink is absent, and its command fd answers the one command it sends.
#define _GNU_SOURCE
#include "fakelab.h"
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <linux/netlink.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <sys/utsname.h>
#include <unistd.h>

static char root[256];
static int exists(const char *p) { return syscall(SYS_faccessat, AT_FDCWD, p, F_OK, 0) == 0; }
static int starts(const char *p, const char *prefix) { return !strncmp(p, prefix, strlen(prefix)); }
static int ends(const char *p, const char *suffix) {
  size_t n = strlen(p), k = strlen(suffix);
  return n >= k && !strcmp(p + n - k, suffix);
}
// The tree's path for p (in buf), or p itself.
static const char *map(const char *p, char *buf, size_t n) {
  if (!p || !root[0]) return p;
  if (starts(p, "/sys/module/nvidia_peermem") || starts(p, "/sys/kernel/mm/memory_peers")) {
    // the lab says whether peermem is loaded: a path of the tree either way (absent: ENOENT)
    snprintf(buf, n, "%s/%s%s", root, fw_fault_peermem(fw_me()->n) ? "peermem" : "absent", p);
    return buf;
  }
  if (fw_host_env() && !strcmp(p, "/proc/sys/kernel/hostname")) {
    snprintf(buf, n, "%s/hostname", root);
    return buf;
  }
  if (strncmp(p, "/sys/", 5) && strncmp(p, "/dev/infiniband/", 16) && strncmp(p, "/etc/libibverbs.d", 17)) return p;
  int down = (ends(p, "/ports/1/state") || ends(p, "/ports/1/phys_state")) && fw_fault_port_down(fw_me()->n);
  snprintf(buf, n, "%s%s%s", root, p, down ? ".down" : "");
  return exists(buf) ? buf : p;
}
static void mkparents(char *p) {
  for (char *s = p + strlen(root) + 1; (s = strchr(s, '/')); s++) { *s = 0; mkdir(p, 0755); *s = '/'; }
}
static void put(const char *text, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(const char *text, const char *fmt, ...) {
  char rel[400], p[700];
  va_list ap; va_start(ap, fmt); vsnprintf(rel, sizeof rel, fmt, ap); va_end(ap);
  snprintf(p, sizeof p, "%s/%s", root, rel);
  mkparents(p);
  FILE *f = fopen(p, "w"); if (f) { fputs(text, f); fclose(f); }
}
static void link_(const char *target, const char *rel) {
  char p[700]; snprintf(p, sizeof p, "%s/%s", root, rel);
  mkparents(p);
  if (symlink(target, p)) { /* made by an earlier process */ }
}
__attribute__((constructor)) static void make_tree(void) {
  const char *r = getenv("FAKEWIRE_SYSFS");
  snprintf(root, sizeof root, "%s", r && *r ? r : "/tmp/fakewire-sys");
  char ready[300]; snprintf(ready, sizeof ready, "%s/.ready", root);
  if (exists(ready)) return;
  mkdir(root, 0755);
  const fw_host *h = fw_me();
  char dev[64], ib[128], v[700], p[700];
  snprintf(dev, sizeof dev, "sys/devices/pci0000:00/%s", h->pci);
  snprintf(ib, sizeof ib, "%s/infiniband/%s", dev, h->dev);
  put("0\n", "%s/numa_node", dev);
  put("0x1d1d\n", "%s/vendor", dev);
  put("0xfa4e\n", "%s/device", dev);
  // what NCCL's topology reads of a NIC's PCI function (a network controller on a Gen4 x16 link)
  put("0x020000\n", "%s/class", dev);
  put("0x1d1d\n", "%s/subsystem_vendor", dev);
  put("0x0001\n", "%s/subsystem_device", dev);
  put("16.0 GT/s PCIe\n", "%s/max_link_speed", dev);
  put("16.0 GT/s PCIe\n", "%s/current_link_speed", dev);
  put("16\n", "%s/max_link_width", dev);
  put("16\n", "%s/current_link_width", dev);
  // libpci (perftest) reads the BARs and takes a missing file for a fatal error: one 32 MiB BAR
  put("0x00000000e0000000 0x00000000e1ffffff 0x000000000014220c\n"
      "0x0000000000000000 0x0000000000000000 0x0000000000000000\n0x0000000000000000 0x0000000000000000 0x0000000000000000\n"
      "0x0000000000000000 0x0000000000000000 0x0000000000000000\n0x0000000000000000 0x0000000000000000 0x0000000000000000\n"
      "0x0000000000000000 0x0000000000000000 0x0000000000000000\n0x0000000000000000 0x0000000000000000 0x0000000000000000\n",
      "%s/resource", dev);
  put("up\n", "%s/net/%s/operstate", dev, h->ndev);
  put("9000\n", "%s/net/%s/mtu", dev, h->ndev);
  put("1: CA\n", "%s/node_type", ib);
  snprintf(v, sizeof v, "LAB%04d\n", h->n);
  put(v, "%s/board_id", ib);
  put("0.1.fakewire\n", "%s/fw_ver", ib);
  put("4: ACTIVE\n", "%s/ports/1/state", ib);
  put("1: DOWN\n", "%s/ports/1/state.down", ib);
  put("5: LinkUp\n", "%s/ports/1/phys_state", ib);
  put("3: Disabled\n", "%s/ports/1/phys_state.down", ib);
  put("Ethernet\n", "%s/ports/1/link_layer", ib);
  put("200 Gb/sec (4X HDR)\n", "%s/ports/1/rate", ib);
  for (int i = 0; i < FW_NGIDS; i++) {
    const uint8_t *g = h->gid[i];
    put(fw_gid_type[i] == 2 ? "RoCE v2\n" : "IB/RoCE v1\n", "%s/ports/1/gid_attrs/types/%d", ib, i);
    snprintf(v, sizeof v, "%s\n", h->ndev);
    put(v, "%s/ports/1/gid_attrs/ndevs/%d", ib, i);
    snprintf(v, sizeof v, "%02x%02x:%02x%02x:%02x%02x:%02x%02x:%02x%02x:%02x%02x:%02x%02x:%02x%02x\n", g[0], g[1],
             g[2], g[3], g[4], g[5], g[6], g[7], g[8], g[9], g[10], g[11], g[12], g[13], g[14], g[15]);
    put(v, "%s/ports/1/gids/%d", ib, i);
  }
  snprintf(v, sizeof v, "%s/%s", root, dev);
  snprintf(p, sizeof p, "%s/%s/device", root, ib);
  if (symlink(v, p)) { /* made by an earlier process */ }
  snprintf(p, sizeof p, "%s/%s", root, ib);
  char rel[128];
  snprintf(rel, sizeof rel, "sys/class/infiniband/%s", h->dev);
  link_(p, rel);
  snprintf(rel, sizeof rel, "sys/bus/pci/devices/%s", h->pci);
  link_(v, rel);
  link_("/dev/null", "dev/infiniband/uverbs0"); // consumers check that the device's char file exists (UCX: a readable, writable char device)
  // What rdma-core's libibverbs reads to find the device without RDMA netlink (socket() below
  // refuses it): the uverbs class, the device's number (the /dev/null it opens), and the
  // ibdev files it asks beside the provider (node GUID, P_Key table). Its provider list is the
  // lab's alone: /etc/libibverbs.d is an empty folder here (DIR/host names the provider).
  struct stat null_st;
  if (!stat("/dev/null", &null_st)) {
    snprintf(v, sizeof v, "%u:%u\n", major(null_st.st_rdev), minor(null_st.st_rdev));
    put(v, "sys/class/infiniband_verbs/uverbs0/dev");
  }
  put("6\n", "sys/class/infiniband_verbs/abi_version");
  put("1\n", "sys/class/infiniband_verbs/uverbs0/abi_version");
  snprintf(v, sizeof v, "%s\n", h->dev);
  put(v, "sys/class/infiniband_verbs/uverbs0/ibdev");
  const uint8_t *g = h->guid;
  snprintf(v, sizeof v, "%02x%02x:%02x%02x:%02x%02x:%02x%02x\n", g[0], g[1], g[2], g[3], g[4], g[5], g[6], g[7]);
  put(v, "%s/node_guid", ib);
  put(v, "%s/sys_image_guid", ib);
  put("0xffff\n", "%s/ports/1/pkeys/0", ib);
  put("0x0\n", "%s/ports/1/lid", ib);
  put("0x0\n", "%s/ports/1/sm_lid", ib);
  snprintf(p, sizeof p, "%s/etc/libibverbs.d", root);
  mkparents(p);
  mkdir(p, 0755);
  put("1.0-fakewire\n", "peermem/sys/module/nvidia_peermem/version");
  put("1.0-fakewire\n", "peermem/sys/kernel/mm/memory_peers/nv_mem/version");
  snprintf(v, sizeof v, "%s\n", h->name);
  put(v, "hostname");
  put("", ".ready");
}

#define NEXT(ret, name, ...) static ret (*next)(__VA_ARGS__); if (!next) next = (ret (*)(__VA_ARGS__))dlsym(RTLD_NEXT, name)
// The fds opened as /dev/infiniband/uverbsN: rdma-core's command fd, whose one command it sends
// without its provider (a completion channel) write() answers as the kernel would.
#define UVERBS_FDS 4096
static unsigned char uverbs_fd[UVERBS_FDS];
static int opened(const char *p, int fd) {
  if (fd >= 0 && fd < UVERBS_FDS) uverbs_fd[fd] = p && !strncmp(p, "/dev/infiniband/uverbs", 22);
  return fd;
}
int open(const char *p, int fl, ...) {
  va_list ap; va_start(ap, fl); mode_t m = va_arg(ap, mode_t); va_end(ap);
  NEXT(int, "open", const char *, int, ...); char b[512]; return opened(p, next(map(p, b, sizeof b), fl, m));
}
int open64(const char *p, int fl, ...) {
  va_list ap; va_start(ap, fl); mode_t m = va_arg(ap, mode_t); va_end(ap);
  NEXT(int, "open64", const char *, int, ...); char b[512]; return opened(p, next(map(p, b, sizeof b), fl, m));
}
// The kernel's uverbs write command that makes a completion channel (IB_USER_VERBS_CMD_CREATE_COMP_CHANNEL,
// 17): a header, the address of the response, and the response is the new fd. Here the fd is a
// pipe's read end, which the provider writes events into (fwprovider.c); the write end stays open
// with the process (a program makes a channel or two).
struct uverbs_cmd { uint32_t command; uint16_t in_words, out_words; uint64_t response; };
ssize_t write(int fd, const void *buf, size_t n) {
  NEXT(ssize_t, "write", int, const void *, size_t);
  if (fd < 0 || fd >= UVERBS_FDS || !uverbs_fd[fd] || n < sizeof(struct uverbs_cmd)) return next(fd, buf, n);
  struct stat st, null_st; // still the /dev/null it opened (not a number used again by a pipe or socket)
  if (fstat(fd, &st) || stat("/dev/null", &null_st) || !S_ISCHR(st.st_mode) || st.st_rdev != null_st.st_rdev) return next(fd, buf, n);
  struct uverbs_cmd c;
  memcpy(&c, buf, sizeof c);
  if (c.command != 17) { errno = EOPNOTSUPP; return -1; } // the lab's provider sends no other
  int ends[2];
  if (pipe2(ends, O_CLOEXEC)) return -1;
  uint32_t channel_fd = (uint32_t)ends[0];
  memcpy((void *)(uintptr_t)c.response, &channel_fd, sizeof channel_fd);
  return (ssize_t)n;
}
// RDMA netlink would show the machine's devices (none, or real ones), not the lab host's: rdma-core
// then finds devices in sysfs, as on a kernel without it.
int socket(int domain, int type, int protocol) {
  NEXT(int, "socket", int, int, int);
  if (domain == AF_NETLINK && protocol == NETLINK_RDMA) { errno = EPROTONOSUPPORT; return -1; }
  return next(domain, type, protocol);
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
// newer tools (coreutils' ls and stat) ask through these
int statx(int d, const char *p, int fl, unsigned mask, struct statx *s) { NEXT(int, "statx", int, const char *, int, unsigned, struct statx *); char b[512]; return next(d, map(p, b, sizeof b), fl, mask, s); }
int fstatat(int d, const char *p, struct stat *s, int fl) { NEXT(int, "fstatat", int, const char *, struct stat *, int); char b[512]; return next(d, map(p, b, sizeof b), s, fl); }
int fstatat64(int d, const char *p, struct stat64 *s, int fl) { NEXT(int, "fstatat64", int, const char *, struct stat64 *, int); char b[512]; return next(d, map(p, b, sizeof b), s, fl); }
int access(const char *p, int m) { NEXT(int, "access", const char *, int); char b[512]; return next(map(p, b, sizeof b), m); }
char *realpath(const char *p, char *out) { NEXT(char *, "realpath", const char *, char *); char b[512]; return next(map(p, b, sizeof b), out); }
ssize_t readlink(const char *p, char *out, size_t n) { NEXT(ssize_t, "readlink", const char *, char *, size_t); char b[512]; return next(map(p, b, sizeof b), out, n); }
int scandir(const char *p, struct dirent ***l, int (*f)(const struct dirent *), int (*c)(const struct dirent **, const struct dirent **)) {
  NEXT(int, "scandir", const char *, struct dirent ***, int (*)(const struct dirent *), int (*)(const struct dirent **, const struct dirent **));
  char b[512]; return next(map(p, b, sizeof b), l, f, c);
}
// The host's net device (fwnetN, named by the GIDs' sysfs ndevs) has an interface index of its
// own, as rdma-core asks it for each GID (_ibv_query_gid_ex's ndev_ifindex).
#define FW_IFINDEX 0x4000
unsigned if_nametoindex(const char *name) {
  NEXT(unsigned, "if_nametoindex", const char *);
  if (fw_host_env() && name && !strcmp(name, fw_me()->ndev)) return FW_IFINDEX + (unsigned)fw_me()->n;
  return next(name);
}
char *if_indextoname(unsigned index, char *name) {
  NEXT(char *, "if_indextoname", unsigned, char *);
  if (fw_host_env() && index == FW_IFINDEX + (unsigned)fw_me()->n) return strcpy(name, fw_me()->ndev);
  return next(index, name);
}
// the lab host's name: tools that group ranks by node see one node per lab host
int uname(struct utsname *u) {
  NEXT(int, "uname", struct utsname *);
  int rc = next(u);
  if (!rc && fw_host_env()) snprintf(u->nodename, sizeof u->nodename, "%s", fw_me()->name);
  return rc;
}
int gethostname(char *name, size_t len) {
  NEXT(int, "gethostname", char *, size_t);
  if (!fw_host_env()) return next(name, len);
  size_t k = strlen(fw_me()->name);
  if (k + 1 > len) { errno = ENAMETOOLONG; return -1; }
  memcpy(name, fw_me()->name, k + 1);
  return 0;
}
