// The consumer lab's fake wire (ours): the data path. ibv_post_send / ibv_post_recv /
// ibv_post_srq_recv / ibv_poll_cq are inline in verbs.h and reach these through the context's ops.
// A work request runs at once, under fw_mu: RDMA WRITE (with or without immediate), RDMA READ and
// SEND (with or without immediate) on RC, SEND on UD (with the 40-byte GRH a RoCE receiver finds
// in front of the payload). Each address is checked against its MR (key, bounds, access) and the
// QP's remote access flags, as an HCA does; bytes move by fw_copy (cuMemcpy where GPU memory is
// involved). A SEND that finds no receive posted waits, and the rest of its send queue behind it,
// until one is posted (RNR retry); a UD SEND with none is dropped, as on a wire.
#define _GNU_SOURCE
#include "fakewire.h"
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { WC_SUCCESS = 0, WC_LOC_LEN_ERR = 1, WC_LOC_PROT_ERR = 4, WC_WR_FLUSH_ERR = 5, WC_REM_INV_REQ_ERR = 9, WC_REM_ACCESS_ERR = 10,
       WC_RETRY_EXC_ERR = 12, WC_GENERAL_ERR = 21 };
enum { OP_WRITE = 0, OP_WRITE_IMM = 1, OP_SEND = 2, OP_SEND_IMM = 3, OP_READ = 4 };
enum { F_SIGNALED = 2, F_INLINE = 8 };
enum { A_LOCAL_WRITE = 1, A_REMOTE_WRITE = 2, A_REMOTE_READ = 4 };

static void complete_send(fw_qp *q, const struct ibv_send_wr *wr, uint32_t status, uint32_t len) {
  if (!status && !(wr->send_flags & F_SIGNALED) && !q->sq_sig_all) return;
  struct ibv_wc w = {0};
  w.wr_id = wr->wr_id; w.status = status; w.byte_len = len; w.qp_num = q->qp.qp_num;
  w.opcode = wr->opcode == OP_READ ? 2 : (wr->opcode == OP_WRITE || wr->opcode == OP_WRITE_IMM) ? 1 : 0;
  fw_cq_push(q->qp.send_cq, &w);
  if (status) { q->qp.state = 6; fw_flush_qp(q); } // an error puts the QP in ERR: what follows is flushed
}
static fw_rq *rq_of(fw_qp *q) { return q->qp.srq ? &((fw_srq *)q->qp.srq)->rq : &q->rq; }

// One contiguous piece of a registered range: bytes (in this process) and whether they are GPU memory.
typedef struct { uint8_t *p; uint32_t n; int gpu; } piece;
static int local_pieces(const struct ibv_sge *sge, int num, int need, piece *out, uint64_t *total) {
  *total = 0;
  for (int i = 0; i < num; i++) {
    fw_mr *m = fw_find_mr(sge[i].lkey, 0, sge[i].addr, sge[i].length, need);
    if (!m) return -1;
    out[i].p = m->bytes + (sge[i].addr - m->iova); out[i].n = sge[i].length; out[i].gpu = m->kind != FW_HOST;
    *total += sge[i].length;
  }
  return 0;
}
// Gather the local pieces into dst (len bytes at a registered remote range, or a host buffer).
static int gather(uint8_t *dst, int dst_gpu, const piece *src, int n) {
  for (int i = 0; i < n; i++) { if (fw_copy(dst, src[i].p, src[i].n, dst_gpu, src[i].gpu)) return -1; dst += src[i].n; }
  return 0;
}
static int scatter(const piece *dst, int n, const uint8_t *src, int src_gpu, uint64_t len) {
  for (int i = 0; i < n && len; i++) {
    uint32_t k = dst[i].n < len ? dst[i].n : (uint32_t)len;
    if (fw_copy(dst[i].p, src, k, dst[i].gpu, src_gpu)) return -1;
    src += k; len -= k;
  }
  return 0;
}
// Deliver a message (host bytes) into the next receive of t: 1 if none is posted, else 0 (status in *st).
static int deliver(fw_qp *from, fw_qp *t, const uint8_t *msg, uint64_t len, int ud, const struct ibv_send_wr *wr, uint64_t rdma_len, uint32_t *st) {
  fw_rq *rq = rq_of(t);
  if (rq->head == rq->tail) return 1;
  fw_rwqe *r = &rq->e[rq->head++ % rq->cap];
  struct ibv_wc w = {0};
  w.wr_id = r->wr_id; w.qp_num = t->qp.qp_num; w.src_qp = from->qp.qp_num;
  w.opcode = wr->opcode == OP_WRITE_IMM ? 129 : 128; // RECV_RDMA_WITH_IMM, RECV
  if (wr->opcode == OP_WRITE_IMM || wr->opcode == OP_SEND_IMM) { w.imm = wr->imm; w.wc_flags |= 2; }
  piece d[FW_MAXSGE]; uint64_t room;
  *st = WC_SUCCESS;
  if (local_pieces(r->sge, r->num_sge, A_LOCAL_WRITE, d, &room)) { w.status = WC_LOC_PROT_ERR; *st = WC_REM_INV_REQ_ERR; }
  else if (room < len + (ud ? 40 : 0)) { w.status = WC_LOC_LEN_ERR; *st = WC_REM_INV_REQ_ERR; }
  else {
    if (ud) { // the GRH: an IPv6 header, or for an IPv4 GID an IPv4 header in its last 20 bytes (dst address at 36)
      uint8_t grh[40] = {0};
      const uint8_t *sg = fw_gids[from->sgid_index].raw, *dg = ((fw_ah *)wr->wr.ud.ah)->attr.grh.dgid.raw;
      if (!memcmp(dg, "\0\0\0\0\0\0\0\0\0\0\xff\xff", 12)) { grh[20] = 0x45; grh[28] = 64; grh[29] = 17; memcpy(grh + 32, sg + 12, 4); memcpy(grh + 36, dg + 12, 4); }
      else { grh[0] = 0x60; grh[6] = 17; grh[7] = 64; memcpy(grh + 8, sg, 16); memcpy(grh + 24, dg, 16); }
      uint8_t *tmp = malloc(len + 40);
      if (!tmp) { w.status = WC_GENERAL_ERR; }
      else { memcpy(tmp, grh, 40); memcpy(tmp + 40, msg, len); if (scatter(d, r->num_sge, tmp, 0, len + 40)) w.status = WC_GENERAL_ERR; free(tmp); }
      w.wc_flags |= 1; w.byte_len = (uint32_t)(len + 40); // IBV_WC_GRH
    } else {
      if (len && scatter(d, r->num_sge, msg, 0, len)) w.status = WC_GENERAL_ERR;
      w.byte_len = (uint32_t)(wr->opcode == OP_WRITE_IMM ? rdma_len : len);
    }
    if (w.status) *st = WC_GENERAL_ERR;
  }
  if (w.status) fw_count_error("receive side refused a message (protection or length)");
  fw_cq_push(t->qp.recv_cq, &w);
  return 0;
}
// Runs one work request of q (RTS). 1 = the receiver had no receive posted (hold it), 0 = done.
static int run_wr(fw_qp *q, const struct ibv_send_wr *wr, const uint8_t *inl) {
  piece loc[FW_MAXSGE]; uint64_t len = 0;
  int read = wr->opcode == OP_READ;
  if (inl) { for (int i = 0; i < wr->num_sge; i++) len += wr->sg_list[i].length; loc[0].p = (uint8_t *)inl; loc[0].n = (uint32_t)len; loc[0].gpu = 0; }
  else if (local_pieces(wr->sg_list, wr->num_sge, read ? A_LOCAL_WRITE : 0, loc, &len)) { fw_count_error("local key/bounds/access (LOC_PROT_ERR)"); complete_send(q, wr, WC_LOC_PROT_ERR, 0); return 0; }
  int nloc = inl ? 1 : wr->num_sge;
  if (q->qp.qp_type == 4) { // UD: SEND only, to the QP the AH and remote QPN name
    fw_qp *t = fw_qp_by_num(wr->wr.ud.remote_qpn);
    uint32_t qkey = (wr->wr.ud.remote_qkey & 0x80000000u) ? q->qkey : wr->wr.ud.remote_qkey, st = 0;
    if (t && t->qp.qp_type == 4 && (t->qp.state == 2 || t->qp.state == 3) && t->qkey == qkey) {
      uint8_t *msg = malloc(len ? len : 1);
      if (!msg || gather(msg, 0, loc, nloc)) { free(msg); complete_send(q, wr, WC_GENERAL_ERR, 0); return 0; }
      if (!deliver(q, t, msg, len, 1, wr, 0, &st)) fw_count_bytes(0, loc[0].gpu, len, 2); // else no receive: dropped
      free(msg);
    }
    complete_send(q, wr, WC_SUCCESS, (uint32_t)len); // UD completes on the wire, delivered or not
    return 0;
  }
  fw_qp *t = fw_qp_by_num(q->dest_qpn);
  if (!t || t->qp.qp_type != 2 || (t->qp.state != 2 && t->qp.state != 3) || t->dest_qpn != q->qp.qp_num) {
    fw_count_error("RC peer is not connected back (RETRY_EXC_ERR)"); complete_send(q, wr, WC_RETRY_EXC_ERR, 0); return 0;
  }
  if (wr->opcode == OP_SEND || wr->opcode == OP_SEND_IMM) {
    fw_rq *rq = rq_of(t);
    if (rq->head == rq->tail) return 1;
    uint8_t *msg = malloc(len ? len : 1); uint32_t st = 0;
    if (!msg || gather(msg, 0, loc, nloc)) { free(msg); complete_send(q, wr, WC_GENERAL_ERR, 0); return 0; }
    deliver(q, t, msg, len, 0, wr, 0, &st);
    free(msg);
    if (!st) fw_count_bytes(0, nloc && loc[0].gpu, len, 2);
    complete_send(q, wr, st, (uint32_t)len);
    return 0;
  }
  if (wr->opcode == OP_WRITE_IMM && rq_of(t)->head == rq_of(t)->tail) return 1; // the immediate needs a receive
  int need = read ? A_REMOTE_READ : A_REMOTE_WRITE;
  if (!len) { // a zero-length RDMA operation checks no key (IB spec): consumers post one as a flush
    uint32_t st = 0;
    if (wr->opcode == OP_WRITE_IMM) deliver(q, t, NULL, 0, 0, wr, 0, &st);
    complete_send(q, wr, st, 0);
    return 0;
  }
  fw_mr *r = fw_find_mr(wr->wr.rdma.rkey, 1, wr->wr.rdma.remote_addr, len, need);
  if (!r || !(t->access & need)) {
    char why[160];
    snprintf(why, sizeof why, "remote %s rkey=%#x addr=%#lx len=%#lx: %s (REM_ACCESS_ERR)", read ? "READ" : "WRITE", wr->wr.rdma.rkey,
             (unsigned long)wr->wr.rdma.remote_addr, (unsigned long)len, r ? "the peer QP lacks the remote access flag" : "no MR of that rkey covers it with that access");
    fw_count_error(why); complete_send(q, wr, WC_REM_ACCESS_ERR, 0); return 0; }
  uint8_t *rp = r->bytes + (wr->wr.rdma.remote_addr - r->iova);
  int rgpu = r->kind != FW_HOST;
  int bad = read ? scatter(loc, nloc, rp, rgpu, len) : gather(rp, rgpu, loc, nloc);
  if (bad) { fw_count_error("copy failed (GENERAL_ERR)"); complete_send(q, wr, WC_GENERAL_ERR, 0); return 0; }
  int lgpu = 0;
  for (int i = 0; i < nloc; i++) lgpu |= loc[i].gpu;
  if (read) fw_count_bytes(lgpu, rgpu, len, 1); else fw_count_bytes(rgpu, lgpu, len, 0);
  uint32_t st = 0;
  if (wr->opcode == OP_WRITE_IMM) deliver(q, t, NULL, 0, 0, wr, len, &st);
  complete_send(q, wr, st, (uint32_t)len);
  return 0;
}
static int hold(fw_qp *q, const struct ibv_send_wr *wr) {
  fw_dwr *d = calloc(1, sizeof *d);
  if (!d) return ENOMEM;
  d->wr = *wr; d->wr.next = NULL;
  memcpy(d->sge, wr->sg_list, sizeof(struct ibv_sge) * (size_t)wr->num_sge); d->wr.sg_list = d->sge;
  if (wr->send_flags & F_INLINE) { // inline data may be reused at once: keep a copy
    uint64_t len = 0;
    for (int i = 0; i < wr->num_sge; i++) len += wr->sg_list[i].length;
    d->inl = malloc(len ? len : 1);
    if (!d->inl) { free(d); return ENOMEM; }
    uint8_t *p = d->inl;
    for (int i = 0; i < wr->num_sge; i++) { memcpy(p, (void *)(uintptr_t)wr->sg_list[i].addr, wr->sg_list[i].length); p += wr->sg_list[i].length; }
  }
  *q->held_tail = d; q->held_tail = &d->next;
  return 0;
}
// Runs what each QP holds, in order, as far as receives allow.
static void retry_held(void) {
  int c = 0;
  for (fw_qp *q; (q = fw_qp_next(&c));) {
    while (q->held && q->qp.state == 3) {
      fw_dwr *d = q->held; // detached while it runs: an error completion flushes what stays held
      q->held = d->next; if (!q->held) q->held_tail = &q->held;
      if (run_wr(q, &d->wr, d->inl)) { d->next = q->held; q->held = d; if (!d->next) q->held_tail = &d->next; break; }
      free(d->inl); free(d);
    }
  }
}
void fw_flush_qp(fw_qp *q) {
  for (fw_dwr *d = q->held, *n; d; d = n) {
    n = d->next;
    struct ibv_wc w = {0};
    w.wr_id = d->wr.wr_id; w.status = WC_WR_FLUSH_ERR; w.qp_num = q->qp.qp_num;
    fw_cq_push(q->qp.send_cq, &w);
    free(d->inl); free(d);
  }
  q->held = NULL; q->held_tail = &q->held;
  if (!q->qp.srq)
    while (q->rq.head != q->rq.tail) {
      struct ibv_wc w = {0};
      w.wr_id = q->rq.e[q->rq.head++ % q->rq.cap].wr_id; w.status = WC_WR_FLUSH_ERR; w.qp_num = q->qp.qp_num; w.opcode = 128;
      fw_cq_push(q->qp.recv_cq, &w);
    }
}
int fw_post_send(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad) {
  fw_qp *q = (fw_qp *)qp;
  int rc = 0;
  pthread_mutex_lock(&fw_mu);
  for (; wr; wr = wr->next) {
    int op = (int)wr->opcode, ud = qp->qp_type == 4;
    int ok_op = ud ? (op == OP_SEND || op == OP_SEND_IMM) : (op <= OP_READ);
    uint64_t len = 0;
    for (int i = 0; i < wr->num_sge && i < FW_MAXSGE; i++) len += wr->sg_list[i].length;
    if (!ok_op || wr->num_sge < 0 || (uint32_t)wr->num_sge > q->cap.max_send_sge || (wr->num_sge && !wr->sg_list) ||
        ((wr->send_flags & F_INLINE) && (op == OP_READ || len > q->cap.max_inline_data)) || (ud && !wr->wr.ud.ah)) { rc = EINVAL; break; }
    if (qp->state == 6) { struct ibv_wc w = {0}; w.wr_id = wr->wr_id; w.status = WC_WR_FLUSH_ERR; w.qp_num = qp->qp_num; fw_cq_push(qp->send_cq, &w); continue; }
    if (qp->state != 3) { rc = EINVAL; break; }
    if (q->held) { rc = hold(q, wr); if (rc) break; continue; }
    uint8_t *inl = NULL;
    if (wr->send_flags & F_INLINE) {
      inl = malloc(len ? len : 1);
      if (!inl) { rc = ENOMEM; break; }
      uint8_t *p = inl;
      for (int i = 0; i < wr->num_sge; i++) { memcpy(p, (void *)(uintptr_t)wr->sg_list[i].addr, wr->sg_list[i].length); p += wr->sg_list[i].length; }
    }
    if (run_wr(q, wr, inl)) rc = hold(q, wr);
    free(inl);
    if (rc) break;
  }
  pthread_mutex_unlock(&fw_mu);
  if (bad) *bad = rc ? wr : NULL;
  return rc;
}
static int rq_push(fw_rq *rq, const struct ibv_recv_wr *wr) {
  if (wr->num_sge < 0 || wr->num_sge > FW_MAXSGE || (wr->num_sge && !wr->sg_list)) return EINVAL;
  if (rq->tail - rq->head == rq->cap) {
    unsigned cap = rq->cap ? rq->cap * 2 : 64;
    fw_rwqe *e = malloc(cap * sizeof *e);
    if (!e) return ENOMEM;
    for (unsigned i = 0; i < rq->tail - rq->head; i++) e[i] = rq->e[(rq->head + i) % rq->cap];
    free(rq->e); rq->e = e; rq->tail -= rq->head; rq->head = 0; rq->cap = cap;
  }
  fw_rwqe *r = &rq->e[rq->tail++ % rq->cap];
  r->wr_id = wr->wr_id; r->num_sge = wr->num_sge;
  memcpy(r->sge, wr->sg_list, sizeof(struct ibv_sge) * (size_t)wr->num_sge);
  return 0;
}
int fw_post_recv(struct ibv_qp *qp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad) {
  fw_qp *q = (fw_qp *)qp;
  int rc = 0;
  pthread_mutex_lock(&fw_mu);
  for (; wr; wr = wr->next) {
    if (qp->srq || qp->state == 0 || (uint32_t)wr->num_sge > q->cap.max_recv_sge) { rc = EINVAL; break; }
    if (qp->state == 6) { struct ibv_wc w = {0}; w.wr_id = wr->wr_id; w.status = WC_WR_FLUSH_ERR; w.qp_num = qp->qp_num; w.opcode = 128; fw_cq_push(qp->recv_cq, &w); continue; }
    if ((rc = rq_push(&q->rq, wr))) break;
  }
  retry_held();
  pthread_mutex_unlock(&fw_mu);
  if (bad) *bad = rc ? wr : NULL;
  return rc;
}
int fw_post_srq_recv(struct ibv_srq *srq, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad) {
  int rc = 0;
  pthread_mutex_lock(&fw_mu);
  for (; wr; wr = wr->next) if ((rc = rq_push(&((fw_srq *)srq)->rq, wr))) break;
  retry_held();
  pthread_mutex_unlock(&fw_mu);
  if (bad) *bad = rc ? wr : NULL;
  return rc;
}
