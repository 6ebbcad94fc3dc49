// A live fake NVIDIA driver for gdrshim's process-life and concurrency tests (ours). Preloaded
// *after* libgdrshim.so. Unlike fakenv.c, which replays a capture in order, it keeps state and
// answers whatever a program issues, from any number of threads, on the files of
// GDRSHIM_TEST_DEV_DIR (nvidiactl, nvidia-uvm, nvidia0, nvidia1), with driver 580's layouts:
//   RM_ALLOC (NVOS64 from the program, NVOS21 from gdrshim) of clients, devices, subdevices,
//   VA spaces, memory (0x40 vidmem, 0x3e sysmem) and NV50_THIRD_PARTY_P2P; RM_FREE; RM_CONTROL
//   of the 503C controls with RM's rules (nvidia-abi.md S3); other controls answer NV_OK.
//   UVM_REGISTER_GPU_VASPACE, CREATE_EXTERNAL_RANGE, MAP_EXTERNAL_ALLOCATION (a new map first
//   unmaps what it overlaps on that GPU), UNMAP_EXTERNAL, MAP_EXTERNAL_SPARSE (an unmap to this
//   fake), FREE.
// fakenv_check(va, len) answers what nvidia_p2p_get_pages would give the NIC (fakeverbs.c asks
// it): 0 only if exactly one registration holds the 64 KiB-rounded range and it is, for every
// page, the memory the process has mapped there.
// DMA-BUF: NV_ESC_CARD_INFO (nvidia0 = gpuId 0x100, nvidia1 = 0x200), the NV0000 gpuId ->
// device instance control, NV2080 GET_INFO_V2's dma-buf capability (FAKERM_DMABUF_CAPABLE, default
// 1), BAR1: FB_GET_INFO_V2's BAR1_SIZE (FAKERM_BAR1_MIB, default 32768; 0: RM cannot tell) and
// FB_GET_STATIC_BAR1_INFO (FAKERM_BAR1_STATIC 1 default, 0, or "refuse": NOT_SUPPORTED), each
// counted in fakenv_bar1_queries(), and NV_ESC_EXPORT_TO_DMABUF_FD with nv-dmabuf.c's checks, each buffer a memfd of its size
// (the lab's libcuda's dma-buf where it sets fakerm_dmabuf_maker).
// fakenv_dmabuf_check(fd, offset, len, iova) answers what the kernel's RDMA core would map: 0 only
// if every page of [iova, iova+len) is, at that moment, the buffer's memory at that offset.
// fakerm_oracle, where a test program sets it (tests/c/stress.c), is called under the driver's
// lock at each export piece, REGISTER_VIDMEM, NIC registration and release (fakerm_oracle_kind).
// FAKERM_FD_CACHE=0: every call's fd is looked up (no cache per number): for programs whose fd
// numbers are closed by raw system calls or close_range and reused by other files.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#define MAXO 65536
typedef struct { uint32_t client, h, parent, cls, device; uint64_t size; int live; } obj_t;
typedef struct { uint64_t base, len, off; uint32_t client, h; int gpu, live; } map_t;
typedef struct { uint32_t client, p2p, h; uint64_t addr, size, off; int live; } reg_t;
static obj_t objs[MAXO]; static int nobjs;
static map_t maps[MAXO]; static int nmaps;
static reg_t regs[MAXO]; static int nregs;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static uint32_t next_handle = 0x7000;
unsigned long fakenv_p2p_errors, fakenv_calls;
// The ground truth's oracle of a test program (tests/c/stress.c sets it), called under `mu`:
// EXPORT (client, h, offset, size) each piece of an export that worked; VIDMEM (client, h, va,
// size, offset) a REGISTER_VIDMEM that works; NIC_VA (va, len) a NIC registration of GPU VA that
// works (nvidia-peermem's answer); NIC_DMABUF (iova, len, result) each dma-buf registration the
// NIC is asked for; OUTLIVED_REG (client, h, va, size) a REGISTER_VIDMEM still live over memory
// or a mapping the driver is about to release; OUTLIVED_BUF (client, h, fd) a dma-buf over
// memory RM is about to free still open at fd (below 256); RELEASE (client, h) an RM free of
// memory, (0, 0, va, len, gpu) a UVM call that unmaps, each checked so.
enum { ORACLE_EXPORT = 1, ORACLE_VIDMEM, ORACLE_NIC_VA, ORACLE_NIC_DMABUF, ORACLE_OUTLIVED_REG, ORACLE_OUTLIVED_BUF, ORACLE_RELEASE };
void (*fakerm_oracle)(int kind, uint32_t client, uint32_t h, uint64_t x, uint64_t y, uint64_t z);
static void oracle(int kind, uint32_t c, uint32_t h, uint64_t x, uint64_t y, uint64_t z) {
  void (*o)(int, uint32_t, uint32_t, uint64_t, uint64_t, uint64_t) = __atomic_load_n(&fakerm_oracle, __ATOMIC_ACQUIRE);
  if (o) o(kind, c, h, x, y, z);
}

static struct { dev_t dev; ino_t ino; } nodes[4]; static int nodes_ready;
static const char *names[4] = {"nvidiactl", "nvidia-uvm", "nvidia0", "nvidia1"};
static void init_nodes(void) {
  const char *d = getenv("GDRSHIM_TEST_DEV_DIR"); char p[4096]; struct stat st;
  for (int i = 0; d && i < 4; i++) { snprintf(p, sizeof p, "%s/%s", d, names[i]); if (!stat(p, &st)) { nodes[i].dev = st.st_dev; nodes[i].ino = st.st_ino; } }
  __atomic_store_n(&nodes_ready, 1, __ATOMIC_RELEASE);
}
// -1 not ours, 0 ctl, 1 uvm, 2/3 GPU nodes; cached per fd number until close (so that the
// fake itself costs little next to what it serves: the alloc-loop benchmark measures the shim)
static signed char fd_node[4096]; // 0 unknown, else node + 2
static int fd_cache = -1;
static int node_of(int fd) {
  if (__atomic_load_n(&fd_cache, __ATOMIC_RELAXED) < 0) { const char *c = getenv("FAKERM_FD_CACHE"); __atomic_store_n(&fd_cache, !c || strcmp(c, "0"), __ATOMIC_RELAXED); }
  int cached = fd >= 0 && fd < 4096 && __atomic_load_n(&fd_cache, __ATOMIC_RELAXED);
  if (cached) { int c = __atomic_load_n(&fd_node[fd], __ATOMIC_RELAXED); if (c) return c - 2; }
  if (!__atomic_load_n(&nodes_ready, __ATOMIC_ACQUIRE)) init_nodes();
  struct stat st; int r = -1;
  // the raw system call: tests/asleep.rs counts the shim's fstats, not the fake's
  if (!syscall(SYS_fstat, fd, &st)) for (int i = 0; i < 4; i++) if (nodes[i].ino && st.st_dev == nodes[i].dev && st.st_ino == nodes[i].ino) r = i;
  if (cached) __atomic_store_n(&fd_node[fd], (signed char)(r + 2), __ATOMIC_RELAXED);
  return r;
}
// libc's, found at load: a driver's calls need no loader lock (a thread that a library's
// constructor waits for may make them). A constructor that runs before this one (libcap-ng's
// closes fds) finds them here first.
static int (*real_close)(int);
static int (*real_dup2)(int, int);
static int (*real_dup3)(int, int, int);
static int (*real_ioctl)(int, unsigned long, void *);
static void find_real(void);
#define REAL(f) (real_##f ? real_##f : (find_real(), real_##f))
__attribute__((constructor)) static void find_real(void) {
  real_close = (int (*)(int))dlsym(RTLD_NEXT, "close");
  real_dup2 = (int (*)(int, int))dlsym(RTLD_NEXT, "dup2");
  real_dup3 = (int (*)(int, int, int))dlsym(RTLD_NEXT, "dup3");
  real_ioctl = (int (*)(int, unsigned long, void *))dlsym(RTLD_NEXT, "ioctl");
}
int close(int fd) {
  int (*real)(int) = REAL(close);
  if (fd >= 0 && fd < 4096) __atomic_store_n(&fd_node[fd], 0, __ATOMIC_RELAXED);
  return real(fd);
}
// a number dup2/dup3 reuse is another file now (as close)
int dup2(int old, int new) {
  int (*real)(int, int) = REAL(dup2);
  int r = real(old, new);
  if (r >= 0 && r < 4096) __atomic_store_n(&fd_node[r], 0, __ATOMIC_RELAXED);
  return r;
}
int dup3(int old, int new, int flags) {
  int (*real)(int, int, int) = REAL(dup3);
  int r = real(old, new, flags);
  if (r >= 0 && r < 4096) __atomic_store_n(&fd_node[r], 0, __ATOMIC_RELAXED);
  return r;
}
static obj_t *obj(uint32_t c, uint32_t h) { for (int i = 0; i < nobjs; i++) if (objs[i].live && objs[i].client == c && objs[i].h == h) return &objs[i]; return NULL; }
static obj_t *add_obj(obj_t o) {
  for (int i = 0; i < nobjs; i++) if (!objs[i].live) { objs[i] = o; objs[i].live = 1; return &objs[i]; }
  if (nobjs == MAXO) return NULL;
  objs[nobjs] = o; objs[nobjs].live = 1; return &objs[nobjs++];
}
static void drop_regs_of_mem(uint32_t c, uint32_t h) { for (int i = 0; i < nregs; i++) if (regs[i].live && regs[i].client == c && regs[i].h == h) regs[i].live = 0; }
static void drop_regs_of_p2p(uint32_t c, uint32_t p) { for (int i = 0; i < nregs; i++) if (regs[i].live && regs[i].client == c && regs[i].p2p == p) regs[i].live = 0; }
// RM frees an object and everything under it; freed vidmem is unregistered from every 503C of its client.
static void free_tree(uint32_t c, uint32_t h) {
  for (int i = 0; i < nobjs; i++) if (objs[i].live && objs[i].client == c && objs[i].parent == h && objs[i].h != h) free_tree(c, objs[i].h);
  obj_t *o = obj(c, h); if (!o) return;
  if (o->cls == 0x40 || o->cls == 0x3e) drop_regs_of_mem(c, h);
  if (o->cls == 0x503c) drop_regs_of_p2p(c, h);
  o->live = 0;
}
static uint32_t device_of(obj_t *o) { // the device an object hangs under
  while (o && o->cls != 0x80) { if (o->parent == o->h) return 0; o = obj(o->client, o->parent); }
  return o ? o->h : 0;
}
static int reg_add(reg_t r) {
  for (int i = 0; i < nregs; i++) if (!regs[i].live) { regs[i] = r; regs[i].live = 1; return 0; }
  if (nregs == MAXO) return -1;
  regs[nregs] = r; regs[nregs].live = 1; nregs++; return 0;
}

static uint32_t rm_alloc(uint32_t c, uint32_t parent, uint32_t *hnew, uint32_t cls, uint8_t *params) {
  obj_t o = {c, *hnew, parent, cls, 0, 0, 0};
  if (cls == 0x41) { if (!o.h) o.h = 0xc1d00000 + ++next_handle; o.client = o.h; o.parent = o.h; add_obj(o); *hnew = o.h; return 0; }
  if (!obj(c, c)) return 0x57;
  obj_t *par = obj(c, parent); if (!par) return 0x57;
  if (!o.h) o.h = 0xcaf00000 + ++next_handle;
  if (obj(c, o.h)) return 0x19;
  if (cls == 0x503c) {
    if (par->cls != 0x2080) return 0x57;
    for (int i = 0; i < nobjs; i++) if (objs[i].live && objs[i].client == c && objs[i].parent == parent && objs[i].cls == 0x503c) return 0x63;
  }
  if (cls == 0x40 || cls == 0x3e) { if (!params) return 0x1f; memcpy(&o.size, params + 64, 8); if (!o.size || o.size & 0xffff) return 0x1f; }
  if (cls == 0x80 && params) memcpy(&o.device, params, 4); // NV0080_ALLOC_PARAMETERS.deviceId
  if (!add_obj(o)) return 0x51;
  *hnew = o.h; return 0;
}

// FAKERM_FREE_DELAY_US=N: an RM_FREE spends N us in the driver before it takes the memory, as a
// large free does; a registration or export of that memory meanwhile is a race the shim lost.
static uint32_t freeing_h; long fakenv_race_violations;
static long free_delay_us(void) { static long d = -1; if (d < 0) { const char *t = getenv("FAKERM_FREE_DELAY_US"); d = t ? atol(t) : 0; } return d; }
// FAKERM_EXPORT_DELAY_US=N: an export's ioctl returns N us after it made the buffer's fd, as a
// thread preempted there would: the number is open and not yet the caller's own.
static long export_delay_us(void) { static long d = -1; if (d < 0) { const char *t = getenv("FAKERM_EXPORT_DELAY_US"); d = t ? atol(t) : 0; } return d; }
static uint32_t p2p_ctrl(uint32_t c, uint32_t p2p, uint32_t cmd, uint8_t *p) {
  obj_t *o = obj(c, p2p); if (!o || o->cls != 0x503c) return 0x57;
  if (cmd == 0x503c0102) {
    if (o->size) return 0x19; // one VA space
    o->size = 1; uint64_t tok = 0xfe00; memcpy(p + 8, &tok, 8); return 0;
  }
  if (cmd == 0x503c0104) {
    uint32_t h; uint64_t ad, sz, of; memcpy(&h, p, 4); memcpy(&ad, p + 8, 8); memcpy(&sz, p + 16, 8); memcpy(&of, p + 24, 8);
    obj_t *m = obj(c, h); if (!m) return 0x57;
    if (h == __atomic_load_n(&freeing_h, __ATOMIC_ACQUIRE)) fakenv_race_violations++;
    if (device_of(m) != device_of(o)) return 0x57;
    if (m->cls != 0x40) return 0x56;
    if (!sz || (ad | sz | of) & 0xffff || of + sz > m->size) return 0x1f;
    for (int i = 0; i < nregs; i++) if (regs[i].live && regs[i].client == c && regs[i].p2p == p2p && (regs[i].h == h || (ad < regs[i].addr + regs[i].size && regs[i].addr < ad + sz))) return 0x19;
    oracle(ORACLE_VIDMEM, c, h, ad, sz, of);
    return reg_add((reg_t){c, p2p, h, ad, sz, of, 1}) ? 0x51 : 0;
  }
  if (cmd == 0x503c0105) {
    uint32_t h; memcpy(&h, p, 4); int found = 0;
    for (int i = 0; i < nregs; i++) if (regs[i].live && regs[i].client == c && regs[i].p2p == p2p && regs[i].h == h) { regs[i].live = 0; found = 1; }
    return found ? 0 : 0x57;
  }
  return 0x24;
}

// (the oracle's) REGISTER_VIDMEMs of GPU gpu's device over [lo, hi), whose mapping goes
static void regs_over(int gpu, uint64_t lo, uint64_t hi) {
  for (int i = 0; i < nregs; i++) {
    reg_t *r = &regs[i];
    if (!r->live || r->addr >= hi || r->addr + r->size <= lo) continue;
    obj_t *d = obj(r->client, device_of(obj(r->client, r->p2p)));
    if (d && (int)d->device == gpu) oracle(ORACLE_OUTLIVED_REG, r->client, r->h, r->addr, r->size, 0);
  }
}
static void unmap(int gpu, uint64_t base, uint64_t len) {
  uint64_t end = base + len;
  oracle(ORACLE_RELEASE, 0, 0, base, len, (uint64_t)(int64_t)gpu);
  for (int i = 0; i < nmaps; i++) {
    map_t *m = &maps[i];
    if (!m->live || (gpu >= 0 && m->gpu != gpu) || m->base >= end || m->base + m->len <= base) continue;
    uint64_t mend = m->base + m->len; map_t keep = *m; m->live = 0;
    if (fakerm_oracle) regs_over(keep.gpu, keep.base > base ? keep.base : base, mend < end ? mend : end);
    if (keep.base < base) { map_t a = keep; a.len = base - keep.base; for (int j = 0; j <= nmaps; j++) if (j == nmaps || !maps[j].live) { maps[j] = a; if (j == nmaps) nmaps++; break; } }
    if (mend > end) { map_t b = keep; b.base = end; b.off = keep.off + (end - keep.base); b.len = mend - end; for (int j = 0; j <= nmaps; j++) if (j == nmaps || !maps[j].live) { maps[j] = b; if (j == nmaps) nmaps++; break; } }
  }
}
static int gpu_of_uuid(const uint8_t *u) { return u[0] == 0xa0 ? 0 : u[0] == 0xb1 ? 1 : -1; }
uint8_t fakerm_uuid[2][16] = {{0xa0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15}, {0xb1, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15}};

static int uvm_call(unsigned long cmd, uint8_t *a) {
  uint32_t st = 0;
  if (cmd == 25) { st = 0; memcpy(a + 28, &st, 4); return 0; } // REGISTER_GPU_VASPACE
  if (cmd == 73) { memcpy(a + 16, &st, 4); return 0; }         // CREATE_EXTERNAL_RANGE
  if (cmd == 33) {                                              // MAP_EXTERNAL_ALLOCATION (580: 256 GPUs)
    uint64_t base, len, off, count; uint32_t c, h; memcpy(&base, a, 8); memcpy(&len, a + 8, 8); memcpy(&off, a + 16, 8);
    memcpy(&count, a + 9240, 8); memcpy(&c, a + 9252, 4); memcpy(&h, a + 9256, 4);
    obj_t *m = obj(c, h);
    if (!m || (m->cls != 0x40 && m->cls != 0x3e && m->cls != 0x71)) st = 0x57; else if (off + len > m->size || !len || count < 1 || count > 256) st = 0x1f;
    for (uint64_t g = 0; !st && g < count; g++) {
      int gpu = gpu_of_uuid(a + 24 + 36 * g); if (gpu < 0) { st = 0x1f; break; }
      unmap(gpu, base, len);
      map_t n = {base, len, off, c, h, gpu, 1}; int j;
      for (j = 0; j < nmaps && maps[j].live; j++) {}
      if (j == MAXO) { st = 0x51; break; }
      maps[j] = n; if (j == nmaps) nmaps++;
    }
    memcpy(a + 9260, &st, 4); return 0;
  }
  // UNMAP_EXTERNAL, and MAP_EXTERNAL_SPARSE, which unmaps first and then maps no memory
  if (cmd == 66 || cmd == 74) { uint64_t base, len; memcpy(&base, a, 8); memcpy(&len, a + 8, 8); unmap(gpu_of_uuid(a + 16), base, len); memcpy(a + 32, &st, 4); return 0; }
  if (cmd == 34) { uint64_t base, len; memcpy(&base, a, 8); memcpy(&len, a + 8, 8); unmap(-1, base, len); memcpy(a + 16, &st, 4); return 0; }
  return 0;
}

// ---- DMA-BUF ----
#define MAXB 4096
typedef struct { uint32_t h; uint64_t off, size; int filled; } slot_t;
typedef struct { dev_t dev; ino_t ino; int gpu, live; uint32_t client, total; uint64_t size; slot_t *slots; } buf_t;
static buf_t bufs[MAXB]; static int nbufs;
unsigned long fakenv_exports, fakenv_export_refusals;
static int bar1_queries;
int fakenv_bar1_queries(void) { return __atomic_load_n(&bar1_queries, __ATOMIC_SEQ_CST); }
static const char *env_or(const char *k, const char *d) { const char *v = getenv(k); return v ? v : d; }
static int capable(void) { const char *c = getenv("FAKERM_DMABUF_CAPABLE"); return !c || strcmp(c, "0"); }
static buf_t *buf_of(int fd) {
  struct stat st; if (fstat(fd, &st)) return NULL;
  for (int i = 0; i < nbufs; i++) if (bufs[i].live && bufs[i].dev == st.st_dev && bufs[i].ino == st.st_ino) return &bufs[i];
  return NULL;
}
// A buffer lives while any fd of the process refers to it (the kernel's reference count, for the
// one process there is): dead entries are reclaimed when the table is full.
static void gc_bufs(void) {
  for (int i = 0; i < nbufs; i++) bufs[i].live = 0;
  char p[64];
  for (int fd = 0; fd < 65536; fd++) {
    struct stat st; if (fstat(fd, &st)) continue;
    (void)p;
    for (int i = 0; i < nbufs; i++) if (bufs[i].dev == st.st_dev && bufs[i].ino == st.st_ino && bufs[i].slots) bufs[i].live = 1;
  }
  for (int i = 0; i < nbufs; i++) if (!bufs[i].live && bufs[i].slots) { free(bufs[i].slots); bufs[i].slots = NULL; }
}

// The lab's stand-in libcuda (tests/lab/labcuda.c) makes the buffer of an export whose memory it
// mapped (its dma-buf, which the lab's wire judges): the address its first piece is mapped at.
int (*fakerm_dmabuf_maker)(uint64_t va, uint64_t size);
static uint64_t mapped_at(uint32_t c, uint32_t h, uint64_t off) {
  for (int i = 0; i < nmaps; i++) if (maps[i].live && maps[i].client == c && maps[i].h == h && off >= maps[i].off && off - maps[i].off < maps[i].len) return maps[i].base + (off - maps[i].off);
  return 0;
}
// nv_dma_buf_export with RmDmabufVerifyMemHandle's rules; the status goes into the params.
static uint32_t export_dmabuf(int gpu, uint8_t *a) {
  int32_t fd; uint32_t client, total, num, index; uint64_t tsize; uint8_t mtype, mmap_ok;
  memcpy(&fd, a, 4); memcpy(&client, a + 4, 4); memcpy(&total, a + 8, 4); memcpy(&num, a + 12, 4); memcpy(&index, a + 16, 4);
  memcpy(&tsize, a + 24, 8); mtype = a[32]; mmap_ok = a[33];
  if (!tsize || !num || !total || num > 128 || num > total) return 0x1f;
  if (mtype > 1) return 0x1f;
  buf_t *b = NULL;
  if (fd == -1) {
    if (!capable()) return 0x56;
    if (mtype == 1 || mmap_ok) return 0x56; // FORCE_PCIE needs a coherent GPU; mmap only on iGPUs
    if (index > total - num) return 0x1f;
    int j; for (j = 0; j < nbufs && bufs[j].live; j++) {}
    if (j == MAXB) { gc_bufs(); for (j = 0; j < nbufs && bufs[j].live; j++) {} }
    if (j == MAXB) return 0x51;
    int nfd = -1; uint64_t va = 0;
    uint32_t h0; uint64_t off0; memcpy(&h0, a + 36, 4); memcpy(&off0, a + 552, 8);
    if (fakerm_dmabuf_maker && !index && (va = mapped_at(client, h0, off0))) nfd = fakerm_dmabuf_maker(va, tsize);
    else if ((nfd = memfd_create("nv_dmabuf", MFD_CLOEXEC)) >= 0 && ftruncate(nfd, (off_t)tsize)) { close(nfd); nfd = -1; }
    if (nfd < 0) return 0x59;
    struct stat st; fstat(nfd, &st);
    b = &bufs[j]; if (j == nbufs) nbufs++;
    *b = (buf_t){st.st_dev, st.st_ino, gpu, 1, client, total, tsize, calloc(total, sizeof(slot_t))};
    fd = nfd;
  } else if (fd >= 0) {
    b = buf_of(fd); if (!b) return 0x1f;
    if (num > b->total || index > b->total - num) return 0x1f;
  } else return 0x1f;
  uint64_t attached = 0; for (uint32_t i = 0; i < b->total; i++) attached += b->slots[i].filled ? b->slots[i].size : 0;
  for (uint32_t i = 0; i < num; i++) {
    uint32_t h; uint64_t off, size; memcpy(&h, a + 36 + 4 * i, 4); memcpy(&off, a + 552 + 8 * i, 8); memcpy(&size, a + 1576 + 8 * i, 8);
    obj_t *m = obj(client, h); uint32_t st = 0;
    if (m && h == __atomic_load_n(&freeing_h, __ATOMIC_ACQUIRE)) fakenv_race_violations++;
    if (!obj(client, client)) st = 0x33; else if (!m) st = 0x57;
    else if (m->cls != 0x40 && m->cls != 0x3e) st = 0x31;
    else { obj_t *d = obj(client, device_of(m)); if (!d || (int)d->device != b->gpu) st = 0x36; }
    if (!st && ((off | size) & 0xfff)) st = 0x1f;
    if (!st && m->cls != 0x40) st = 0x1f;
    if (!st && (!size || size > m->size || off > m->size - size)) st = 0x1f;
    if (!st && b->slots[index + i].filled) st = 0x17;
    if (!st && size > b->size - attached) st = 0x1f;
    if (st) { for (uint32_t k = 0; k < i; k++) b->slots[index + k].filled = 0; if (fd != *(int32_t *)a) { close(fd); b->live = 0; } return st; }
    b->slots[index + i] = (slot_t){h, off, size, 1}; attached += size;
  }
  int complete = 1; for (uint32_t i = 0; i < b->total; i++) complete &= b->slots[i].filled;
  if (complete && attached != b->size) { if (fd != *(int32_t *)a) { close(fd); b->live = 0; } return 0x1f; }
  for (uint32_t i = 0; i < num; i++) { uint32_t h; uint64_t off, size; memcpy(&h, a + 36 + 4 * i, 4); memcpy(&off, a + 552 + 8 * i, 8); memcpy(&size, a + 1576 + 8 * i, 8); oracle(ORACLE_EXPORT, client, h, off, size, 0); }
  memcpy(a, &fd, 4); fakenv_exports++;
  return 0;
}
// What ib_umem_dmabuf would map for an MR of [iova, iova+len) at `offset` in the buffer of fd: 0
// exactly the process's memory at those addresses now, -1 not, -2 not a complete buffer of ours.
int fakenv_dmabuf_check(int fd, uint64_t offset, uint64_t len, uint64_t iova) {
  pthread_mutex_lock(&mu);
  buf_t *b = buf_of(fd); int r = 0;
  if (!b) r = -2;
  for (uint32_t i = 0; !r && i < b->total; i++) if (!b->slots[i].filled) r = -2;
  if (!r && (!len || offset + len > b->size)) r = -1;
  for (uint64_t p = 0; !r && p < ((iova & 0xfff) + len + 0xfff) / 0x1000; p++) {
    uint64_t va = (iova & ~0xfffull) + p * 0x1000, bo = (offset & ~0xfffull) + p * 0x1000, at = 0;
    slot_t *s = NULL;
    for (uint32_t i = 0; i < b->total; at += b->slots[i].size, i++) if (bo >= at && bo < at + b->slots[i].size) { s = &b->slots[i]; break; }
    if (!s) { r = -1; break; }
    uint64_t moff = s->off + (bo - at); int seen = 0;
    for (int i = 0; i < nmaps; i++) {
      map_t *m = &maps[i];
      if (!m->live || va < m->base || va >= m->base + m->len) continue;
      seen = 1;
      if (m->client != b->client || m->h != s->h || m->off + (va - m->base) != moff) r = -1;
    }
    if (!seen) r = -1;
  }
  oracle(ORACLE_NIC_DMABUF, b ? b->client : 0, 0, iova, len, (uint64_t)(int64_t)r);
  pthread_mutex_unlock(&mu);
  return r;
}
int fakenv_dmabufs_open(void) { // fds of this process that are fake dma-bufs
  int n = 0; char p[64];
  for (int fd = 0; fd < 4096; fd++) { snprintf(p, sizeof p, "/proc/self/fd/%d", fd); char t[256]; ssize_t k = readlink(p, t, sizeof t - 1); if (k > 0) { t[k] = 0; if (strstr(t, "memfd:nv_dmabuf")) n++; } }
  return n;
}

// (the oracle's) what still holds memory (c, h) as RM is about to free it: a REGISTER_VIDMEM, or a
// dma-buf over it open at an fd below 256 (the NIC's own references sit at 512 and up)
static void outlived_by_free(uint32_t c, uint32_t h) {
  obj_t *m = obj(c, h);
  if (!m || (m->cls != 0x40 && m->cls != 0x3e)) return;
  oracle(ORACLE_RELEASE, c, h, 0, 0, 0);
  for (int i = 0; i < nregs; i++) if (regs[i].live && regs[i].client == c && regs[i].h == h) oracle(ORACLE_OUTLIVED_REG, c, h, regs[i].addr, regs[i].size, 0);
  ino_t cand[64]; dev_t dev[64]; int n = 0;
  for (int i = 0; i < nbufs && n < 64; i++) {
    if (!bufs[i].live || !bufs[i].slots || bufs[i].client != c) continue;
    for (uint32_t k = 0; k < bufs[i].total; k++) if (bufs[i].slots[k].filled && bufs[i].slots[k].h == h) { cand[n] = bufs[i].ino; dev[n++] = bufs[i].dev; break; }
  }
  for (int fd = 3; n && fd < 256; fd++) {
    struct stat st; if (syscall(SYS_fstat, fd, &st)) continue;
    for (int k = 0; k < n; k++) if (st.st_ino == cand[k] && st.st_dev == dev[k]) oracle(ORACLE_OUTLIVED_BUF, c, h, (uint64_t)fd, 0, 0);
  }
}

// NV0000 / NV2080 queries gdrshim's DMA-BUF route makes; no state, so no lock. 1: answered.
static int gpu_query(uint32_t *w) {
  uint8_t *p; uint64_t pp; memcpy(&pp, w + 4, 8); p = (uint8_t *)(uintptr_t)pp;
  if (w[2] == 0x205) { // GET_ID_INFO_V2 on the root client
    uint32_t id; if (w[6] != 32 || !p) { w[7] = 0x3a; return 1; }
    memcpy(&id, p, 4); uint32_t inst = id == 0x100 ? 0 : id == 0x200 ? 1 : 99;
    w[7] = inst == 99 ? 0x1f : 0; if (inst != 99) memcpy(p + 8, &inst, 4); return 1;
  }
  if (w[2] == 0x20800102) { // GET_INFO_V2 on a subdevice, 580's size
    if (w[6] != 564 || !p) { w[7] = 0x3a; return 1; }
    uint32_t n, idx, yes = capable(); memcpy(&n, p, 4); memcpy(&idx, p + 4, 4);
    if (n < 1 || n > 0x46) { w[7] = 0x1f; return 1; }
    if (idx == 0x3d) memcpy(p + 8, &yes, 4);
    w[7] = 0; return 1;
  }
  if (w[2] == 0x20801303) { // FB_GET_INFO_V2, 580's size (4 + 8 * 0x80)
    __atomic_add_fetch(&bar1_queries, 1, __ATOMIC_SEQ_CST);
    if (w[6] != 1028 || !p) { w[7] = 0x3a; return 1; }
    uint32_t n, idx, kib = (uint32_t)(atol(env_or("FAKERM_BAR1_MIB", "32768")) << 10); memcpy(&n, p, 4); memcpy(&idx, p + 4, 4);
    if (n < 1 || n > 0x80) { w[7] = 0x1f; return 1; }
    if (idx == 5) memcpy(p + 8, &kib, 4);
    w[7] = 0; return 1;
  }
  if (w[2] == 0x20801354) { // FB_GET_STATIC_BAR1_INFO
    __atomic_add_fetch(&bar1_queries, 1, __ATOMIC_SEQ_CST);
    const char *k = env_or("FAKERM_BAR1_STATIC", "1");
    if (w[6] != 24 || !p) { w[7] = 0x3a; return 1; }
    if (!strcmp(k, "refuse")) { w[7] = 0x56; return 1; }
    memset(p, 0, 24); p[0] = atoi(k) != 0;
    if (p[0]) { uint64_t size = (uint64_t)atol(env_or("FAKERM_BAR1_MIB", "32768")) << 20; memcpy(p + 16, &size, 8); }
    w[7] = 0; return 1;
  }
  return 0;
}

// FAKERM_THRASH_KB=N: each call writes N KiB first and runs 128 KiB of code, as the real
// driver's work evicts the caller's data and instruction caches between two calls (the
// benchmark then sees the hook's cold-cache cost).
static long thrash_kb = -1; static volatile uint8_t *thrash_buf;
static void thrash_code(void) {
#if defined(__x86_64__)
  __asm__ volatile(".rept 16384\n\tnopl 0x0(%%rax,%%rax,1)\n\t.byte 0x90\n\t.endr" ::: "memory");
#endif
}
static void thrash(void) {
  if (thrash_kb < 0) { const char *t = getenv("FAKERM_THRASH_KB"); thrash_kb = t ? atol(t) : 0; if (thrash_kb) thrash_buf = malloc(thrash_kb << 10); }
  if (!thrash_kb) return;
  for (long i = 0; i < (thrash_kb << 10); i += 64) thrash_buf[i]++;
  thrash_code();
}
static int fake_ioctl(int fd, unsigned long req, void *arg);
// A driver's call that works leaves errno alone: so does the fake's (its first one looks things up).
int ioctl(int fd, unsigned long req, void *arg) {
  int e = errno, rc = fake_ioctl(fd, req, arg);
  if (rc == 0) errno = e;
  return rc;
}
// NVIDIA escapes ('F') issued on an fd that is no node of the fake's (a program's own file at a
// number gdrshim had checked and no longer held), and exports asked on a GPU node the program
// opened itself (the rigs mark their own opens of one with O_NONBLOCK; gdrshim never opens so)
unsigned long fakenv_escapes_elsewhere, fakenv_exports_on_program_nodes;
static int fake_ioctl(int fd, unsigned long req, void *arg) {
  int (*real)(int, unsigned long, void *) = REAL(ioctl);
  int node = node_of(fd);
  if (node < 0) {
    if (((req >> 8) & 0xff) == 0x46) __atomic_add_fetch(&fakenv_escapes_elsewhere, 1, __ATOMIC_RELAXED);
    return real(fd, req, arg);
  }
  if (node >= 2 && (req & 0xff) == 0xd9 && (syscall(SYS_fcntl, fd, F_GETFL) & O_NONBLOCK)) __atomic_add_fetch(&fakenv_exports_on_program_nodes, 1, __ATOMIC_RELAXED);
  thrash();
  if (!arg) { errno = EFAULT; return -1; }
  uint8_t *a = arg; uint32_t *w = arg; unsigned nr = req & 0xff, size = (req >> 16) & 0x3fff;
  // controls other than the 503C's touch no state: answered without the lock (signal handlers issue them)
  // RM copies the parameters in first: a pointer it cannot read is an error status, rc 0
  uint64_t pp0 = 0; if (node != 1 && (nr == 0x2a || nr == 0x2b) && size >= 32) memcpy(&pp0, a + 16, 8);
  if (pp0 && pp0 < 0x10000) { w[nr == 0x2b && size == 48 ? 10 : 7] = 0x1e; return 0; }
  if (node != 1 && nr == 0x2a && size == 32 && (w[2] >> 16) != 0x503c) { if (!gpu_query(w)) w[7] = 0; return 0; }
  if (node == 0 && nr == 0xc8 && size == 32 * 72) { // CARD_INFO
    memset(a, 0, 32 * 72);
    for (int g = 0; g < 2; g++) { a[72 * g] = 1; uint32_t id = 0x100 * (g + 1), minor = g; memcpy(a + 72 * g + 16, &id, 4); memcpy(a + 72 * g + 56, &minor, 4); }
    return 0;
  }
  if (nr == 0xd9) { // EXPORT_TO_DMABUF_FD: /dev/nvidiaN only, exact size
    if (node < 2 || size != 2608) { errno = EINVAL; return -1; }
    pthread_mutex_lock(&mu); uint32_t st = export_dmabuf(node - 2, a); pthread_mutex_unlock(&mu);
    if (st) fakenv_export_refusals++;
    memcpy(a + 2600, &st, 4);
    if (!st && export_delay_us()) usleep((useconds_t)export_delay_us());
    return 0;
  }
  if (node != 1 && nr == 0x29 && size == 16 && free_delay_us()) {
    __atomic_store_n(&freeing_h, w[2], __ATOMIC_RELEASE);
    usleep((useconds_t)free_delay_us());
  }
  pthread_mutex_lock(&mu);
  __atomic_add_fetch(&fakenv_calls, 1, __ATOMIC_RELAXED);
  int rc = 0;
  if (node == 1) rc = uvm_call(req, a);
  else if (nr == 0x2b && (size == 48 || size == 32)) {
    uint64_t pp; memcpy(&pp, a + 16, 8);
    uint32_t st = rm_alloc(w[0], w[1], &w[2], w[3], (uint8_t *)(uintptr_t)pp);
    if (w[3] == 0x503c && st) fakenv_p2p_errors++;
    w[size == 48 ? 10 : 7] = st;
  } else if (nr == 0x29 && size == 16) {
    if (fakerm_oracle) outlived_by_free(w[0], w[2]);
    if (!obj(w[0], w[2])) w[3] = 0x57; else { free_tree(w[0], w[2]); w[3] = 0; }
    __atomic_store_n(&freeing_h, 0, __ATOMIC_RELEASE);
  } else if (nr == 0x27 && size == 56) {
    // NV_ESC_RM_ALLOC_MEMORY (NVOS02): host pages the caller has, described to RM (libcuda's
    // pinned host memory: class 0x71, its handle the caller's), later mapped into GPU VA
    uint64_t limit; memcpy(&limit, a + 32, 8);
    obj_t o = {w[0], w[2], w[1], w[3], 0, limit + 1, 0};
    w[10] = w[3] != 0x71 || !obj(w[0], w[0]) || !obj(w[0], w[1]) ? 0x57 : obj(w[0], w[2]) ? 0x19 : add_obj(o) ? 0 : 0x51;
  } else if (nr == 0x2a && size == 32) {
    uint64_t pp; memcpy(&pp, a + 16, 8);
    w[7] = p2p_ctrl(w[0], w[1], w[2], (uint8_t *)(uintptr_t)pp);
    if (w[7]) fakenv_p2p_errors++;
  } else { errno = EINVAL; rc = -1; }
  pthread_mutex_unlock(&mu);
  return rc;
}

// What nvidia_p2p_get_pages gives the NIC for [va, va+len) of this process: 1 host memory,
// 0 registered exactly right, -1 not (ibv_reg_mr fails with EFAULT).
int fakenv_check(uint64_t va, uint64_t len) {
  pthread_mutex_lock(&mu);
  uint64_t lo = va & ~0xffffull, hi = (va + len + 0xffff) & ~0xffffull;
  int mapped = 0, r = 0, hits = 0; reg_t hit = {0};
  // host memory: nothing mapped there for a GPU, or only system memory (pinned host pages, which
  // the kernel pins as any host memory: peermem says they are not its)
  int vidmem = 0;
  for (int i = 0; i < nmaps; i++) {
    map_t *m = &maps[i];
    if (!m->live || va + len <= m->base || m->base + m->len <= va) continue;
    obj_t *o = obj(m->client, m->h);
    vidmem |= !o || (o->cls != 0x3e && o->cls != 0x71);
    if (va >= m->base && va < m->base + m->len) mapped = 1;
  }
  if (!mapped || !vidmem) { pthread_mutex_unlock(&mu); return 1; }
  for (int i = 0; i < nregs; i++) {
    if (!regs[i].live) continue;
    obj_t *o = obj(regs[i].client, regs[i].p2p);
    if (o && o->size == 1 && lo >= regs[i].addr && hi <= regs[i].addr + regs[i].size) { hits++; hit = regs[i]; }
  }
  if (hits != 1) r = -1;
  // every 4 KiB page of the rounded range: each GPU that maps it maps the registered memory at the registered offset
  for (uint64_t p = lo; !r && p < hi; p += 0x1000) {
    int seen = 0;
    for (int i = 0; i < nmaps; i++) {
      map_t *m = &maps[i];
      if (!m->live || p < m->base || p >= m->base + m->len) continue;
      seen = 1;
      if (m->client != hit.client || m->h != hit.h || m->off + (p - m->base) != hit.off + (p - hit.addr)) r = -1;
    }
    if (!seen) r = -1;
  }
  if (!r) oracle(ORACLE_NIC_VA, 0, 0, va, len, 0);
  pthread_mutex_unlock(&mu);
  return r;
}
int fakenv_live_registrations(void) { pthread_mutex_lock(&mu); int n = 0; for (int i = 0; i < nregs; i++) n += regs[i].live; pthread_mutex_unlock(&mu); return n; }
int fakenv_p2p_objects(void) { pthread_mutex_lock(&mu); int n = 0; for (int i = 0; i < nobjs; i++) n += objs[i].live && objs[i].cls == 0x503c; pthread_mutex_unlock(&mu); return n; }

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
