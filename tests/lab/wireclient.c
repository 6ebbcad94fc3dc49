// The fake wire's own verbs client (ours; CI: tests/lab.rs): what consumers rely on, checked call
// by call through rdma-core's libibverbs.so.1 and the lab's provider (tests/lab/fwprovider.c,
// fakewire*.c), with host memory, through the context's ops table as verbs.h's inline
// ibv_post_send / ibv_post_recv / ibv_poll_cq reach it.
//   wireclient host   device, port, GIDs; the QP state machine's refusals; MR refusals; RDMA WRITE,
//                     READ, SEND/RECV (a receive posted late: the send waits), WRITE with immediate,
//                     inline SEND, SRQ, UD with its GRH, a completion channel; access errors put the
//                     QP in ERR and flush what follows
//   wireclient gpu    with labcuda.c's stand-in libcuda: a plain MR over "GPU" memory is refused
//                     EFAULT (FAKEWIRE_PEERMEM unset), or taken and written through cuMemcpy (=1)
#define _GNU_SOURCE
#include "fakewire.h"
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

struct ibv_device **ibv_get_device_list(int *n);
const char *ibv_get_device_name(struct ibv_device *d);
struct ibv_context *ibv_open_device(struct ibv_device *d);
int ibv_query_device(struct ibv_context *c, struct ibv_device_attr *a);
int ibv_query_port(struct ibv_context *c, uint8_t port, struct ibv_port_attr *a);
int ibv_query_gid(struct ibv_context *c, uint8_t port, int index, union ibv_gid *gid);
int _ibv_query_gid_ex(struct ibv_context *c, uint32_t port, uint32_t index, struct ibv_gid_entry *e, uint32_t flags, size_t size);
struct ibv_pd *ibv_alloc_pd(struct ibv_context *c);
struct ibv_mr *ibv_reg_mr(struct ibv_pd *pd, void *addr, size_t len, int access);
struct ibv_mr *ibv_reg_mr_iova2(struct ibv_pd *pd, void *addr, size_t len, uint64_t iova, unsigned access);
struct ibv_mr *ibv_reg_dmabuf_mr(struct ibv_pd *pd, uint64_t off, size_t len, uint64_t iova, int fd, int access);
int ibv_dereg_mr(struct ibv_mr *mr);
struct ibv_comp_channel *ibv_create_comp_channel(struct ibv_context *c);
int ibv_get_cq_event(struct ibv_comp_channel *ch, struct ibv_cq **cq, void **ctx);
struct ibv_cq *ibv_create_cq(struct ibv_context *c, int cqe, void *ctx, struct ibv_comp_channel *ch, int vec);
struct ibv_srq *ibv_create_srq(struct ibv_pd *pd, struct ibv_srq_init_attr *a);
struct ibv_qp *ibv_create_qp(struct ibv_pd *pd, struct ibv_qp_init_attr *a);
int ibv_modify_qp(struct ibv_qp *qp, struct ibv_qp_attr *a, int mask);
int ibv_query_qp(struct ibv_qp *qp, struct ibv_qp_attr *a, int mask, struct ibv_qp_init_attr *init);
struct ibv_ah *ibv_create_ah(struct ibv_pd *pd, struct ibv_ah_attr *a);
void labcuda_gpu(void *p, size_t n) __attribute__((weak));
extern unsigned long labcuda_copies __attribute__((weak));

static int checks;
#define CHECK(c, ...) do { if (!(c)) { fprintf(stderr, "wireclient: FAILED %s:%d: %s: ", __FILE__, __LINE__, #c); fprintf(stderr, __VA_ARGS__); fputc('\n', stderr); exit(1); } checks++; } while (0)

static struct ibv_context *ctx;
static struct ibv_pd *pd;
enum { RW = 1 | 2 | 4 }; // local write, remote write, remote read
enum { M_RC_INIT = 1 | 16 | 32 | 8, M_RC_RTR = 1 | 128 | 256 | (1 << 20) | 4096 | 131072 | 32768, M_RC_RTS = 1 | 65536 | 512 | 1024 | 2048 | 8192 };

static struct ibv_qp *rc_qp(struct ibv_cq *cq, struct ibv_srq *srq) {
  struct ibv_qp_init_attr a = {.send_cq = cq, .recv_cq = cq, .srq = srq, .cap = {64, 64, 4, 4, 64}, .qp_type = 2};
  struct ibv_qp *q = ibv_create_qp(pd, &a);
  CHECK(q, "create RC QP: %s", strerror(errno));
  return q;
}
static struct ibv_qp_attr rtr_attr(uint32_t dest, int gid) {
  struct ibv_qp_attr a = {.qp_state = 2, .path_mtu = 5, .dest_qp_num = dest, .max_dest_rd_atomic = 4, .min_rnr_timer = 12};
  a.ah_attr.is_global = 1; a.ah_attr.port_num = 1; a.ah_attr.grh.sgid_index = 3; a.ah_attr.grh.hop_limit = 64;
  ibv_query_gid(ctx, 1, gid, &a.ah_attr.grh.dgid);
  return a;
}
static void connect_rc(struct ibv_qp *q, uint32_t dest, unsigned access) {
  struct ibv_qp_attr a = {.qp_state = 1, .port_num = 1, .qp_access_flags = access};
  CHECK(!ibv_modify_qp(q, &a, M_RC_INIT), "RESET->INIT");
  a = rtr_attr(dest, 3);
  CHECK(!ibv_modify_qp(q, &a, M_RC_RTR), "INIT->RTR");
  struct ibv_qp_attr s = {.qp_state = 3, .timeout = 14, .retry_cnt = 7, .rnr_retry = 7, .max_rd_atomic = 4};
  CHECK(!ibv_modify_qp(q, &s, M_RC_RTS), "RTR->RTS");
}
static int post(struct ibv_qp *q, uint32_t op, void *buf, uint32_t len, uint32_t lkey, uint64_t raddr, uint32_t rkey, unsigned flags, uint64_t id) {
  struct ibv_sge s = {(uint64_t)(uintptr_t)buf, len, lkey};
  struct ibv_send_wr w = {0}, *bad = NULL;
  w.wr_id = id; w.sg_list = &s; w.num_sge = 1; w.opcode = op; w.send_flags = flags | 2; w.imm = 0xabcd;
  w.wr.rdma.remote_addr = raddr; w.wr.rdma.rkey = rkey;
  return q->context->ops.post_send(q, &w, &bad);
}
static int post_recv(struct ibv_qp *q, void *buf, uint32_t len, uint32_t lkey, uint64_t id) {
  struct ibv_sge s = {(uint64_t)(uintptr_t)buf, len, lkey};
  struct ibv_recv_wr w = {id, NULL, &s, 1}, *bad = NULL;
  return q->srq ? ctx->ops.post_srq_recv(q->srq, &w, &bad) : ctx->ops.post_recv(q, &w, &bad);
}
static struct ibv_wc poll1(struct ibv_cq *cq) {
  struct ibv_wc w;
  int n = cq->context->ops.poll_cq(cq, 1, &w);
  CHECK(n == 1, "one completion expected, polled %d", n);
  return w;
}
static void fill(uint8_t *p, size_t n, unsigned seed) { for (size_t i = 0; i < n; i++) p[i] = (uint8_t)(i * 31 + seed); }

static void host(void) {
  int n = 0;
  struct ibv_device **l = ibv_get_device_list(&n);
  CHECK(n == 1 && l[0] && !strcmp(ibv_get_device_name(l[0]), "fwroce_0"), "one device fwroce_0 (n=%d)", n);
  ctx = ibv_open_device(l[0]);
  CHECK(ctx && ctx->abi_compat == (void *)-1, "opened, rdma-core's extended context (verbs_context)");
  struct ibv_device_attr da; struct ibv_port_attr pa; union ibv_gid g; struct ibv_gid_entry ge;
  CHECK(!ibv_query_device(ctx, &da) && da.phys_port_cnt == 1 && da.max_sge >= 4, "query_device");
  CHECK(!ibv_query_port(ctx, 1, &pa) && pa.state == 4 && pa.link_layer == 2 && pa.gid_tbl_len == FW_NGIDS, "ACTIVE RoCE port");
  CHECK(ibv_query_port(ctx, 2, &pa) == EINVAL, "port 2 does not exist");
  CHECK(!ibv_query_gid(ctx, 1, 3, &g) && g.raw[10] == 0xff && g.raw[12] == 10, "GID 3 is ::ffff:10.0.0.1");
  CHECK(!_ibv_query_gid_ex(ctx, 1, 3, &ge, 0, sizeof ge) && ge.gid_type == 2, "GID 3 is RoCE v2 (type %u)", ge.gid_type);
  pd = ibv_alloc_pd(ctx);
  CHECK(pd, "alloc_pd");

  // registrations and their refusals
  size_t sz = 1 << 20;
  uint8_t *a = aligned_alloc(4096, sz), *b = aligned_alloc(4096, sz), *c = aligned_alloc(4096, sz);
  struct ibv_mr *ma = ibv_reg_mr(pd, a, sz, RW), *mb = ibv_reg_mr_iova2(pd, b, sz, 0x7000000000ull, RW), *mc = ibv_reg_mr(pd, c, sz, 1);
  CHECK(ma && mb && mc && ma->lkey != mb->lkey && ma->rkey != mb->rkey, "reg_mr, reg_mr_iova2");
  errno = 0; CHECK(!ibv_reg_mr(pd, a, sz, 2) && errno == EINVAL, "remote write without local write: EINVAL");
  errno = 0; CHECK(!ibv_reg_dmabuf_mr(pd, 0, sz, 0, -1, 1) && errno == EBADF, "dma-buf support probe (fd -1): EBADF");
  // NCCL's own probe (net_ib ncclIbDmaBufSupport): length 0, access 0, fd -1; it takes dma-buf as
  // supported unless errno is EOPNOTSUPP or EPROTONOSUPPORT, as an inbox kernel with dma-buf answers
  errno = 0; CHECK(!ibv_reg_dmabuf_mr(pd, 0, 0, 0, -1, 0) && errno == EBADF, "NCCL's dma-buf probe (len 0, access 0, fd -1): EBADF");
  int mfd = memfd_create("notadmabuf", 0);
  CHECK(mfd >= 0 && !ftruncate(mfd, (off_t)sz), "memfd");
  errno = 0; CHECK(!ibv_reg_dmabuf_mr(pd, 0, sz, (uint64_t)(uintptr_t)a, mfd, 1) && errno == EINVAL, "a memfd is no NVIDIA dma-buf: EINVAL");

  // the state machine
  struct ibv_comp_channel *ch = ibv_create_comp_channel(ctx);
  struct ibv_cq *cq = ibv_create_cq(ctx, 256, (void *)0x5eed, ch, 0);
  CHECK(ch && cq, "channel, CQ");
  struct ibv_qp *q1 = rc_qp(cq, NULL), *q2 = rc_qp(cq, NULL);
  CHECK(q1->qp_num != q2->qp_num, "distinct QP numbers");
  struct ibv_qp_attr at = {.qp_state = 1, .port_num = 1};
  CHECK(ibv_modify_qp(q1, &at, 1 | 16 | 32) == EINVAL, "RESET->INIT without access flags: EINVAL");
  at = (struct ibv_qp_attr){.qp_state = 2};
  CHECK(ibv_modify_qp(q1, &at, 1) == EINVAL, "RESET->RTR: EINVAL");
  at = (struct ibv_qp_attr){.qp_state = 1, .port_num = 1, .qp_access_flags = 2 | 4};
  CHECK(!ibv_modify_qp(q1, &at, M_RC_INIT), "RESET->INIT");
  CHECK(post(q1, 0, a, 8, ma->lkey, (uint64_t)(uintptr_t)c, mc->rkey, 0, 1) == EINVAL, "post_send in INIT: EINVAL");
  at = rtr_attr(q2->qp_num, 3); at.ah_attr.is_global = 0;
  CHECK(ibv_modify_qp(q1, &at, M_RC_RTR) == EINVAL, "RoCE RTR without a GRH: EINVAL");
  at = rtr_attr(q2->qp_num, 3); at.ah_attr.grh.dgid.raw[15] ^= 0x5a;
  CHECK(ibv_modify_qp(q1, &at, M_RC_RTR) == ETIMEDOUT, "RTR to a GID of no port: ETIMEDOUT");
  at = rtr_attr(q2->qp_num, 3);
  CHECK(ibv_modify_qp(q1, &at, M_RC_RTR & ~4096) == EINVAL, "RTR without rq_psn: EINVAL");
  at = (struct ibv_qp_attr){.qp_state = 0};
  CHECK(!ibv_modify_qp(q1, &at, 1), "back to RESET");
  connect_rc(q1, q2->qp_num, 2 | 4);
  connect_rc(q2, q1->qp_num, 2 | 4);
  struct ibv_qp_attr qa; struct ibv_qp_init_attr qi;
  CHECK(!ibv_query_qp(q1, &qa, 1, &qi) && qa.qp_state == 3 && qa.dest_qp_num == q2->qp_num && qi.qp_type == 2, "query_qp: RTS, connected");

  // RDMA WRITE a -> b (b by its iova), READ b -> c, every byte checked
  fill(a, sz, 7); memset(b, 0, sz); memset(c, 0, sz);
  CHECK(!post(q1, 0, a + 4096, 65536, ma->lkey, 0x7000000000ull + 8192, mb->rkey, 0, 11), "post WRITE");
  struct ibv_wc w = poll1(cq);
  CHECK(w.wr_id == 11 && w.status == 0 && w.opcode == 1 && w.byte_len == 65536, "WRITE completion (status %u)", w.status);
  CHECK(!memcmp(b + 8192, a + 4096, 65536) && b[8191] == 0 && b[8192 + 65536] == 0, "WRITE moved exactly its bytes");
  CHECK(!post(q2, 4, c, 65536, mc->lkey, 0x7000000000ull + 8192, mb->rkey, 0, 12), "post READ");
  w = poll1(cq);
  CHECK(w.wr_id == 12 && w.status == 0 && w.opcode == 2 && !memcmp(c, a + 4096, 65536), "READ brought the bytes back");
  // SEND before the receive is posted: it waits (RNR), then lands; with immediate too
  fill(a, 4096, 99);
  CHECK(!post(q1, 2, a, 4000, ma->lkey, 0, 0, 0, 13), "post SEND (no receive yet)");
  struct ibv_wc none;
  CHECK(ctx->ops.poll_cq(cq, 1, &none) == 0, "the SEND waits for a receive");
  CHECK(!post_recv(q2, c, 8192, mc->lkey, 14), "post_recv");
  struct ibv_wc w1 = poll1(cq), w2 = poll1(cq);
  CHECK(w1.wr_id == 14 && w1.opcode == 128 && w1.byte_len == 4000 && w1.src_qp == q1->qp_num && !memcmp(c, a, 4000), "RECV of 4000 bytes");
  CHECK(w2.wr_id == 13 && w2.status == 0 && w2.opcode == 0, "SEND completes once delivered");
  CHECK(!post_recv(q2, c, 8192, mc->lkey, 15), "post_recv");
  CHECK(!post(q1, 1, a, 512, ma->lkey, (uint64_t)(uintptr_t)(b + 100), 0, 0, 16), "post WRITE_IMM with rkey 0");
  w = poll1(cq);
  CHECK(w.wr_id == 16 && w.status == 10, "WRITE_IMM with a wrong rkey: REM_ACCESS_ERR (status %u)", w.status);
  w = poll1(cq); // the responder's QP goes to ERR too (an HCA's class C responder error)
  CHECK(w.wr_id == 15 && w.status == 5 && w.opcode == 128, "the responder's QP in ERR flushes its posted receive");
  // inline SEND from a buffer reused at once, into an SRQ
  struct ibv_srq_init_attr sa = {.attr = {64, 4, 0}};
  struct ibv_srq *srq = ibv_create_srq(pd, &sa);
  struct ibv_qp *q3 = rc_qp(cq, NULL), *q4 = rc_qp(cq, srq);
  connect_rc(q3, q4->qp_num, 2); connect_rc(q4, q3->qp_num, 2);
  char msg[48] = "inline bytes, the buffer is reused at once";
  CHECK(!post(q3, 2, msg, sizeof msg, 0, 0, 0, 8, 17), "inline SEND (no lkey)");
  memset(msg, 'x', sizeof msg);
  CHECK(post_recv(q4, c, 64, mc->lkey, 18) == 0, "post_srq_recv");
  w1 = poll1(cq); w2 = poll1(cq);
  CHECK(w1.wr_id == 18 && !strcmp((char *)c, "inline bytes, the buffer is reused at once") && w2.wr_id == 17, "inline SEND through the SRQ");
  // WRITE with immediate: bytes, then a receive completion carrying the immediate
  CHECK(!post_recv(q4, c, 64, mc->lkey, 19), "post_srq_recv");
  fill(a, 1024, 3);
  CHECK(!post(q3, 1, a, 1024, ma->lkey, 0x7000000000ull, mb->rkey, 0, 20), "WRITE_IMM");
  w1 = poll1(cq); w2 = poll1(cq);
  CHECK(w1.wr_id == 19 && w1.opcode == 129 && (w1.wc_flags & 2) && w1.imm == 0xabcd && w1.byte_len == 1024 && !memcmp(b, a, 1024), "RECV_RDMA_WITH_IMM");
  CHECK(w2.wr_id == 20 && w2.status == 0, "WRITE_IMM completion");
  // access: q4's peer q3 allows remote write only, so a READ from q4 fails, the QP goes to ERR and flushes
  CHECK(!post(q4, 4, c, 64, mc->lkey, 0x7000000000ull, mb->rkey, 0, 21) && !post(q4, 0, a, 64, ma->lkey, 0x7000000000ull, mb->rkey, 0, 22), "posts");
  w1 = poll1(cq); w2 = poll1(cq);
  CHECK(w1.wr_id == 21 && w1.status == 10 && w2.wr_id == 22 && w2.status == 5, "READ refused REM_ACCESS_ERR, the next flushed (%u, %u)", w1.status, w2.status);
  CHECK(!ibv_query_qp(q4, &qa, 1, &qi) && qa.qp_state == 6, "QP in ERR");
  // a local key that does not cover the range: the requester alone goes to ERR
  struct ibv_qp *q5 = rc_qp(cq, NULL), *q6 = rc_qp(cq, NULL);
  connect_rc(q5, q6->qp_num, 2 | 4); connect_rc(q6, q5->qp_num, 2 | 4);
  CHECK(!post_recv(q6, c, 64, mc->lkey, 24), "post_recv");
  CHECK(!post(q5, 0, a + sz - 100, 200, ma->lkey, (uint64_t)(uintptr_t)b, mb->rkey, 0, 23), "post WRITE past the local MR");
  w = poll1(cq);
  CHECK(w.wr_id == 23 && w.status == 4, "past the local MR: LOC_PROT_ERR (%u)", w.status);
  CHECK(!ibv_query_qp(q5, &qa, 1, &qi) && qa.qp_state == 6 && !ibv_query_qp(q6, &qa, 1, &qi) && qa.qp_state == 3,
        "the requester in ERR, the responder never asked: RTS");
  CHECK(ctx->ops.poll_cq(cq, 1, &none) == 0, "the responder's receive stays posted");

  // UD: the receiver finds a 40-byte GRH before the payload
  struct ibv_qp_init_attr ua = {.send_cq = cq, .recv_cq = cq, .cap = {16, 16, 1, 1, 0}, .qp_type = 4};
  struct ibv_qp *u1 = ibv_create_qp(pd, &ua), *u2 = ibv_create_qp(pd, &ua);
  CHECK(u1 && u2, "UD QPs");
  for (struct ibv_qp *u = u1; u; u = u == u1 ? u2 : NULL) {
    struct ibv_qp_attr x = {.qp_state = 1, .port_num = 1, .qkey = 0x1ee7};
    CHECK(!ibv_modify_qp(u, &x, 1 | 16 | 32 | 64), "UD INIT");
    x.qp_state = 2; CHECK(!ibv_modify_qp(u, &x, 1), "UD RTR");
    x.qp_state = 3; CHECK(!ibv_modify_qp(u, &x, 1 | 65536), "UD RTS");
  }
  struct ibv_ah_attr aa = {.is_global = 1, .port_num = 1}; ibv_query_gid(ctx, 1, 3, &aa.grh.dgid);
  struct ibv_ah *ah = ibv_create_ah(pd, &aa);
  CHECK(ah, "create_ah");
  CHECK(!post_recv(u2, c, 4096, mc->lkey, 30), "UD post_recv");
  CHECK(!ctx->ops.req_notify_cq(cq, 0), "arm the CQ");
  struct ibv_sge s = {(uint64_t)(uintptr_t)a, 100, ma->lkey};
  struct ibv_send_wr uw = {.wr_id = 31, .sg_list = &s, .num_sge = 1, .opcode = 2, .send_flags = 2}, *bad;
  uw.wr.ud.ah = ah; uw.wr.ud.remote_qpn = u2->qp_num; uw.wr.ud.remote_qkey = 0x1ee7;
  CHECK(!ctx->ops.post_send(u1, &uw, &bad), "UD SEND");
  struct ibv_cq *evcq; void *evctx;
  CHECK(!ibv_get_cq_event(ch, &evcq, &evctx) && evcq == cq && evctx == (void *)0x5eed, "completion channel event");
  w1 = poll1(cq);
  CHECK(w1.wr_id == 30 && w1.byte_len == 140 && (w1.wc_flags & 1) && !memcmp(c + 40, a, 100) && c[36] == 10 && c[39] == 1, "UD RECV with the GRH (dst 10.0.0.1)");
  w2 = poll1(cq);
  CHECK(w2.wr_id == 31 && w2.status == 0, "UD SEND completion");
  CHECK(!ibv_dereg_mr(ma) && !ibv_dereg_mr(mb) && !ibv_dereg_mr(mc), "dereg");
}

static void gpu(void) {
  CHECK(labcuda_gpu != NULL, "built with labcuda (libcuda.so.1)");
  int n; struct ibv_device **l = ibv_get_device_list(&n);
  ctx = ibv_open_device(l[0]); pd = ibv_alloc_pd(ctx);
  size_t sz = 1 << 16;
  uint8_t *g = aligned_alloc(4096, sz), *h = aligned_alloc(4096, sz);
  labcuda_gpu(g, sz);
  struct ibv_mr *mh = ibv_reg_mr(pd, h, sz, RW);
  errno = 0;
  struct ibv_mr *mg = ibv_reg_mr(pd, g, sz, RW);
  const char *pm = getenv("FAKEWIRE_PEERMEM");
  if (!pm || strcmp(pm, "1")) { CHECK(!mg && errno == EFAULT, "plain MR over GPU memory without peermem: EFAULT"); return; }
  CHECK(mg && mh, "plain MR over GPU memory with peermem");
  struct ibv_cq *cq = ibv_create_cq(ctx, 16, NULL, NULL, 0);
  struct ibv_qp *q1 = rc_qp(cq, NULL), *q2 = rc_qp(cq, NULL);
  connect_rc(q1, q2->qp_num, 2 | 4); connect_rc(q2, q1->qp_num, 2 | 4);
  fill(h, sz, 5); memset(g, 0, sz);
  unsigned long before = labcuda_copies;
  CHECK(!post(q1, 0, h, (uint32_t)sz, mh->lkey, (uint64_t)(uintptr_t)g, mg->rkey, 0, 1), "WRITE host -> GPU");
  struct ibv_wc w = poll1(cq);
  CHECK(w.status == 0 && !memcmp(g, h, sz) && labcuda_copies == before + 1, "bytes through cuMemcpy (status %u)", w.status);
}

int main(int argc, char **argv) {
  const char *mode = argc > 1 ? argv[1] : "host";
  if (!strcmp(mode, "host")) host();
  else if (!strcmp(mode, "gpu")) gpu();
  else { fprintf(stderr, "usage: wireclient host|gpu\n"); return 2; }
  printf("wireclient %s: %d checks passed\n", mode, checks);
  return 0;
}
