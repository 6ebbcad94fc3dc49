// A fake NVIDIA driver for gdrshim's scale benchmark (ours): preloaded after the shim, it answers
// every call on the nodes of GDRSHIM_TEST_DEV_DIR at once, keeping no state, so that what the
// benchmark times beyond the program's own work is the shim's. RM_ALLOC hands out handles,
// RM_FREE and RM_CONTROL answer NV_OK (the 503C's REGISTER_VA_SPACE with a token; the few queries
// gdrshim makes with fakerm.c's answers), UVM calls answer NV_OK with their status untouched.
// EXPORT_TO_DMABUF_FD on nvidia0 answers with a dup of one memfd made at the first export (what
// the buffer holds is not read here), so that an export costs the driver one system call.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

static struct { dev_t dev; ino_t ino; } nodes[3];
static const char *names[3] = {"nvidiactl", "nvidia-uvm", "nvidia0"};
static int nodes_ready;
static uint32_t next_handle = 0x10000;
uint8_t fakerm_uuid[2][16] = {{0xa0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15}, {0xb1, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15}};

// -1 not ours, else the node; cached per fd until close
static signed char fd_node[65536];
static int node_of(int fd) {
  if (fd >= 0 && fd < 65536) { int c = fd_node[fd]; if (c) return c - 2; }
  if (!nodes_ready) {
    const char *d = getenv("GDRSHIM_TEST_DEV_DIR"); char p[4096]; struct stat st;
    for (int i = 0; d && i < 3; i++) { snprintf(p, sizeof p, "%s/%s", d, names[i]); if (!stat(p, &st)) { nodes[i].dev = st.st_dev; nodes[i].ino = st.st_ino; } }
    nodes_ready = 1;
  }
  struct stat st; int r = -1;
  if (!syscall(SYS_fstat, fd, &st)) for (int i = 0; i < 3; i++) if (nodes[i].ino && st.st_dev == nodes[i].dev && st.st_ino == nodes[i].ino) r = i;
  if (fd >= 0 && fd < 65536) fd_node[fd] = (signed char)(r + 2);
  return r;
}
int close(int fd) {
  static int (*real)(int);
  if (!real) real = (int (*)(int))dlsym(RTLD_NEXT, "close");
  if (fd >= 0 && fd < 65536) fd_node[fd] = 0;
  return real(fd);
}

int ioctl(int fd, unsigned long req, void *arg) {
  static int (*real)(int, unsigned long, void *);
  if (!real) real = (int (*)(int, unsigned long, void *))dlsym(RTLD_NEXT, "ioctl");
  int node = node_of(fd);
  if (node < 0) return real(fd, req, arg);
  if (!arg) { errno = EFAULT; return -1; }
  uint8_t *a = arg; uint32_t *w = arg; unsigned nr = req & 0xff, size = (req >> 16) & 0x3fff;
  if (node == 1) return 0;
  if (nr == 0x2b && (size == 48 || size == 32)) { // RM_ALLOC
    if (!w[2]) w[2] = __atomic_add_fetch(&next_handle, 1, __ATOMIC_RELAXED);
    w[size == 48 ? 10 : 7] = 0;
  } else if (nr == 0x29 && size == 16) { // RM_FREE
    w[3] = 0;
  } else if (nr == 0x2a && size == 32) { // RM_CONTROL
    uint64_t pp; memcpy(&pp, a + 16, 8); uint8_t *p = (uint8_t *)(uintptr_t)pp;
    if (w[2] == 0x503c0102 && p) { uint64_t tok = 0xfe00; memcpy(p + 8, &tok, 8); }
    if (w[2] == 0x205 && p) { uint32_t inst = 0; memcpy(p + 8, &inst, 4); }
    if (w[2] == 0x20800102 && p) { uint32_t yes = 1; memcpy(p + 8, &yes, 4); }
    w[7] = 0;
  } else if (nr == 0xd9 && size == 2608 && node == 2) { // EXPORT_TO_DMABUF_FD
    static int buffer = -1;
    if (buffer < 0) buffer = memfd_create("nv_dmabuf", MFD_CLOEXEC);
    int32_t fd; memcpy(&fd, a, 4);
    uint32_t st = 0;
    if (fd == -1 && (fd = fcntl(buffer, F_DUPFD_CLOEXEC, 0)) < 0) st = 0x51;
    memcpy(a, &fd, 4); memcpy(a + 2600, &st, 4);
  } else if (nr == 0xc8 && size == 32 * 72) { // CARD_INFO: one GPU
    memset(a, 0, 32 * 72); a[0] = 1; uint32_t id = 0x100; memcpy(a + 16, &id, 4);
  } else { errno = EINVAL; return -1; }
  return 0;
}

// libcuda's cuMemMap and cuMemUnmap for the test programs (tests/c/program_owns.h): the program
// made its mapping itself; through gdrshim's hooks the range becomes the program's own memory
int cuMemMap(uint64_t ptr, size_t size, size_t offset, uint64_t handle, unsigned long long flags) {
  (void)ptr; (void)size; (void)offset; (void)handle; (void)flags;
  return 0;
}
int cuMemUnmap(uint64_t ptr, size_t size) {
  (void)ptr; (void)size;
  return 0;
}
