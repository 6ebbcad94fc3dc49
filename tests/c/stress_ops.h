// The stress test's calls (tests/c/stress.c includes it once): the fake driver's RM and UVM calls
// as libcuda makes them, thread-safe, with the program's handles (H_PROG: reused, so RM's memory
// under one number has generations); the CUDA allocation entry points gdrshim hooks, each reached
// as the exported symbol and through cuGetProcAddress; every registration entry point (ibv_reg_mr
// direct and through dlvsym, iova2, reg_mr_ex, the program's own dma-buf through
// ibv_reg_dmabuf_mr, rereg, mlx5dv devx umems by address). A working call must leave errno alone.
#pragma once

#define SENT 4242
enum {
  K_REG,
  K_REG_OK,
  K_PROBE,
  K_PROBE_OK,
  K_DEREG,
  K_REREG,
  K_REREG_OK,
  K_EXPORT,
  K_EXPORT_OK,
  K_OWN_DMABUF,
  K_UMEM,
  K_UMEM_OK,
  K_ALLOC,
  K_FREE,
  K_DRIVER_FREE,
  K_REMAP,
  K_FORK,
  K_SPAWN,
  K_OWN_CLOSE,
  K_CTX,
  K_CTX_ALLOC,
  K_BORROW,
  K_CHURN,
  K_CYCLE,
  K_N
};
static const char *k_names[K_N] = {"reg",   "reg_ok",   "probe",  "probe_served", "dereg",
                                   "rereg", "rereg_ok", "export", "export_ok",    "own_dmabuf_mr",
                                   "umem",  "umem_ok",  "alloc",  "free",         "driver_free",
                                   "remap", "fork",     "spawn",  "own_close",    "ctx",
                                   "ctx_alloc", "borrow", "churn", "cycles"};
static unsigned long kc[K_N];
static void count(int k) { __atomic_add_fetch(&kc[k], 1, __ATOMIC_RELAXED); }
static long fails; // calls that must work and did not (printed; the test bounds them)
static void failed(const char *what, long a, long b) {
  if (__atomic_add_fetch(&fails, 1, __ATOMIC_SEQ_CST) > 20) return;
  say("FAILED %s %#lx %#lx (thread %d)\n", what, (unsigned long)a, (unsigned long)b, tid_no);
  say_ring(6);
}
static void errno_kept(const char *what, long a) {
  if (errno != SENT) violation(what, (uint64_t)a, (uint64_t)errno);
}

// ---- the driver ----
static int drv(int fd, unsigned long req, void *a) {
  errno = SENT;
  int rc = ioctl(fd, req, a);
  if (!rc) errno_kept("errno changed by a working driver call", (long)req);
  return rc;
}
static int t_mem(int g, uint64_t size, int reg, int slot) {
  uint8_t p[128] = {0};
  memcpy(p + 64, &size, 8);
  uint32_t a[12] = {client, dev[g], H_PROG(reg, slot), 0x40};
  uint64_t pp = (uintptr_t)p;
  memcpy(&a[4], &pp, 8);
  note("RM_ALLOC", H_PROG(reg, slot), size, a[10]);
  if (drv(ctl, NV_IOCTL(0x2b, 48), a) || a[10]) {
    failed("RM_ALLOC", a[2], a[10]);
    return -1;
  }
  truth_gen(reg, slot);
  return 0;
}
static void t_free_mem(int g, int reg, int slot) {
  uint32_t a[4] = {client, dev[g], H_PROG(reg, slot), 0};
  note("RM_FREE", a[2], 0, 0);
  if (drv(ctl, NV_IOCTL(0x29, 16), a) || a[3]) failed("RM_FREE", a[2], a[3]);
  truth_end_mem(reg, slot);
  count(K_DRIVER_FREE);
}
static void t_uvm(unsigned long cmd, void *a, size_t at) {
  uint32_t st = 0;
  if (drv(uvm, cmd, a) || (memcpy(&st, (uint8_t *)a + at, 4), st)) failed("UVM", (long)cmd, st);
}
static void t_range(uint64_t va, uint64_t len) {
  uint64_t r[3] = {va, len, 0};
  t_uvm(73, r, 16);
}
// Memory (reg, slot) at [va, va+len) from offset off, on the GPUs of gmask.
static void t_map(uint64_t va, uint64_t len, uint64_t off, int gmask, int slot) {
  uint8_t a[9264] = {0};
  uint32_t h = H_PROG(region_of(va), slot);
  uint64_t n = 0;
  memcpy(a, &va, 8);
  memcpy(a + 8, &len, 8);
  memcpy(a + 16, &off, 8);
  for (int g = 0; g < 2; g++)
    if (gmask & (1 << g)) memcpy(a + 24 + 36 * n++, uuid[g], 16);
  note("UVM map", va, len, (long)h << 4 | gmask);
  memcpy(a + 9240, &n, 8);
  memcpy(a + 9248, &ctl, 4);
  memcpy(a + 9252, &client, 4);
  memcpy(a + 9256, &h, 4);
  t_uvm(33, a, 9260);
}
static void t_unmap(int g, uint64_t va, uint64_t len) {
  note("UVM unmap", va, len, g);
  uint8_t a[40] = {0};
  memcpy(a, &va, 8);
  memcpy(a + 8, &len, 8);
  memcpy(a + 16, uuid[g], 16);
  t_uvm(66, a, 32);
  count(K_DRIVER_FREE);
}
static void t_uvm_free(uint64_t va, uint64_t len) {
  note("UVM free", va, len, 0);
  uint64_t f[3] = {va, len, 0};
  t_uvm(34, f, 16);
  count(K_DRIVER_FREE);
}

// ---- CUDA's entry points, through gdrshim's hooks ----
typedef int (*alloc_t)(uint64_t *, size_t);
static alloc_t cu_alloc[2];
static int (*cu_alloc_async)(uint64_t *, size_t, void *),
    (*cu_alloc_pool)(uint64_t *, size_t, void *, void *);
static int (*cu_alloc_pitch)(uint64_t *, size_t *, size_t, size_t, unsigned);
static int (*cu_free[2])(uint64_t),
    (*cu_map)(uint64_t, size_t, size_t, uint64_t, unsigned long long),
    (*cu_unmap)(uint64_t, size_t);
static int (*cu_access)(uint64_t, size_t, const void *, size_t),
    (*cu_handle)(int *, uint64_t, size_t, int, unsigned long long);
static void (*set_next)(uint64_t);
static int (*ctx_at_end)(void *, void (*)(void *), void *);
static int (*ctx_retain)(void **, int), (*ctx_release)(int), (*ctx_create)(void **, unsigned, int),
    (*ctx_destroy)(void *), (*ctx_set_current)(void *);
static void *must(void *p, const char *what) {
  if (!p) {
    fprintf(stderr, "stress: no %s\n", what);
    exit(2);
  }
  return p;
}
static void cuda_setup(void) {
  void *cu = dlopen(getenv("FAKE_LIBCUDA"), RTLD_NOW | RTLD_GLOBAL);
  must(cu, "fake libcuda");
  int (*gp)(const char *, void **, int, uint64_t, int *) =
      must(dlsym(cu, "cuGetProcAddress_v2"), "cuGetProcAddress_v2");
  void *p = NULL;
  cu_alloc[0] = must(dlsym(RTLD_DEFAULT, "cuMemAlloc_v2"), "cuMemAlloc_v2");
  gp("cuMemAlloc", &p, 12000, 0, NULL);
  cu_alloc[1] = must(p, "cuMemAlloc by cuGetProcAddress");
  cu_free[0] = must(dlsym(RTLD_DEFAULT, "cuMemFree_v2"), "cuMemFree_v2");
  p = NULL;
  gp("cuMemFree", &p, 12000, 0, NULL);
  cu_free[1] = must(p, "cuMemFree by cuGetProcAddress");
  cu_alloc_async = must(dlsym(RTLD_DEFAULT, "cuMemAllocAsync"), "cuMemAllocAsync");
  cu_alloc_pool = must(dlsym(RTLD_DEFAULT, "cuMemAllocFromPoolAsync"), "cuMemAllocFromPoolAsync");
  cu_alloc_pitch = must(dlsym(RTLD_DEFAULT, "cuMemAllocPitch_v2"), "cuMemAllocPitch_v2");
  cu_map = must(dlsym(RTLD_DEFAULT, "cuMemMap"), "cuMemMap");
  cu_unmap = must(dlsym(RTLD_DEFAULT, "cuMemUnmap"), "cuMemUnmap");
  cu_access = must(dlsym(RTLD_DEFAULT, "cuMemSetAccess"), "cuMemSetAccess");
  cu_handle =
      must(dlsym(RTLD_DEFAULT, "cuMemGetHandleForAddressRange"), "cuMemGetHandleForAddressRange");
  set_next = must(dlsym(cu, "fakecuda_set_next"), "fakecuda_set_next");
  ctx_at_end = must(dlsym(cu, "fakecuda_at_end"), "fakecuda_at_end");
  void *f[5] = {0};
  const char *ctx_names[5] = {"cuDevicePrimaryCtxRetain", "cuDevicePrimaryCtxRelease",
                              "cuCtxCreate", "cuCtxDestroy", "cuCtxSetCurrent"};
  for (int i = 0; i < 5; i++) {
    gp(ctx_names[i], &f[i], 12080, 0, NULL);
    must(f[i], ctx_names[i]);
  }
  ctx_retain = f[0], ctx_release = f[1], ctx_create = f[2], ctx_destroy = f[3];
  ctx_set_current = f[4];
}
// The program is handed [va, va+len) by entry point `how` (0-5 carve or allocate, 6 cuMemMap of
// a handle, 7 cuMemSetAccess), counted to reach; the truth has it first.
static int cu_own(int how, uint64_t va, uint64_t len, uint64_t reach, int slot, uint64_t moff) {
  truth_begin(va, len, how >= 6 ? va + len : reach, slot, moff);
  note(how == 6 ? "cuMemMap" : how == 7 ? "cuMemSetAccess" : "cuMemAlloc*", va, len, (long)reach);
  uint64_t d = 0;
  size_t pitch = 0;
  int r;
  set_next(va);
  errno = SENT;
  switch (how) {
  case 0:
  case 1: r = cu_alloc[how](&d, len); break;
  case 2: r = cu_alloc_async(&d, len, NULL); break;
  case 3: r = cu_alloc_pool(&d, len, NULL, NULL); break;
  case 4: r = cu_alloc_pitch(&d, &pitch, len, 1, 4); break;
  case 5: r = cu_alloc[0](&d, len); break;
  case 6:
    r = cu_map(va, len, 0, 0, 0);
    d = va;
    break;
  default:
    r = cu_access(va, len, NULL, 0);
    d = va;
    break;
  }
  if (r || d != va) {
    failed("a CUDA allocation", va, r);
    truth_free_at(va);
    return -1;
  }
  errno_kept("errno changed by a CUDA allocation", (long)va);
  truth_settled(va);
  count(K_ALLOC);
  return 0;
}
// The program gives [va, va+len) back: cuMemFree of its pointer, or cuMemUnmap of the range.
static void cu_release(uint64_t va, uint64_t len, int by_unmap) {
  note(by_unmap ? "cuMemUnmap" : "cuMemFree", va, len, 0);
  errno = SENT;
  int r = by_unmap ? cu_unmap(va, len) : cu_free[rand() & 1](va);
  if (r) failed("a CUDA release", va, r);
  else errno_kept("errno changed by a CUDA release", (long)va);
  if (by_unmap) truth_end_range(va, va + len);
  else truth_free_at(va);
  count(K_FREE);
}

// ---- registration entry points ----
struct mr_attr {
  size_t length;
  int access;
  uint64_t comp_mask, iova;
  void *addr;
  int fd;
  uint64_t fd_offset;
  void *dmah, *buf;
};
struct umem_in {
  void *addr;
  size_t size;
  uint32_t access;
  uint64_t pgsz_bitmap, comp_mask;
  int dmabuf_fd;
};
static struct ibv_mr *(*e_iova2)(void *, void *, size_t, uint64_t, unsigned),
    *(*e_regex)(void *, struct mr_attr *);
static struct ibv_mr *(*e_dmabuf)(void *, uint64_t, size_t, uint64_t, int, int);
static int (*e_rereg)(struct ibv_mr *, int, void *, void *, size_t, int);
static void *(*u_reg)(void *, void *, size_t, uint32_t), *(*u_regex)(void *, struct umem_in *);
static int (*u_dereg)(void *);
static void (*u_va)(uint64_t);
static int new_verbs;
static void verbs_setup(void) {
  void *vh = must(dlopen("libibverbs.so.1", RTLD_NOW | RTLD_GLOBAL), "libibverbs.so.1");
  e_iova2 = must(dlvsym(vh, "ibv_reg_mr_iova2", "IBVERBS_1.8"), "ibv_reg_mr_iova2");
  e_rereg = must(dlsym(RTLD_DEFAULT, "ibv_rereg_mr"), "ibv_rereg_mr");
  e_regex = dlvsym(vh, "ibv_reg_mr_ex", "IBVERBS_1.15");
  e_dmabuf = dlvsym(vh, "ibv_reg_dmabuf_mr", "IBVERBS_1.12");
  // rdma-core 34 and later (ibv_reg_mr_ex is a later one's, 1.15: rdma-core 44 has none)
  new_verbs = e_dmabuf != NULL;
  void *mh = must(dlopen("libmlx5.so.1", RTLD_NOW | RTLD_LOCAL), "libmlx5.so.1");
  u_reg = must(dlvsym(mh, "mlx5dv_devx_umem_reg", "MLX5_1.7"), "mlx5dv_devx_umem_reg");
  u_dereg = must(dlvsym(mh, "mlx5dv_devx_umem_dereg", "MLX5_1.7"), "mlx5dv_devx_umem_dereg");
  u_regex = must(dlsym(RTLD_DEFAULT, "mlx5dv_devx_umem_reg_ex"), "mlx5dv_devx_umem_reg_ex");
  u_va = must(dlsym(mh, "fakemlx5_set_thread_va"), "fakemlx5_set_thread_va");
}
// An MR or umem the program holds.
typedef struct {
  void *obj;
  uint64_t va, len;
  int umem;
} held_t;
// Registers [va, va+len) by entry point `how`: NULL where it failed.
static void *reg_by(int how, uint64_t va, uint64_t len, int *umem) {
  void *pd = rig_pd, *a = (void *)(uintptr_t)va;
  struct mr_attr at;
  *umem = how >= 5;
  switch (how) {
  case 0: return direct(pd, a, len, 0xf);
  case 1: return vreg(pd, a, len, 0xf);
  case 2: return e_iova2(pd, a, len, va, 0xf);
  case 3:
  case 4:
    if (!e_regex) return vreg(pd, a, len, 0xf);
    at = (struct mr_attr){.length = len,
                          .access = 0xf,
                          .comp_mask = how == 3 ? 2 : 3,
                          .iova = va,
                          .addr = a,
                          .fd = -1};
    return e_regex(pd, &at);
  case 5: u_va(va); return u_reg(rig_ctx, a, len, 7);
  default: {
    struct umem_in in = {a, len, 7, ~0xfffull, 0, -1};
    u_va(va);
    return u_regex(rig_ctx, &in);
  }
  }
}
static const char *reg_names[7] = {
    "ibv_reg_mr",         "ibv_reg_mr (dlvsym)",  "ibv_reg_mr_iova2",       "ibv_reg_mr_ex",
    "ibv_reg_mr_ex iova", "mlx5dv_devx_umem_reg", "mlx5dv_devx_umem_reg_ex"};
static void unreg(held_t *h) {
  op_begin(h->umem ? "umem dereg" : "ibv_dereg_mr", h->va, h->len);
  errno = SENT;
  int r = h->umem ? u_dereg(h->obj) : vdereg(h->obj);
  op_end(r);
  if (r) failed("a dereg", (long)h->va, r);
  else errno_kept("errno changed by a dereg", (long)h->va);
  count(K_DEREG);
}
