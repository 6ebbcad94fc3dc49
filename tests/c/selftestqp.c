// The NIC half of gdrshim-tool selftest's stand-in libibverbs (ours): one HCA ("fake_mlx5_0",
// one RoCE port, four GIDs), protection domains, CQs, RC QPs with the RESET/INIT/RTR/RTS rules a
// loopback needs, and RDMA WRITE/READ that move bytes between registered ranges (each checked
// against its MR: lkey, rkey, bounds, access) through COPY(), with completions on the CQ.
// Included by tests/c/selftestverbs.c (CI: memcpy over the fake driver's host-backed GPU memory)
// and tests/gpu/stubverbs.c (H200: cuMemcpy between real GPU and host memory), which define the
// registration calls on top of st_mr_new/st_mr_free. The structs are the x86-64 ABI of
// rdma-core's verbs.h, written out so that no libibverbs-dev is needed to build it.
// Environment:
//   SELFTESTVERBS_DEVICES=0       no HCA (ibv_get_device_list finds none)
//   SELFTESTVERBS_SPEED/_WIDTH    the port's active_speed/active_width codes
//   SELFTESTVERBS_FAULT=LIST      comma-separated faults: efault (every GPU registration fails with
//                                 EFAULT: the including file applies it), status (the first RDMA
//                                 work request completes with IBV_WC_REM_ACCESS_ERR), corrupt (one
//                                 byte of the first transfer's destination flipped), gid
//                                 (ibv_query_gid answers a GID that is not the port's, so RTR to
//                                 it cannot resolve: ETIMEDOUT), abort (the provider crashes in
//                                 ibv_reg_mr: SIGABRT)
//   SELFTESTVERBS_DELAY_US=N      each work request takes N us more (a slow path: step 5 must see it)
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifndef ST_DEF_SPEED
#define ST_DEF_SPEED 1 // SDR
#endif
#ifndef ST_DEF_WIDTH
#define ST_DEF_WIDTH 1 // 1x
#endif

struct ibv_device { char name[64]; };
struct ibv_context;
struct ibv_sge { uint64_t addr; uint32_t length, lkey; };
struct ibv_send_wr {
  uint64_t wr_id; struct ibv_send_wr *next; struct ibv_sge *sg_list; int num_sge; uint32_t opcode; unsigned send_flags; uint32_t imm;
  uint64_t remote_addr; uint32_t rkey; uint32_t wr_rest[5]; uint32_t xrc; uint64_t tail[6];
};
struct ibv_recv_wr { uint64_t wr_id; struct ibv_recv_wr *next; struct ibv_sge *sg_list; int num_sge; };
struct ibv_wc {
  uint64_t wr_id; uint32_t status, opcode, vendor_err, byte_len, imm, qp_num, src_qp; unsigned wc_flags;
  uint16_t pkey_index, slid; uint8_t sl, dlid_path_bits;
};
struct ibv_cq { struct ibv_context *context; void *channel, *cq_context; uint32_t handle; int cqe; char mutex_cond[88]; uint32_t a, b;
  struct ibv_wc ring[4096]; unsigned head, tail; };
struct ibv_qp { struct ibv_context *context; void *qp_context, *pd; struct ibv_cq *send_cq, *recv_cq; void *srq; uint32_t handle, qp_num, state, qp_type;
  char mutex_cond[88]; uint32_t events; int sq_sig_all, dest; };
struct ibv_context_ops {
  void *before_poll[11];
  int (*poll_cq)(struct ibv_cq *, int, struct ibv_wc *);
  void *before_post[13];
  int (*post_send)(struct ibv_qp *, struct ibv_send_wr *, struct ibv_send_wr **);
  int (*post_recv)(struct ibv_qp *, struct ibv_recv_wr *, struct ibv_recv_wr **);
  void *after[5];
};
struct ibv_context { struct ibv_device *device; struct ibv_context_ops ops; int cmd_fd, async_fd, num_comp_vectors; char mutex[40]; void *abi_compat; };
struct ibv_pd { struct ibv_context *context; uint32_t handle; };
struct ibv_mr { void *context, *pd, *addr; size_t length; uint32_t handle, lkey, rkey; };
union ibv_gid { uint8_t raw[16]; uint64_t g[2]; };
struct ibv_port_attr {
  uint32_t state, max_mtu, active_mtu; int gid_tbl_len; uint32_t port_cap_flags, max_msg_sz, bad_pkey_cntr, qkey_viol_cntr;
  uint16_t pkey_tbl_len, lid, sm_lid; uint8_t lmc, max_vl_num, sm_sl, subnet_timeout, init_type_reply, active_width, active_speed, phys_state, link_layer, flags;
  uint16_t port_cap_flags2;
};
struct ibv_qp_cap { uint32_t max_send_wr, max_recv_wr, max_send_sge, max_recv_sge, max_inline_data; };
struct ibv_qp_init_attr { void *qp_context; struct ibv_cq *send_cq, *recv_cq; void *srq; struct ibv_qp_cap cap; uint32_t qp_type; int sq_sig_all; };
struct ibv_global_route { union ibv_gid dgid; uint32_t flow_label; uint8_t sgid_index, hop_limit, traffic_class; };
struct ibv_ah_attr { struct ibv_global_route grh; uint16_t dlid; uint8_t sl, src_path_bits, static_rate, is_global, port_num; };
struct ibv_qp_attr {
  uint32_t qp_state, cur_qp_state, path_mtu, path_mig_state, qkey, rq_psn, sq_psn, dest_qp_num; unsigned qp_access_flags;
  struct ibv_qp_cap cap; struct ibv_ah_attr ah_attr, alt_ah_attr; uint16_t pkey_index, alt_pkey_index;
  uint8_t en_sqd_async_notify, sq_draining, max_rd_atomic, max_dest_rd_atomic, min_rnr_timer, port_num, timeout, retry_cnt, rnr_retry, alt_port_num, alt_timeout;
  uint32_t rate_limit;
};
_Static_assert(sizeof(struct ibv_qp_attr) == 144, "ibv_qp_attr");
_Static_assert(sizeof(struct ibv_send_wr) == 128, "ibv_send_wr");
_Static_assert(sizeof(struct ibv_wc) == 48, "ibv_wc");
_Static_assert(__builtin_offsetof(struct ibv_context, ops.post_send) == 208, "post_send");
_Static_assert(__builtin_offsetof(struct ibv_context, ops.poll_cq) == 96, "poll_cq");
_Static_assert(__builtin_offsetof(struct ibv_qp, qp_num) == 52, "qp_num");
_Static_assert(sizeof(struct ibv_port_attr) == 52, "ibv_port_attr");

// ---- memory regions ----
typedef struct { struct ibv_mr mr; uint64_t iova; int access, fd; } st_mr_t;
#define ST_MAXMR 65536
static st_mr_t *st_mrs[ST_MAXMR];
static int st_hi; // slots in use are below it
static pthread_mutex_t st_mu = PTHREAD_MUTEX_INITIALIZER;
static uint32_t st_next_key = 0x100;
static int st_fault(const char *f) { const char *l = getenv("SELFTESTVERBS_FAULT"); return l && strstr(l, f) != NULL; }
static int st_env(const char *n, int def) { const char *v = getenv(n); return v && *v ? atoi(v) : def; }
// A new MR of [iova, iova+len) as the NIC addresses it; mr->addr is what the caller sees.
static struct ibv_mr *st_mr_new(void *pd, void *addr, uint64_t iova, size_t len, int access, int fd) {
  st_mr_t *m = calloc(1, sizeof *m);
  if (!m) { errno = ENOMEM; return NULL; }
  m->mr.pd = pd; m->mr.addr = addr; m->mr.length = len; m->iova = iova; m->access = access; m->fd = fd;
  pthread_mutex_lock(&st_mu);
  int i; for (i = 0; i < ST_MAXMR && st_mrs[i]; i++) {}
  if (i == ST_MAXMR) { pthread_mutex_unlock(&st_mu); free(m); errno = ENOMEM; return NULL; }
  m->mr.lkey = st_next_key++; m->mr.rkey = st_next_key++ | 0x80000000u; m->mr.handle = (uint32_t)i;
  st_mrs[i] = m; if (i >= st_hi) st_hi = i + 1;
  pthread_mutex_unlock(&st_mu);
  return &m->mr;
}
static void st_mr_free(struct ibv_mr *mr) {
  st_mr_t *m = (st_mr_t *)mr;
  pthread_mutex_lock(&st_mu);
  for (int i = 0; i < st_hi; i++) if (st_mrs[i] == m) st_mrs[i] = NULL;
  while (st_hi > 0 && !st_mrs[st_hi - 1]) st_hi--;
  pthread_mutex_unlock(&st_mu);
  if (m->fd >= 0) close(m->fd);
  free(m);
}
// The MR whose key (lkey, or rkey when remote) is `key` and that covers [a, a+n) with `need` access.
static st_mr_t *st_find(uint32_t key, int remote, uint64_t a, uint64_t n, int need) {
  st_mr_t *r = NULL;
  pthread_mutex_lock(&st_mu);
  for (int i = 0; i < st_hi; i++) {
    st_mr_t *m = st_mrs[i];
    if (!m || (remote ? m->mr.rkey : m->mr.lkey) != key) continue;
    if (a >= m->iova && n <= m->mr.length && a - m->iova <= m->mr.length - n && (m->access & need) == need) r = m;
  }
  pthread_mutex_unlock(&st_mu);
  return r;
}

// ---- device, port, GIDs ----
static struct ibv_device st_dev = {"fake_mlx5_0"};
static const union ibv_gid st_gids[4] = {
  {{0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0x02, 0x11, 0x22, 0xff, 0xfe, 0x33, 0x44, 0x55}},   // link-local (RoCE v1)
  {{0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0x02, 0x11, 0x22, 0xff, 0xfe, 0x33, 0x44, 0x55}},   // link-local (RoCE v2)
  {{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 0, 0, 1}},                        // ::ffff:10.0.0.1 (RoCE v1)
  {{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 0, 0, 1}},                        // ::ffff:10.0.0.1 (RoCE v2)
};
struct ibv_device **ibv_get_device_list(int *n) {
  int k = st_env("SELFTESTVERBS_DEVICES", 1) ? 1 : 0;
  struct ibv_device **l = calloc(2, sizeof *l);
  if (!l) { errno = ENOMEM; return NULL; }
  if (k) l[0] = &st_dev;
  if (n) *n = k;
  return l;
}
void ibv_free_device_list(struct ibv_device **l) { free(l); }
const char *ibv_get_device_name(struct ibv_device *d) { return d->name; }
static int st_poll_cq(struct ibv_cq *cq, int n, struct ibv_wc *wc);
static int st_post_send(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad);
static int st_post_recv(struct ibv_qp *qp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad) { (void)qp; (void)wr; if (bad) *bad = NULL; return 0; }
struct ibv_context *ibv_open_device(struct ibv_device *d) {
  struct ibv_context *c = calloc(1, sizeof *c);
  if (!c) { errno = ENOMEM; return NULL; }
  c->device = d; c->ops.poll_cq = st_poll_cq; c->ops.post_send = st_post_send; c->ops.post_recv = st_post_recv; c->cmd_fd = -1; c->async_fd = -1;
  return c;
}
int ibv_close_device(struct ibv_context *c) { free(c); return 0; }
struct ibv_pd *ibv_alloc_pd(struct ibv_context *c) { struct ibv_pd *p = calloc(1, sizeof *p); if (p) p->context = c; else errno = ENOMEM; return p; }
int ibv_dealloc_pd(struct ibv_pd *p) { free(p); return 0; }
int ibv_query_port(struct ibv_context *c, uint8_t port, struct ibv_port_attr *a) {
  (void)c;
  if (port != 1) return EINVAL;
  memset(a, 0, 48); // the compat prefix, as rdma-core's exported ibv_query_port fills it
  a->state = 4; a->max_mtu = 5; a->active_mtu = 3; a->gid_tbl_len = 4; a->max_msg_sz = 1u << 30; a->pkey_tbl_len = 1;
  a->active_speed = (uint8_t)st_env("SELFTESTVERBS_SPEED", ST_DEF_SPEED); a->active_width = (uint8_t)st_env("SELFTESTVERBS_WIDTH", ST_DEF_WIDTH);
  a->phys_state = 5; a->link_layer = 2; // Ethernet: RoCE
  return 0;
}
int ibv_query_gid(struct ibv_context *c, uint8_t port, int index, union ibv_gid *gid) {
  (void)c;
  if (port != 1 || index < 0 || index >= 4) return -1;
  *gid = st_gids[index];
  if (st_fault("gid")) gid->raw[15] ^= 0x5a; // a GID of no port here
  return 0;
}

// ---- CQ and QP ----
struct ibv_cq *ibv_create_cq(struct ibv_context *c, int cqe, void *ctx, void *chan, int vec) {
  (void)chan; (void)vec;
  if (cqe < 1 || cqe > 4096) { errno = EINVAL; return NULL; }
  struct ibv_cq *q = calloc(1, sizeof *q);
  if (!q) { errno = ENOMEM; return NULL; }
  q->context = c; q->cq_context = ctx; q->cqe = cqe;
  return q;
}
int ibv_destroy_cq(struct ibv_cq *q) { free(q); return 0; }
static uint32_t st_next_qpn = 0x1c0;
struct ibv_qp *ibv_create_qp(struct ibv_pd *pd, struct ibv_qp_init_attr *a) {
  if (!pd || a->qp_type != 2 || !a->send_cq) { errno = EINVAL; return NULL; }
  struct ibv_qp *q = calloc(1, sizeof *q);
  if (!q) { errno = ENOMEM; return NULL; }
  q->context = pd->context; q->pd = pd; q->send_cq = a->send_cq; q->recv_cq = a->recv_cq; q->qp_num = st_next_qpn++; q->qp_type = 2; q->sq_sig_all = a->sq_sig_all;
  return q;
}
int ibv_destroy_qp(struct ibv_qp *q) { free(q); return 0; }
// RESET->INIT->RTR->RTS only; RTR must address this port: its own GID (RoCE needs the GRH).
int ibv_modify_qp(struct ibv_qp *q, struct ibv_qp_attr *a, int mask) {
  if (!(mask & 1)) return EINVAL;
  uint32_t to = a->qp_state;
  if (to == 6) { q->state = 6; return 0; } // IBV_QPS_ERR from any state: the rest is flushed
  if (to != q->state + 1 || to > 3) return EINVAL;
  if (to == 1 && (!(mask & 32) || a->port_num != 1)) return EINVAL;
  if (to == 2) {
    if ((mask & (128 | 256 | (1 << 20))) != (128 | 256 | (1 << 20))) return EINVAL;
    if (!a->ah_attr.is_global) return EINVAL; // RoCE: no GRH, no address
    int found = 0;
    for (int i = 0; i < 4; i++) if (!memcmp(&a->ah_attr.grh.dgid, &st_gids[i], 16)) found = 1;
    if (!found) return ETIMEDOUT; // the destination GID resolves to no MAC
    if (a->ah_attr.grh.sgid_index >= 4) return EINVAL;
    if (a->dest_qp_num != q->qp_num) return EINVAL; // the fake HCA knows no other QP
    q->dest = (int)a->dest_qp_num;
  }
  q->state = to;
  return 0;
}

// ---- data ----
static int COPY(void *dst, const void *src, size_t n); // 0, or the copy failed
static int st_status_fault_done, st_corrupt_done;
static void st_complete(struct ibv_qp *qp, struct ibv_send_wr *wr, uint32_t status, uint32_t len) {
  if (!status && !(wr->send_flags & 2) && !qp->sq_sig_all) return;
  struct ibv_cq *cq = qp->send_cq;
  if (cq->tail - cq->head >= 4096) return; // overrun: the completion is lost, as on a real CQ
  struct ibv_wc *w = &cq->ring[cq->tail++ % 4096];
  memset(w, 0, sizeof *w);
  w->wr_id = wr->wr_id; w->status = status; w->opcode = wr->opcode == 4 ? 2 : 1; w->byte_len = len; w->qp_num = qp->qp_num;
  if (status) qp->state = 6; // IBV_QPS_ERR: what follows is flushed
}
static int st_post_send(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad) {
  for (; wr; wr = wr->next) {
    if (qp->state != 3 && qp->state != 6) { if (bad) *bad = wr; return EINVAL; }
    if (wr->num_sge != 1 || (wr->opcode != 0 && wr->opcode != 4)) { if (bad) *bad = wr; return EINVAL; }
    struct ibv_sge *s = wr->sg_list;
    if (qp->state == 6) { st_complete(qp, wr, 5, 0); continue; } // IBV_WC_WR_FLUSH_ERR
    if (st_fault("status") && !__atomic_exchange_n(&st_status_fault_done, 1, __ATOMIC_RELAXED)) { st_complete(qp, wr, 10, 0); continue; }
    int read = wr->opcode == 4;
    st_mr_t *l = st_find(s->lkey, 0, s->addr, s->length, read ? 1 : 0);
    if (!l) { st_complete(qp, wr, 4, 0); continue; } // IBV_WC_LOC_PROT_ERR
    st_mr_t *r = st_find(wr->rkey, 1, wr->remote_addr, s->length, read ? 4 : 2);
    if (!r) { st_complete(qp, wr, 10, 0); continue; } // IBV_WC_REM_ACCESS_ERR
    // the NIC addresses an MR by iova; the bytes are at the caller's address (iova for reg_mr,
    // the GPU VA for the dma-buf MRs this tool makes with iova = its address)
    void *la = (void *)(uintptr_t)s->addr, *ra = (void *)(uintptr_t)wr->remote_addr;
    if (read ? COPY(la, ra, s->length) : COPY(ra, la, s->length)) { st_complete(qp, wr, 21, 0); continue; } // IBV_WC_GENERAL_ERR
    if (st_fault("corrupt") && !__atomic_exchange_n(&st_corrupt_done, 1, __ATOMIC_RELAXED) && s->length > 0x3234) {
      uint8_t b; uint8_t *at = (uint8_t *)(read ? la : ra) + 0x3234;
      if (!COPY(&b, at, 1)) { b ^= 0x01; COPY(at, &b, 1); }
    }
    int delay = st_env("SELFTESTVERBS_DELAY_US", 0);
    if (delay > 0) usleep((useconds_t)delay);
    st_complete(qp, wr, 0, s->length);
  }
  if (bad) *bad = NULL;
  return 0;
}
static int st_poll_cq(struct ibv_cq *cq, int n, struct ibv_wc *wc) {
  int k = 0;
  while (k < n && cq->head != cq->tail) wc[k++] = cq->ring[cq->head++ % 4096];
  return k;
}
