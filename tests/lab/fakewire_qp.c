// The consumer lab's fake wire (ours): CQs and completion channels, SRQs, QPs with the kernel's
// state machine (ib_modify_qp_is_ok's required attributes for RC and UD), address handles, and
// the table of this process's QPs. A destination GID resolves when it is a lab host's (one of
// this port's when the process is alone) whose QPs exist; else ETIMEDOUT, as an address that
// resolves to no neighbour. See fakewire.c.
#define _GNU_SOURCE
#include "fakewire.h"
#include <errno.h>
#include <sys/stat.h>
#include <signal.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

// ---- completion channels and CQs ----
struct ibv_comp_channel *ibv_create_comp_channel(struct ibv_context *c) {
  fw_channel *ch = calloc(1, sizeof *ch);
  if (!ch) { errno = ENOMEM; return NULL; }
  ch->ch.context = c;
  ch->ch.fd = eventfd(0, EFD_CLOEXEC | EFD_SEMAPHORE); // one count per notified CQ
  if (ch->ch.fd < 0) { free(ch); return NULL; }
  return &ch->ch;
}
int ibv_destroy_comp_channel(struct ibv_comp_channel *ch) { close(ch->fd); free(ch); return 0; }
int ibv_get_cq_event(struct ibv_comp_channel *ch, struct ibv_cq **cq, void **ctx) {
  fw_channel *c = (fw_channel *)ch;
  uint64_t v;
  if (read(ch->fd, &v, sizeof v) != (ssize_t)sizeof v) return -1; // EAGAIN on a non-blocking fd, as the real one
  pthread_mutex_lock(&fw_mu);
  struct ibv_cq *q = c->head != c->tail ? c->q[c->head++ % 4096] : NULL;
  pthread_mutex_unlock(&fw_mu);
  if (!q) { errno = EAGAIN; return -1; }
  *cq = q; *ctx = q->cq_context;
  return 0;
}
void ibv_ack_cq_events(struct ibv_cq *cq, unsigned n) { (void)cq; (void)n; }
struct ibv_cq *ibv_create_cq(struct ibv_context *c, int cqe, void *ctx, struct ibv_comp_channel *ch, int vec) {
  (void)vec;
  if (cqe < 1 || cqe > (1 << 22)) { errno = EINVAL; return NULL; }
  fw_cq *q = calloc(1, sizeof *q);
  if (!q) { errno = ENOMEM; return NULL; }
  q->cq.context = c; q->cq.channel = ch; q->cq.cq_context = ctx; q->cq.cqe = cqe;
  pthread_mutex_init(&q->cq.mutex, NULL); pthread_cond_init(&q->cq.cond, NULL);
  return &q->cq;
}
int ibv_destroy_cq(struct ibv_cq *cq) { fw_cq *q = (fw_cq *)cq; free(q->ring); free(q); return 0; }
int ibv_resize_cq(struct ibv_cq *cq, int cqe) { if (cqe < 1) return EINVAL; cq->cqe = cqe; return 0; }
// Completions are kept however many (the ring grows): the fake never overruns a CQ.
void fw_cq_push(struct ibv_cq *cq, const struct ibv_wc *wc) {
  fw_cq *q = (fw_cq *)cq;
  if (q->tail - q->head == q->cap) {
    unsigned cap = q->cap ? q->cap * 2 : 256;
    struct ibv_wc *r = malloc(cap * sizeof *r);
    if (!r) { fw_count_error("CQ ring allocation failed: completion lost"); return; }
    for (unsigned i = 0; i < q->tail - q->head; i++) r[i] = q->ring[(q->head + i) % q->cap];
    free(q->ring); q->ring = r; q->tail -= q->head; q->head = 0; q->cap = cap;
  }
  q->ring[q->tail++ % q->cap] = *wc;
  if (q->armed && cq->channel) {
    q->armed = 0;
    fw_notify(cq);
  }
}
#ifndef FW_PROVIDER
void fw_notify(struct ibv_cq *cq) {
  fw_channel *ch = (fw_channel *)cq->channel;
  if (ch->tail - ch->head < 4096) { ch->q[ch->tail++ % 4096] = cq; uint64_t one = 1; if (write(ch->ch.fd, &one, sizeof one) < 0) fw_count_error("channel write"); }
}
#endif
int fw_poll_cq(struct ibv_cq *cq, int n, struct ibv_wc *wc) {
  fw_cq *q = (fw_cq *)cq;
  int k = 0;
  pthread_mutex_lock(&fw_mu);
  if (q->head == q->tail) fw_wire_progress();
  while (k < n && q->head != q->tail) wc[k++] = q->ring[q->head++ % q->cap];
  pthread_mutex_unlock(&fw_mu);
  return k;
}
int fw_req_notify_cq(struct ibv_cq *cq, int solicited) {
  (void)solicited;
  pthread_mutex_lock(&fw_mu); ((fw_cq *)cq)->armed = 1; pthread_mutex_unlock(&fw_mu);
  return 0;
}

// ---- QP numbers: a file per number names the process that owns it (DIR/run/hostN/qp/<qpn>) ----
static int qp_file(char *p, size_t n, int host, uint32_t qpn) {
  const char *lab = fw_lab_dir();
  if (!lab) return -1;
  return snprintf(p, n, "%s/run/host%d/qp/%06x", lab, host, qpn) < (int)n ? 0 : -1;
}
int fw_qpn_owner(int host, uint32_t qpn) { // the pid, or -1
  char p[512], b[32] = "";
  if (qp_file(p, sizeof p, host, qpn)) return -1;
  int fd = open(p, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  ssize_t k = read(fd, b, sizeof b - 1);
  close(fd);
  return k > 0 ? atoi(b) : -1;
}
static void mkdirs(const char *path) {
  char p[512];
  snprintf(p, sizeof p, "%s", path);
  for (char *s = p + 1; (s = strchr(s, '/')); s++) {
    *s = 0;
    mkdir(p, 0755);
    *s = '/';
  }
  mkdir(p, 0755);
}
int fw_qpn_claim(uint32_t *qpn) {
  static uint32_t local = 0x100; // one process only: numbers of its own
  char p[512], d[512];
  if (!fw_lab_dir()) {
    *qpn = local++;
    return 0;
  }
  snprintf(d, sizeof d, "%s/run/host%d/qp", fw_lab_dir(), fw_me()->n);
  mkdirs(d);
  static uint32_t next;
  if (!next) next = 0x100 + (((uint32_t)getpid() & 0xfff) << 8);
  for (int tries = 0; tries < 4096; tries++, next = next >= 0xfffff0 ? 0x100 : next + 1) {
    qp_file(p, sizeof p, fw_me()->n, next);
    int fd = open(p, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0) {
      int pid = fw_qpn_owner(fw_me()->n, next);
      if (errno == EEXIST && pid > 0 && kill(pid, 0) && errno == ESRCH) {
        unlink(p);
        tries--;
        continue;
      } // its process is gone
      continue;
    }
    char b[32];
    int k = snprintf(b, sizeof b, "%d\n", getpid());
    int ok = write(fd, b, (size_t)k) == k;
    close(fd);
    if (!ok) {
      unlink(p);
      return -1;
    }
    *qpn = next++;
    return 0;
  }
  return -1;
}
void fw_qpn_release(uint32_t qpn) {
  char p[512];
  if (!qp_file(p, sizeof p, fw_me()->n, qpn) && fw_qpn_owner(fw_me()->n, qpn) == getpid()) unlink(p);
}

// ---- this process's QPs (numbers from fw_qpn_claim: unique on the lab host) ----
#define FW_MAXQP 65536
static fw_qp *fw_qps[FW_MAXQP];
static int fw_nqps;
fw_qp *fw_qp_by_num(uint32_t qpn) {
  for (int i = 0; i < fw_nqps; i++) if (fw_qps[i]->qp.qp_num == qpn) return fw_qps[i];
  return NULL;
}
fw_qp *fw_qp_at(int i) { return i < fw_nqps ? fw_qps[i] : NULL; }
static int qp_slot(fw_qp *q) {
  if (fw_nqps == FW_MAXQP || fw_qpn_claim(&q->qp.qp_num)) return -1;
  fw_qps[fw_nqps++] = q;
  return 0;
}
// The lab host a destination GID names, if it resolves (see above), else -1.
static int resolve(const union ibv_gid *g) {
  int h = fw_gid_host(g->raw);
  if (h < 0) return -1;
  if (!fw_lab_dir()) return h == fw_me()->n ? h : -1;
  char p[512];
  snprintf(p, sizeof p, "%s/run/host%d/qp", fw_lab_dir(), h);
  return h == fw_me()->n || !access(p, F_OK) ? h : -1;
}

// ---- SRQs ----
struct ibv_srq *ibv_create_srq(struct ibv_pd *pd, struct ibv_srq_init_attr *a) {
  if (!pd || !a || a->attr.max_wr < 1 || a->attr.max_wr > 32767 || a->attr.max_sge > FW_MAXSGE) { errno = EINVAL; return NULL; }
  fw_srq *s = calloc(1, sizeof *s);
  if (!s) { errno = ENOMEM; return NULL; }
  s->srq.context = pd->context; s->srq.srq_context = a->srq_context; s->srq.pd = pd;
  pthread_mutex_init(&s->srq.mutex, NULL); pthread_cond_init(&s->srq.cond, NULL);
  return &s->srq;
}
int ibv_destroy_srq(struct ibv_srq *srq) { fw_srq *s = (fw_srq *)srq; free(s->rq.e); free(s); return 0; }
int ibv_modify_srq(struct ibv_srq *srq, struct ibv_srq_attr *a, int mask) { (void)srq; (void)a; (void)mask; return 0; }

// ---- QPs ----
struct ibv_qp *ibv_create_qp(struct ibv_pd *pd, struct ibv_qp_init_attr *a) {
  if (!pd || !a || (a->qp_type != 2 && a->qp_type != 4) || !a->send_cq || !a->recv_cq) { errno = EINVAL; return NULL; } // RC or UD
  if (a->cap.max_send_sge > FW_MAXSGE || a->cap.max_recv_sge > FW_MAXSGE || a->cap.max_send_wr > 32768 || a->cap.max_recv_wr > 32768 || a->cap.max_inline_data > 1024) { errno = EINVAL; return NULL; }
  fw_qp *q = calloc(1, sizeof *q);
  if (!q) { errno = ENOMEM; return NULL; }
  q->qp.context = pd->context; q->qp.qp_context = a->qp_context; q->qp.pd = pd; q->qp.send_cq = a->send_cq; q->qp.recv_cq = a->recv_cq;
  q->qp.srq = a->srq; q->qp.qp_type = a->qp_type; q->qp.state = 0;
  pthread_mutex_init(&q->qp.mutex, NULL); pthread_cond_init(&q->qp.cond, NULL);
  if (!a->cap.max_send_sge) a->cap.max_send_sge = 1;
  if (!a->cap.max_recv_sge) a->cap.max_recv_sge = 1;
  q->cap = a->cap; q->sq_sig_all = a->sq_sig_all; q->pend_tail = &q->pend; q->in_tail = &q->in; q->dest_host = -1;
  pthread_mutex_lock(&fw_mu);
  int bad = qp_slot(q);
  pthread_mutex_unlock(&fw_mu);
  if (bad) { free(q); errno = ENOMEM; return NULL; }
  return &q->qp;
}
int ibv_destroy_qp(struct ibv_qp *qp) {
  fw_qp *q = (fw_qp *)qp;
  pthread_mutex_lock(&fw_mu);
  for (int i = 0; i < fw_nqps; i++) if (fw_qps[i] == q) { fw_qps[i] = fw_qps[--fw_nqps]; break; }
  fw_qp_gone(q);
  fw_qpn_release(qp->qp_num);
  pthread_mutex_unlock(&fw_mu);
  free(q->rq.e); free(q);
  return 0;
}
enum { M_STATE = 1, M_ACCESS = 8, M_PKEY = 16, M_PORT = 32, M_QKEY = 64, M_AV = 128, M_MTU = 256, M_TIMEOUT = 512, M_RETRY = 1024,
       M_RNR_RETRY = 2048, M_RQ_PSN = 4096, M_RD_ATOMIC = 8192, M_MIN_RNR = 32768, M_SQ_PSN = 65536, M_DEST_RD_ATOMIC = 131072, M_DEST_QPN = 1 << 20 };
// The attributes each transition requires (and the kernel refuses EINVAL without): ib_modify_qp_is_ok.
static int required(uint32_t type, uint32_t from, uint32_t to) {
  int rc = type == 2;
  if (from == 0 && to == 1) return M_PKEY | M_PORT | (rc ? M_ACCESS : M_QKEY);
  if (from == 1 && to == 2) return rc ? M_AV | M_MTU | M_DEST_QPN | M_RQ_PSN | M_DEST_RD_ATOMIC | M_MIN_RNR : 0;
  if (from == 2 && to == 3) return rc ? M_SQ_PSN | M_TIMEOUT | M_RETRY | M_RNR_RETRY | M_RD_ATOMIC : M_SQ_PSN;
  if ((from == 1 && to == 1) || (from == 3 && to == 3) || to == 0 || to == 6) return 0;
  return -1; // not a transition
}
int ibv_modify_qp(struct ibv_qp *qp, struct ibv_qp_attr *a, int mask) {
  fw_qp *q = (fw_qp *)qp;
  pthread_mutex_lock(&fw_mu);
  uint32_t from = qp->state, to = mask & M_STATE ? a->qp_state : from;
  int need = required(qp->qp_type, from, to), rc = 0;
  if (need < 0 || (mask & need) != need) { rc = EINVAL; goto out; }
  if ((mask & M_PORT) && a->port_num != 1) { rc = EINVAL; goto out; }
  if (mask & M_AV) { // RoCE: the address is a GRH whose destination GID must resolve
    if (!a->ah_attr.is_global || a->ah_attr.grh.sgid_index >= FW_NGIDS) { rc = EINVAL; goto out; }
    int h = resolve(&a->ah_attr.grh.dgid);
    if (h < 0) { rc = ETIMEDOUT; goto out; }
    q->dgid = a->ah_attr.grh.dgid; q->sgid_index = a->ah_attr.grh.sgid_index; q->dest_host = h;
  }
  if (mask & M_DEST_QPN) q->dest_qpn = a->dest_qp_num;
  if (mask & M_ACCESS) q->access = a->qp_access_flags;
  if (mask & M_QKEY) q->qkey = a->qkey;
  if (mask & M_MTU) q->attr.path_mtu = a->path_mtu;
  if (mask & M_SQ_PSN) q->attr.sq_psn = a->sq_psn;
  if (mask & M_RQ_PSN) q->attr.rq_psn = a->rq_psn;
  if (mask & M_TIMEOUT) q->attr.timeout = a->timeout;
  if (mask & M_RETRY) q->attr.retry_cnt = a->retry_cnt;
  if (mask & M_RNR_RETRY) q->attr.rnr_retry = a->rnr_retry;
  if (mask & M_RD_ATOMIC) q->attr.max_rd_atomic = a->max_rd_atomic;
  if (mask & M_DEST_RD_ATOMIC) q->attr.max_dest_rd_atomic = a->max_dest_rd_atomic;
  if (mask & M_MIN_RNR) q->attr.min_rnr_timer = a->min_rnr_timer;
  if (mask & M_AV) q->attr.ah_attr = a->ah_attr;
  if (mask & M_PKEY) q->attr.pkey_index = a->pkey_index;
  if (mask & M_PORT) q->attr.port_num = a->port_num;
  if (to == 6 && from != 6) fw_to_error(q);
  qp->state = to;
  if (to == 0) { // RESET discards, without completions
    fw_qp_gone(q);
    q->pend_tail = &q->pend; q->in_tail = &q->in;
    q->rq.head = q->rq.tail = 0; q->dest_qpn = 0; q->dest_host = -1;
  }
out:
  pthread_mutex_unlock(&fw_mu);
  return rc;
}
int ibv_query_qp(struct ibv_qp *qp, struct ibv_qp_attr *a, int mask, struct ibv_qp_init_attr *init) {
  (void)mask;
  fw_qp *q = (fw_qp *)qp;
  pthread_mutex_lock(&fw_mu);
  *a = q->attr;
  a->qp_state = a->cur_qp_state = qp->state; a->dest_qp_num = q->dest_qpn; a->qp_access_flags = q->access; a->qkey = q->qkey; a->cap = q->cap;
  if (init) { memset(init, 0, sizeof *init); init->qp_context = qp->qp_context; init->send_cq = qp->send_cq; init->recv_cq = qp->recv_cq; init->srq = qp->srq; init->cap = q->cap; init->qp_type = qp->qp_type; init->sq_sig_all = q->sq_sig_all; }
  pthread_mutex_unlock(&fw_mu);
  return 0;
}

// ---- address handles (UD) ----
struct ibv_ah *ibv_create_ah(struct ibv_pd *pd, struct ibv_ah_attr *a) {
  if (!pd || !a || a->port_num != 1 || !a->is_global) { errno = EINVAL; return NULL; } // RoCE: GRH required
  pthread_mutex_lock(&fw_mu);
  int host = resolve(&a->grh.dgid);
  pthread_mutex_unlock(&fw_mu);
  if (host < 0) { errno = ETIMEDOUT; return NULL; }
  fw_ah *h = calloc(1, sizeof *h);
  if (!h) { errno = ENOMEM; return NULL; }
  h->ah.context = pd->context; h->ah.pd = pd; h->attr = *a;
  return &h->ah;
}
int ibv_destroy_ah(struct ibv_ah *ah) { free(ah); return 0; }
