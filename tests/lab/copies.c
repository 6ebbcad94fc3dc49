// Two copies of rdma-core's libibverbs in one lab host (ours, test only; tests/lab_copies.rs):
// the system's, and a wheel's renamed copy, each with its own lab provider, each used by a
// library of its own (copyuser.c, loaded RTLD_LOCAL, as Python loads extension modules). With
// the stand-in libcuda (and gdrshim with the fake driver, preloaded), each library registers
// host memory and GPU memory through ibv_reg_mr, ibv_reg_mr_iova and ibv_reg_mr_iova2, and GPU
// memory through ibv_reg_dmabuf_mr of a dma-buf of gdrshim's export (on the DMA-BUF route), then
// deregisters each. A
// provider that a copy not its own calls says MIXED and refuses (fwprovider.c).
//   copies ORDER ROUNDS   ORDER 12 loads libcopyuser1 first, 21 libcopyuser2 first. Prints
//                         "copies ORDER host_mrs=H gpu_mrs=G dmabuf_mrs=D ok" (what was registered,
//                         by kind) or names what failed.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct ibv_mr;
typedef void *(*pd_fn)(void);
typedef struct ibv_mr *(*reg_fn)(int, void *, void *, size_t, int);
typedef int (*dereg_fn)(struct ibv_mr *);
struct user { pd_fn pd; reg_fn reg; dereg_fn dereg; void *p; };

static int failures, counts[3]; // host, GPU by address, GPU by dma-buf
static const char *entry[] = {"ibv_reg_mr", "ibv_reg_mr_iova", "ibv_reg_mr_iova2", "ibv_reg_dmabuf_mr"};
static void fail(const char *what, int copy, int how) {
  fprintf(stderr, "copies: copy %d: %s through %s: %s\n", copy, what, entry[how], strerror(errno));
  failures++;
}

static struct user load(int n) {
  char name[32];
  snprintf(name, sizeof name, "libcopyuser%d.so", n);
  void *h = dlopen(name, RTLD_NOW | RTLD_LOCAL);
  if (!h) { fprintf(stderr, "dlopen %s: %s\n", name, dlerror()); exit(2); }
  struct user u = {(pd_fn)dlsym(h, "user_pd"), (reg_fn)dlsym(h, "user_reg"), (dereg_fn)dlsym(h, "user_dereg"), NULL};
  if (!u.pd || !u.reg || !u.dereg) { fprintf(stderr, "%s: functions missing\n", name); exit(2); }
  if (!(u.p = u.pd())) { fprintf(stderr, "copy %d: no PD on the lab's device: %s\n", n, strerror(errno)); exit(2); }
  return u;
}

static void reg_dereg(struct user *u, int copy, int how, void *addr, size_t len, int fd, int kind) {
  errno = 0;
  struct ibv_mr *m = u->reg(how, u->p, addr, len, fd);
  if (!m) { fail(kind ? "a GPU MR" : "a host MR", copy, how); return; }
  counts[kind]++;
  if (u->dereg(m)) fail("dereg", copy, how);
}

int main(int argc, char **argv) {
  const char *order = argc > 1 ? argv[1] : "";
  int rounds = argc > 2 ? atoi(argv[2]) : 1;
  if ((strcmp(order, "12") && strcmp(order, "21")) || rounds < 1) { fprintf(stderr, "usage: copies 12|21 ROUNDS\n"); return 2; }
  void *cu = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
  int (*cu_init)(unsigned) = cu ? (int (*)(unsigned))dlsym(cu, "cuInit") : NULL;
  int (*retain)(void **, int) = cu ? (int (*)(void **, int))dlsym(cu, "cuDevicePrimaryCtxRetain") : NULL;
  int (*set_ctx)(void *) = cu ? (int (*)(void *))dlsym(cu, "cuCtxSetCurrent") : NULL;
  int (*alloc)(uint64_t *, size_t) = cu ? (int (*)(uint64_t *, size_t))dlsym(cu, "cuMemAlloc_v2") : NULL;
  int (*export_dmabuf)(uint64_t, uint64_t) = (int (*)(uint64_t, uint64_t))dlsym(RTLD_DEFAULT, "gdrshim_export_dmabuf");
  void *ctx;
  uint64_t gpu = 0;
  const size_t len = 2 << 20;
  if (!alloc || cu_init(0) || retain(&ctx, 0) || set_ctx(ctx) || alloc(&gpu, len)) { fprintf(stderr, "copies: no GPU memory from libcuda\n"); return 2; }
  if (!export_dmabuf) { fprintf(stderr, "copies: gdrshim is not preloaded\n"); return 2; }
  struct user u[3];
  u[order[0] - '0'] = load(order[0] - '0');
  u[order[1] - '0'] = load(order[1] - '0');
  static char host[1 << 16] __attribute__((aligned(4096)));
  for (int r = 0; r < rounds; r++)
    for (int copy = 1; copy <= 2; copy++) {
      for (int how = 0; how < 3; how++) {
        reg_dereg(&u[copy], copy, how, host, sizeof host, -1, 0);
        reg_dereg(&u[copy], copy, how, (void *)(uintptr_t)gpu, len, -1, 1);
      }
      int fd = export_dmabuf(gpu, len);
      if (fd == -EPERM) continue; // the NV503C route exports nothing
      if (fd < 0) { errno = -fd; fail("gdrshim_export_dmabuf", copy, 3); continue; }
      reg_dereg(&u[copy], copy, 3, (void *)(uintptr_t)gpu, len, fd, 2);
      close(fd);
    }
  printf("copies %s host_mrs=%d gpu_mrs=%d dmabuf_mrs=%d %s\n", order, counts[0], counts[1], counts[2], failures ? "FAILED" : "ok");
  return failures != 0;
}
