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
//   blocked host 1 WRITEs into host 0's GPU memory while host 0's only thread is blocked in a
//           pageable copy of it that waits for those bytes (labpair-gpu)
//   regs    alone: host name, port state, dma-buf and GPU registrations, peermem's sysfs file
// Memory: host (malloc, ibv_reg_mr) or gpu (the stand-in libcuda's, as dma-buf MRs). The
// scenarios between hosts are in labpair_cases.c.
#define _GNU_SOURCE
#include "labpair.h"
#include <endian.h>
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/utsname.h>
#include <time.h>
#include <unistd.h>

#ifdef LAB_GPU
int cuInit(unsigned flags);
int cuDevicePrimaryCtxRetain(void **c, int d);
int cuCtxSetCurrent(void *c);
int cuMemAlloc_v2(uint64_t *p, size_t n);
int cuMemGetHandleForAddressRange(void *handle, uint64_t dptr, size_t size, int type,
                                  unsigned long long flags);
#endif
int checks, self, nhosts, gpu;
const char *rdv;

double now_ms(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}
// ---- the files in RDV ----
void put(const char *name, const char *text) {
  char p[512], t[520];
  snprintf(p, sizeof p, "%s/%s", rdv, name);
  snprintf(t, sizeof t, "%s.tmp", p);
  FILE *f = fopen(t, "w");
  REQUIRE(f && fputs(text, f) >= 0 && !fclose(f) && !rename(t, p), "write %s", p);
}
void get(const char *name, char *buf, size_t n) { // waits for it (20 s at most)
  char p[512];
  snprintf(p, sizeof p, "%s/%s", rdv, name);
  for (double end = now_ms() + 20000;;) {
    FILE *f = fopen(p, "r");
    if (f) {
      size_t k = fread(buf, 1, n - 1, f);
      buf[k] = 0;
      fclose(f);
      return;
    }
    REQUIRE(now_ms() < end, "%s never came", p);
    struct timespec ms = {0, 2000000};
    nanosleep(&ms, NULL);
  }
}
void barrier(const char *step) {
  char name[64], b[8];
  snprintf(name, sizeof name, "%s-%d", step, self);
  put(name, "1");
  for (int i = 0; i < nhosts; i++) {
    snprintf(name, sizeof name, "%s-%d", step, i);
    get(name, b, sizeof b);
  }
}

// ---- verbs ----
struct ibv_context *ctx;
struct ibv_pd *pd;
struct ibv_comp_channel *ch;
struct ibv_cq *cq;
union ibv_gid my_gid;
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
// Memory of the kind asked, registered: host memory by ibv_reg_mr, GPU memory (cuMemAlloc's, in
// the primary context) as a dma-buf MR.
struct ibv_mr *memory(size_t n, int access, uint8_t **out) {
  uint8_t *p = NULL;
  if (!gpu) {
    CHECK(p = aligned_alloc(65536, n), "memory");
    memset(p, 0, n);
    *out = p;
    return ibv_reg_mr(pd, p, n, access);
  }
#ifdef LAB_GPU
  void *primary;
  uint64_t g = 0;
  CHECK(!cuInit(0) && !cuDevicePrimaryCtxRetain(&primary, 0) && !cuCtxSetCurrent(primary) &&
            !cuMemAlloc_v2(&g, n),
        "GPU memory");
  *out = p = (uint8_t *)(uintptr_t)g;
  memset(p, 0, n); // the stand-in's GPU memory is host pages
  int fd = -1;
  CHECK(!cuMemGetHandleForAddressRange(&fd, (uint64_t)(uintptr_t)p, n, 1, 0), "dma-buf export");
  struct ibv_mr *mr = ibv_reg_dmabuf_mr(pd, 0, n, (uint64_t)(uintptr_t)p, fd, access);
  close(fd);
  return mr;
#else
  CHECK(0, "built without the stand-in libcuda");
#endif
}
struct ibv_qp *rc_qp(struct ibv_srq *srq) {
  struct ibv_qp_init_attr a = {
      .send_cq = cq, .recv_cq = cq, .srq = srq, .cap = {256, 256, 1, 1, 64}, .qp_type = IBV_QPT_RC};
  struct ibv_qp *q = ibv_create_qp(pd, &a);
  CHECK(q, "RC QP: %s", strerror(errno));
  return q;
}
void connect_rc(struct ibv_qp *q, const union ibv_gid *gid, uint32_t qpn, int access, int timeout) {
  struct ibv_qp_attr a = {.qp_state = IBV_QPS_INIT, .port_num = 1, .qp_access_flags = access};
  CHECK(!ibv_modify_qp(q, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS),
        "INIT");
  a = (struct ibv_qp_attr){.qp_state = IBV_QPS_RTR,
                           .path_mtu = IBV_MTU_4096,
                           .dest_qp_num = qpn,
                           .rq_psn = 0,
                           .max_dest_rd_atomic = 4,
                           .min_rnr_timer = 12};
  a.ah_attr.is_global = 1;
  a.ah_attr.port_num = 1;
  a.ah_attr.grh.dgid = *gid;
  a.ah_attr.grh.sgid_index = 3;
  a.ah_attr.grh.hop_limit = 64;
  CHECK(!ibv_modify_qp(q, &a,
                       IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                           IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER),
        "RTR");
  a = (struct ibv_qp_attr){.qp_state = IBV_QPS_RTS,
                           .timeout = (uint8_t)timeout,
                           .retry_cnt = 7,
                           .rnr_retry = 7,
                           .max_rd_atomic = 4};
  CHECK(!ibv_modify_qp(q, &a,
                       IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
                           IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC),
        "RTS");
}
void post(struct ibv_qp *q, enum ibv_wr_opcode op, void *buf, uint32_t len, uint32_t lkey,
          uint64_t raddr, uint32_t rkey, uint64_t id) {
  struct ibv_sge s = {(uint64_t)(uintptr_t)buf, len, lkey};
  struct ibv_send_wr w = {.wr_id = id,
                          .sg_list = &s,
                          .num_sge = 1,
                          .opcode = op,
                          .send_flags = IBV_SEND_SIGNALED},
                     *bad;
  w.imm_data = htobe32(0x1000u + (unsigned)self);
  w.wr.rdma.remote_addr = raddr;
  w.wr.rdma.rkey = rkey;
  CHECK(!ibv_post_send(q, &w, &bad), "post_send op %d", op);
}
void post_recv(struct ibv_qp *q, struct ibv_srq *srq, void *buf, uint32_t len, uint32_t lkey,
               uint64_t id) {
  struct ibv_sge s = {(uint64_t)(uintptr_t)buf, len, lkey};
  struct ibv_recv_wr w = {.wr_id = id, .sg_list = &s, .num_sge = 1}, *bad;
  CHECK(!(srq ? ibv_post_srq_recv(srq, &w, &bad) : ibv_post_recv(q, &w, &bad)), "post_recv");
}
// The next completion, waited for on the channel (10 s at most).
struct ibv_wc next_wc(void) {
  struct ibv_wc w;
  for (double end = now_ms() + 10000;;) {
    if (ibv_poll_cq(cq, 1, &w) == 1) return w;
    REQUIRE(!ibv_req_notify_cq(cq, 0), "arm");
    if (ibv_poll_cq(cq, 1, &w) == 1) return w;
    struct pollfd p = {ch->fd, POLLIN, 0};
    REQUIRE(now_ms() < end && poll(&p, 1, (int)(end - now_ms()) + 1) >= 0, "no completion in 10 s");
    struct ibv_cq *evcq;
    void *evctx;
    if (p.revents && !ibv_get_cq_event(ch, &evcq, &evctx)) ibv_ack_cq_events(evcq, 1);
  }
}
void fill(uint8_t *p, size_t n, int from, int to) {
  for (size_t i = 0; i < n; i++) p[i] = (uint8_t)(i * 7 + from * 31 + to * 5 + 1);
}
size_t wrong(const uint8_t *p, size_t n, int from, int to, long *first) {
  size_t bad = 0;
  *first = -1;
  for (size_t i = 0; i < n; i++)
    if (p[i] != (uint8_t)(i * 7 + from * 31 + to * 5 + 1)) {
      if (*first < 0) *first = (long)i;
      bad++;
    }
  return bad;
}
static void gid_hex(const union ibv_gid *g, char *out) {
  for (int i = 0; i < 16; i++) sprintf(out + 2 * i, "%02x", g->raw[i]);
}
static void hex_gid(const char *s, union ibv_gid *g) {
  for (int i = 0; i < 16; i++) sscanf(s + 2 * i, "%2hhx", &g->raw[i]);
}

// ---- scenarios ----
uint64_t addr2;
void publish(uint32_t rkey, uint64_t addr, uint32_t ud, uint32_t *qpn, int nq) {
  char b[4096], g[33], name[32];
  gid_hex(&my_gid, g);
  int k = snprintf(b, sizeof b, "%s %u %u %lx %lx %d", g, rkey, ud, (unsigned long)addr,
                   (unsigned long)addr2, getpid());
  for (int i = 0; i < nq; i++) k += snprintf(b + k, sizeof b - (size_t)k, " %u", qpn[i]);
  snprintf(name, sizeof name, "addr-%d", self);
  put(name, b);
}
peer lookup(int h, int nq) {
  char b[4096], g[40], name[32];
  peer p = {0};
  unsigned long a, a2;
  snprintf(name, sizeof name, "addr-%d", h);
  get(name, b, sizeof b);
  char *s = b;
  int k;
  CHECK(sscanf(s, "%39s %u %u %lx %lx %d%n", g, &p.rkey, &p.ud, &a, &a2, &p.pid, &k) == 6,
        "address of host %d", h);
  hex_gid(g, &p.gid);
  p.addr = a;
  p.addr2 = a2;
  for (int i = 0; i < nq; i++) {
    s += k;
    CHECK(sscanf(s, " %u%n", &p.qpn[i], &k) == 1, "QP %d of host %d", i, h);
  }
  return p;
}

static void regs(void) {
  struct utsname u;
  char hn[64] = "";
  CHECK(!uname(&u) && !gethostname(hn, sizeof hn), "uname, gethostname");
  struct ibv_port_attr pa;
  CHECK(!ibv_query_port(ctx, 1, &pa), "query_port");
  errno = 0;
  struct ibv_mr *probe = ibv_reg_dmabuf_mr(pd, 0, 0, 0, -1, 0); // NCCL's probe
  int probe_errno = errno;
  uint8_t *m;
  errno = 0;
  struct ibv_mr *dm = gpu ? memory(CH, ALL, &m) : NULL;
  int dm_errno = errno;
  errno = 0;
  struct ibv_mr *plain = gpu ? ibv_reg_mr(pd, m, CH, ALL) : NULL;
  int plain_errno = errno;
  printf("labpair regs host %d: uname=%s gethostname=%s device=%s port=%s dmabuf_probe=%s "
         "dmabuf_mr=%s plain_gpu_mr=%s "
         "peermem_sysfs=%d\n",
         self, u.nodename, hn, ibv_get_device_name(ctx->device), ibv_port_state_str(pa.state),
         probe ? "ok" : strerror(probe_errno),
         dm    ? "ok"
         : gpu ? strerror(dm_errno)
               : "-",
         plain ? "ok"
         : gpu ? strerror(plain_errno)
               : "-",
         !access("/sys/module/nvidia_peermem/version", F_OK));
}

int main(int argc, char **argv) {
  if (argc < 5) {
    fprintf(
        stderr,
        "usage: labpair mesh|errors|retry|retry-alive|stream|blocked|regs RDV SELF NHOSTS [host|gpu]\n");
    return 2;
  }
  const char *what = argv[1];
  rdv = argv[2];
  self = atoi(argv[3]);
  nhosts = atoi(argv[4]);
  gpu = argc > 5 && !strcmp(argv[5], "gpu");
  open_hca();
  if (!strcmp(what, "mesh")) mesh();
  else if (!strcmp(what, "errors")) errors();
  else if (!strcmp(what, "retry")) retry(1);
  else if (!strcmp(what, "retry-alive")) retry(0);
  else if (!strcmp(what, "stream")) stream();
  else if (!strcmp(what, "blocked")) blocked();
  else if (!strcmp(what, "regs")) regs();
  else {
    fprintf(stderr, "labpair: no scenario %s\n", what);
    return 2;
  }
  printf("labpair %s host %d: %d checks passed\n", what, self, checks);
  return 0;
}
