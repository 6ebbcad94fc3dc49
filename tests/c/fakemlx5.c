// A fake libmlx5.so.1 for gdrshim's tests (ours), versioned like rdma-core's providers/mlx5: the
// devx umem registrations as the NIC plus nvidia-peermem (an address-based umem of GPU memory
// works only where the fake driver has it registered, else EFAULT, as on a GeForce) or the
// kernel's RDMA core for a dma-buf umem (MLX5DV_UMEM_MASK_DMABUF: `addr` is the offset in the
// buffer, which must be, page by page, the process's memory at fakemlx5_va, the VA the test
// means, or the calling thread's fakemlx5_set_thread_va where set; the umem keeps a dup of the fd
// at 512 or above, as the kernel's own reference, until dereg). comp_mask bits other than DMABUF give
// EOPNOTSUPP, as libmlx5 does. It records what it was asked (fakemlx5_*).
// FAKEMLX5_DMABUF_FAIL=ERRNO refuses every dma-buf umem with that errno.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <unistd.h>
struct mlx5dv_devx_umem_in { void *addr; size_t size; uint32_t access; uint64_t pgsz_bitmap; uint64_t comp_mask; int dmabuf_fd; };
struct umem { uint32_t umem_id; int buf_fd; };
uint64_t fakemlx5_va, fakemlx5_last_mask, fakemlx5_last_pgsz, fakemlx5_last_addr;
static __thread uint64_t thread_va;
void fakemlx5_set_thread_va(uint64_t va) { thread_va = va; }
unsigned long fakemlx5_legacy, fakemlx5_ex, fakemlx5_dmabuf;
// registrations and deregs pass a cancellation point (rdma-core's write()) where the fake
// libibverbs' switch fakeverbs_cancel_point_in_reg is on
static void cancel_point(void) {
  int *on = (int *)dlsym(RTLD_DEFAULT, "fakeverbs_cancel_point_in_reg");
  if (on && __atomic_load_n(on, __ATOMIC_ACQUIRE)) pthread_testcancel();
}
static struct umem *made(int buf_fd) {
  struct umem *u = calloc(1, sizeof *u); u->umem_id = 5; u->buf_fd = buf_fd;
  return u;
}
static struct umem *by_address(void *addr, size_t size) {
  int (*check)(uint64_t, uint64_t) = (int (*)(uint64_t, uint64_t))dlsym(RTLD_DEFAULT, "fakenv_check");
  if (check && check((uint64_t)(uintptr_t)addr, size) < 0) { errno = EFAULT; return NULL; }
  return made(-1);
}
struct umem *mlx5dv_devx_umem_reg(void *ctx, void *addr, size_t size, uint32_t access) {
  (void)ctx; (void)access;
  __atomic_add_fetch(&fakemlx5_legacy, 1, __ATOMIC_RELAXED);
  cancel_point();
  fakemlx5_last_addr = (uint64_t)(uintptr_t)addr;
  return by_address(addr, size);
}
struct umem *mlx5dv_devx_umem_reg_ex(void *ctx, struct mlx5dv_devx_umem_in *in) {
  (void)ctx;
  __atomic_add_fetch(&fakemlx5_ex, 1, __ATOMIC_RELAXED);
  cancel_point();
  fakemlx5_last_mask = in->comp_mask; fakemlx5_last_pgsz = in->pgsz_bitmap; fakemlx5_last_addr = (uint64_t)(uintptr_t)in->addr;
  if (in->comp_mask & ~1ull) { errno = EOPNOTSUPP; return NULL; }
  if (!(in->comp_mask & 1)) return by_address(in->addr, in->size);
  __atomic_add_fetch(&fakemlx5_dmabuf, 1, __ATOMIC_RELAXED);
  const char *fail = getenv("FAKEMLX5_DMABUF_FAIL");
  if (fail) { errno = atoi(fail); return NULL; }
  if (in->dmabuf_fd < 0) { errno = EBADF; return NULL; }
  int (*check)(int, uint64_t, uint64_t, uint64_t) = (int (*)(int, uint64_t, uint64_t, uint64_t))dlsym(RTLD_DEFAULT, "fakenv_dmabuf_check");
  uint64_t va = thread_va ? thread_va : fakemlx5_va;
  int r = check ? check(in->dmabuf_fd, (uint64_t)(uintptr_t)in->addr, in->size, va) : -2;
  if (r == -2) { errno = EINVAL; return NULL; }
  if (r) { errno = EFAULT; return NULL; }
  return made(fcntl(in->dmabuf_fd, F_DUPFD_CLOEXEC, 512));
}
int mlx5dv_devx_umem_dereg(struct umem *u) {
  cancel_point();
  if (u->buf_fd >= 0) close(u->buf_fd);
  free(u);
  return 0;
}
