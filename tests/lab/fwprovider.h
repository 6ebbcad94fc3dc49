// The provider ABI of rdma-core's libibverbs.so.1 that the lab's provider (fwprovider.c) is
// loaded through (ours): rdma-core 44's IBVERBS_PRIVATE_34, the x86-64 layouts written out
// because rdma-core installs no driver.h. rdma-core changes the version name whenever these
// change, so a libibverbs of another private ABI refuses to load the provider rather than
// misread it. Public objects (ibv_context, ibv_pd, ...) are fakewire.h's.
#ifndef FWPROVIDER_H
#define FWPROVIDER_H
#include "fakewire.h"

// One entry of a provider's table of the devices it drives; a table ends with kind 0.
enum { FW_MATCH_END = 0, FW_MATCH_MODALIAS = 2 };
struct fw_match_ent {
  void *driver_data;
  const char *modalias; // fnmatch pattern; "rdma_device:*N<name>*" matches a device by its name
  uint16_t vendor, device;
  uint8_t kind;
};

struct fw_verbs_device;
struct fw_verbs_context;
// What a provider gives libibverbs: how to tell its devices, make a device and open a context.
struct fw_device_ops {
  const char *name;
  uint32_t min_abi, max_abi; // the kernel uverbs ABI of the device (its sysfs abi_version)
  const struct fw_match_ent *match_table;
  const void *static_providers;
  void *match_device;
  struct fw_verbs_context *(*alloc_context)(struct ibv_device *device, int cmd_fd, void *private_data);
  void *import_context;
  struct fw_verbs_device *(*alloc_device)(void *sysfs_dev);
  void (*uninit_device)(struct fw_verbs_device *device);
};

// A device as the provider allocates it (ibv_device first); libibverbs fills in the rest.
struct fw_verbs_device {
  struct ibv_device device;
  const struct fw_device_ops *ops;
  int refcount;
  void *entry[2];
  void *sysfs;
  uint64_t core_support;
};

// The extended context: libibverbs' own entry points grow downwards before `sz`, and the public
// ibv_context (the pointer programs hold) is last.
struct fw_verbs_context {
  void *lib_ops[39];
  size_t sz;
  struct ibv_context context;
};

// The provider's operations, all 76 in rdma-core 44's order (alphabetical); NULL: not provided
// (libibverbs answers EOPNOTSUPP). Only those the lab provides have types.
struct fw_context_ops {
  void *advise_mr, *alloc_dm, *alloc_mw, *alloc_null_mr, *alloc_parent_domain;
  struct ibv_pd *(*alloc_pd)(struct ibv_context *c);
  void *alloc_td, *async_event, *attach_counters_point_flow, *attach_mcast, *bind_mw, *close_xrcd, *cq_event;
  struct ibv_ah *(*create_ah)(struct ibv_pd *pd, struct ibv_ah_attr *a);
  void *create_counters;
  struct ibv_cq *(*create_cq)(struct ibv_context *c, int cqe, struct ibv_comp_channel *ch, int vec);
  void *create_cq_ex, *create_flow, *create_flow_action_esp;
  struct ibv_qp *(*create_qp)(struct ibv_pd *pd, struct ibv_qp_init_attr *a);
  void *create_qp_ex, *create_rwq_ind_table;
  struct ibv_srq *(*create_srq)(struct ibv_pd *pd, struct ibv_srq_init_attr *a);
  void *create_srq_ex, *create_wq, *dealloc_mw;
  int (*dealloc_pd)(struct ibv_pd *pd);
  void *dealloc_td;
  int (*dereg_mr)(struct ibv_mr *mr); // rdma-core's verbs_mr, which begins with the ibv_mr
  int (*destroy_ah)(struct ibv_ah *ah);
  void *destroy_counters;
  int (*destroy_cq)(struct ibv_cq *cq);
  void *destroy_flow, *destroy_flow_action;
  int (*destroy_qp)(struct ibv_qp *qp);
  void *destroy_rwq_ind_table;
  int (*destroy_srq)(struct ibv_srq *srq);
  void *destroy_wq, *detach_mcast;
  void (*free_context)(struct ibv_context *c);
  void *free_dm, *get_srq_num, *import_dm, *import_mr, *import_pd, *modify_cq, *modify_flow_action_esp;
  int (*modify_qp)(struct ibv_qp *qp, struct ibv_qp_attr *a, int mask);
  void *modify_qp_rate_limit;
  int (*modify_srq)(struct ibv_srq *srq, struct ibv_srq_attr *a, int mask);
  void *modify_wq, *open_qp, *open_xrcd;
  int (*poll_cq)(struct ibv_cq *cq, int n, struct ibv_wc *wc);
  int (*post_recv)(struct ibv_qp *qp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad);
  int (*post_send)(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad);
  void *post_srq_ops;
  int (*post_srq_recv)(struct ibv_srq *srq, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad);
  int (*query_device_ex)(struct ibv_context *c, const void *input, void *attr, size_t attr_size);
  void *query_ece;
  int (*query_port)(struct ibv_context *c, uint8_t port, struct ibv_port_attr *a);
  int (*query_qp)(struct ibv_qp *qp, struct ibv_qp_attr *a, int mask, struct ibv_qp_init_attr *init);
  void *query_qp_data_in_order, *query_rt_values, *query_srq, *read_counters, *reg_dm_mr;
  struct ibv_mr *(*reg_dmabuf_mr)(struct ibv_pd *pd, uint64_t off, size_t len, uint64_t iova, int fd, int access);
  struct ibv_mr *(*reg_mr)(struct ibv_pd *pd, void *addr, size_t len, uint64_t iova, int access);
  int (*req_notify_cq)(struct ibv_cq *cq, int solicited);
  int (*rereg_mr)(struct ibv_mr *mr, int flags, struct ibv_pd *pd, void *addr, size_t len, int access);
  int (*resize_cq)(struct ibv_cq *cq, int cqe);
  void *set_ece, *unimport_dm, *unimport_mr, *unimport_pd;
};

_Static_assert(sizeof(struct fw_match_ent) == 24, "verbs_match_ent");
_Static_assert(offsetof(struct fw_match_ent, kind) == 20, "verbs_match_ent.kind");
_Static_assert(sizeof(struct fw_device_ops) == 72, "verbs_device_ops");
_Static_assert(offsetof(struct fw_device_ops, alloc_context) == 40, "verbs_device_ops.alloc_context");
_Static_assert(offsetof(struct fw_device_ops, alloc_device) == 56, "verbs_device_ops.alloc_device");
_Static_assert(sizeof(struct fw_verbs_device) == 712, "verbs_device");
_Static_assert(offsetof(struct fw_verbs_device, sysfs) == 696, "verbs_device.sysfs");
_Static_assert(sizeof(struct fw_verbs_context) == 648, "verbs_context");
_Static_assert(offsetof(struct fw_verbs_context, context) == 320, "verbs_context.context");
_Static_assert(sizeof(struct fw_context_ops) == 76 * sizeof(void *), "verbs_context_ops");
_Static_assert(offsetof(struct fw_context_ops, alloc_pd) == 5 * 8, "alloc_pd");
_Static_assert(offsetof(struct fw_context_ops, create_cq) == 15 * 8, "create_cq");
_Static_assert(offsetof(struct fw_context_ops, create_qp) == 19 * 8, "create_qp");
_Static_assert(offsetof(struct fw_context_ops, dereg_mr) == 28 * 8, "dereg_mr");
_Static_assert(offsetof(struct fw_context_ops, free_context) == 39 * 8, "free_context");
_Static_assert(offsetof(struct fw_context_ops, modify_qp) == 47 * 8, "modify_qp");
_Static_assert(offsetof(struct fw_context_ops, poll_cq) == 53 * 8, "poll_cq");
_Static_assert(offsetof(struct fw_context_ops, query_device_ex) == 58 * 8, "query_device_ex");
_Static_assert(offsetof(struct fw_context_ops, reg_dmabuf_mr) == 67 * 8, "reg_dmabuf_mr");
_Static_assert(offsetof(struct fw_context_ops, reg_mr) == 68 * 8, "reg_mr");
_Static_assert(offsetof(struct fw_context_ops, resize_cq) == 71 * 8, "resize_cq");

// libibverbs' side (IBVERBS_PRIVATE_34)
void verbs_register_driver_34(const struct fw_device_ops *ops);
void *_verbs_init_and_alloc_context(struct ibv_device *device, int cmd_fd, size_t alloc_size,
                                    struct fw_verbs_context *context_offset, uint32_t driver_id);
void verbs_set_ops(struct fw_verbs_context *vctx, const struct fw_context_ops *ops);
void verbs_uninit_context(struct fw_verbs_context *vctx);
#endif
