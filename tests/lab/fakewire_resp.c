// The consumer lab's fake wire (ours): the responder's side of a work request (see
// fakewire_data.c for the whole), and the receive queues. fw_respond runs a request in this
// process's memory, from this process (answered at once) or from another (over the wire).
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
  WC_GENERAL_ERR = 21
};
enum { A_LOCAL_WRITE = 1, A_REMOTE_WRITE = 2, A_REMOTE_READ = 4 };

// ---- responder ----
static void answer(struct fw_conn *to, const fw_msg *req, uint32_t status, const uint8_t *pay,
                   uint64_t n, int gpu) {
  fw_trace("answer qpn %#x seq=%llu status=%u", req->dst_qpn, (unsigned long long)req->seq, status);
  fw_msg a = *req;
  a.kind = FW_M_RSP;
  a.status = status;
  a.paylen = pay ? n : 0;
  a.pad = (uint32_t)gpu;
  fw_reply(to, &a, pay);
}
// Into the next receive of t: -1 none posted, else 0 with the NAK for the requester in *nak.
static int receive(fw_qp *t, const fw_msg *m, const uint8_t *pay, uint32_t *nak) {
  fw_rq *rq = fw_rq_of(t);
  if (rq->head == rq->tail) return -1;
  fw_rwqe *r = &rq->e[rq->head++ % rq->cap];
  struct ibv_wc w = {0};
  w.wr_id = r->wr_id;
  w.qp_num = t->qp.qp_num;
  w.src_qp = m->src_qpn;
  w.opcode = m->op == OP_WRITE_IMM ? 129 : 128; // RECV_RDMA_WITH_IMM, RECV
  if (m->op == OP_WRITE_IMM || m->op == OP_SEND_IMM) {
    w.imm = m->imm;
    w.wc_flags |= 2;
  }
  *nak = 0;
  if (m->op == OP_WRITE_IMM) w.byte_len = (uint32_t)m->len; // the bytes went to the RDMA range
  else {
    fw_piece d[FW_MAXSGE];
    uint64_t room, grh = m->ud ? 40 : 0;
    if (fw_local_pieces(r->sge, r->num_sge, A_LOCAL_WRITE, d, &room)) {
      w.status = WC_LOC_PROT_ERR;
      *nak = WC_REM_OP_ERR;
    } else if (room < m->paylen + grh) {
      w.status = WC_LOC_LEN_ERR;
      *nak = WC_REM_INV_REQ_ERR;
    } else {
      uint8_t *tmp = malloc(m->paylen + grh + 1);
      if (!tmp) w.status = WC_GENERAL_ERR;
      else {
        memset(tmp, 0, grh);
        if (m->ud) { // the GRH: IPv6, or for an IPv4 GID an IPv4 header in its last 20 bytes
          if (!memcmp(m->dgid, "\0\0\0\0\0\0\0\0\0\0\xff\xff", 12)) {
            tmp[20] = 0x45;
            tmp[28] = 64;
            tmp[29] = 17;
            memcpy(tmp + 32, m->sgid + 12, 4);
            memcpy(tmp + 36, m->dgid + 12, 4);
          } else {
            tmp[0] = 0x60;
            tmp[6] = 17;
            tmp[7] = 64;
            memcpy(tmp + 8, m->sgid, 16);
            memcpy(tmp + 24, m->dgid, 16);
          }
          w.wc_flags |= 1; // IBV_WC_GRH
        }
        if (m->paylen) memcpy(tmp + grh, pay, m->paylen);
        if (fw_scatter(d, r->num_sge, tmp, m->paylen + grh)) w.status = WC_GENERAL_ERR;
        free(tmp);
      }
      if (w.status) *nak = WC_REM_OP_ERR;
      else fw_count_bytes(fw_any_gpu(d, r->num_sge), (int)m->pad, m->paylen, 2);
      w.byte_len = (uint32_t)(m->paylen + grh);
    }
    if (w.status) fw_count_error("receive side refused a message (protection or length)");
  }
  fw_cq_push(t->qp.recv_cq, &w);
  return 0;
}
// Runs one RC request at t: 1 = no receive posted (hold it), 0 = answered (pay consumed).
static int execute(fw_qp *t, struct fw_conn *from, const fw_msg *m, uint8_t *pay) {
  int op = (int)m->op, read = op == OP_READ;
  uint32_t nak = 0;
  if ((op == OP_SEND || op == OP_SEND_IMM || op == OP_WRITE_IMM) &&
      fw_rq_of(t)->head == fw_rq_of(t)->tail)
    return 1;
  if (op == OP_SEND || op == OP_SEND_IMM) {
    receive(t, m, pay, &nak);
    answer(from, m, nak, NULL, 0, 0);
    free(pay);
    if (nak) fw_to_error(t);
    return 0;
  }
  uint8_t *out = NULL;
  int rgpu = 0;
  // a zero-length RDMA operation checks no key (IB spec): consumers post one as a flush
  if (m->len) {
    int need = read ? A_REMOTE_READ : A_REMOTE_WRITE;
    fw_mr *r = fw_find_mr(m->rkey, 1, m->raddr, m->len, need);
    if (!r || !(t->access & need)) {
      char why[200];
      snprintf(why, sizeof why, "remote %s rkey=%#x addr=%#lx len=%#lx: %s (REM_ACCESS_ERR)",
               read ? "READ" : "WRITE", m->rkey, (unsigned long)m->raddr, (unsigned long)m->len,
               r ? "the QP lacks the remote access flag"
                 : "no MR of that rkey covers it with that access");
      fw_count_error(why);
      answer(from, m, WC_REM_ACCESS_ERR, NULL, 0, 0);
      free(pay);
      fw_to_error(t);
      return 0;
    }
    uint8_t *rp = r->bytes + (m->raddr - r->iova);
    rgpu = r->kind != FW_HOST;
    int bad;
    if (read) bad = !(out = malloc(m->len)) || fw_copy(out, rp, m->len, 0, rgpu);
    else bad = m->paylen != m->len || fw_copy(rp, pay, m->len, rgpu, 0);
    if (bad) {
      fw_count_error("copy failed (REM_OP_ERR)");
      answer(from, m, WC_REM_OP_ERR, NULL, 0, 0);
      free(out);
      free(pay);
      fw_to_error(t);
      return 0;
    }
    if (!read) fw_count_bytes(rgpu, (int)m->pad, m->len, 0);
  }
  if (op == OP_WRITE_IMM)
    receive(t, m, NULL, &nak); // the responder completes before it acknowledges
  answer(from, m, 0, out, read ? m->len : 0, rgpu);
  free(out);
  free(pay);
  return 0;
}
static void hold(fw_qp *t, struct fw_conn *from, const fw_msg *m, uint8_t *pay) {
  fw_in *h = calloc(1, sizeof *h);
  if (!h) {
    free(pay);
    return;
  } // dropped: the requester's retries run out
  h->from = from;
  h->m = *m;
  h->pay = pay;
  *t->in_tail = h;
  t->in_tail = &h->next;
  answer(from, m, FW_RNR, NULL, 0, 0);
}
void fw_respond(struct fw_conn *from, const fw_msg *m, uint8_t *pay) {
  fw_qp *t = fw_qp_by_num(m->dst_qpn);
  int live = t && (t->qp.state == 2 || t->qp.state == 3);
  if (m->ud) {
    uint32_t nak;
    if (live && t->qp.qp_type == 4 && t->qkey == m->qkey)
      receive(t, m, pay, &nak); // none posted: dropped
    free(pay);
    return;
  }
  if (!live || t->qp.qp_type != 2 || t->dest_qpn != m->src_qpn ||
      t->dest_host != (int)m->src_host) {
    fw_count_wire(0);
    fw_trace("dropped: qpn %#x is %s", m->dst_qpn,
             !t ? "no QP here" : !live ? "not ready to receive (not RTR/RTS)" : "connected to another QP");
    free(pay); // no QP that knows the sender: dropped
    return;
  }
  if (t->in || execute(t, from, m, pay)) hold(t, from, m, pay);
}
void fw_retry_held(void) {
  fw_qp *t;
  for (int i = 0; (t = fw_qp_at(i)); i++)
    while (t->in && (t->qp.state == 2 || t->qp.state == 3)) {
      fw_in *h = t->in; // detached while it runs: an error flushes only what is behind it
      t->in = h->next;
      if (!t->in) t->in_tail = &t->in;
      if (execute(t, h->from, &h->m, h->pay)) { // still no receive: back in front
        h->next = t->in;
        t->in = h;
        if (!h->next) t->in_tail = &h->next;
        break;
      }
      free(h);
    }
}

static int rq_push(fw_rq *rq, const struct ibv_recv_wr *wr) {
  if (wr->num_sge < 0 || wr->num_sge > FW_MAXSGE || (wr->num_sge && !wr->sg_list)) return EINVAL;
  if (rq->tail - rq->head == rq->cap) {
    unsigned cap = rq->cap ? rq->cap * 2 : 64;
    fw_rwqe *e = malloc(cap * sizeof *e);
    if (!e) return ENOMEM;
    for (unsigned i = 0; i < rq->tail - rq->head; i++) e[i] = rq->e[(rq->head + i) % rq->cap];
    free(rq->e);
    rq->e = e;
    rq->tail -= rq->head;
    rq->head = 0;
    rq->cap = cap;
  }
  fw_rwqe *r = &rq->e[rq->tail++ % rq->cap];
  r->wr_id = wr->wr_id;
  r->num_sge = wr->num_sge;
  memcpy(r->sge, wr->sg_list, sizeof(struct ibv_sge) * (size_t)wr->num_sge);
  return 0;
}
int fw_post_recv(struct ibv_qp *qp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad) {
  fw_qp *q = (fw_qp *)qp;
  int rc = 0;
  pthread_mutex_lock(&fw_mu);
  for (; wr; wr = wr->next) {
    if (qp->srq || qp->state == 0 || (uint32_t)wr->num_sge > q->cap.max_recv_sge) {
      rc = EINVAL;
      break;
    }
    if (qp->state == 6) {
      struct ibv_wc w = {0};
      w.wr_id = wr->wr_id;
      w.status = WC_WR_FLUSH_ERR;
      w.qp_num = qp->qp_num;
      w.opcode = 128;
      fw_cq_push(qp->recv_cq, &w);
      continue;
    }
    if ((rc = rq_push(&q->rq, wr))) break;
  }
  fw_retry_held();
  pthread_mutex_unlock(&fw_mu);
  if (bad) *bad = rc ? wr : NULL;
  return rc;
}
int fw_post_srq_recv(struct ibv_srq *srq, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad) {
  int rc = 0;
  pthread_mutex_lock(&fw_mu);
  for (; wr; wr = wr->next)
    if ((rc = rq_push(&((fw_srq *)srq)->rq, wr))) break;
  fw_retry_held();
  pthread_mutex_unlock(&fw_mu);
  if (bad) *bad = rc ? wr : NULL;
  return rc;
}
