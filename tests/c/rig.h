// The fake machine's helpers every end-to-end program of ours shares (ours): the live fake driver
// (fakerm.c) through RM and UVM calls as libcuda makes them, one client with two GPUs, and the
// fake NIC (fakeverbs.c) through libibverbs as NCCL reaches it (dlopen + dlvsym) and as a
// program linked against it does (the exported symbol). The libibverbs is rdma-core's own with
// the fake NIC as its provider (rigprovider.c), or fakeverbs.c itself where a test needs what
// rdma-core 44 is not (an rdma-core older than 34). A C file includes it once.
#pragma once
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include "program_owns.h"
#include "rignic.h"
#include <unistd.h>
#include "../../include/gdrshim.h"

#define NV_IOCTL(nr, size) (0xC0000000u | ((size) << 16) | (0x46u << 8) | (nr))
#define K64 0x10000ull
#define BASE 0x7f0000000000ull
struct ibv_mr { void *context, *pd, *addr; size_t length; uint32_t handle, lkey, rkey; };
typedef struct ibv_mr *(*reg_t)(void *, void *, size_t, int);
typedef int (*dereg_t)(struct ibv_mr *);
static int ctl, uvm, failures;
static uint32_t client, dev[2], sub[2], vas[2];
static uint8_t (*uuid)[16];
static reg_t vreg, direct;
static dereg_t vdereg;
// The PD every registration names and its context (rignic.h; the stand-in libmlx5 reads none).
static void *rig_pd = (void *)0x1, *rig_ctx = (void *)0x1;
static int (*open_bufs)(void);

static void fail(const char *what, long a, long b) { failures++; fprintf(stderr, "FAIL %s %#lx %#lx\n", what, (unsigned long)a, (unsigned long)b); }

static uint32_t rm_alloc(uint32_t parent, uint32_t cls, void *params) {
  uint32_t a[12] = {client, parent, 0, cls}; uint64_t p = (uintptr_t)params; memcpy(&a[4], &p, 8);
  if (cls == 0x41) a[0] = a[1] = 0;
  if (ioctl(ctl, NV_IOCTL(0x2b, 48), a) || a[10]) { fail("RM_ALLOC", cls, a[10]); return 0; }
  return a[2];
}
static inline void rm_free(uint32_t parent, uint32_t h) {
  uint32_t a[4] = {client, parent, h, 0};
  if (ioctl(ctl, NV_IOCTL(0x29, 16), a) || a[3]) fail("RM_FREE", h, a[3]);
}
static uint32_t alloc_mem(int g, uint64_t size) { uint8_t p[128] = {0}; memcpy(p + 64, &size, 8); return rm_alloc(dev[g], 0x40, p); }
static void uvm_call(unsigned long cmd, void *a, size_t status_at) {
  uint32_t st = 0;
  if (ioctl(uvm, cmd, a) || (memcpy(&st, (uint8_t *)a + status_at, 4), st)) fail("UVM", cmd, st);
}
static int cuda_internal; // the next mappings are CUDA's own memory, not handed to the program
static void map(uint64_t base, uint64_t len, uint64_t off, int g, uint32_t h) {
  static uint8_t a[9264];
  memset(a, 0, sizeof a); memcpy(a, &base, 8); memcpy(a + 8, &len, 8); memcpy(a + 16, &off, 8); memcpy(a + 24, uuid[g], 16);
  uint64_t count = 1; memcpy(a + 9240, &count, 8); memcpy(a + 9248, &ctl, 4); memcpy(a + 9252, &client, 4); memcpy(a + 9256, &h, 4);
  uvm_call(33, a, 9260);
  if (!cuda_internal) program_owns(base, len);
}
// cudaMalloc as libcuda does it: memory, an external range, the mapping
static inline uint32_t gpu_alloc(int g, uint64_t va, uint64_t size) {
  uint32_t h = alloc_mem(g, size);
  uint64_t r[3] = {va, size, 0}; uvm_call(73, r, 16);
  map(va, size, 0, g, h);
  return h;
}
static inline void gpu_free(int g, uint64_t va, uint64_t size, uint32_t h) {
  uint64_t f[3] = {va, size, 0}; uvm_call(34, f, 16);
  rm_free(dev[g], h);
}

// "early": the route is asked once the GPU's device exists but before its subdevice does (a device
// attribute read before CUDA made its context)
static int ask_early, early_route = -1;

// The fake driver's client, devices, subdevices and VA spaces, as CUDA's initialisation makes them.
static void setup_driver(void) {
  const char *d = getenv("GDRSHIM_TEST_DEV_DIR"); char p[4096];
  snprintf(p, sizeof p, "%s/nvidiactl", d); ctl = open(p, O_RDWR | O_CLOEXEC);
  snprintf(p, sizeof p, "%s/nvidia-uvm", d); uvm = open(p, O_RDWR | O_CLOEXEC);
  uuid = (uint8_t (*)[16])dlsym(RTLD_DEFAULT, "fakerm_uuid");
  open_bufs = (int (*)(void))dlsym(RTLD_DEFAULT, "fakenv_dmabufs_open");
  if (ctl < 0 || uvm < 0 || !uuid || !open_bufs) { fprintf(stderr, "no fake driver\n"); exit(2); }
  client = rm_alloc(0, 0x41, NULL);
  for (int g = 0; g < 2; g++) {
    uint8_t dp[56] = {0}; uint32_t id = g; memcpy(dp, &id, 4);
    dev[g] = rm_alloc(client, 0x80, dp);
    if (ask_early && g == 0) early_route = gdrshim_dl_gdr_route();
    uint32_t sp = 0; sub[g] = rm_alloc(dev[g], 0x2080, &sp);
    uint8_t vp[56] = {0}; vas[g] = rm_alloc(dev[g], 0x90f1, vp);
    uint8_t r[32] = {0}; memcpy(r, uuid[g], 16); memcpy(r + 16, &ctl, 4); memcpy(r + 20, &client, 4); memcpy(r + 24, &vas[g], 4);
    uvm_call(25, r, 28);
  }
}

// The driver, and libibverbs loaded into the global scope.
static inline void setup(void) {
  setup_driver();
  void *vh = dlopen("libibverbs.so.1", RTLD_NOW | RTLD_GLOBAL);
  if (!vh) { fprintf(stderr, "dlopen libibverbs.so.1: %s\n", dlerror()); exit(2); }
  vreg = (reg_t)dlvsym(vh, "ibv_reg_mr", "IBVERBS_1.1");
  vdereg = (dereg_t)dlvsym(vh, "ibv_dereg_mr", "IBVERBS_1.1");
  direct = (reg_t)dlsym(RTLD_DEFAULT, "ibv_reg_mr");
  if (!vreg || !vdereg || !direct) { fprintf(stderr, "verbs symbols missing\n"); exit(2); }
  rig_pd = rig_nic_pd(vh, &rig_ctx, (void *)0x1);
}

// One MR that must work: it reads as an ibv_reg_mr MR of [addr, addr+len).
static inline struct ibv_mr *must_reg(reg_t f, uint64_t addr, uint64_t len, const char *what) {
  errno = 4242;
  struct ibv_mr *m = f(rig_pd, (void *)(uintptr_t)addr, len, 0xf);
  if (!m) { fail(what, addr, errno); return NULL; }
  if ((uint64_t)(uintptr_t)m->addr != addr || m->length != len) fail("MR fields", (long)(uintptr_t)m->addr, (long)m->length);
  if (errno != 4242) fail("errno changed by a working registration", addr, errno);
  return m;
}
// One registration that must fail as it would without gdrshim: EFAULT from the fake NIC.
static inline void must_miss(uint64_t addr, uint64_t len, int access, const char *what) {
  errno = 0;
  struct ibv_mr *m = vreg(rig_pd, (void *)(uintptr_t)addr, len, access);
  if (m) { fail(what, addr, len); vdereg(m); }
  else if (errno != EFAULT) fail("a miss must fail with EFAULT", addr, errno);
}

// One registration gdrshim must not serve (nothing there to export): whatever the provider does
// with it, it is not a dma-buf MR (the fake NIC gives those lkey 9).
static inline void must_not_export(uint64_t addr, uint64_t len, const char *what) {
  struct ibv_mr *m = vreg(rig_pd, (void *)(uintptr_t)addr, len, 0xf);
  if (m && m->lkey == 9) fail(what, addr, len);
  if (m) vdereg(m);
}

// Distinct fake dma-bufs the process's fds refer to (the NIC's MRs hold fds of their own).
static inline int distinct_bufs(void) {
  ino_t seen[256]; int n = 0; char p[64], t[256];
  for (int fd = 0; fd < 4096; fd++) {
    snprintf(p, sizeof p, "/proc/self/fd/%d", fd); ssize_t k = readlink(p, t, sizeof t - 1);
    if (k <= 0) continue;
    t[k] = 0;
    struct stat st;
    if (!strstr(t, "memfd:nv_dmabuf") || fstat(fd, &st)) continue;
    int dup = 0; for (int i = 0; i < n; i++) dup |= seen[i] == st.st_ino;
    if (!dup && n < 256) seen[n++] = st.st_ino;
  }
  return n;
}


// An MR that must work, deregistered at once.
static inline void must_reg_dereg(uint64_t addr, uint64_t len, const char *what) {
  struct ibv_mr *m = must_reg(vreg, addr, len, what);
  if (m && vdereg(m)) fail("dereg", (long)addr, errno);
}
