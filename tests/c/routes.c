// Both registration routes end to end under the real libgdrshim.so (ours), with the live fake
// driver (fakerm.c: RM, UVM, dma-buf exports) and the fake NIC (fakeverbs.c), under rdma-core's
// libibverbs as its provider or as the libibverbs itself (rig.h):
//   routes matrix       the route the shim took, and what one GPU registration gives
//   routes dmabuf N     DMA-BUF route: MRs over one, two and 130 memory objects (two export
//                       calls), unaligned sub-ranges, through dlvsym and directly, read as the
//                       caller's MRs; misses (two GPUs, freed memory, ODP) fail as without
//                       gdrshim; N register/deregister cycles; no fd left at the end
//   routes cuda         cuMemGetHandleForAddressRange through cuGetProcAddress of a libcuda that
//                       answers 801 (a GeForce): gdrshim's fd, a complete buffer of the right size
//   routes owned        two allocations side by side, then CUDA's own memory right after them:
//                       MRs and dma-bufs over the allocations are served, any range with a byte
//                       of CUDA's memory is refused on every path (verbs, cuMemGetHandleFor-
//                       AddressRange: CUDA_ERROR_INVALID_VALUE, gdrshim_export_dmabuf: -EACCES)
//   routes refused      the provider refuses every export: the original call fails as without
//                       gdrshim (EFAULT), no fd left
//   routes umem         libmlx5's devx umem registrations (fakemlx5.c) on GPU memory, host
//                       memory, a miss, a mask bit gdrshim does not know, the program's own
//                       dma-buf: what the fake NIC was asked, errno, the registrations and
//                       buffers left
//   routes mrex         ibv_reg_mr_ex of GPU memory with a DMA handle, and with a mask bit
//                       gdrshim does not know: the masks the provider saw (fakeverbs.c as the
//                       libibverbs: rdma-core 44 has no ibv_reg_mr_ex)
//   routes shared       one buffer registered 4 times (a second NIC/PD, a relaxed-order twin):
//                       one export, our one fd open while MRs use it and none after the last;
//                       the memory freed and allocated again at the same VA: a new export that
//                       is the new memory; a caller's cuMemGetHandleForAddressRange-style fd is
//                       its own; a fork child gets nothing from the parent's buffer
//   routes cancel      a registration and a dereg whose provider passes a cancellation point
//                       while one is pending: each call completes and is told to gdrshim, the
//                       thread is cancelled after it
//   routes quick       a dereg right after its registration, a free while an MR lives (for
//                       GDRSHIM_TEST_SETTLE_LATE=1)
//   routes attrs        the GDR (116), VMM GDR (110) and DMA-BUF (124) attributes as NCCL reads them
//   routes vmm [ask [F]] cuMemCreate with gpuDirectRDMACapable=F (default 1; after reading attribute
//                       110 with "ask"): its result, libcuda's calls, the caller's flag after the call
// Prints "routes MODE ok key=value ..." and exits 0, or names what went wrong and exits 1.
#include "rig.h"

static int matrix(void) {
  gpu_alloc(0, BASE, 4 * K64);
  errno = 0;
  struct ibv_mr *m = vreg(rig_pd, (void *)BASE, 4 * K64, 0xf);
  printf("routes matrix ok route=%d active=%d registered=%s errno=%d\n", gdrshim_dl_gdr_route(), gdrshim_dl_gdr_active(), m ? "yes" : "no", m ? 0 : errno);
  if (m) vdereg(m);
  return 0;
}

static int early(void) {
  gpu_alloc(0, BASE, 4 * K64);
  struct ibv_mr *m = vreg(rig_pd, (void *)BASE, 4 * K64, 0xf);
  printf("routes early ok before=%d route=%d registered=%s\n", early_route, gdrshim_dl_gdr_route(), m ? "yes" : "no");
  if (m) vdereg(m);
  return 0;
}

static int dmabuf(long cycles) {
  int fds0 = open_bufs();
  uint32_t a = gpu_alloc(0, BASE, 64 * K64);                      // one object
  uint32_t b = gpu_alloc(0, BASE + 64 * K64, 32 * K64);           // right after it: two objects
  uint32_t c = gpu_alloc(1, BASE + 96 * K64, 16 * K64);           // on the other GPU
  (void)c;
  for (int i = 0; i < 130; i++) gpu_alloc(0, BASE + (1024 + i) * K64, K64); // 130 objects in a row
  struct ibv_mr *m[6];
  m[0] = must_reg(vreg, BASE, 64 * K64, "whole allocation");
  m[1] = must_reg(direct, BASE + 0x1234, 0x5000, "unaligned sub-range, exported symbol");
  m[2] = must_reg(vreg, BASE + 60 * K64, 8 * K64, "across two memory objects");
  m[3] = must_reg(vreg, BASE + 1024 * K64, 130 * K64, "130 objects: two export calls");
  m[4] = must_reg(vreg, BASE + 1024 * K64 + 0x800, 0x10, "16 bytes");
  m[5] = must_reg(vreg, BASE + 4 * K64, 4 * K64, "a second MR of the same memory");
  must_miss(BASE + 95 * K64, 2 * K64, 0xf, "across two GPUs");
  must_not_export(BASE + 200 * K64, K64, "unmapped");
  must_miss(BASE, K64, 0xf | 0x40, "ODP");
  // host memory is the provider's, untouched
  static char host[1 << 16];
  struct ibv_mr *h = vreg(rig_pd, host, sizeof host, 0xf);
  if (!h || h->addr != host) fail("host MR", (long)(uintptr_t)h, 0); else vdereg(h);
  // free the second object while an MR over it is live: the dma-buf keeps the memory (a warning)
  gpu_free(0, BASE + 64 * K64, 32 * K64, b);
  must_not_export(BASE + 64 * K64, K64, "freed memory");
  for (int i = 0; i < 6; i++) if (m[i] && vdereg(m[i])) fail("dereg", i, 0);
  for (long i = 0; i < cycles; i++) {
    struct ibv_mr *x = must_reg(i & 1 ? direct : vreg, BASE + (i % 60) * K64, K64 + (i % 7) * 0x1000, "cycle");
    if (x && vdereg(x)) fail("cycle dereg", i, 0);
  }
  int fds1 = open_bufs();
  if (fds1 != fds0) fail("dma-buf fds left", fds0, fds1);
  (void)a;
  printf("routes dmabuf %s cycles=%ld buffers_left=%d failures=%d\n", failures ? "FAILED" : "ok", cycles, fds1 - fds0, failures);
  return failures != 0;
}

// BAR1 as a budget: six 64 MiB buffers on GPU 0, each registered twice (the second MR reuses
// the buffer), all live at once; the fake RM's BAR1 is set by the test. BAR1 is asked at the
// first export only (fakenv_bar1_queries: none before, two at it, none after).
static int bar1(void) {
  int (*queries)(void) = (int (*)(void))dlsym(RTLD_DEFAULT, "fakenv_bar1_queries");
  if (!queries) { fprintf(stderr, "no fakenv_bar1_queries\n"); return 2; }
  const uint64_t m64 = 64ull << 20;
  for (int i = 0; i < 6; i++) gpu_alloc(0, BASE + i * m64, m64);
  int before = queries();
  struct ibv_mr *m[12];
  for (int i = 0; i < 6; i++) {
    m[2 * i] = must_reg(vreg, BASE + i * m64, m64, "64 MiB");
    if (i == 0) before = before * 100 + queries();
    m[2 * i + 1] = must_reg(direct, BASE + i * m64, m64, "the same buffer again");
  }
  for (int i = 0; i < 12; i++) if (m[i] && vdereg(m[i])) fail("dereg", i, 0);
  struct ibv_mr *x = must_reg(vreg, BASE, m64, "after the others went");
  if (x) vdereg(x);
  printf("routes bar1 %s queries=%04d,%d\n", failures ? "FAILED" : "ok", before, queries());
  return failures != 0;
}

static int shared(void) {
  unsigned long *exports = (unsigned long *)dlsym(RTLD_DEFAULT, "fakenv_exports");
  if (!exports) { fprintf(stderr, "no fakenv_exports\n"); return 2; }
  int fds0 = distinct_bufs();
  uint32_t a = gpu_alloc(0, BASE, 64 * K64);
  unsigned long e0 = *exports;
  struct ibv_mr *m[4];
  for (int i = 0; i < 4; i++) m[i] = must_reg(i & 1 ? direct : vreg, BASE, 64 * K64, "the same buffer again");
  unsigned long exports_for_4 = *exports - e0;
  int open_while_used = distinct_bufs() - fds0;
  // a caller's own export of the same memory: a new buffer, its fd its own to close
  int own = gdrshim_dl_export_dmabuf(BASE, 64 * K64);
  if (own < 0) fail("gdrshim_export_dmabuf", own, 0);
  unsigned long exports_caller = *exports - e0 - exports_for_4;
  close(own);
  struct ibv_mr *twin = must_reg(vreg, BASE, 64 * K64, "after the caller's fd closed");
  // a fork child: inert, the parent's buffer is not used for it (the NIC refuses GPU VA)
  pid_t pid = fork();
  if (pid == 0) {
    errno = 0;
    struct ibv_mr *x = vreg(rig_pd, (void *)(uintptr_t)BASE, 64 * K64, 0xf);
    _exit(x == NULL && errno == EFAULT ? 0 : 1);
  }
  int status = -1; waitpid(pid, &status, 0);
  int child_ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
  if (!child_ok) fail("fork child registered over the parent's buffer", status, 0);
  for (int i = 0; i < 4; i++) if (m[i] && vdereg(m[i])) fail("dereg", i, 0);
  int open_before_last = distinct_bufs() - fds0;
  if (twin && vdereg(twin)) fail("dereg twin", 0, 0);
  int open_after_last = distinct_bufs() - fds0;
  // freed and allocated again at the same VA while an MR of the old memory lives: the new MR
  // must be the new memory (the fake NIC checks every page), by a new export
  struct ibv_mr *old = must_reg(vreg, BASE, 64 * K64, "before the free");
  gpu_free(0, BASE, 64 * K64, a);
  unsigned long e1 = *exports;
  gpu_alloc(0, BASE, 64 * K64);
  struct ibv_mr *fresh = must_reg(vreg, BASE, 64 * K64, "the same VA, new memory");
  unsigned long exports_new = *exports - e1;
  if (fresh && vdereg(fresh)) fail("dereg fresh", 0, 0);
  if (old && vdereg(old)) fail("dereg old", 0, 0);
  int left = distinct_bufs() - fds0;
  printf("routes shared %s exports_for_4=%lu open_while_used=%d exports_caller=%lu child_ok=%d open_before_last=%d open_after_last=%d exports_new=%lu left=%d\n",
         failures ? "FAILED" : "ok", exports_for_4, open_while_used, exports_caller, child_ok, open_before_last, open_after_last, exports_new, left);
  return failures != 0;
}

typedef int (*getproc_t)(const char *, void **, int, uint64_t, int *);
typedef int (*handle_t)(void *, uint64_t, size_t, int, unsigned long long);
typedef int (*attr_t)(int *, int, int);
static int cuda(void) {
  gpu_alloc(0, BASE, 64 * K64);
  void *lib = dlopen(getenv("FAKE_LIBCUDA"), RTLD_NOW | RTLD_LOCAL);
  getproc_t gp = lib ? (getproc_t)dlsym(lib, "cuGetProcAddress_v2") : NULL;
  if (!gp) { fprintf(stderr, "no fake libcuda\n"); return 2; }
  handle_t hf = NULL; attr_t af = NULL;
  gp("cuMemGetHandleForAddressRange", (void **)&hf, 12080, 0, NULL);
  gp("cuDeviceGetAttribute", (void **)&af, 12080, 0, NULL);
  int supported = -1; af(&supported, 124, 0);
  int fd = -1, r = hf(&fd, BASE + 2 * K64, 8 * K64, 1, 0);
  struct stat st = {0};
  if (r || fd < 0 || fstat(fd, &st) || st.st_size != (off_t)(8 * K64)) fail("served fd", r, fd);
  int fd2 = -1, r2 = hf(&fd2, BASE + 0x100, K64, 1, 0); // not page aligned: INVALID_VALUE, as libcuda answers
  int fd3 = -1, r3 = hf(&fd3, BASE + 80 * K64, K64, 1, 0); // not mapped: libcuda says INVALID_VALUE
  int direct_fd = gdrshim_dl_export_dmabuf(BASE, 4 * K64);
  if (direct_fd < 0) fail("gdrshim_export_dmabuf", direct_fd, 0);
  printf("routes cuda %s attr124=%d r=%d size=%ld r_unaligned=%d r_unmapped=%d export=%s\n", failures ? "FAILED" : "ok", supported, r, (long)st.st_size, r2, r3,
         direct_fd >= 0 ? "fd" : "none");
  close(fd); close(direct_fd);
  return failures != 0;
}

static int owned(void) {
  gpu_alloc(0, BASE, 4 * K64);
  gpu_alloc(0, BASE + 4 * K64, 4 * K64);
  cuda_internal = 1;
  gpu_alloc(0, BASE + 8 * K64, 8 * K64);
  cuda_internal = 0;
  void *lib = dlopen(getenv("FAKE_LIBCUDA"), RTLD_NOW | RTLD_LOCAL);
  getproc_t gp = lib ? (getproc_t)dlsym(lib, "cuGetProcAddress_v2") : NULL;
  handle_t hf = NULL;
  if (gp) gp("cuMemGetHandleForAddressRange", (void **)&hf, 12080, 0, NULL);
  if (!hf) { fprintf(stderr, "no fake libcuda\n"); return 2; }
  int routed = gdrshim_dl_gdr_route();
  // (the NV503C route registers one memory object per MR: there, inside the first allocation)
  struct ibv_mr *both = must_reg(vreg, BASE + K64, routed == 1 ? 6 * K64 : 2 * K64, "MR over the program's allocations");
  must_miss(BASE + 8 * K64, K64, 0xf, "MR over CUDA's own memory");
  must_miss(BASE + 6 * K64, 4 * K64, 0xf, "MR running past the allocation into CUDA's memory");
  int fd = -1, r_both = hf(&fd, BASE, 8 * K64, 1, 0);
  if (fd >= 0) close(fd);
  int fd2 = -1, r_cuda = hf(&fd2, BASE + 8 * K64, 8 * K64, 1, 0), fd3 = -1, r_past = hf(&fd3, BASE, 12 * K64, 1, 0);
  int e_cuda = gdrshim_dl_export_dmabuf(BASE + 8 * K64, K64), e_both = gdrshim_dl_export_dmabuf(BASE, 8 * K64);
  if (e_both >= 0) close(e_both);
  if (both) vdereg(both);
  // pinned host memory (cudaHostAlloc): host pages described to RM (NV_ESC_RM_ALLOC_MEMORY, class
  // 0x71) and mapped into GPU VA at their own address; NCCL registers its host buffers so, with
  // plain host memory beside them too: host memory to the NIC, not a miss over GPU memory
  uint8_t *hp = mmap(NULL, 16 * K64, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  uint64_t host = ((uint64_t)(uintptr_t)hp + K64 - 1) & ~(K64 - 1);
  uint32_t os[14] = {client, dev[0], 0x5c0000f1, 0x71, 0x40001010};
  uint64_t pm = host, limit = 4 * K64 - 1; memcpy(&os[6], &pm, 8); memcpy(&os[8], &limit, 8);
  if (ioctl(ctl, NV_IOCTL(0x27, 56), os) || os[10]) fail("RM_ALLOC_MEMORY", 0x71, os[10]);
  uint64_t rng[3] = {host, 4 * K64, 0}; uvm_call(73, rng, 16);
  cuda_internal = 1; map(host, 4 * K64, 0, 0, 0x5c0000f1); cuda_internal = 0;
  int pinned = 0;
  for (int i = 0; i < 2; i++) { // inside it (NCCL's 0x81000-byte buffer), and running past it
    uint64_t len = i ? 8 * K64 : 0x21000;
    struct ibv_mr *m = must_reg(vreg, host + K64, len, "MR over pinned host memory");
    pinned += m != NULL;
    if (m) vdereg(m);
  }
  printf("routes owned %s route=%d both=%s r_both=%d r_cuda=%d r_past=%d export_cuda=%d export_both=%s pinned=%d\n", failures ? "FAILED" : "ok", routed,
         both ? "mr" : "none", r_both, r_cuda, r_past, e_cuda, e_both >= 0 ? "fd" : "none", pinned);
  return failures != 0;
}

static void *fake_cuda(getproc_t *gp) {
  void *lib = dlopen(getenv("FAKE_LIBCUDA"), RTLD_NOW | RTLD_LOCAL);
  *gp = lib ? (getproc_t)dlsym(lib, "cuGetProcAddress_v2") : NULL;
  if (!*gp) { fprintf(stderr, "no fake libcuda\n"); exit(2); }
  return lib;
}

static int attrs(void) {
  gpu_alloc(0, BASE, 4 * K64);
  getproc_t gp; fake_cuda(&gp);
  attr_t af = NULL;
  gp("cuDeviceGetAttribute", (void **)&af, 12080, 0, NULL);
  int v116 = -1, v110 = -1, v124 = -1, v75 = -1;
  int r = af(&v116, 116, 0) | af(&v110, 110, 0) | af(&v124, 124, 0) | af(&v75, 75, 0);
  printf("routes attrs ok r=%d a116=%d a110=%d a124=%d a75=%d\n", r, v116, v110, v124, v75);
  return 0;
}

typedef int (*create_t)(uint64_t *, size_t, const void *, unsigned long long);
static int vmm(int ask, int flag) {
  gpu_alloc(0, BASE, 4 * K64);
  getproc_t gp; void *lib = fake_cuda(&gp);
  attr_t af = NULL; create_t cf = NULL;
  gp("cuDeviceGetAttribute", (void **)&af, 12080, 0, NULL);
  gp("cuMemCreate", (void **)&cf, 12080, 0, NULL);
  int *calls = (int *)dlsym(lib, "fakecuda_create_calls");
  if (!af || !cf || !calls) { fprintf(stderr, "no cuMemCreate\n"); return 2; }
  int v110 = -1;
  if (ask) af(&v110, 110, 0);
  // CUmemAllocationProp: pinned device memory on device 0, allocFlags.gpuDirectRDMACapable = 1
  unsigned char prop[32] = {0};
  prop[0] = 1; prop[8] = 1; prop[25] = (unsigned char)flag;
  unsigned char before[32]; memcpy(before, prop, sizeof prop);
  uint64_t h = 0;
  errno = 4242;
  int r = cf(&h, 2 << 20, prop, 0);
  int e = errno;
  printf("routes vmm ok a110=%d r=%d calls=%d flag_after=%d prop_same=%d handle=%#llx errno=%d\n", v110, r, *calls, prop[25],
         !memcmp(before, prop, sizeof prop), (unsigned long long)h, e);
  return 0;
}

static int refused(void) {
  int fds0 = open_bufs();
  gpu_alloc(0, BASE, 4 * K64);
  must_miss(BASE, 4 * K64, 0xf, "a refused export falls back");
  int fds1 = open_bufs();
  if (fds1 != fds0) fail("dma-buf fds left", fds0, fds1);
  printf("routes refused %s buffers_left=%d\n", failures ? "FAILED" : "ok", fds1 - fds0);
  return failures != 0;
}

// "explicit": gdrshim_register as the process's first registration, before any route is decided:
// on a DMA-BUF rig the call decides DMA-BUF, which has no registration to hold (-EOPNOTSUPP), and
// no buffer is left open
static int explicit_first(void) {
  int fds0 = open_bufs();
  gpu_alloc(0, BASE, 4 * K64);
  int64_t h = gdrshim_dl_register(BASE, 4 * K64); // (asking the route first would decide it)
  int fds1 = open_bufs();
  printf("routes explicit ok handle=%lld route=%d buffers_left=%d\n", (long long)h, gdrshim_dl_gdr_route(), fds1 - fds0);
  return 0;
}

struct umem_in { void *addr; size_t size; uint32_t access; uint64_t pgsz_bitmap, comp_mask; int dmabuf_fd; };
typedef void *(*ureg_t)(void *, void *, size_t, uint32_t);
typedef void *(*uregex_t)(void *, struct umem_in *);
typedef int (*udereg_t)(void *);
static void *must_sym(void *h, const char *name, const char *ver) {
  void *p = ver ? dlvsym(h, name, ver) : dlsym(h, name);
  if (!p) { fprintf(stderr, "no %s\n", name); exit(2); }
  return p;
}
static int umem(void) {
  int fds0 = open_bufs();
  gpu_alloc(0, BASE, 64 * K64);
  gpu_alloc(0, BASE + 64 * K64, 32 * K64);
  gpu_alloc(1, BASE + 96 * K64, 16 * K64);
  void *h = dlopen("libmlx5.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!h) { fprintf(stderr, "dlopen libmlx5.so.1: %s\n", dlerror()); return 2; }
  ureg_t reg = (ureg_t)must_sym(h, "mlx5dv_devx_umem_reg", "MLX5_1.7");
  uregex_t regex = (uregex_t)must_sym(RTLD_DEFAULT, "mlx5dv_devx_umem_reg_ex", NULL); // gdrshim's export
  udereg_t dereg = (udereg_t)must_sym(h, "mlx5dv_devx_umem_dereg", "MLX5_1.7");
  uint64_t *va = must_sym(h, "fakemlx5_va", NULL), *mask = must_sym(h, "fakemlx5_last_mask", NULL), *pgsz = must_sym(h, "fakemlx5_last_pgsz", NULL);
  unsigned long *legacy = must_sym(h, "fakemlx5_legacy", NULL), *ex = must_sym(h, "fakemlx5_ex", NULL);
  int (*live_regs)(void) = (int (*)(void))must_sym(RTLD_DEFAULT, "fakenv_live_registrations", NULL);
  void *ctx = rig_ctx;
  // GPU memory through mlx5dv_devx_umem_reg (dlvsym)
  *va = BASE + K64;
  unsigned long l0 = *legacy, x0 = *ex;
  errno = 4242;
  void *u = reg(ctx, (void *)(uintptr_t)(BASE + K64), 4 * K64, 7);
  int e1 = errno, during = live_regs(), bufs_during = open_bufs() - fds0;
  printf("umem1 ok=%d errno=%d legacy=%lu ex=%lu mask=%#lx pgsz=%#lx regs=%d bufs=%d\n", !!u, e1, *legacy - l0, *ex - x0, (unsigned long)*mask,
         (unsigned long)*pgsz, during, bufs_during);
  if (u && dereg(u)) fail("umem dereg", 0, 0);
  printf("umem1 after regs=%d bufs=%d\n", live_regs(), open_bufs() - fds0);
  // GPU memory through mlx5dv_devx_umem_reg_ex (gdrshim's exported symbol), its page sizes kept
  *va = BASE + 8 * K64;
  struct umem_in in = {(void *)(uintptr_t)(BASE + 8 * K64), 2 * K64, 3, ~0xffffull, 0, -1};
  errno = 4242;
  u = regex(ctx, &in);
  printf("umem2 ok=%d errno=%d mask=%#lx pgsz=%#lx regs=%d caller_mask=%#lx\n", !!u, errno, (unsigned long)*mask, (unsigned long)*pgsz, live_regs(),
         (unsigned long)in.comp_mask);
  if (u && dereg(u)) fail("umem dereg", 0, 0);
  // host memory: the provider's, by address
  static char host[1 << 16];
  l0 = *legacy; x0 = *ex;
  u = reg(ctx, host, sizeof host, 7);
  printf("umem host ok=%d legacy=%lu ex=%lu\n", !!u, *legacy - l0, *ex - x0);
  if (u) dereg(u);
  // a miss (across two GPUs): nothing registered, the provider's EFAULT
  x0 = *ex;
  errno = 0;
  u = reg(ctx, (void *)(uintptr_t)(BASE + 95 * K64), 2 * K64, 7);
  printf("umem miss ok=%d errno=%d ex=%lu regs=%d\n", !!u, errno, *ex - x0, live_regs());
  if (u) dereg(u);
  // a mask bit gdrshim does not know, on GPU memory: untouched
  struct umem_in odd = {(void *)(uintptr_t)BASE, K64, 7, ~0xfffull, 0x20, -1};
  errno = 0;
  u = regex(ctx, &odd);
  printf("umem unknown ok=%d errno=%d mask=%#lx\n", !!u, errno, (unsigned long)*mask);
  // the program's own dma-buf (fd -1 here): untouched
  struct umem_in own = {(void *)0, K64, 7, ~0xfffull, 1, -1};
  errno = 0;
  u = regex(ctx, &own);
  printf("umem own ok=%d errno=%d\n", !!u, errno);
  printf("routes umem %s buffers_left=%d failures=%d\n", failures ? "FAILED" : "ok", open_bufs() - fds0, failures);
  return failures != 0;
}

struct mr_init_attr { size_t length; int access; uint64_t comp_mask, iova; void *addr; int fd; uint64_t fd_offset; void *dmah, *buf; };
static int mrex(void) {
  int fds0 = open_bufs();
  gpu_alloc(0, BASE, 64 * K64);
  void *vh = dlopen("libibverbs.so.1", RTLD_NOW | RTLD_GLOBAL);
  struct ibv_mr *(*f)(void *, struct mr_init_attr *) = (struct ibv_mr * (*)(void *, struct mr_init_attr *)) must_sym(vh, "ibv_reg_mr_ex", "IBVERBS_1.15");
  uint64_t *mask = must_sym(vh, "fakeverbs_mrex_mask", NULL);
  void **dmah = must_sym(vh, "fakeverbs_mrex_dmah", NULL);
  struct mr_init_attr a = {2 * K64, 0xf, 0x2 | 0x10, 0, (void *)(uintptr_t)(BASE + K64), -1, 0, (void *)0xd0a4, NULL};
  errno = 4242;
  struct ibv_mr *m = f(rig_pd, &a);
  printf("mrex dmah ok=%d errno=%d addr_shown=%d mask=%#lx dmah=%#lx\n", !!m, errno, m && (uint64_t)(uintptr_t)m->addr == BASE + K64, (unsigned long)*mask,
         (unsigned long)(uintptr_t)*dmah);
  if (m) vdereg(m);
  struct mr_init_attr b = {K64, 0xf, 0x2 | 0x40, 0, (void *)(uintptr_t)BASE, -1, 0, NULL, NULL};
  errno = 0;
  m = f(rig_pd, &b);
  printf("mrex unknown ok=%d errno=%d mask=%#lx\n", !!m, errno, (unsigned long)*mask);
  printf("routes mrex %s buffers_left=%d failures=%d\n", failures ? "FAILED" : "ok", open_bufs() - fds0, failures);
  return failures != 0;
}

// A thread with a cancellation pending registers GPU memory through a provider that passes a
// cancellation point inside the call (rdma-core's write()). The MR must be made and its outcome
// told to gdrshim (registration or buffer held by the MR, given back at its dereg); the thread
// is cancelled at its own next cancellation point, after the call.
// Runs job(arg) in a thread with a cancellation pending (the fakes' calls pass a cancellation
// point): 1 when the job's call completed (*result) and the thread was cancelled after it.
struct pending_job { void *(*job)(void *); void *arg, *result; };
static void *pending_run(void *p) {
  struct pending_job *j = p;
  int old; pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, &old);
  pthread_cancel(pthread_self()); // pending from here on
  pthread_setcancelstate(old, NULL);
  j->result = j->job(j->arg);
  pthread_testcancel();
  return (void *)7;
}
static int run_cancelled(void *(*job)(void *), void *arg, void **result) {
  struct pending_job j = {job, arg, (void *)-1}; pthread_t t; void *ret = NULL;
  pthread_create(&t, NULL, pending_run, &j); pthread_join(t, &ret);
  *result = j.result;
  return ret == PTHREAD_CANCELED && j.result != (void *)-1;
}
static void *(*ureg_fn)(void *, void *, size_t, uint32_t);
static int (*udereg_fn)(void *);
static void *reg_job(void *p) { return vreg(rig_pd, (void *)(uintptr_t)*(uint64_t *)p, 64 * K64, 0xf); }
static void *dereg_job(void *mr) { return (void *)(intptr_t)vdereg(mr); }
static void *ureg_job(void *p) { return ureg_fn(rig_ctx, (void *)(uintptr_t)*(uint64_t *)p, 64 * K64, 7); }
static void *udereg_job(void *u) { return (void *)(intptr_t)udereg_fn(u); }
// A registration and its dereg (verbs MR, then devx umem), each in a thread with a cancellation
// pending: every call completes and is told to gdrshim, each thread is cancelled after its call,
// the buffer or registration is held while the MR lives and given back at its dereg.
static int cancel(void) {
  int *flag = (int *)dlsym(RTLD_DEFAULT, "fakeverbs_cancel_point_in_reg");
  void *h = dlopen("libmlx5.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!flag || !h) { fprintf(stderr, "fake verbs without fakeverbs_cancel_point_in_reg, or no libmlx5.so.1\n"); return 2; }
  ureg_fn = (void *(*)(void *, void *, size_t, uint32_t))must_sym(h, "mlx5dv_devx_umem_reg", "MLX5_1.7");
  udereg_fn = (int (*)(void *))must_sym(h, "mlx5dv_devx_umem_dereg", "MLX5_1.7");
  *(uint64_t *)must_sym(h, "fakemlx5_va", NULL) = BASE;
  int fds0 = distinct_bufs(), cancelled = 0, made = 0, bufs_while_used = -1;
  uint64_t base = BASE, held = 0, held_after = ~0ull; uint32_t a = gpu_alloc(0, base, 64 * K64);
  void *(*regs[2])(void *) = {reg_job, ureg_job}, *(*deregs[2])(void *) = {dereg_job, udereg_job};
  for (int k = 0; k < 2; k++) {
    void *obj = NULL, *rc = NULL;
    __atomic_store_n(flag, 1, __ATOMIC_RELEASE);
    cancelled += run_cancelled(regs[k], &base, &obj);
    __atomic_store_n(flag, 0, __ATOMIC_RELEASE);
    if (!obj) { fail("no MR or umem: the thread was cancelled inside the provider's call", k, 0); continue; }
    made++;
    struct gdrshim_counters c; memset(&c, 0, sizeof c); gdrshim_dl_counters(&c, sizeof c);
    held += c.live_registrations + c.dmabuf_buffers;
    if (k == 0) bufs_while_used = distinct_bufs() - fds0;
    __atomic_store_n(flag, 1, __ATOMIC_RELEASE);
    cancelled += run_cancelled(deregs[k], obj, &rc);
    __atomic_store_n(flag, 0, __ATOMIC_RELEASE);
    if (rc != NULL) fail("dereg", k, (long)(intptr_t)rc);
    memset(&c, 0xff, sizeof c); gdrshim_dl_counters(&c, sizeof c);
    held_after = (k ? held_after : 0) + c.live_registrations + c.dmabuf_buffers + c.registered_bytes;
  }
  int left = distinct_bufs() - fds0;
  gpu_free(0, base, 64 * K64, a);
  printf("routes cancel %s cancelled=%d made=%d held=%lu bufs_while_used=%d held_after=%lu left=%d\n", failures ? "FAILED" : "ok", cancelled, made,
         (unsigned long)held, bufs_while_used, (unsigned long)held_after, left);
  return failures != 0;
}

// One MR deregistered at once, then one whose memory is freed while it lives: with every
// outcome kept for the core's next holder (GDRSHIM_TEST_SETTLE_LATE=1), the dereg must still
// find its MR and the release must still see the MR (its warning); nothing left at the end.
static int quick(void) {
  int fds0 = distinct_bufs();
  uint32_t a = gpu_alloc(0, BASE, 64 * K64);
  struct ibv_mr *m = must_reg(vreg, BASE, 64 * K64, "quick");
  if (m && vdereg(m)) fail("dereg", 0, 0);
  struct ibv_mr *m2 = must_reg(vreg, BASE, 64 * K64, "before the free");
  gpu_free(0, BASE, 64 * K64, a);
  if (m2 && vdereg(m2)) fail("dereg after the free", 0, 0);
  struct gdrshim_counters c; memset(&c, 0xff, sizeof c); gdrshim_dl_counters(&c, sizeof c);
  printf("routes quick %s left=%d dmabuf_buffers=%lu registered_bytes=%lu exports=%lu\n", failures ? "FAILED" : "ok", distinct_bufs() - fds0,
         (unsigned long)c.dmabuf_buffers, (unsigned long)c.registered_bytes, (unsigned long)c.dmabuf_exports);
  return failures != 0;
}

int main(int argc, char **argv) {
  if (argc < 2) return 2;
  ask_early = !strcmp(argv[1], "early");
  setup();
  if (ask_early) return early();
  if (!strcmp(argv[1], "matrix")) return matrix();
  if (!strcmp(argv[1], "dmabuf")) return dmabuf(argc > 2 ? atol(argv[2]) : 100);
  if (!strcmp(argv[1], "cuda")) return cuda();
  if (!strcmp(argv[1], "shared")) return shared();
  if (!strcmp(argv[1], "cancel")) return cancel();
  if (!strcmp(argv[1], "quick")) return quick();
  if (!strcmp(argv[1], "refused")) return refused();
  if (!strcmp(argv[1], "owned")) return owned();
  if (!strcmp(argv[1], "attrs")) return attrs();
  if (!strcmp(argv[1], "vmm")) return vmm(argc > 2 && !strcmp(argv[2], "ask"), argc > 3 ? atoi(argv[3]) : 1);
  if (!strcmp(argv[1], "explicit")) return explicit_first();
  if (!strcmp(argv[1], "umem")) return umem();
  if (!strcmp(argv[1], "mrex")) return mrex();
  if (!strcmp(argv[1], "bar1")) return bar1();
  return 2;
}
