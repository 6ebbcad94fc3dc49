// Two copies of a fake libibverbs whose private layouts differ (ours): built with -DCOPY=1 as
// libibverbs.so.1 (the system's, which NCCL loads) and with -DCOPY=2 as
// libibverbs-1a2b3c4d.so.1 (a wheel's copy, renamed by auditwheel, as NIXL's UCX carries it).
// Each copy keeps its mark in its PDs and MRs at an offset of its own; a function handed an
// object of the other copy says "MIXED" on stderr and fails with EINVAL, as a real mix of two
// rdma-core versions would read garbage. Registrations of GPU memory by dma-buf are checked
// with the fake driver (fakenv_dmabuf_check) where it is loaded.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MARK (0x11111111u * COPY)
#define AT (COPY == 1 ? 0 : 3) // where this copy keeps its mark, among four words
struct obj { uint32_t word[4]; };
struct ibv_pd { void *context; uint32_t handle; struct obj priv; };
struct ibv_mr { void *context; struct ibv_pd *pd; void *addr; size_t length; uint32_t handle, lkey, rkey; struct obj priv; };

static int mine(const struct obj *o, const char *what) {
  if (o->word[AT] == MARK) return 1;
  fprintf(stderr, "MIXED: copy %d of libibverbs was handed a %s of another copy\n", COPY, what);
  errno = EINVAL;
  return 0;
}

struct ibv_pd *ibv_alloc_pd(void *context) {
  struct ibv_pd *pd = calloc(1, sizeof *pd);
  pd->context = context; pd->priv.word[AT] = MARK;
  return pd;
}
int ibv_dealloc_pd(struct ibv_pd *pd) { if (!mine(&pd->priv, "PD")) return EINVAL; free(pd); return 0; }

static struct ibv_mr *new_mr(struct ibv_pd *pd, void *addr, size_t len, uint32_t lkey) {
  struct ibv_mr *mr = calloc(1, sizeof *mr);
  mr->pd = pd; mr->addr = addr; mr->length = len; mr->lkey = mr->rkey = lkey; mr->priv.word[AT] = MARK;
  return mr;
}
struct ibv_mr *ibv_reg_mr(struct ibv_pd *pd, void *addr, size_t len, int access) {
  (void)access;
  if (!mine(&pd->priv, "PD")) return NULL;
  // GPU memory by address needs nvidia-peermem: the fake driver says whether a registration holds it
  int (*check)(uint64_t, uint64_t) = (int (*)(uint64_t, uint64_t))dlsym(RTLD_DEFAULT, "fakenv_check");
  if (check && check((uint64_t)(uintptr_t)addr, len) < 0) { errno = EFAULT; return NULL; }
  return new_mr(pd, addr, len, 7);
}
struct ibv_mr *ibv_reg_dmabuf_mr(struct ibv_pd *pd, uint64_t off, size_t len, uint64_t iova, int fd, int access) {
  (void)access;
  if (!mine(&pd->priv, "PD")) return NULL;
  if (fd < 0) { errno = EBADF; return NULL; }
  int (*check)(int, uint64_t, uint64_t, uint64_t) = (int (*)(int, uint64_t, uint64_t, uint64_t))dlsym(RTLD_DEFAULT, "fakenv_dmabuf_check");
  if (check && check(fd, off, len, iova)) { errno = EFAULT; return NULL; }
  return new_mr(pd, (void *)(uintptr_t)off, len, 9);
}
int ibv_dereg_mr(struct ibv_mr *mr) { if (!mine(&mr->priv, "MR")) return EINVAL; free(mr); return 0; }
int ibv_rereg_mr(struct ibv_mr *mr, int flags, struct ibv_pd *pd, void *addr, size_t len, int access) {
  (void)pd; (void)access;
  if (!mine(&mr->priv, "MR")) { errno = EINVAL; return -1; }
  if (flags & 1) { mr->addr = addr; mr->length = len; }
  return 0;
}
