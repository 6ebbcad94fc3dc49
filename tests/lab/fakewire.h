// The consumer lab's fake wire (ours): the x86-64 ABI of rdma-core's libibverbs that released
// consumers (UCX, NIXL, Mooncake, NCCL) compile against, written out so that no libibverbs-dev is
// needed, plus the fake's own state. Only what the fake touches is named; the rest is padding of
// the right size. Layouts follow rdma-core's verbs.h (v48..v60 agree on every struct here).
#ifndef FAKEWIRE_H
#define FAKEWIRE_H
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include "fakelab.h"


struct ibv_device {
  void *ops[2];
  int node_type, transport_type; // IBV_NODE_CA = 1, IBV_TRANSPORT_IB = 0
  char name[64], dev_name[64], dev_path[256], ibdev_path[256];
};
struct ibv_context;
struct ibv_cq;
struct ibv_qp;
struct ibv_srq;
struct ibv_sge { uint64_t addr; uint32_t length, lkey; };
struct ibv_send_wr {
  uint64_t wr_id; struct ibv_send_wr *next; struct ibv_sge *sg_list; int num_sge; uint32_t opcode; unsigned send_flags; uint32_t imm;
  union {
    struct { uint64_t remote_addr; uint32_t rkey; } rdma;
    struct { uint64_t remote_addr, compare_add, swap; uint32_t rkey; } atomic;
    struct { struct ibv_ah *ah; uint32_t remote_qpn, remote_qkey; } ud;
  } wr;
  uint32_t xrc_remote_srqn; uint32_t pad0;
  uint64_t tail[6];
};
struct ibv_recv_wr { uint64_t wr_id; struct ibv_recv_wr *next; struct ibv_sge *sg_list; int num_sge; };
struct ibv_wc {
  uint64_t wr_id; uint32_t status, opcode, vendor_err, byte_len, imm, qp_num, src_qp; unsigned wc_flags;
  uint16_t pkey_index, slid; uint8_t sl, dlid_path_bits;
};
struct ibv_context_ops {
  void *compat0[11];                                              // query_device .. _compat_create_cq
  int (*poll_cq)(struct ibv_cq *, int, struct ibv_wc *);          // 11
  int (*req_notify_cq)(struct ibv_cq *, int);                     // 12
  void *compat1[7];                                               // 13..19
  int (*post_srq_recv)(struct ibv_srq *, struct ibv_recv_wr *, struct ibv_recv_wr **); // 20
  void *compat2[4];                                               // 21..24
  int (*post_send)(struct ibv_qp *, struct ibv_send_wr *, struct ibv_send_wr **);      // 25
  int (*post_recv)(struct ibv_qp *, struct ibv_recv_wr *, struct ibv_recv_wr **);      // 26
  void *compat3[5];                                               // 27..31
};
struct ibv_context {
  struct ibv_device *device; struct ibv_context_ops ops; int cmd_fd, async_fd, num_comp_vectors;
  pthread_mutex_t mutex; void *abi_compat; // not (void *)-1: no verbs_context, so verbs.h's inline calls take their legacy paths
};
struct ibv_comp_channel { struct ibv_context *context; int fd, refcnt; };
struct ibv_pd { struct ibv_context *context; uint32_t handle; };
struct ibv_mr { struct ibv_context *context; struct ibv_pd *pd; void *addr; size_t length; uint32_t handle, lkey, rkey; };
struct ibv_cq {
  struct ibv_context *context; struct ibv_comp_channel *channel; void *cq_context; uint32_t handle; int cqe;
  pthread_mutex_t mutex; pthread_cond_t cond; uint32_t comp_events_completed, async_events_completed;
};
struct ibv_srq { struct ibv_context *context; void *srq_context; struct ibv_pd *pd; uint32_t handle; pthread_mutex_t mutex; pthread_cond_t cond; uint32_t events_completed; };
struct ibv_qp {
  struct ibv_context *context; void *qp_context; struct ibv_pd *pd; struct ibv_cq *send_cq, *recv_cq; struct ibv_srq *srq;
  uint32_t handle, qp_num, state, qp_type; pthread_mutex_t mutex; pthread_cond_t cond; uint32_t events_completed;
};
union ibv_gid { uint8_t raw[16]; uint64_t g[2]; };
struct ibv_global_route { union ibv_gid dgid; uint32_t flow_label; uint8_t sgid_index, hop_limit, traffic_class; };
struct ibv_ah_attr { struct ibv_global_route grh; uint16_t dlid; uint8_t sl, src_path_bits, static_rate, is_global, port_num; };
struct ibv_ah { struct ibv_context *context; struct ibv_pd *pd; uint32_t handle; };
struct ibv_port_attr { // the 48-byte compat prefix that the exported ibv_query_port fills
  uint32_t state, max_mtu, active_mtu; int gid_tbl_len; uint32_t port_cap_flags, max_msg_sz, bad_pkey_cntr, qkey_viol_cntr;
  uint16_t pkey_tbl_len, lid, sm_lid; uint8_t lmc, max_vl_num, sm_sl, subnet_timeout, init_type_reply, active_width, active_speed, phys_state, link_layer, flags;
};
struct ibv_device_attr {
  char fw_ver[64]; uint64_t node_guid, sys_image_guid, max_mr_size, page_size_cap; uint32_t vendor_id, vendor_part_id, hw_ver;
  int max_qp, max_qp_wr; unsigned device_cap_flags; int max_sge, max_sge_rd, max_cq, max_cqe, max_mr, max_pd, max_qp_rd_atom, max_ee_rd_atom,
      max_res_rd_atom, max_qp_init_rd_atom, max_ee_init_rd_atom, atomic_cap, max_ee, max_rdd, max_mw, max_raw_ipv6_qp, max_raw_ethy_qp,
      max_mcast_grp, max_mcast_qp_attach, max_total_mcast_qp_attach, max_ah, max_fmr, max_map_per_fmr, max_srq, max_srq_wr, max_srq_sge;
  uint16_t max_pkeys; uint8_t local_ca_ack_delay, phys_port_cnt;
};
struct ibv_qp_cap { uint32_t max_send_wr, max_recv_wr, max_send_sge, max_recv_sge, max_inline_data; };
struct ibv_qp_init_attr { void *qp_context; struct ibv_cq *send_cq, *recv_cq; struct ibv_srq *srq; struct ibv_qp_cap cap; uint32_t qp_type; int sq_sig_all; };
struct ibv_srq_attr { uint32_t max_wr, max_sge, srq_limit; };
struct ibv_srq_init_attr { void *srq_context; struct ibv_srq_attr attr; };
struct ibv_qp_attr {
  uint32_t qp_state, cur_qp_state, path_mtu, path_mig_state, qkey, rq_psn, sq_psn, dest_qp_num; unsigned qp_access_flags;
  struct ibv_qp_cap cap; struct ibv_ah_attr ah_attr, alt_ah_attr; uint16_t pkey_index, alt_pkey_index;
  uint8_t en_sqd_async_notify, sq_draining, max_rd_atomic, max_dest_rd_atomic, min_rnr_timer, port_num, timeout, retry_cnt, rnr_retry, alt_port_num, alt_timeout;
  uint32_t rate_limit;
};
struct ibv_gid_entry { union ibv_gid gid; uint32_t gid_index, port_num, gid_type, ndev_ifindex; };
struct ibv_async_event { void *element; uint32_t event_type; };

_Static_assert(sizeof(struct ibv_device) == 664, "ibv_device");
_Static_assert(sizeof(struct ibv_qp_attr) == 144, "ibv_qp_attr");
_Static_assert(sizeof(struct ibv_send_wr) == 128, "ibv_send_wr");
_Static_assert(offsetof(struct ibv_send_wr, wr.ud.remote_qpn) == 48, "ud.remote_qpn");
_Static_assert(offsetof(struct ibv_send_wr, wr.atomic.rkey) == 64, "atomic.rkey");
_Static_assert(sizeof(struct ibv_wc) == 48, "ibv_wc");
_Static_assert(offsetof(struct ibv_context, ops.poll_cq) == 96, "poll_cq");
_Static_assert(offsetof(struct ibv_context, ops.post_srq_recv) == 168, "post_srq_recv");
_Static_assert(offsetof(struct ibv_context, ops.post_send) == 208, "post_send");
_Static_assert(offsetof(struct ibv_context, abi_compat) == 320, "abi_compat");
_Static_assert(offsetof(struct ibv_qp, qp_num) == 52, "qp_num");
_Static_assert(sizeof(struct ibv_qp) == 160, "ibv_qp");
_Static_assert(sizeof(struct ibv_cq) == 128, "ibv_cq");
_Static_assert(sizeof(struct ibv_port_attr) == 48, "ibv_port_attr compat");
_Static_assert(sizeof(struct ibv_device_attr) == 232, "ibv_device_attr");
_Static_assert(sizeof(struct ibv_ah_attr) == 32, "ibv_ah_attr");
_Static_assert(sizeof(struct ibv_qp_init_attr) == 64, "ibv_qp_init_attr");
_Static_assert(sizeof(struct ibv_gid_entry) == 32, "ibv_gid_entry");


// ---- the fake's own state (fakewire.c: device and MRs; fakewire_qp.c: CQs, QPs; fakewire_data.c:
// what a work request does at each end; fakewire_net.c: the wire between processes) ----
enum fw_kind { FW_HOST, FW_GPU_DMABUF, FW_GPU_PEERMEM };
typedef struct fw_mr {
  struct ibv_mr mr; // first: the caller's pointer is ours
  uint32_t mr_type; int mr_access; // the rest of rdma-core's verbs_mr, which its ibv_dereg_mr reads
  uint64_t iova;    // what the wire addresses
  uint8_t *bytes;   // where the byte at iova is in this process (host VA, or GPU VA through UVA)
  int access, fd, kind;
} fw_mr;
typedef struct fw_cq {
  struct ibv_cq cq;
  struct ibv_wc *ring; unsigned cap, head, tail; int armed;
  int notify_fd; // the provider's: where its channel's events are written (-1: none)
} fw_cq;
#define FW_MAXSGE 16
typedef struct fw_rwqe { uint64_t wr_id; int num_sge; struct ibv_sge sge[FW_MAXSGE]; } fw_rwqe;
typedef struct fw_rq { fw_rwqe *e; unsigned cap, head, tail; } fw_rq; // posted receives (copied)
typedef struct fw_srq { struct ibv_srq srq; fw_rq rq; } fw_srq;

// What travels on the wire: a request from a QP to a QP, or the answer to one. The payload
// (WRITE and SEND bytes, READ's answer) follows the header.
enum { FW_M_HELLO = 1, FW_M_REQ = 2, FW_M_RSP = 3 };
enum { OP_WRITE = 0, OP_WRITE_IMM = 1, OP_SEND = 2, OP_SEND_IMM = 3, OP_READ = 4 };
#define FW_RNR 0xffffu   // an answer that says "no receive posted yet: keep waiting" (RNR NAK)
#define FW_REARM 0xfffeu // the responder dropped what it held: the requester's timer runs again
typedef struct fw_msg {
  uint32_t kind, op, src_host, src_qpn, dst_qpn, status, rkey, imm, qkey, ud, pid, pad;
  uint64_t seq, raddr, len, paylen; // len: the operation's length; paylen: bytes that follow
  uint8_t sgid[16], dgid[16];
} fw_msg;
// A work request on the wire whose answer is awaited, in post order.
typedef struct fw_req {
  struct fw_req *next;
  uint64_t seq, wr_id; uint32_t opcode, flags, len, status; // status: FW_PENDING until answered
  int num_sge; struct ibv_sge sge[FW_MAXSGE];                // where a READ's answer goes
  int64_t deadline;                                           // ms; 0: none (not sent, or RNR)
  struct fw_conn *conn;                                       // the connection it left on
} fw_req;
#define FW_PENDING 0xfffffffeu
struct fw_conn;
// A request the responder holds: no receive was posted for it (RNR), or one ahead of it is held.
typedef struct fw_in { struct fw_in *next; struct fw_conn *from; fw_msg m; uint8_t *pay; } fw_in;
typedef struct fw_qp {
  struct ibv_qp qp;
  struct ibv_qp_attr attr; // what ibv_query_qp answers
  struct ibv_qp_cap cap; int sq_sig_all;
  uint32_t dest_qpn, qkey; unsigned access; union ibv_gid dgid; uint8_t sgid_index;
  int dest_host; // the lab host the AV names
  fw_rq rq;
  fw_req *pend, **pend_tail; // requester: sent, unanswered
  fw_in *in, **in_tail;      // responder: held requests, in arrival order
  uint64_t next_seq;
  int gated; // its first request passed the lab's gate (fakewire_gate.c)
} fw_qp;
typedef struct fw_ah { struct ibv_ah ah; struct ibv_ah_attr attr; } fw_ah;
typedef struct fw_channel { struct ibv_comp_channel ch; struct ibv_cq *q[4096]; unsigned head, tail; } fw_channel;

extern pthread_mutex_t fw_mu; // every piece of the fake's state, the wire's included
// fakewire.c
fw_mr *fw_find_mr(uint32_t key, int remote, uint64_t a, uint64_t n, int need); // under fw_mu
int fw_copy(void *dst, const void *src, size_t n, int dst_gpu, int src_gpu);  // 0, or the copy failed
void fw_count_bytes(int dst_gpu, int src_gpu, uint64_t n, int op); // op: 0 write, 1 read, 2 send
void fw_count_error(const char *why);
void fw_count_wire(int what); // 0 dropped (link down, no peer), 1 corrupted, 2 timed out
// fakewire_copier.c: the GPU copies by a copier process in a CUDA context of its own
int fw_copier_register(uint64_t a, uint64_t n); // at a GPU MR: 1 if the copier holds its allocation
int fw_copier_copy(void *dst, const void *src, size_t n, int dst_gpu, int src_gpu, int *rc); // 1: done there
extern unsigned long fw_copier_copies, fw_copier_fallbacks;
// fakewire_qp.c
fw_qp *fw_qp_by_num(uint32_t qpn); // under fw_mu
fw_qp *fw_qp_at(int i);            // under fw_mu: the i-th live QP, or NULL past the end
int fw_qpn_claim(uint32_t *qpn);   // a QP number no process of this lab host uses
void fw_qpn_release(uint32_t qpn);
int fw_qpn_owner(int host, uint32_t qpn); // the pid of the process that owns it, or -1
int fw_poll_cq(struct ibv_cq *cq, int n, struct ibv_wc *wc);
int fw_req_notify_cq(struct ibv_cq *cq, int solicited);
void fw_cq_push(struct ibv_cq *cq, const struct ibv_wc *wc); // under fw_mu
// Under fw_mu: cq's completion channel learns that cq has a completion (fakewire_qp.c; built as a
// provider, fwprovider.c: rdma-core reads the channel)
void fw_notify(struct ibv_cq *cq);
// fakewire_data.c (the requester) and fakewire_resp.c (the responder)
typedef struct { uint8_t *p; uint32_t n; int gpu; } fw_piece; // contiguous bytes of one MR, here
fw_rq *fw_rq_of(fw_qp *q); // its receive queue, or its SRQ's
// The pieces the sges name, each checked against its MR (key, bounds, access need): 0, or -1.
int fw_local_pieces(const struct ibv_sge *sge, int num, int need, fw_piece *out, uint64_t *total);
int fw_scatter(const fw_piece *dst, int n, const uint8_t *src, uint64_t len); // 0, or copy failed
int fw_any_gpu(const fw_piece *p, int n);
int fw_post_send(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad);
int fw_post_recv(struct ibv_qp *qp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad);
int fw_post_srq_recv(struct ibv_srq *srq, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad);
void fw_to_error(fw_qp *q); // under fw_mu: ERR; what is held, posted or awaited flushes
void fw_respond(struct fw_conn *from, const fw_msg *m, uint8_t *pay); // under fw_mu; takes pay
void fw_answered(const fw_msg *m, const uint8_t *pay); // under fw_mu: an answer came back
void fw_retry_held(void);                              // under fw_mu: receives were posted
int64_t fw_expire(int64_t now); // under fw_mu: answers overdue time out; the next deadline (0: none)
// Under fw_mu: request seq of QP qpn left on conn (NULL: answered here, or dropped); arm: its
// answer is due within the QP's retry time from now.
void fw_req_sent(uint32_t qpn, uint64_t seq, struct fw_conn *conn, int arm);
void fw_conn_lost(struct fw_conn *c); // under fw_mu: what awaits an answer over c times out
void fw_qp_gone(fw_qp *q);                             // under fw_mu: frees what the QP holds
// fakewire_gate.c: under no lock of ours, before a QP's first request
void fw_gate(fw_qp *q);
extern unsigned long fw_gate_passed, fw_gate_timeouts;
// fakewire_net.c
int64_t fw_now_ms(void);
void fw_wire_start(void); // the wire's thread, once per process
void fw_wire_progress(void); // under fw_mu: what has arrived, without waiting
// Sends m (and pay) to the host and QP it names: 0 on the wire (or delivered here), -1 dropped.
int fw_send(const fw_msg *m, uint8_t *pay); // under fw_mu; takes pay
void fw_reply(struct fw_conn *to, const fw_msg *m, const uint8_t *pay); // under fw_mu

int64_t fw_retry_ms(const fw_qp *q); // how long an HCA retries before RETRY_EXC_ERR
// FAKEWIRE_TRACE=PREFIX: one timed line per message and GPU copy into PREFIX.<host>.<pid>
int fw_tracing(void);
void fw_trace(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
#endif
