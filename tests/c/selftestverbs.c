// A libibverbs.so.1 stand-in for gdrshim-tool selftest's tests (ours): the NIC of selftestqp.c
// (device, port, GIDs, CQ, RC QP, RDMA WRITE/READ with completions) over registrations checked
// like tests/c/fakeverbs.c checks them: GPU memory registers only where the fake driver
// (fakerm.c, preloaded) says the NIC would get exactly that memory (fakenv_check for ibv_reg_mr
// through nvidia-peermem, fakenv_dmabuf_check for ibv_reg_dmabuf_mr), else EFAULT. The fake
// driver's GPU memory is host pages (tests/c/selftestcuda.c maps them at the GPU addresses), so
// the bytes move with memcpy. SELFTESTVERBS_FAULT=efault refuses every GPU registration.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <stdio.h>
#include "selftestqp.c"

static int COPY(void *dst, const void *src, size_t n) { memcpy(dst, src, n); return 0; }

static void *fake(const char *name) { return dlsym(RTLD_DEFAULT, name); }
// 1 host memory, 0 GPU memory the NIC gets exactly, -1 GPU memory it cannot get
static int gpu_check(void *addr, size_t len) {
  int (*check)(uint64_t, uint64_t) = (int (*)(uint64_t, uint64_t))fake("fakenv_check");
  return check ? check((uint64_t)(uintptr_t)addr, len) : 1;
}
struct ibv_mr *ibv_reg_mr(struct ibv_pd *pd, void *addr, size_t len, int access) {
  if (!pd || !len) { errno = EINVAL; return NULL; }
  if (st_fault("abort")) abort();
  int r = gpu_check(addr, len);
  if (r < 0 || (r == 0 && st_fault("efault"))) { errno = EFAULT; return NULL; }
  return st_mr_new(pd, addr, (uint64_t)(uintptr_t)addr, len, access, -1);
}
struct ibv_mr *ibv_reg_mr_iova2(struct ibv_pd *pd, void *addr, size_t len, uint64_t iova, unsigned access) {
  struct ibv_mr *m = ibv_reg_mr(pd, addr, len, (int)access);
  if (m) ((st_mr_t *)m)->iova = iova;
  return m;
}
struct ibv_mr *ibv_reg_dmabuf_mr(struct ibv_pd *pd, uint64_t off, size_t len, uint64_t iova, int fd, int access) {
  if (!pd || fd < 0) { errno = fd < 0 ? EBADF : EINVAL; return NULL; }
  if ((access & 0x40) || (off & 0xfff) != (iova & 0xfff)) { errno = EINVAL; return NULL; }
  int (*check)(int, uint64_t, uint64_t, uint64_t) = (int (*)(int, uint64_t, uint64_t, uint64_t))fake("fakenv_dmabuf_check");
  int r = check ? check(fd, off, len, iova) : -2;
  if (r == -2) { errno = EINVAL; return NULL; }
  if (r || st_fault("efault")) { errno = EFAULT; return NULL; }
  // the MR holds the buffer until ibv_dereg_mr; rdma-core sets mr->addr to the offset
  return st_mr_new(pd, (void *)(uintptr_t)off, iova, len, access, fcntl(fd, F_DUPFD_CLOEXEC, 0));
}
int ibv_dereg_mr(struct ibv_mr *mr) { st_mr_free(mr); return 0; }
