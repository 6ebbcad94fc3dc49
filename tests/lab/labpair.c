// Lab hosts talking over the fake wire (ours; CI: tests/lab_hosts.rs). A plain verbs program
// (rdma-core's verbs.h: its inline post/poll calls reach the fake as any consumer's do), run as
// one process per lab host: `DIR/host N labpair SCENARIO RDV N NHOSTS [host|gpu]`. The hosts
// swap their addresses through files in RDV (as rdma-core's examples swap them over TCP).
//   mesh    every pair: RDMA WRITE, WRITE with immediate, READ, SEND into an SRQ, UD SEND with
//           its GRH; every byte checked, by the host that owns the memory
//   errors  host 0 asks, host 1 answers: a wrong rkey, a range past the MR, READ without remote
//           read (QP, then MR), a wrong lkey, a receive too small: each status checked at both ends
//   retry   host 0 WRITEs to host 1 that is gone (exited; or alive behind a fault): RETRY_EXC_ERR
//           after the QP's retry time; prints elapsed_ms and retry_ms
//   stream  host 0 WRITEs 8 MiB in 1 MiB messages to host 1: elapsed_ms; host 1 counts wrong bytes
//   regs    alone: host name, port state, dma-buf and GPU registrations, peermem's sysfs file
// Memory: host (malloc, ibv_reg_mr) or gpu (the stand-in libcuda's, as dma-buf MRs).
#define _GNU_SOURCE
#include <endian.h>
#include <errno.h>
#include <infiniband/verbs.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/utsname.h>
#include <time.h>
#include <unistd.h>

#ifdef LAB_GPU
void labcuda_gpu(void *p, size_t n);
int cuMemGetHandleForAddressRange(void *handle, uint64_t dptr, size_t size, int type, unsigned long long flags);
#endif
static int checks, self, nhosts, gpu;
static const char *rdv;
#define REQUIRE(c, ...) do { if (!(c)) { fprintf(stderr, "labpair host %d: FAILED %s:%d: %s: ", self, __FILE__, __LINE__, #c); \
  fprintf(stderr, __VA_ARGS__); fputc('\n', stderr); exit(1); } } while (0)
#define CHECK(c, ...) do { REQUIRE(c, __VA_ARGS__); checks++; } while (0) // counted: the checks a run passed
enum { ALL = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ, CH = 65536 };

static double now_ms(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec * 1e3 + t.tv_nsec / 1e6; }
// ---- the files in RDV ----
static void put(const char *name, const char *text) {
  char p[512], t[520];
  snprintf(p, sizeof p, "%s/%s", rdv, name); snprintf(t, sizeof t, "%s.tmp", p);
  FILE *f = fopen(t, "w");
  REQUIRE(f && fputs(text, f) >= 0 && !fclose(f) && !rename(t, p), "write %s", p);
}
static void get(const char *name, char *buf, size_t n) { // waits for it (20 s at most)
  char p[512]; snprintf(p, sizeof p, "%s/%s", rdv, name);
  for (double end = now_ms() + 20000;;) {
    FILE *f = fopen(p, "r");
    if (f) { size_t k = fread(buf, 1, n - 1, f); buf[k] = 0; fclose(f); return; }
    REQUIRE(now_ms() < end, "%s never came", p);
    struct timespec ms = {0, 2000000}; nanosleep(&ms, NULL);
  }
}
static void barrier(const char *step) {
  char name[64], b[8];
  snprintf(name, sizeof name, "%s-%d", step, self); put(name, "1");
  for (int i = 0; i < nhosts; i++) { snprintf(name, sizeof name, "%s-%d", step, i); get(name, b, sizeof b); }
}

// ---- verbs ----
static struct ibv_context *ctx;
static struct ibv_pd *pd;
static struct ibv_comp_channel *ch;
static struct ibv_cq *cq;
static union ibv_gid my_gid;
static void open_hca(void) {
  int n = 0;
  struct ibv_device **l = ibv_get_device_list(&n);
  CHECK(l && n == 1, "one HCA per lab host (%d)", n);
  ctx = ibv_open_device(l[0]);
  CHECK(ctx && (pd = ibv_alloc_pd(ctx)), "open, PD");
  CHECK(!ibv_query_gid(ctx, 1, 3, &my_gid), "GID 3");
  ch = ibv_create_comp_channel(ctx);
  CHECK(ch && (cq = ibv_create_cq(ctx, 4096, NULL, ch, 0)), "channel, CQ");
  ibv_free_device_list(l);
}
// Memory of the kind asked, registered: host memory by ibv_reg_mr, GPU memory as a dma-buf MR.
static struct ibv_mr *memory(size_t n, int access, uint8_t **out) {
  uint8_t *p = aligned_alloc(65536, n);
  CHECK(p, "memory");
  memset(p, 0, n);
  *out = p;
  if (!gpu) return ibv_reg_mr(pd, p, n, access);
#ifdef LAB_GPU
  labcuda_gpu(p, n);
  int fd = -1;
  CHECK(!cuMemGetHandleForAddressRange(&fd, (uint64_t)(uintptr_t)p, n, 1, 0), "dma-buf export");
  struct ibv_mr *mr = ibv_reg_dmabuf_mr(pd, 0, n, (uint64_t)(uintptr_t)p, fd, access);
  close(fd);
  return mr;
#else
  CHECK(0, "built without the stand-in libcuda");
#endif
}
static struct ibv_qp *rc_qp(struct ibv_srq *srq) {
  struct ibv_qp_init_attr a = {.send_cq = cq, .recv_cq = cq, .srq = srq, .cap = {256, 256, 1, 1, 64}, .qp_type = IBV_QPT_RC};
  struct ibv_qp *q = ibv_create_qp(pd, &a);
  CHECK(q, "RC QP: %s", strerror(errno));
  return q;
}
static void connect_rc(struct ibv_qp *q, const union ibv_gid *gid, uint32_t qpn, int access, int timeout) {
  struct ibv_qp_attr a = {.qp_state = IBV_QPS_INIT, .port_num = 1, .qp_access_flags = access};
  CHECK(!ibv_modify_qp(q, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS), "INIT");
  a = (struct ibv_qp_attr){.qp_state = IBV_QPS_RTR, .path_mtu = IBV_MTU_4096, .dest_qp_num = qpn, .rq_psn = 0,
                           .max_dest_rd_atomic = 4, .min_rnr_timer = 12};
  a.ah_attr.is_global = 1; a.ah_attr.port_num = 1; a.ah_attr.grh.dgid = *gid; a.ah_attr.grh.sgid_index = 3; a.ah_attr.grh.hop_limit = 64;
  CHECK(!ibv_modify_qp(q, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                                  IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER), "RTR");
  a = (struct ibv_qp_attr){.qp_state = IBV_QPS_RTS, .timeout = (uint8_t)timeout, .retry_cnt = 7, .rnr_retry = 7, .max_rd_atomic = 4};
  CHECK(!ibv_modify_qp(q, &a, IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                                  IBV_QP_MAX_QP_RD_ATOMIC), "RTS");
}
static void post(struct ibv_qp *q, enum ibv_wr_opcode op, void *buf, uint32_t len, uint32_t lkey, uint64_t raddr, uint32_t rkey, uint64_t id) {
  struct ibv_sge s = {(uint64_t)(uintptr_t)buf, len, lkey};
  struct ibv_send_wr w = {.wr_id = id, .sg_list = &s, .num_sge = 1, .opcode = op, .send_flags = IBV_SEND_SIGNALED}, *bad;
  w.imm_data = htobe32(0x1000u + (unsigned)self); w.wr.rdma.remote_addr = raddr; w.wr.rdma.rkey = rkey;
  CHECK(!ibv_post_send(q, &w, &bad), "post_send op %d", op);
}
static void post_recv(struct ibv_qp *q, struct ibv_srq *srq, void *buf, uint32_t len, uint32_t lkey, uint64_t id) {
  struct ibv_sge s = {(uint64_t)(uintptr_t)buf, len, lkey};
  struct ibv_recv_wr w = {.wr_id = id, .sg_list = &s, .num_sge = 1}, *bad;
  CHECK(!(srq ? ibv_post_srq_recv(srq, &w, &bad) : ibv_post_recv(q, &w, &bad)), "post_recv");
}
// The next completion, waited for on the channel (10 s at most).
static struct ibv_wc next_wc(void) {
  struct ibv_wc w;
  for (double end = now_ms() + 10000;;) {
    if (ibv_poll_cq(cq, 1, &w) == 1) return w;
    REQUIRE(!ibv_req_notify_cq(cq, 0), "arm");
    if (ibv_poll_cq(cq, 1, &w) == 1) return w;
    struct pollfd p = {ch->fd, POLLIN, 0};
    REQUIRE(now_ms() < end && poll(&p, 1, (int)(end - now_ms()) + 1) >= 0, "no completion in 10 s");
    struct ibv_cq *evcq; void *evctx;
    if (p.revents && !ibv_get_cq_event(ch, &evcq, &evctx)) ibv_ack_cq_events(evcq, 1);
  }
}
static void fill(uint8_t *p, size_t n, int from, int to) { for (size_t i = 0; i < n; i++) p[i] = (uint8_t)(i * 7 + from * 31 + to * 5 + 1); }
static size_t wrong(const uint8_t *p, size_t n, int from, int to, long *first) {
  size_t bad = 0; *first = -1;
  for (size_t i = 0; i < n; i++) if (p[i] != (uint8_t)(i * 7 + from * 31 + to * 5 + 1)) { if (*first < 0) *first = (long)i; bad++; }
  return bad;
}
static void gid_hex(const union ibv_gid *g, char *out) { for (int i = 0; i < 16; i++) sprintf(out + 2 * i, "%02x", g->raw[i]); }
static void hex_gid(const char *s, union ibv_gid *g) { for (int i = 0; i < 16; i++) sscanf(s + 2 * i, "%2hhx", &g->raw[i]); }

// ---- scenarios ----
typedef struct { union ibv_gid gid; uint32_t rkey, ud; uint64_t addr, addr2; uint32_t qpn[64]; int pid; } peer;
static uint64_t addr2; // a second address to publish (errors: an MR without remote read)
static void publish(uint32_t rkey, uint64_t addr, uint32_t ud, uint32_t *qpn, int nq) {
  char b[4096], g[33], name[32];
  gid_hex(&my_gid, g);
  int k = snprintf(b, sizeof b, "%s %u %u %lx %lx %d", g, rkey, ud, (unsigned long)addr, (unsigned long)addr2, getpid());
  for (int i = 0; i < nq; i++) k += snprintf(b + k, sizeof b - (size_t)k, " %u", qpn[i]);
  snprintf(name, sizeof name, "addr-%d", self); put(name, b);
}
static peer lookup(int h, int nq) {
  char b[4096], g[40], name[32]; peer p = {0}; unsigned long a, a2;
  snprintf(name, sizeof name, "addr-%d", h); get(name, b, sizeof b);
  char *s = b; int k;
  CHECK(sscanf(s, "%39s %u %u %lx %lx %d%n", g, &p.rkey, &p.ud, &a, &a2, &p.pid, &k) == 6, "address of host %d", h);
  hex_gid(g, &p.gid); p.addr = a; p.addr2 = a2;
  for (int i = 0; i < nq; i++) { s += k; CHECK(sscanf(s, " %u%n", &p.qpn[i], &k) == 1, "QP %d of host %d", i, h); }
  return p;
}

static void mesh(void) {
  enum { IN_W, IN_S, OUT, RD, NCH };
  size_t n = (size_t)nhosts * NCH * CH;
  uint8_t *m, *u;
  struct ibv_mr *mr = memory(n, ALL, &m), *umr = ibv_reg_mr(pd, (u = calloc(2 * (size_t)nhosts, 4096)), 2 * (size_t)nhosts * 4096, ALL);
  CHECK(mr && umr, "MRs: %s", strerror(errno));
  struct ibv_srq_init_attr sa = {.attr = {1024, 1, 0}};
  struct ibv_srq *srq = ibv_create_srq(pd, &sa);
  struct ibv_qp_init_attr ua = {.send_cq = cq, .recv_cq = cq, .cap = {64, 64, 1, 1, 0}, .qp_type = IBV_QPT_UD};
  struct ibv_qp *udq = ibv_create_qp(pd, &ua), *q[64];
  CHECK(srq && udq && nhosts <= 64, "SRQ, UD QP");
  struct ibv_qp_attr x = {.qp_state = IBV_QPS_INIT, .port_num = 1, .qkey = 0x11111111};
  CHECK(!ibv_modify_qp(udq, &x, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY), "UD INIT");
  x.qp_state = IBV_QPS_RTR; CHECK(!ibv_modify_qp(udq, &x, IBV_QP_STATE), "UD RTR");
  x.qp_state = IBV_QPS_RTS; CHECK(!ibv_modify_qp(udq, &x, IBV_QP_STATE | IBV_QP_SQ_PSN), "UD RTS");
  uint32_t qpn[64];
  for (int i = 0; i < nhosts; i++) { q[i] = rc_qp(srq); qpn[i] = q[i]->qp_num; }
  publish(mr->rkey, (uint64_t)(uintptr_t)m, udq->qp_num, qpn, nhosts);
  peer pr[64];
#define AT(h, c) ((size_t)((h) * NCH + (c)) * CH)
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
    post(q[i], IBV_WR_RDMA_WRITE, m + AT(i, OUT), CH, mr->lkey, base + AT(self, IN_W), pr[i].rkey, 1);
    post(q[i], IBV_WR_SEND, m + AT(i, OUT), 4096, mr->lkey, 0, 0, 2);
    post(q[i], IBV_WR_RDMA_WRITE_WITH_IMM, m + AT(i, OUT), 1024, mr->lkey, base + AT(self, IN_W) + CH - 1024, pr[i].rkey, 3);
    post(q[i], IBV_WR_RDMA_READ, m + AT(i, RD), CH, mr->lkey, base + AT(self, OUT), pr[i].rkey, 4);
    struct ibv_ah_attr aa = {.is_global = 1, .port_num = 1, .grh = {.dgid = pr[i].gid, .sgid_index = 3, .hop_limit = 1}};
    struct ibv_ah *ah = ibv_create_ah(pd, &aa);
    CHECK(ah, "AH to host %d", i);
    uint8_t *slot = u + (size_t)(nhosts + i) * 4096; // receives use slots 0..nhosts-1
    fill(slot, 256, self, i);
    struct ibv_sge s = {(uint64_t)(uintptr_t)slot, 256, umr->lkey};
    struct ibv_send_wr w = {.wr_id = 5, .sg_list = &s, .num_sge = 1, .opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED}, *bad;
    w.wr.ud.ah = ah; w.wr.ud.remote_qpn = pr[i].ud; w.wr.ud.remote_qkey = 0x11111111;
    CHECK(!ibv_post_send(udq, &w, &bad), "UD SEND");
    sends += 5; recvs += 3;
  }
  while (sends || recvs) {
    struct ibv_wc w = next_wc();
    CHECK(w.status == IBV_WC_SUCCESS, "completion wr_id %lu: %s", (unsigned long)w.wr_id, ibv_wc_status_str(w.status));
    if (!(w.opcode & IBV_WC_RECV)) { sends--; continue; }
    recvs--;
    int from = -1; long first;
    for (int i = 0; i < nhosts; i++) if (i != self && (q[i]->qp_num == w.qp_num || (w.qp_num == udq->qp_num && pr[i].ud == w.src_qp))) from = i;
    CHECK(from >= 0, "a receive from no peer (qp %u src %u)", w.qp_num, w.src_qp);
    uint8_t *buf = w.wr_id >= 300 ? u + (w.wr_id - 300) * 4096 : m + AT(w.wr_id % 100, IN_S) + (w.wr_id >= 200 ? CH / 2 : 0);
    if (w.opcode == IBV_WC_RECV_RDMA_WITH_IMM) { // the WRITE before it on that QP has landed too
      CHECK(be32toh(w.imm_data) == 0x1000u + (unsigned)from && w.byte_len == 1024, "immediate of host %d", from);
      CHECK(!wrong(m + AT(from, IN_W), CH - 1024, from, self, &first), "WRITE from host %d (first wrong at %ld)", from, first);
      CHECK(!wrong(m + AT(from, IN_W) + CH - 1024, 1024, from, self, &first), "WRITE_IMM from host %d", from);
    } else if (w.qp_num == udq->qp_num) {
      CHECK(w.byte_len == 296 && (w.wc_flags & IBV_WC_GRH) && !wrong(buf + 40, 256, from, self, &first), "UD from host %d", from);
      CHECK(!memcmp(buf + 32, pr[from].gid.raw + 12, 4) && !memcmp(buf + 36, my_gid.raw + 12, 4), "GRH addresses");
    } else CHECK(w.byte_len == 4096 && !wrong(buf, 4096, from, self, &first), "SEND from host %d (%u bytes)", from, w.byte_len);
  }
  for (int i = 0; i < nhosts; i++)
    if (i != self) { long first; CHECK(!wrong(m + AT(i, RD), CH, i, self, &first), "READ from host %d (first wrong at %ld)", i, first); }
  barrier("finished"); // no host leaves while another still reads its memory
}

static void errors(void) {
  enum { BAD_RKEY, PAST_END, NO_READ_QP, NO_READ_MR, BAD_LKEY, SMALL_RECV, N };
  uint8_t *m, *w;
  struct ibv_mr *mr = memory(CH, ALL, &m), *wo = ibv_reg_mr(pd, (w = calloc(1, CH)), CH, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  CHECK(mr && wo, "MRs");
  struct ibv_qp *q[N]; uint32_t qpn[N + 1];
  for (int i = 0; i < N; i++) { q[i] = rc_qp(NULL); qpn[i] = q[i]->qp_num; }
  qpn[N] = wo->rkey; addr2 = (uint64_t)(uintptr_t)w;
  publish(mr->rkey, (uint64_t)(uintptr_t)m, 0, qpn, N + 1);
  peer p = lookup(!self, N + 1);
  for (int i = 0; i < N; i++) connect_rc(q[i], &p.gid, p.qpn[i], i == NO_READ_QP ? IBV_ACCESS_REMOTE_WRITE : ALL, 14);
  if (self == 1) {
    post_recv(q[BAD_RKEY], NULL, m, 64, mr->lkey, 10);
    post_recv(q[SMALL_RECV], NULL, m, 64, mr->lkey, 11);
    barrier("posted");
    barrier("asked");
    struct ibv_wc a = next_wc(), b = next_wc();
    if (a.wr_id == 11) { struct ibv_wc t = a; a = b; b = t; }
    CHECK(a.wr_id == 10 && a.status == IBV_WC_WR_FLUSH_ERR, "the refused QP flushed its receive (%s)", ibv_wc_status_str(a.status));
    CHECK(b.wr_id == 11 && b.status == IBV_WC_LOC_LEN_ERR, "a receive too small: LOC_LEN_ERR (%s)", ibv_wc_status_str(b.status));
    int err[N] = {[BAD_RKEY] = 1, [PAST_END] = 1, [NO_READ_QP] = 1, [NO_READ_MR] = 1, [SMALL_RECV] = 1};
    for (int i = 0; i < N; i++) {
      struct ibv_qp_attr qa; struct ibv_qp_init_attr qi;
      CHECK(!ibv_query_qp(q[i], &qa, IBV_QP_STATE, &qi) && (qa.qp_state == IBV_QPS_ERR) == err[i], "responder QP %d state %d", i, qa.qp_state);
    }
    return;
  }
  barrier("posted");
  struct { int qp; enum ibv_wr_opcode op; uint32_t len, lkey; uint64_t raddr; uint32_t rkey; enum ibv_wc_status want; } c[] = {
    {BAD_RKEY, IBV_WR_RDMA_WRITE, 64, mr->lkey, p.addr, p.rkey ^ 1, IBV_WC_REM_ACCESS_ERR},
    {PAST_END, IBV_WR_RDMA_WRITE, 128, mr->lkey, p.addr + CH - 64, p.rkey, IBV_WC_REM_ACCESS_ERR},
    {NO_READ_QP, IBV_WR_RDMA_READ, 64, mr->lkey, p.addr, p.rkey, IBV_WC_REM_ACCESS_ERR},
    {NO_READ_MR, IBV_WR_RDMA_READ, 64, mr->lkey, p.addr2, p.qpn[N], IBV_WC_REM_ACCESS_ERR},
    {BAD_LKEY, IBV_WR_RDMA_WRITE, 64, mr->lkey ^ 1, p.addr, p.rkey, IBV_WC_LOC_PROT_ERR},
    {SMALL_RECV, IBV_WR_SEND, 4096, mr->lkey, 0, 0, IBV_WC_REM_INV_REQ_ERR},
  };
  for (unsigned i = 0; i < sizeof c / sizeof *c; i++) {
    post(q[c[i].qp], c[i].op, m, c[i].len, c[i].lkey, c[i].raddr, c[i].rkey, i);
    post(q[c[i].qp], IBV_WR_RDMA_WRITE, m, 8, mr->lkey, p.addr, p.rkey, 100 + i); // flushed behind it
    struct ibv_wc a = next_wc(), b = next_wc();
    CHECK(a.wr_id == i && a.status == c[i].want, "case %u: %s, wanted %s", i, ibv_wc_status_str(a.status), ibv_wc_status_str(c[i].want));
    CHECK(b.wr_id == 100 + i && b.status == IBV_WC_WR_FLUSH_ERR, "case %u: the next WR flushed (%s)", i, ibv_wc_status_str(b.status));
  }
  barrier("asked");
}

static int alive(int pid) { // a zombie is gone: its sockets are closed
  char p[64], b[256] = "";
  snprintf(p, sizeof p, "/proc/%d/stat", pid);
  FILE *f = fopen(p, "r");
  if (!f) return 0;
  size_t k = fread(b, 1, sizeof b - 1, f); fclose(f); b[k] = 0;
  char *r = strrchr(b, ')');
  return r && r[1] == ' ' && r[2] != 'Z' && r[2] != 'X';
}
static void retry(int peer_exits) {
  uint8_t *m;
  struct ibv_mr *mr = memory(CH, ALL, &m);
  struct ibv_qp *q = rc_qp(NULL); uint32_t qpn = q->qp_num;
  publish(mr->rkey, (uint64_t)(uintptr_t)m, 0, &qpn, 1);
  peer p = lookup(!self, 1);
  connect_rc(q, &p.gid, p.qpn[0], ALL, 12); // 4.096 us x 2^12 x 8 tries: 134 ms
  barrier("connected");
  if (self == 1) { if (!peer_exits) barrier("done"); return; }
  for (double end = now_ms() + 10000; peer_exits && alive(p.pid);) {
    REQUIRE(now_ms() < end, "host 1 did not exit");
    struct timespec ms = {0, 2000000}; nanosleep(&ms, NULL);
  }
  double t0 = now_ms();
  post(q, IBV_WR_RDMA_WRITE, m, 4096, mr->lkey, p.addr, p.rkey, 1);
  struct ibv_wc w = next_wc();
  CHECK(w.wr_id == 1 && w.status == IBV_WC_RETRY_EXC_ERR, "no answer: RETRY_EXC_ERR (%s)", ibv_wc_status_str(w.status));
  printf("labpair retry host 0: elapsed_ms=%.0f retry_ms=%.0f\n", now_ms() - t0, 4.096e-3 * 4096 * 8);
  if (!peer_exits) barrier("done");
}

static void stream(void) {
  enum { MSG = 1 << 20, TOTAL = 8 * MSG };
  uint8_t *m;
  struct ibv_mr *mr = memory(TOTAL + CH, ALL, &m);
  struct ibv_qp *q = rc_qp(NULL); uint32_t qpn = q->qp_num;
  publish(mr->rkey, (uint64_t)(uintptr_t)m, 0, &qpn, 1);
  peer p = lookup(!self, 1);
  connect_rc(q, &p.gid, p.qpn[0], ALL, 16);
  if (self == 1) post_recv(q, NULL, m + TOTAL, CH, mr->lkey, 9);
  else fill(m, TOTAL, 0, 1);
  barrier("posted");
  if (self == 1) {
    struct ibv_wc w = next_wc();
    CHECK(w.status == IBV_WC_SUCCESS && w.wr_id == 9, "the last SEND: %s", ibv_wc_status_str(w.status));
    long first; size_t bad = wrong(m, TOTAL, 0, 1, &first);
    printf("labpair stream host 1: wrong_bytes=%zu first_wrong=%ld\n", bad, first);
    return;
  }
  double t0 = now_ms();
  for (int i = 0; i < TOTAL / MSG; i++) post(q, IBV_WR_RDMA_WRITE, m + (size_t)i * MSG, MSG, mr->lkey, p.addr + (size_t)i * MSG, p.rkey, (uint64_t)i);
  post(q, IBV_WR_SEND, m, 64, mr->lkey, 0, 0, 99);
  for (int i = 0; i <= TOTAL / MSG; i++) { struct ibv_wc w = next_wc(); CHECK(w.status == IBV_WC_SUCCESS, "WRITE %lu: %s", (unsigned long)w.wr_id, ibv_wc_status_str(w.status)); }
  printf("labpair stream host 0: elapsed_ms=%.0f bytes=%d\n", now_ms() - t0, TOTAL);
}

static void regs(void) {
  struct utsname u; char hn[64] = "";
  CHECK(!uname(&u) && !gethostname(hn, sizeof hn), "uname, gethostname");
  struct ibv_port_attr pa;
  CHECK(!ibv_query_port(ctx, 1, &pa), "query_port");
  errno = 0;
  struct ibv_mr *probe = ibv_reg_dmabuf_mr(pd, 0, 0, 0, -1, 0); // NCCL's probe
  int probe_errno = errno;
  uint8_t *m; errno = 0;
  struct ibv_mr *dm = gpu ? memory(CH, ALL, &m) : NULL;
  int dm_errno = errno;
  errno = 0;
  struct ibv_mr *plain = gpu ? ibv_reg_mr(pd, m, CH, ALL) : NULL;
  int plain_errno = errno;
  printf("labpair regs host %d: uname=%s gethostname=%s device=%s port=%s dmabuf_probe=%s dmabuf_mr=%s plain_gpu_mr=%s "
         "peermem_sysfs=%d\n", self, u.nodename, hn, ibv_get_device_name(ctx->device), ibv_port_state_str(pa.state),
         probe ? "ok" : strerror(probe_errno), dm ? "ok" : gpu ? strerror(dm_errno) : "-", plain ? "ok" : gpu ? strerror(plain_errno) : "-",
         !access("/sys/module/nvidia_peermem/version", F_OK));
}

int main(int argc, char **argv) {
  if (argc < 5) { fprintf(stderr, "usage: labpair mesh|errors|retry|retry-alive|stream|regs RDV SELF NHOSTS [host|gpu]\n"); return 2; }
  const char *what = argv[1];
  rdv = argv[2]; self = atoi(argv[3]); nhosts = atoi(argv[4]); gpu = argc > 5 && !strcmp(argv[5], "gpu");
  open_hca();
  if (!strcmp(what, "mesh")) mesh();
  else if (!strcmp(what, "errors")) errors();
  else if (!strcmp(what, "retry")) retry(1);
  else if (!strcmp(what, "retry-alive")) retry(0);
  else if (!strcmp(what, "stream")) stream();
  else if (!strcmp(what, "regs")) regs();
  else { fprintf(stderr, "labpair: no scenario %s\n", what); return 2; }
  printf("labpair %s host %d: %d checks passed\n", what, self, checks);
  return 0;
}
