// A fake libibverbs.so.1 for gdrshim's tests (ours), versioned like rdma-core. It plays the NIC
// plus nvidia-peermem: a registration of GPU memory succeeds only when the fake driver says the
// range lies inside exactly one registration of the right memory object, on exactly one 503C
// of this process with one VA space; otherwise EFAULT, as ibv_reg_mr gives on a GeForce.
// ibv_reg_dmabuf_mr plays the kernel's RDMA core (ib_umem_dmabuf): the fd must be a complete
// buffer of the fake driver whose memory is, page by page, the process's memory at [iova,
// iova+len) (else EFAULT); fd -1 gives EBADF (NCCL's probe), ON_DEMAND and an iova whose page
// offset differs from the buffer offset's give EINVAL; the MR holds its own reference to the
// buffer (a dup of the fd at 512 or above) until ibv_dereg_mr; mr->addr is the offset, as
// rdma-core sets it. fakeverbs_reg_calls counts registrations by address that reached it.
// FAKEVERBS_DMABUF_FAIL=ERRNO refuses every dma-buf registration with that errno. Built with
// -DNO_DMABUF (and a map without IBVERBS_1.12) it is an rdma-core older than 34. ibv_reg_mr_ex
// (IBVERBS_1.15) records the comp_mask and dmah it was given (fakeverbs_mrex_*), refuses bits
// rdma-core v64.0 does not know with EOPNOTSUPP, and registers by address or by dma-buf as above.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
struct ibv_mr { void *context, *pd, *addr; size_t length; uint32_t handle, lkey, rkey; };
// every MR: a dma-buf MR keeps its buffer here; mr_type and access are the rest of rdma-core's
// verbs_mr (rigprovider.c: rdma-core's ibv_dereg_mr reads them)
struct mr_held { struct ibv_mr mr; uint32_t mr_type; int access; int buf_fd; };
unsigned long fakeverbs_dmabuf, fakeverbs_dmabuf_wrong, fakeverbs_reg_calls;
// dma-buf registrations handed an fd that is no buffer of the fake driver (a program's own file
// at a number gdrshim had checked and no longer held): the kernel would pin whatever it names
unsigned long fakeverbs_dmabuf_foreign;
int fakeverbs_exit_in_reg; // a thread that ends inside the provider's registration (pthread_exit)
int fakeverbs_cancel_point_in_reg; // registrations pass a cancellation point, as rdma-core's write() does
static void cancel_point(void) { if (__atomic_load_n(&fakeverbs_cancel_point_in_reg, __ATOMIC_ACQUIRE)) pthread_testcancel(); }
static struct ibv_mr *reg(void *addr, size_t len) {
  if (__atomic_load_n(&fakeverbs_exit_in_reg, __ATOMIC_ACQUIRE)) pthread_exit((void *)42);
  __atomic_add_fetch(&fakeverbs_reg_calls, 1, __ATOMIC_RELAXED);
  cancel_point();
  // the fake driver's view (preloaded, so looked up once); none: every MR is host memory
  static int (*check)(uint64_t, uint64_t); static int looked;
  if (!__atomic_load_n(&looked, __ATOMIC_ACQUIRE)) {
    __atomic_store_n(&check, (int (*)(uint64_t, uint64_t))dlsym(RTLD_DEFAULT, "fakenv_check"), __ATOMIC_RELAXED);
    __atomic_store_n(&looked, 1, __ATOMIC_RELEASE);
  }
  int r = check ? check((uint64_t)(uintptr_t)addr, len) : 1;
  if (r < 0) { errno = EFAULT; return NULL; }
  struct mr_held *h = calloc(1, sizeof *h); h->buf_fd = -1;
  struct ibv_mr *m = &h->mr; m->addr = addr; m->length = len; m->lkey = m->rkey = 7;
  return m;
}
struct ibv_mr *ibv_reg_mr(void *pd, void *addr, size_t len, int access) { (void)pd; (void)access; return reg(addr, len); }
struct ibv_mr *ibv_reg_mr_iova2(void *pd, void *addr, size_t len, uint64_t iova, unsigned access) { (void)pd; (void)iova; (void)access; return reg(addr, len); }
#ifndef NO_DMABUF
static struct ibv_mr *dmabuf_reg(uint64_t off, size_t len, uint64_t iova, int fd, int access) {
  __atomic_add_fetch(&fakeverbs_dmabuf, 1, __ATOMIC_RELAXED);
  cancel_point();
  const char *fail = getenv("FAKEVERBS_DMABUF_FAIL");
  if (fail) { errno = atoi(fail); return NULL; }
  if (fd < 0) { errno = EBADF; return NULL; }
  char link[64], target[256]; snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
  ssize_t k = readlink(link, target, sizeof target - 1);
  if (k <= 0 || (target[k] = 0, strncmp(target, "/memfd:nv_dmabuf", 16))) __atomic_add_fetch(&fakeverbs_dmabuf_foreign, 1, __ATOMIC_RELAXED);
  if ((access & 0x40) || (off & 0xfff) != (iova & 0xfff)) { errno = EINVAL; return NULL; }
  int (*check)(int, uint64_t, uint64_t, uint64_t) = (int (*)(int, uint64_t, uint64_t, uint64_t))dlsym(RTLD_DEFAULT, "fakenv_dmabuf_check");
  int r = check ? check(fd, off, len, iova) : -2;
  if (r == -2) { errno = EINVAL; return NULL; }
  if (r) { __atomic_add_fetch(&fakeverbs_dmabuf_wrong, 1, __ATOMIC_RELAXED); errno = EFAULT; return NULL; }
  // the kernel's own reference to the buffer, no fd of the program's: kept far above the numbers
  // a program (or a test that closes numbers) uses
  struct mr_held *h = calloc(1, sizeof *h); h->buf_fd = fcntl(fd, F_DUPFD_CLOEXEC, 512);
  struct ibv_mr *m = &h->mr; m->addr = (void *)(uintptr_t)off; m->length = len; m->lkey = m->rkey = 9;
  h->mr_type = 3; h->access = access; // IBV_MR_TYPE_DMABUF_MR
  return m;
}
struct ibv_mr *ibv_reg_dmabuf_mr(void *pd, uint64_t off, size_t len, uint64_t iova, int fd, int access) { (void)pd; return dmabuf_reg(off, len, iova, fd, access); }
struct ibv_mr_init_attr { size_t length; int access; uint64_t comp_mask, iova; void *addr; int fd; uint64_t fd_offset; void *dmah, *buf; };
uint64_t fakeverbs_mrex_mask; void *fakeverbs_mrex_dmah;
struct ibv_mr *ibv_reg_mr_ex(void *pd, struct ibv_mr_init_attr *a) {
  (void)pd;
  fakeverbs_mrex_mask = a->comp_mask; fakeverbs_mrex_dmah = (a->comp_mask & 0x10) ? a->dmah : NULL;
  if (a->comp_mask & ~0x3full) { errno = EOPNOTSUPP; return NULL; }
  if (a->comp_mask & 4) return dmabuf_reg(a->fd_offset, a->length, (a->comp_mask & 1) ? a->iova : a->fd_offset, a->fd, a->access);
  if (a->comp_mask & 2) return reg(a->addr, a->length);
  errno = EINVAL; return NULL;
}
#endif
int ibv_dereg_mr(struct ibv_mr *mr) {
  cancel_point();
  struct mr_held *h = (struct mr_held *)mr;
  if (h->buf_fd >= 0) close(h->buf_fd);
  free(h);
  return 0;
}
int ibv_rereg_mr(struct ibv_mr *mr, int flags, void *pd, void *addr, size_t len, int access) {
  (void)pd; (void)access;
  if (!(flags & 1)) return 0;
  struct ibv_mr *n = reg(addr, len);
  if (!n) return 1; // IBV_REREG_MR_ERR_INPUT
  mr->addr = addr; mr->length = len; free(n);
  return 0;
}
