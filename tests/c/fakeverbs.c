// A fake libibverbs.so.1 for gdrshim's tests (ours), versioned like rdma-core. It plays the NIC
// plus nvidia-peermem: a registration of GPU memory succeeds only when the fake driver says the
// range lies inside exactly one registration of the right memory object, on exactly one 503C
// of this process with one VA space; otherwise EFAULT, as ibv_reg_mr gives on a GeForce.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
struct ibv_mr { void *context, *pd, *addr; size_t length; uint32_t handle, lkey, rkey; };
unsigned long fakeverbs_dmabuf;
int fakeverbs_exit_in_reg; // a thread that ends inside the provider's registration (pthread_exit)
static struct ibv_mr *reg(void *addr, size_t len) {
  if (__atomic_load_n(&fakeverbs_exit_in_reg, __ATOMIC_ACQUIRE)) pthread_exit((void *)42);
  int (*check)(uint64_t, uint64_t) = (int (*)(uint64_t, uint64_t))dlsym(RTLD_DEFAULT, "fakenv_check");
  int r = check ? check((uint64_t)(uintptr_t)addr, len) : 1;
  if (r < 0) { errno = EFAULT; return NULL; }
  struct ibv_mr *m = calloc(1, sizeof *m); m->addr = addr; m->length = len; m->lkey = m->rkey = 7;
  return m;
}
struct ibv_mr *ibv_reg_mr(void *pd, void *addr, size_t len, int access) { (void)pd; (void)access; return reg(addr, len); }
struct ibv_mr *ibv_reg_mr_iova2(void *pd, void *addr, size_t len, uint64_t iova, unsigned access) { (void)pd; (void)iova; (void)access; return reg(addr, len); }
struct ibv_mr *ibv_reg_dmabuf_mr(void *pd, uint64_t off, size_t len, uint64_t iova, int fd, int access) { (void)pd; (void)off; (void)iova; (void)fd; (void)access; fakeverbs_dmabuf++; struct ibv_mr *m = calloc(1, sizeof *m); m->length = len; return m; }
int ibv_dereg_mr(struct ibv_mr *mr) { free(mr); return 0; }
int ibv_rereg_mr(struct ibv_mr *mr, int flags, void *pd, void *addr, size_t len, int access) {
  (void)pd; (void)access;
  if (!(flags & 1)) return 0;
  struct ibv_mr *n = reg(addr, len);
  if (!n) return 1; // IBV_REREG_MR_ERR_INPUT
  mr->addr = addr; mr->length = len; free(n);
  return 0;
}
