// The consumer lab's fake wire (ours): what a work request does at each end (the requester here,
// the responder in fakewire_resp.c). ibv_post_send / ibv_post_recv / ibv_post_srq_recv /
// ibv_poll_cq are inline in verbs.h and reach these through the context's ops.
//
// Requester (fw_post_send): the local keys are checked and the bytes to send gathered at once
// (cuMemcpy for GPU memory); an RC request then waits, in post order, for its answer. Responder
// (fw_respond): the QP must be connected back (else the request is dropped, as a wire drops a
// packet for a QP that does not know the sender, and the requester's retries run out:
// RETRY_EXC_ERR); the remote key, bounds and access are checked as an HCA checks them, and
// refused with the NAK an HCA sends (REM_ACCESS_ERR; a receive too small: REM_INV_REQ_ERR; a
// receive whose own key fails: REM_OP_ERR), the responder's QP going to ERR too. A SEND or
// WRITE_IMM that finds no receive posted is held, with all after it on that QP, until one is
// posted (RNR with infinite retry; the requester's timer stops meanwhile). UD SENDs complete on
// the wire, delivered or not. The requester of the same process is answered at once; others over
// the wire (fakewire_net.c). Completions come in post order; an error moves the QP to ERR and
// flushes the rest.
#define _GNU_SOURCE
#include "fakewire.h"
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum {
  WC_SUCCESS = 0,
  WC_LOC_LEN_ERR = 1,
  WC_LOC_PROT_ERR = 4,
  WC_WR_FLUSH_ERR = 5,
  WC_REM_INV_REQ_ERR = 9,
  WC_REM_ACCESS_ERR = 10,
  WC_REM_OP_ERR = 11,
  WC_RETRY_EXC_ERR = 12,
  WC_GENERAL_ERR = 21
};
enum { F_SIGNALED = 2, F_INLINE = 8 };
enum { A_LOCAL_WRITE = 1, A_REMOTE_WRITE = 2, A_REMOTE_READ = 4 };

fw_rq *fw_rq_of(fw_qp *q) { return q->qp.srq ? &((fw_srq *)q->qp.srq)->rq : &q->rq; }
static void complete(fw_qp *q, uint64_t wr_id, uint32_t opcode, uint32_t flags, uint32_t status,
                     uint32_t len) {
  if (!status && !(flags & F_SIGNALED) && !q->sq_sig_all) return;
  struct ibv_wc w = {0};
  w.wr_id = wr_id;
  w.status = status;
  w.byte_len = len;
  w.qp_num = q->qp.qp_num;
  w.opcode = opcode == OP_READ ? 2 : (opcode == OP_WRITE || opcode == OP_WRITE_IMM) ? 1 : 0;
  fw_cq_push(q->qp.send_cq, &w);
}

// ---- registered ranges ----
int fw_local_pieces(const struct ibv_sge *sge, int num, int need, fw_piece *out, uint64_t *total) {
  *total = 0;
  for (int i = 0; i < num; i++) {
    fw_mr *m = fw_find_mr(sge[i].lkey, 0, sge[i].addr, sge[i].length, need);
    if (!m) return -1;
    out[i].p = m->bytes + (sge[i].addr - m->iova);
    out[i].n = sge[i].length;
    out[i].gpu = m->kind != FW_HOST;
    *total += sge[i].length;
  }
  return 0;
}
static int gather(uint8_t *dst, const fw_piece *src, int n) {
  for (int i = 0; i < n; i++) {
    if (fw_copy(dst, src[i].p, src[i].n, 0, src[i].gpu)) return -1;
    dst += src[i].n;
  }
  return 0;
}
int fw_scatter(const fw_piece *dst, int n, const uint8_t *src, uint64_t len) {
  for (int i = 0; i < n && len; i++) {
    uint32_t k = dst[i].n < len ? dst[i].n : (uint32_t)len;
    if (fw_copy(dst[i].p, src, k, dst[i].gpu, 0)) return -1;
    src += k;
    len -= k;
  }
  return 0;
}
int fw_any_gpu(const fw_piece *p, int n) {
  int g = 0;
  for (int i = 0; i < n; i++) g |= p[i].gpu;
  return g;
}

// ---- requester ----
static void drain(fw_qp *q) { // completes answered requests from the head, in post order
  while (q->pend && q->pend->status != FW_PENDING) {
    fw_req *e = q->pend;
    q->pend = e->next;
    if (!q->pend) q->pend_tail = &q->pend;
    uint32_t st = e->status;
    complete(q, e->wr_id, e->opcode, e->flags, st, st ? 0 : e->len);
    free(e);
    if (st) {
      fw_to_error(q);
      return;
    }
  }
}
static fw_req *find_req(fw_qp *q, uint64_t seq) {
  for (fw_req *e = q->pend; e; e = e->next)
    if (e->seq == seq) return e;
  return NULL;
}
static void arm(fw_qp *q, fw_req *e) {
  int64_t r = fw_retry_ms(q);
  e->deadline = r < 0 ? 0 : fw_now_ms() + r;
}
void fw_req_sent(uint32_t qpn, uint64_t seq, struct fw_conn *conn, int armed) {
  fw_qp *q = fw_qp_by_num(qpn);
  fw_req *e = q ? find_req(q, seq) : NULL;
  if (!e || e->status != FW_PENDING) return;
  e->conn = conn;
  if (armed) arm(q, e);
}
void fw_conn_lost(struct fw_conn *c) {
  fw_qp *q;
  for (int i = 0; (q = fw_qp_at(i)); i++)
    for (fw_req *e = q->pend; e; e = e->next)
      if (e->conn == c && e->status == FW_PENDING && !e->deadline) arm(q, e);
}
void fw_answered(const fw_msg *m, const uint8_t *pay) {
  fw_qp *q = fw_qp_by_num(m->src_qpn);
  fw_req *e = q ? find_req(q, m->seq) : NULL;
  if (!e || e->status != FW_PENDING) return; // flushed meanwhile
  if (m->status == FW_RNR) {
    e->deadline = 0;
    return;
  }
  if (m->status == FW_REARM) {
    if (!e->deadline) arm(q, e);
    return;
  }
  e->status = m->status;
  if (!m->status && e->opcode == OP_READ) {
    fw_piece d[FW_MAXSGE];
    uint64_t room;
    if (fw_local_pieces(e->sge, e->num_sge, A_LOCAL_WRITE, d, &room) || room < m->paylen) {
      fw_count_error("READ answer: the local range went away (LOC_PROT_ERR)");
      e->status = WC_LOC_PROT_ERR;
    } else if (fw_scatter(d, e->num_sge, pay, m->paylen)) {
      fw_count_error("READ answer: copy failed (GENERAL_ERR)");
      e->status = WC_GENERAL_ERR;
    } else fw_count_bytes(fw_any_gpu(d, e->num_sge), (int)m->pad, m->paylen, 1);
  }
  drain(q);
}
int64_t fw_expire(int64_t now) {
  fw_qp *q;
  int64_t next = 0;
  for (int i = 0; (q = fw_qp_at(i)); i++) {
    int hit = 0;
    for (fw_req *e = q->pend; e; e = e->next) {
      if (e->status != FW_PENDING || !e->deadline) continue;
      if (e->deadline <= now) {
        fw_trace("RETRY_EXC_ERR qpn %#x seq=%llu op=%u len=%u: no answer by the deadline", q->qp.qp_num,
                 (unsigned long long)e->seq, e->opcode, e->len);
        e->status = WC_RETRY_EXC_ERR;
        hit = 1;
        fw_count_wire(2);
      } else if (!next || e->deadline < next) next = e->deadline;
    }
    if (hit) drain(q);
  }
  return next;
}
void fw_to_error(fw_qp *q) {
  q->qp.state = 6;
  for (fw_req *e = q->pend, *n; e; e = n) {
    n = e->next;
    struct ibv_wc w = {0};
    w.wr_id = e->wr_id;
    w.status = WC_WR_FLUSH_ERR;
    w.qp_num = q->qp.qp_num;
    fw_cq_push(q->qp.send_cq, &w);
    free(e);
  }
  q->pend = NULL;
  q->pend_tail = &q->pend;
  fw_in *held = q->in; // an ERR responder drops what it held: those requesters retry in vain
  q->in = NULL;
  q->in_tail = &q->in;
  for (fw_in *h = held, *n; h; h = n) {
    n = h->next;
    fw_msg a = h->m;
    a.kind = FW_M_RSP;
    a.status = FW_REARM;
    a.paylen = 0;
    fw_reply(h->from, &a, NULL);
    free(h->pay);
    free(h);
  }
  if (!q->qp.srq)
    while (q->rq.head != q->rq.tail) {
      struct ibv_wc w = {0};
      w.wr_id = q->rq.e[q->rq.head++ % q->rq.cap].wr_id;
      w.status = WC_WR_FLUSH_ERR;
      w.qp_num = q->qp.qp_num;
      w.opcode = 128;
      fw_cq_push(q->qp.recv_cq, &w);
    }
}
void fw_qp_gone(fw_qp *q) {
  for (fw_req *e = q->pend, *n; e; e = n) {
    n = e->next;
    free(e);
  }
  for (fw_in *h = q->in, *n; h; h = n) {
    n = h->next;
    free(h->pay);
    free(h);
  }
  q->pend = NULL;
  q->in = NULL;
}

// One work request of q (RTS): 0, or EINVAL/ENOMEM for post_send to return.
static int post_one(fw_qp *q, const struct ibv_send_wr *wr) {
  fw_piece loc[FW_MAXSGE];
  uint64_t len = 0;
  int ud = q->qp.qp_type == 4, inl = (wr->send_flags & F_INLINE) != 0, bad = 0;
  if (inl)
    for (int i = 0; i < wr->num_sge; i++) len += wr->sg_list[i].length;
  else
    bad = fw_local_pieces(wr->sg_list, wr->num_sge, wr->opcode == OP_READ ? A_LOCAL_WRITE : 0, loc,
                          &len);
  fw_req *e = NULL;
  if (!ud) {
    e = calloc(1, sizeof *e);
    if (!e) return ENOMEM;
    e->seq = ++q->next_seq;
    e->wr_id = wr->wr_id;
    e->opcode = wr->opcode;
    e->flags = wr->send_flags;
    e->len = (uint32_t)len;
    e->status = FW_PENDING;
    e->num_sge = wr->num_sge;
    memcpy(e->sge, wr->sg_list, sizeof(struct ibv_sge) * (size_t)wr->num_sge);
    *q->pend_tail = e;
    q->pend_tail = &e->next;
  }
  if (bad) { // a local key, bound or access the MR does not give
    fw_count_error("local key/bounds/access (LOC_PROT_ERR)");
    if (e) {
      e->status = WC_LOC_PROT_ERR;
      drain(q);
    } else {
      complete(q, wr->wr_id, wr->opcode, wr->send_flags, WC_LOC_PROT_ERR, 0);
      fw_to_error(q);
    }
    return 0;
  }
  fw_msg m = {.kind = FW_M_REQ,
              .op = wr->opcode,
              .src_host = (uint32_t)fw_me()->n,
              .src_qpn = q->qp.qp_num,
              .imm = wr->imm,
              .len = len,
              .pad = (uint32_t)(!inl && fw_any_gpu(loc, wr->num_sge))};
  uint8_t *pay = NULL;
  if (wr->opcode != OP_READ &&
      len) { // the bytes leave now: verbs let the HCA read them any time before completion
    pay = malloc(len);
    if (!pay) return ENOMEM;
    if (inl) {
      uint8_t *p = pay;
      for (int i = 0; i < wr->num_sge; i++) {
        memcpy(p, (void *)(uintptr_t)wr->sg_list[i].addr, wr->sg_list[i].length);
        p += wr->sg_list[i].length;
      }
    } else if (gather(pay, loc, wr->num_sge)) {
      free(pay);
      fw_count_error("copy failed (GENERAL_ERR)");
      if (e) {
        e->status = WC_GENERAL_ERR;
        drain(q);
      } else complete(q, wr->wr_id, wr->opcode, wr->send_flags, WC_GENERAL_ERR, 0);
      return 0;
    }
  }
  m.paylen = pay ? len : 0;
  if (ud) {
    fw_ah *ah = (fw_ah *)wr->wr.ud.ah;
    m.ud = 1;
    m.dst_qpn = wr->wr.ud.remote_qpn;
    m.qkey = (wr->wr.ud.remote_qkey & 0x80000000u) ? q->qkey : wr->wr.ud.remote_qkey;
    memcpy(m.sgid, fw_me()->gid[ah->attr.grh.sgid_index % FW_NGIDS], 16);
    memcpy(m.dgid, ah->attr.grh.dgid.raw, 16);
    fw_send(&m, pay);
    complete(q, wr->wr_id, wr->opcode, wr->send_flags, WC_SUCCESS,
             (uint32_t)len); // on the wire: done
    return 0;
  }
  m.dst_qpn = q->dest_qpn;
  m.seq = e->seq;
  m.rkey = wr->wr.rdma.rkey;
  m.raddr = wr->wr.rdma.remote_addr;
  memcpy(m.sgid, fw_me()->gid[q->sgid_index % FW_NGIDS], 16);
  memcpy(m.dgid, q->dgid.raw, 16);
  fw_send(&m, pay);
  return 0;
}
int fw_post_send(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad) {
  fw_qp *q = (fw_qp *)qp;
  int rc = 0;
  if (qp->qp_type == 2 && qp->state == 3) fw_gate(q); // RC, RTS: the lab's "gate N"
  pthread_mutex_lock(&fw_mu);
  for (; wr; wr = wr->next) {
    int op = (int)wr->opcode, ud = qp->qp_type == 4;
    int ok_op = ud ? (op == OP_SEND || op == OP_SEND_IMM) : (op <= OP_READ);
    uint64_t len = 0;
    for (int i = 0; i < wr->num_sge && i < FW_MAXSGE; i++) len += wr->sg_list[i].length;
    if (!ok_op || wr->num_sge < 0 || (uint32_t)wr->num_sge > q->cap.max_send_sge ||
        (wr->num_sge && !wr->sg_list) ||
        ((wr->send_flags & F_INLINE) && (op == OP_READ || len > q->cap.max_inline_data)) ||
        (ud && !wr->wr.ud.ah)) {
      rc = EINVAL;
      break;
    }
    if (qp->state == 6) {
      struct ibv_wc w = {0};
      w.wr_id = wr->wr_id;
      w.status = WC_WR_FLUSH_ERR;
      w.qp_num = qp->qp_num;
      fw_cq_push(qp->send_cq, &w);
      continue;
    }
    if (qp->state != 3) {
      rc = EINVAL;
      break;
    }
    if ((rc = post_one(q, wr))) break;
  }
  pthread_mutex_unlock(&fw_mu);
  if (bad) *bad = rc ? wr : NULL;
  return rc;
}
