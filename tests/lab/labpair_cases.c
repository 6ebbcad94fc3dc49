// Lab hosts talking over the fake wire (ours): the scenarios between hosts (labpair.c says
// what each checks).
#define _GNU_SOURCE
#include "labpair.h"
#include <endian.h>
#include <errno.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

void mesh(void) {
  enum { IN_W, IN_S, OUT, RD, NCH };
  size_t n = (size_t)nhosts * NCH * CH;
  uint8_t *m, *u;
  struct ibv_mr *mr = memory(n, ALL, &m),
                *umr = ibv_reg_mr(pd, (u = calloc(2 * (size_t)nhosts, 4096)),
                                  2 * (size_t)nhosts * 4096, ALL);
  CHECK(mr && umr, "MRs: %s", strerror(errno));
  struct ibv_srq_init_attr sa = {.attr = {1024, 1, 0}};
  struct ibv_srq *srq = ibv_create_srq(pd, &sa);
  struct ibv_qp_init_attr ua = {
      .send_cq = cq, .recv_cq = cq, .cap = {64, 64, 1, 1, 0}, .qp_type = IBV_QPT_UD};
  struct ibv_qp *udq = ibv_create_qp(pd, &ua), *q[64];
  CHECK(srq && udq && nhosts <= 64, "SRQ, UD QP");
  struct ibv_qp_attr x = {.qp_state = IBV_QPS_INIT, .port_num = 1, .qkey = 0x11111111};
  CHECK(!ibv_modify_qp(udq, &x, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY),
        "UD INIT");
  x.qp_state = IBV_QPS_RTR;
  CHECK(!ibv_modify_qp(udq, &x, IBV_QP_STATE), "UD RTR");
  x.qp_state = IBV_QPS_RTS;
  CHECK(!ibv_modify_qp(udq, &x, IBV_QP_STATE | IBV_QP_SQ_PSN), "UD RTS");
  uint32_t qpn[64];
  for (int i = 0; i < nhosts; i++) {
    q[i] = rc_qp(srq);
    qpn[i] = q[i]->qp_num;
  }
  publish(mr->rkey, (uint64_t)(uintptr_t)m, udq->qp_num, qpn, nhosts);
  peer pr[64];
#define AT(h, c) ((size_t)((h)*NCH + (c)) * CH)
  for (int i = 0; i < nhosts; i++) {
    if (i == self) continue;
    pr[i] = lookup(i, nhosts);
    connect_rc(q[i], &pr[i].gid, pr[i].qpn[self], ALL, 14);
    fill(m + AT(i, OUT), CH, self, i);
    post_recv(NULL, srq, m + AT(i, IN_S), CH, mr->lkey, 100 + (uint64_t)i);
    post_recv(NULL, srq, m + AT(i, IN_S) + CH / 2, CH / 2, mr->lkey, 200 + (uint64_t)i);
    post_recv(udq, NULL, u + (size_t)i * 4096, 4096, umr->lkey, 300 + (uint64_t)i);
  }
  barrier("posted");
  int sends = 0, recvs = 0;
  for (int i = 0; i < nhosts; i++) {
    if (i == self) continue;
    uint64_t base = pr[i].addr;
    post(q[i], IBV_WR_RDMA_WRITE, m + AT(i, OUT), CH, mr->lkey, base + AT(self, IN_W), pr[i].rkey,
         1);
    post(q[i], IBV_WR_SEND, m + AT(i, OUT), 4096, mr->lkey, 0, 0, 2);
    post(q[i], IBV_WR_RDMA_WRITE_WITH_IMM, m + AT(i, OUT), 1024, mr->lkey,
         base + AT(self, IN_W) + CH - 1024, pr[i].rkey, 3);
    post(q[i], IBV_WR_RDMA_READ, m + AT(i, RD), CH, mr->lkey, base + AT(self, OUT), pr[i].rkey, 4);
    struct ibv_ah_attr aa = {
        .is_global = 1, .port_num = 1, .grh = {.dgid = pr[i].gid, .sgid_index = 3, .hop_limit = 1}};
    struct ibv_ah *ah = ibv_create_ah(pd, &aa);
    CHECK(ah, "AH to host %d", i);
    uint8_t *slot = u + (size_t)(nhosts + i) * 4096; // receives use slots 0..nhosts-1
    fill(slot, 256, self, i);
    struct ibv_sge s = {(uint64_t)(uintptr_t)slot, 256, umr->lkey};
    struct ibv_send_wr w = {.wr_id = 5,
                            .sg_list = &s,
                            .num_sge = 1,
                            .opcode = IBV_WR_SEND,
                            .send_flags = IBV_SEND_SIGNALED},
                       *bad;
    w.wr.ud.ah = ah;
    w.wr.ud.remote_qpn = pr[i].ud;
    w.wr.ud.remote_qkey = 0x11111111;
    CHECK(!ibv_post_send(udq, &w, &bad), "UD SEND");
    sends += 5;
    recvs += 3;
  }
  while (sends || recvs) {
    struct ibv_wc w = next_wc();
    CHECK(w.status == IBV_WC_SUCCESS, "completion wr_id %lu: %s", (unsigned long)w.wr_id,
          ibv_wc_status_str(w.status));
    if (!(w.opcode & IBV_WC_RECV)) {
      sends--;
      continue;
    }
    recvs--;
    int from = -1;
    long first;
    for (int i = 0; i < nhosts; i++)
      if (i != self &&
          (q[i]->qp_num == w.qp_num || (w.qp_num == udq->qp_num && pr[i].ud == w.src_qp)))
        from = i;
    CHECK(from >= 0, "a receive from no peer (qp %u src %u)", w.qp_num, w.src_qp);
    uint8_t *buf = w.wr_id >= 300 ? u + (w.wr_id - 300) * 4096
                                  : m + AT(w.wr_id % 100, IN_S) + (w.wr_id >= 200 ? CH / 2 : 0);
    if (w.opcode == IBV_WC_RECV_RDMA_WITH_IMM) { // the WRITE before it on that QP has landed too
      CHECK(be32toh(w.imm_data) == 0x1000u + (unsigned)from && w.byte_len == 1024,
            "immediate of host %d", from);
      CHECK(!wrong(m + AT(from, IN_W), CH - 1024, from, self, &first),
            "WRITE from host %d (first wrong at %ld)", from, first);
      CHECK(!wrong(m + AT(from, IN_W) + CH - 1024, 1024, from, self, &first),
            "WRITE_IMM from host %d", from);
    } else if (w.qp_num == udq->qp_num) {
      CHECK(w.byte_len == 296 && (w.wc_flags & IBV_WC_GRH) &&
                !wrong(buf + 40, 256, from, self, &first),
            "UD from host %d", from);
      CHECK(!memcmp(buf + 32, pr[from].gid.raw + 12, 4) && !memcmp(buf + 36, my_gid.raw + 12, 4),
            "GRH addresses");
    } else
      CHECK(w.byte_len == 4096 && !wrong(buf, 4096, from, self, &first),
            "SEND from host %d (%u bytes)", from, w.byte_len);
  }
  for (int i = 0; i < nhosts; i++)
    if (i != self) {
      long first;
      CHECK(!wrong(m + AT(i, RD), CH, i, self, &first), "READ from host %d (first wrong at %ld)", i,
            first);
    }
  barrier("finished"); // no host leaves while another still reads its memory
}

void errors(void) {
  enum { BAD_RKEY, PAST_END, NO_READ_QP, NO_READ_MR, BAD_LKEY, SMALL_RECV, N };
  uint8_t *m, *w;
  struct ibv_mr *mr = memory(CH, ALL, &m),
                *wo = ibv_reg_mr(pd, (w = calloc(1, CH)), CH,
                                 IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  CHECK(mr && wo, "MRs");
  struct ibv_qp *q[N];
  uint32_t qpn[N + 1];
  for (int i = 0; i < N; i++) {
    q[i] = rc_qp(NULL);
    qpn[i] = q[i]->qp_num;
  }
  qpn[N] = wo->rkey;
  addr2 = (uint64_t)(uintptr_t)w;
  publish(mr->rkey, (uint64_t)(uintptr_t)m, 0, qpn, N + 1);
  peer p = lookup(!self, N + 1);
  for (int i = 0; i < N; i++)
    connect_rc(q[i], &p.gid, p.qpn[i], i == NO_READ_QP ? IBV_ACCESS_REMOTE_WRITE : ALL, 14);
  if (self == 1) {
    post_recv(q[BAD_RKEY], NULL, m, 64, mr->lkey, 10);
    post_recv(q[SMALL_RECV], NULL, m, 64, mr->lkey, 11);
    barrier("posted");
    barrier("asked");
    struct ibv_wc a = next_wc(), b = next_wc();
    if (a.wr_id == 11) {
      struct ibv_wc t = a;
      a = b;
      b = t;
    }
    CHECK(a.wr_id == 10 && a.status == IBV_WC_WR_FLUSH_ERR,
          "the refused QP flushed its receive (%s)", ibv_wc_status_str(a.status));
    CHECK(b.wr_id == 11 && b.status == IBV_WC_LOC_LEN_ERR, "a receive too small: LOC_LEN_ERR (%s)",
          ibv_wc_status_str(b.status));
    int err[N] = {
        [BAD_RKEY] = 1, [PAST_END] = 1, [NO_READ_QP] = 1, [NO_READ_MR] = 1, [SMALL_RECV] = 1};
    for (int i = 0; i < N; i++) {
      struct ibv_qp_attr qa;
      struct ibv_qp_init_attr qi;
      CHECK(!ibv_query_qp(q[i], &qa, IBV_QP_STATE, &qi) && (qa.qp_state == IBV_QPS_ERR) == err[i],
            "responder QP %d state %d", i, qa.qp_state);
    }
    return;
  }
  barrier("posted");
  struct {
    int qp;
    enum ibv_wr_opcode op;
    uint32_t len, lkey;
    uint64_t raddr;
    uint32_t rkey;
    enum ibv_wc_status want;
  } c[] = {
      {BAD_RKEY, IBV_WR_RDMA_WRITE, 64, mr->lkey, p.addr, p.rkey ^ 1, IBV_WC_REM_ACCESS_ERR},
      {PAST_END, IBV_WR_RDMA_WRITE, 128, mr->lkey, p.addr + CH - 64, p.rkey, IBV_WC_REM_ACCESS_ERR},
      {NO_READ_QP, IBV_WR_RDMA_READ, 64, mr->lkey, p.addr, p.rkey, IBV_WC_REM_ACCESS_ERR},
      {NO_READ_MR, IBV_WR_RDMA_READ, 64, mr->lkey, p.addr2, p.qpn[N], IBV_WC_REM_ACCESS_ERR},
      {BAD_LKEY, IBV_WR_RDMA_WRITE, 64, mr->lkey ^ 1, p.addr, p.rkey, IBV_WC_LOC_PROT_ERR},
      {SMALL_RECV, IBV_WR_SEND, 4096, mr->lkey, 0, 0, IBV_WC_REM_INV_REQ_ERR},
  };
  for (unsigned i = 0; i < sizeof c / sizeof *c; i++) {
    post(q[c[i].qp], c[i].op, m, c[i].len, c[i].lkey, c[i].raddr, c[i].rkey, i);
    post(q[c[i].qp], IBV_WR_RDMA_WRITE, m, 8, mr->lkey, p.addr, p.rkey,
         100 + i); // flushed behind it
    struct ibv_wc a = next_wc(), b = next_wc();
    CHECK(a.wr_id == i && a.status == c[i].want, "case %u: %s, wanted %s", i,
          ibv_wc_status_str(a.status), ibv_wc_status_str(c[i].want));
    CHECK(b.wr_id == 100 + i && b.status == IBV_WC_WR_FLUSH_ERR,
          "case %u: the next WR flushed (%s)", i, ibv_wc_status_str(b.status));
  }
  barrier("asked");
}

static int alive(int pid) { // a zombie is gone: its sockets are closed
  char p[64], b[256] = "";
  snprintf(p, sizeof p, "/proc/%d/stat", pid);
  FILE *f = fopen(p, "r");
  if (!f) return 0;
  size_t k = fread(b, 1, sizeof b - 1, f);
  fclose(f);
  b[k] = 0;
  char *r = strrchr(b, ')');
  return r && r[1] == ' ' && r[2] != 'Z' && r[2] != 'X';
}
void retry(int peer_exits) {
  uint8_t *m;
  struct ibv_mr *mr = memory(CH, ALL, &m);
  struct ibv_qp *q = rc_qp(NULL);
  uint32_t qpn = q->qp_num;
  publish(mr->rkey, (uint64_t)(uintptr_t)m, 0, &qpn, 1);
  peer p = lookup(!self, 1);
  connect_rc(q, &p.gid, p.qpn[0], ALL, 12); // 4.096 us x 2^12 x 8 tries: 134 ms
  barrier("connected");
  if (self == 1) {
    if (!peer_exits) barrier("done");
    return;
  }
  for (double end = now_ms() + 10000; peer_exits && alive(p.pid);) {
    REQUIRE(now_ms() < end, "host 1 did not exit");
    struct timespec ms = {0, 2000000};
    nanosleep(&ms, NULL);
  }
  double t0 = now_ms();
  post(q, IBV_WR_RDMA_WRITE, m, 4096, mr->lkey, p.addr, p.rkey, 1);
  struct ibv_wc w = next_wc();
  CHECK(w.wr_id == 1 && w.status == IBV_WC_RETRY_EXC_ERR, "no answer: RETRY_EXC_ERR (%s)",
        ibv_wc_status_str(w.status));
  printf("labpair retry host 0: elapsed_ms=%.0f retry_ms=%.0f\n", now_ms() - t0,
         4.096e-3 * 4096 * 8);
  if (!peer_exits) barrier("done");
}

void stream(void) {
  enum { MSG = 1 << 20, TOTAL = 8 * MSG };
  uint8_t *m;
  struct ibv_mr *mr = memory(TOTAL + CH, ALL, &m);
  struct ibv_qp *q = rc_qp(NULL);
  uint32_t qpn = q->qp_num;
  publish(mr->rkey, (uint64_t)(uintptr_t)m, 0, &qpn, 1);
  peer p = lookup(!self, 1);
  connect_rc(q, &p.gid, p.qpn[0], ALL, 16);
  if (self == 1) post_recv(q, NULL, m + TOTAL, CH, mr->lkey, 9);
  else fill(m, TOTAL, 0, 1);
  barrier("posted");
  if (self == 1) {
    struct ibv_wc w = next_wc();
    CHECK(w.status == IBV_WC_SUCCESS && w.wr_id == 9, "the last SEND: %s",
          ibv_wc_status_str(w.status));
    long first;
    size_t bad = wrong(m, TOTAL, 0, 1, &first);
    printf("labpair stream host 1: wrong_bytes=%zu first_wrong=%ld\n", bad, first);
    return;
  }
  double t0 = now_ms();
  for (int i = 0; i < TOTAL / MSG; i++)
    post(q, IBV_WR_RDMA_WRITE, m + (size_t)i * MSG, MSG, mr->lkey, p.addr + (size_t)i * MSG, p.rkey,
         (uint64_t)i);
  post(q, IBV_WR_SEND, m, 64, mr->lkey, 0, 0, 99);
  for (int i = 0; i <= TOTAL / MSG; i++) {
    struct ibv_wc w = next_wc();
    CHECK(w.status == IBV_WC_SUCCESS, "WRITE %lu: %s", (unsigned long)w.wr_id,
          ibv_wc_status_str(w.status));
  }
  printf("labpair stream host 0: elapsed_ms=%.0f bytes=%d\n", now_ms() - t0, TOTAL);
}

#ifdef LAB_GPU
int cuStreamWaitValue32_v2(void *s, uint64_t addr, uint32_t value, unsigned flags);
int cuMemcpyDtoH_v2(void *d, uint64_t s, size_t n);
int cuDevicePrimaryCtxRetain(void **c, int d);
int cuCtxSetCurrent(void *c);
extern unsigned long labcuda_waited;
#endif
// Host 1 WRITEs CH bytes into host 0's GPU memory, then a flag word after them, while host 0's
// only thread is blocked in a pageable copy of that memory whose legacy stream waits for the flag
// (as `t.cpu()` after a collective waits in libcuda for NCCL's kernel, which waits for those
// bytes): host 0's wire must write its GPU memory while that thread holds what libcuda holds for
// a pageable copy. Host 0 checks every byte its copy read.
void blocked(void) {
#ifdef LAB_GPU
  uint8_t *m;
  struct ibv_mr *mr = memory(2 * CH, ALL, &m);
  CHECK(mr, "GPU MR: %s", strerror(errno));
  struct ibv_qp *q = rc_qp(NULL);
  uint32_t qpn = q->qp_num;
  publish(mr->rkey, (uint64_t)(uintptr_t)m, 0, &qpn, 1);
  peer p = lookup(!self, 1);
  connect_rc(q, &p.gid, p.qpn[0], ALL, 16);
  if (self == 1) {
    fill(m, CH, 1, 0);
    memcpy(m + CH, &(uint32_t){1}, 4);
  }
  barrier("connected");
  if (self == 0) {
    void *primary;
    CHECK(!cuDevicePrimaryCtxRetain(&primary, 0) && !cuCtxSetCurrent(primary), "context");
    // CU_STREAM_WAIT_VALUE_EQ (1) on the legacy stream, then a synchronous pageable copy behind it
    CHECK(!cuStreamWaitValue32_v2(NULL, (uint64_t)(uintptr_t)(m + CH), 1, 1), "stream wait");
    uint8_t *h = malloc(CH + 4);
    CHECK(h, "memory");
    put("blocking", "1");
    double t0 = now_ms();
    int rc = cuMemcpyDtoH_v2(h, (uint64_t)(uintptr_t)m, CH + 4);
    CHECK(!rc, "the pageable copy never got its bytes (CUDA error %d after %.0f ms): the wire could "
               "not write GPU memory while this thread was blocked in libcuda", rc, now_ms() - t0);
    long first;
    size_t bad = wrong(h, CH, 1, 0, &first);
    uint32_t flag;
    memcpy(&flag, h + CH, 4);
    CHECK(!bad && flag == 1, "%zu wrong bytes (first at %ld), flag %u", bad, first, flag);
    CHECK(labcuda_waited >= 1, "the copy never waited: the bytes came before it blocked");
    printf("labpair blocked host 0: blocked_ms=%.0f wrong_bytes=%zu\n", now_ms() - t0, bad);
    free(h);
    return;
  }
  char b[8];
  get("blocking", b, sizeof b);
  struct timespec settle = {0, 200000000}; // host 0 is inside its copy by then
  nanosleep(&settle, NULL);
  post(q, IBV_WR_RDMA_WRITE, m, CH, mr->lkey, p.addr, p.rkey, 1);
  post(q, IBV_WR_RDMA_WRITE, m + CH, 4, mr->lkey, p.addr + CH, p.rkey, 2);
  for (int i = 0; i < 2; i++) {
    struct ibv_wc w = next_wc();
    CHECK(w.status == IBV_WC_SUCCESS, "WRITE %lu: %s", (unsigned long)w.wr_id,
          ibv_wc_status_str(w.status));
  }
#else
  CHECK(0, "blocked needs the stand-in libcuda: labpair-gpu");
#endif
}
