// The rig's fake NIC (fakeverbs.c, built in with its ibv_* definitions hidden) as a provider of
// rdma-core's own libibverbs (ours, test only): librignic-rdmav34.so, which rdma-core loads from
// RDMAV_DRIVERS for the lab's device fwroce_0 (its sysfs tree and /dev/infiniband from the lab's
// fakesys.so, tests/lab/README.md). Programs then register through rdma-core's ibv_* functions,
// tail calls and symbol versions, and the NIC judges each registration as fakeverbs.c does (the
// fake driver's view of GPU memory). Only registrations: no QPs, no CQs.
#define _GNU_SOURCE
#include "fwprovider.h"
#include <errno.h>
#include <stdlib.h>
#include <sys/eventfd.h>

// fakeverbs.c's
struct ibv_mr *ibv_reg_mr_iova2(void *pd, void *addr, size_t len, uint64_t iova, unsigned access);
struct ibv_mr *ibv_reg_dmabuf_mr(void *pd, uint64_t off, size_t len, uint64_t iova, int fd, int access);
int ibv_dereg_mr(struct ibv_mr *mr);
int ibv_rereg_mr(struct ibv_mr *mr, int flags, void *pd, void *addr, size_t len, int access);

static struct ibv_pd *alloc_pd(struct ibv_context *c) {
  struct ibv_pd *p = calloc(1, sizeof *p);
  if (p) p->context = c; else errno = ENOMEM;
  return p;
}
static int dealloc_pd(struct ibv_pd *p) { free(p); return 0; }
static struct ibv_mr *reg_mr(struct ibv_pd *pd, void *addr, size_t len, uint64_t iova, int access) {
  return ibv_reg_mr_iova2(pd, addr, len, iova, (unsigned)access);
}
static struct ibv_mr *reg_dmabuf_mr(struct ibv_pd *pd, uint64_t off, size_t len, uint64_t iova, int fd, int access) {
  return ibv_reg_dmabuf_mr(pd, off, len, iova, fd, access);
}
static int rereg_mr(struct ibv_mr *mr, int flags, struct ibv_pd *pd, void *addr, size_t len, int access) {
  return ibv_rereg_mr(mr, flags, pd, addr, len, access);
}
static void free_context(struct ibv_context *c) {
  struct fw_verbs_context *v = (struct fw_verbs_context *)((char *)c - offsetof(struct fw_verbs_context, context));
  verbs_uninit_context(v);
  free(v);
}
static const struct fw_context_ops ops = {
  .alloc_pd = alloc_pd, .dealloc_pd = dealloc_pd, .reg_mr = reg_mr, .reg_dmabuf_mr = reg_dmabuf_mr,
  .dereg_mr = ibv_dereg_mr, .rereg_mr = rereg_mr, .free_context = free_context,
};
static struct fw_verbs_context *alloc_context(struct ibv_device *device, int cmd_fd, void *private_data) {
  (void)private_data;
  struct fw_verbs_context *v = _verbs_init_and_alloc_context(device, cmd_fd, sizeof *v, NULL, 0);
  if (!v) return NULL;
  v->context.async_fd = eventfd(0, EFD_CLOEXEC); // never signalled: the rig has no async events
  verbs_set_ops(v, &ops);
  return v;
}
static struct fw_verbs_device *alloc_device(void *sysfs_dev) {
  (void)sysfs_dev;
  struct fw_verbs_device *d = calloc(1, sizeof *d);
  if (!d) errno = ENOMEM;
  return d;
}
static void uninit_device(struct fw_verbs_device *d) { free(d); }
static const struct fw_match_ent match[] = {
  {.modalias = "rdma_device:*Nfwroce_*", .kind = FW_MATCH_MODALIAS},
  {.kind = FW_MATCH_END},
};
static const struct fw_device_ops device_ops = {
  .name = "rignic", .min_abi = 0, .max_abi = ~0u, .match_table = match,
  .alloc_context = alloc_context, .alloc_device = alloc_device, .uninit_device = uninit_device,
};
__attribute__((constructor)) static void rig_register(void) { verbs_register_driver_34(&device_ops); }
