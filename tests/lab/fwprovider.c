// The lab's fake HCA as a provider of rdma-core's own libibverbs (ours, test only):
// libfwroce-rdmav34.so, which rdma-core loads from RDMAV_DRIVERS (DIR/host names it) and offers
// for every device named fwroce_N under $SYSFS_PATH/class/infiniband_verbs (the tree fakesys.c
// makes). Programs call rdma-core's ibv_* functions, its symbol versions, its tail calls and its
// checks; the device's work is the fake wire's (fakewire*.c, built in with -DFW_PROVIDER, whose
// ibv_* definitions stay hidden inside this file). rdma-core opens /dev/infiniband/uverbsN
// (fakesys.c gives a /dev/null) and sends the kernel only the command that makes a completion
// channel (fakesys.c answers it with a pipe; fw_notify writes each event there as the kernel
// would). The ABI: fwprovider.h.
//
// A provider is bound to one copy of libibverbs, the one its NEEDED entry names; a process may
// hold two (a wheel's renamed copy). Every registration checks that the libibverbs that called
// it is that copy: another copy handed this provider's objects says "MIXED" on stderr and fails
// with EINVAL (a real provider would read them with another copy's layouts).
#define _GNU_SOURCE
#include "fwprovider.h"
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

// fakewire*.c's definitions (hidden in this library), which the operations below use
struct ibv_mr *ibv_reg_mr_iova2(struct ibv_pd *pd, void *addr, size_t len, uint64_t iova, unsigned access);
struct ibv_mr *ibv_reg_dmabuf_mr(struct ibv_pd *pd, uint64_t off, size_t len, uint64_t iova, int fd, int access);
int ibv_dereg_mr(struct ibv_mr *mr);
int ibv_query_device(struct ibv_context *c, struct ibv_device_attr *a);
int ibv_query_port(struct ibv_context *c, uint8_t port, struct ibv_port_attr *a);
struct ibv_cq *ibv_create_cq(struct ibv_context *c, int cqe, void *ctx, struct ibv_comp_channel *ch, int vec);
int ibv_destroy_cq(struct ibv_cq *cq);
int ibv_resize_cq(struct ibv_cq *cq, int cqe);
struct ibv_srq *ibv_create_srq(struct ibv_pd *pd, struct ibv_srq_init_attr *a);
int ibv_destroy_srq(struct ibv_srq *srq);
int ibv_modify_srq(struct ibv_srq *srq, struct ibv_srq_attr *a, int mask);
struct ibv_qp *ibv_create_qp(struct ibv_pd *pd, struct ibv_qp_init_attr *a);
int ibv_destroy_qp(struct ibv_qp *qp);
int ibv_modify_qp(struct ibv_qp *qp, struct ibv_qp_attr *a, int mask);
int ibv_query_qp(struct ibv_qp *qp, struct ibv_qp_attr *a, int mask, struct ibv_qp_init_attr *init);
struct ibv_ah *ibv_create_ah(struct ibv_pd *pd, struct ibv_ah_attr *a);
int ibv_destroy_ah(struct ibv_ah *ah);

// ---- which copy of libibverbs this provider serves ----
static void *my_front; // the load base of the libibverbs this provider registered with
// Whether the libibverbs function that called the operation (at return address ra) is of the
// copy this provider serves; if not, says so and sets EINVAL.
static int from_my_front(const char *op, void *ra) {
  Dl_info i;
  if (dladdr(ra, &i) && i.dli_fbase == my_front) return 1;
  fprintf(stderr, "MIXED: fwroce provider of %p got %s from %s, another copy of libibverbs\n", my_front, op,
          dladdr(ra, &i) && i.dli_fname ? i.dli_fname : "?");
  errno = EINVAL;
  return 0;
}

// ---- protection domains and memory regions ----
static struct ibv_pd *alloc_pd(struct ibv_context *c) {
  struct ibv_pd *p = calloc(1, sizeof *p);
  if (p) p->context = c; else errno = ENOMEM;
  return p;
}
static int dealloc_pd(struct ibv_pd *p) { free(p); return 0; }
// rdma-core's ibv_reg_mr, ibv_reg_mr_iova and ibv_reg_mr_iova2 all end here (counted as
// reg_mr_iova2 in the summary)
__attribute__((noinline)) static struct ibv_mr *reg_mr(struct ibv_pd *pd, void *addr, size_t len, uint64_t iova, int access) {
  if (!from_my_front("reg_mr", __builtin_return_address(0))) return NULL;
  return ibv_reg_mr_iova2(pd, addr, len, iova, (unsigned)access);
}
__attribute__((noinline)) static struct ibv_mr *reg_dmabuf_mr(struct ibv_pd *pd, uint64_t off, size_t len, uint64_t iova, int fd, int access) {
  if (!from_my_front("reg_dmabuf_mr", __builtin_return_address(0))) return NULL;
  return ibv_reg_dmabuf_mr(pd, off, len, iova, fd, access);
}
__attribute__((noinline)) static int dereg_mr(struct ibv_mr *mr) {
  if (!from_my_front("dereg_mr", __builtin_return_address(0))) return EINVAL;
  return ibv_dereg_mr(mr);
}

// ---- device and context ----
static int query_device_ex(struct ibv_context *c, const void *input, void *attr, size_t size) {
  (void)input;
  if (size < sizeof(struct ibv_device_attr)) return EINVAL;
  ibv_query_device(c, attr);
  // the extended attributes: none (zero is "not supported" in every field)
  memset((char *)attr + sizeof(struct ibv_device_attr), 0, size - sizeof(struct ibv_device_attr));
  return 0;
}

// ---- CQs and their completion channels ----
static struct ibv_cq *create_cq(struct ibv_context *c, int cqe, struct ibv_comp_channel *ch, int vec) {
  struct ibv_cq *cq = ibv_create_cq(c, cqe, NULL, ch, vec);
  if (!cq) return NULL;
  fw_cq *q = (fw_cq *)cq;
  q->notify_fd = -1;
  if (ch) { // the channel's pipe (fakesys.c made it), written from here
    char p[64];
    snprintf(p, sizeof p, "/proc/self/fd/%d", ch->fd);
    q->notify_fd = open(p, O_WRONLY | O_NONBLOCK | O_CLOEXEC);
    if (q->notify_fd < 0) { int e = errno; ibv_destroy_cq(cq); errno = e; return NULL; }
  }
  return cq;
}
static int destroy_cq(struct ibv_cq *cq) {
  fw_cq *q = (fw_cq *)cq;
  if (q->notify_fd >= 0) close(q->notify_fd);
  return ibv_destroy_cq(cq);
}
// What the kernel writes on a completion channel: the CQ's handle, which rdma-core's
// ibv_get_cq_event takes for the CQ's address.
void fw_notify(struct ibv_cq *cq) {
  uint64_t handle = (uint64_t)(uintptr_t)cq;
  int fd = ((fw_cq *)cq)->notify_fd;
  if (fd >= 0 && write(fd, &handle, sizeof handle) != (ssize_t)sizeof handle) fw_count_error("channel write");
}

static void free_context(struct ibv_context *c);
static const struct fw_context_ops fw_ops = {
  .alloc_pd = alloc_pd, .dealloc_pd = dealloc_pd,
  .reg_mr = reg_mr, .reg_dmabuf_mr = reg_dmabuf_mr, .dereg_mr = dereg_mr,
  .query_device_ex = query_device_ex, .query_port = ibv_query_port,
  .create_cq = create_cq, .destroy_cq = destroy_cq, .resize_cq = ibv_resize_cq,
  .poll_cq = fw_poll_cq, .req_notify_cq = fw_req_notify_cq,
  .create_qp = ibv_create_qp, .destroy_qp = ibv_destroy_qp, .modify_qp = ibv_modify_qp, .query_qp = ibv_query_qp,
  .post_send = fw_post_send, .post_recv = fw_post_recv,
  .create_srq = ibv_create_srq, .destroy_srq = ibv_destroy_srq, .modify_srq = ibv_modify_srq, .post_srq_recv = fw_post_srq_recv,
  .create_ah = ibv_create_ah, .destroy_ah = ibv_destroy_ah,
  .free_context = free_context,
};

static struct fw_verbs_context *alloc_context(struct ibv_device *device, int cmd_fd, void *private_data) {
  (void)private_data;
  struct fw_verbs_context *v = _verbs_init_and_alloc_context(device, cmd_fd, sizeof *v, NULL, 0);
  if (!v) return NULL;
  fw_wire_start();
  v->context.num_comp_vectors = 1;
  v->context.async_fd = eventfd(0, EFD_CLOEXEC); // never signalled: no async events on a fake wire
  verbs_set_ops(v, &fw_ops);
  return v;
}
static void free_context(struct ibv_context *c) {
  struct fw_verbs_context *v = (struct fw_verbs_context *)((char *)c - offsetof(struct fw_verbs_context, context));
  verbs_uninit_context(v);
  free(v);
}
static struct fw_verbs_device *alloc_device(void *sysfs_dev) {
  (void)sysfs_dev;
  struct fw_verbs_device *d = calloc(1, sizeof *d);
  if (!d) errno = ENOMEM;
  return d;
}
static void uninit_device(struct fw_verbs_device *d) { free(d); }

static const struct fw_match_ent fw_match[] = {
  {.modalias = "rdma_device:*Nfwroce_*", .kind = FW_MATCH_MODALIAS}, // the lab's devices, by name
  {.kind = FW_MATCH_END},
};
static const struct fw_device_ops fw_device_ops = {
  .name = "fwroce", .min_abi = 0, .max_abi = ~0u, .match_table = fw_match,
  .alloc_context = alloc_context, .alloc_device = alloc_device, .uninit_device = uninit_device,
};

__attribute__((constructor)) static void fw_register(void) {
  Dl_info i;
  if (dladdr((void *)verbs_register_driver_34, &i)) my_front = i.dli_fbase;
  verbs_register_driver_34(&fw_device_ops);
}
