// Two copies of libibverbs in one process, as vLLM/Dynamo-style serving has them (ours): the
// system's (tests/c/twoverbs.c built as libibverbs.so.1), which NCCL loads RTLD_LOCAL and calls
// through dlvsym, and a wheel's renamed copy (libibverbs-1a2b3c4d.so.1), which a library of the
// wheel links and calls directly (tests/c/twouser.c: libuser1.so links the system's copy,
// libuser2.so the wheel's). Each copy fails loudly when handed the other's objects.
//   twocopies ORDER   ORDER 12 loads libuser1 first, 21 libuser2 first. Through each way in, host
//                     and GPU memory (the DMA-BUF route's conversion to ibv_reg_dmabuf_mr
//                     included) are registered, re-registered and deregistered in the caller's
//                     own copy; then the wheel's copy is unloaded, the rest goes on, and it is
//                     loaded again. Prints "twocopies ORDER ok" or names what went wrong.
#include "rig.h"

typedef void *(*pd_fn)(void *);
typedef void *(*user_pd_fn)(void);
typedef struct ibv_mr *(*user_reg_fn)(void *, void *, size_t);
typedef int (*user_rereg_fn)(struct ibv_mr *, void *, void *, size_t);
struct user { void *h; user_pd_fn pd; user_reg_fn reg; user_rereg_fn rereg; dereg_t dereg; };

static struct user load_user(int n) {
  char name[32];
  snprintf(name, sizeof name, "libuser%d.so", n);
  struct user u = {dlopen(name, RTLD_NOW | RTLD_LOCAL), 0, 0, 0, 0};
  if (!u.h) { fprintf(stderr, "dlopen %s: %s\n", name, dlerror()); exit(2); }
  u.pd = (user_pd_fn)dlsym(u.h, "user_pd");
  u.reg = (user_reg_fn)dlsym(u.h, "user_reg");
  u.rereg = (user_rereg_fn)dlsym(u.h, "user_rereg");
  u.dereg = (dereg_t)dlsym(u.h, "user_dereg");
  if (!u.pd || !u.reg || !u.rereg || !u.dereg) { fprintf(stderr, "%s: functions missing\n", name); exit(2); }
  return u;
}

static char host[1 << 16];

// Host memory (registered, moved, deregistered) and GPU memory (a dma-buf MR: lkey 9) through
// library n's direct calls.
static void use(struct user *u, int n) {
  void *pd = u->pd();
  struct ibv_mr *m = u->reg(pd, host, sizeof host);
  if (!m) fail("host MR", n, errno);
  else {
    if (u->rereg(m, pd, host + 4096, 4096)) fail("rereg", n, errno);
    if (u->dereg(m)) fail("dereg", n, errno);
  }
  m = u->reg(pd, (void *)BASE, 64 * K64);
  if (!m || m->lkey != 9) fail("a GPU MR, a dma-buf MR of the caller's copy", n, m ? (long)m->lkey : errno);
  if (m && u->dereg(m)) fail("dereg of the GPU MR", n, errno);
}

// NCCL's way: the system's copy by its name, RTLD_LOCAL, its functions by dlvsym; GPU memory by
// ibv_reg_mr (converted) and by ibv_reg_dmabuf_mr of a buffer of its own.
static void use_as_nccl(void *h) {
  pd_fn alloc = (pd_fn)dlvsym(h, "ibv_alloc_pd", "IBVERBS_1.1");
  reg_t reg = (reg_t)dlvsym(h, "ibv_reg_mr", "IBVERBS_1.1");
  dereg_t dereg = (dereg_t)dlvsym(h, "ibv_dereg_mr", "IBVERBS_1.1");
  struct ibv_mr *(*dmabuf)(void *, uint64_t, size_t, uint64_t, int, int) =
      (struct ibv_mr *(*)(void *, uint64_t, size_t, uint64_t, int, int))dlvsym(h, "ibv_reg_dmabuf_mr", "IBVERBS_1.12");
  if (!alloc || !reg || !dereg || !dmabuf) { fprintf(stderr, "dlvsym on libibverbs.so.1 failed\n"); exit(2); }
  void *pd = alloc(NULL);
  struct ibv_mr *m = reg(pd, (void *)BASE, 64 * K64, 0xf);
  if (!m || m->lkey != 9) fail("NCCL's GPU MR", 0, m ? (long)m->lkey : errno);
  if (m && dereg(m)) fail("NCCL's dereg", 0, errno);
  int fd = gdrshim_dl_export_dmabuf(BASE, 64 * K64);
  if (fd < 0) { fail("gdrshim_export_dmabuf", fd, 0); return; }
  m = dmabuf(pd, 0, 64 * K64, BASE, fd, 0xf);
  close(fd);
  if (!m) fail("NCCL's ibv_reg_dmabuf_mr", 0, errno);
  else if (dereg(m)) fail("NCCL's dereg of its dma-buf MR", 0, errno);
}

int main(int argc, char **argv) {
  const char *order = argc > 1 ? argv[1] : "";
  if (strcmp(order, "12") && strcmp(order, "21")) { fprintf(stderr, "usage: twocopies 12|21\n"); return 2; }
  setup_driver();
  gpu_alloc(0, BASE, 64 * K64);
  struct user u[3];
  u[order[0] - '0'] = load_user(order[0] - '0');
  u[order[1] - '0'] = load_user(order[1] - '0');
  void *h1 = dlopen("libibverbs.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!h1) { fprintf(stderr, "dlopen libibverbs.so.1: %s\n", dlerror()); return 2; }
  for (int round = 0; round < 2; round++) {
    use(&u[1], 1);
    use(&u[2], 2);
    use_as_nccl(h1);
    // the wheel's copy goes (its library unloaded): the others go on; it comes back
    if (dlclose(u[2].h)) fail("dlclose", 2, 0);
    use(&u[1], 1);
    use_as_nccl(h1);
    u[2] = load_user(2);
  }
  printf("twocopies %s %s\n", order, failures ? "FAILED" : "ok");
  return failures != 0;
}
