// A library of one copy of rdma-core's libibverbs (ours, test only; tests/lab_copies.rs): built
// twice, as libcopyuser1.so linked to the system's libibverbs.so.1 and as libcopyuser2.so linked to
// a wheel's renamed copy (libibverbs-1a2b3c4d.so.1), as a library of a Python wheel links the copy
// it carries. Its calls reach its own copy without gdrshim; with gdrshim preloaded, the
// registrations reach gdrshim's hooks first, which must go on to this copy.
#include <infiniband/verbs.h>
#include <stdint.h>

enum { ACCESS = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ };

// This copy's PD on the lab host's device (NULL: no device, errno set).
struct ibv_pd *user_pd(void) {
  int n = 0;
  struct ibv_device **l = ibv_get_device_list(&n);
  struct ibv_context *c = l && n == 1 ? ibv_open_device(l[0]) : NULL;
  if (l) ibv_free_device_list(l);
  return c ? ibv_alloc_pd(c) : NULL;
}

// [addr, addr+len) registered through entry point `how`: 0 ibv_reg_mr, 1 ibv_reg_mr_iova,
// 2 ibv_reg_mr_iova2, 3 ibv_reg_dmabuf_mr of `fd` (offset 0, iova addr).
struct ibv_mr *user_reg(int how, struct ibv_pd *pd, void *addr, size_t len, int fd) {
  uint64_t iova = (uint64_t)(uintptr_t)addr;
  switch (how) {
  case 0: return ibv_reg_mr(pd, addr, len, ACCESS); // (verbs.h calls the ibv_reg_mr symbol)
  case 1: return ibv_reg_mr_iova(pd, addr, len, iova, ACCESS);
  case 2: return ibv_reg_mr_iova2(pd, addr, len, iova, ACCESS);
  default: return ibv_reg_dmabuf_mr(pd, 0, len, iova, fd, ACCESS);
  }
}

int user_dereg(struct ibv_mr *mr) { return ibv_dereg_mr(mr); }
