// A stand-in libnccl.so.2 for the lab (ours, CI only): two-rank communicators whose send/recv
// stage the bytes through host memory over a unix socket (cuMemcpyDtoH/HtoD of the process's
// libcuda), and whose log says what NCCL's says of its network connections
// ("Channel 00/0 : 0[0] -> 1[0] [send] via NET/IB/0[/GDRDMA]", NCCL_DEBUG=INFO to
// NCCL_DEBUG_FILE). GDRDMA is decided as NCCL decides it on a GeForce, from what the process
// answers: the GPU's GPUDirect RDMA or dma-buf attribute through libcuda's cuDeviceGetAttribute
// as dlsym gives it (gdrshim answers there), the NIC's dma-buf MRs (NCCL's probe,
// ibv_reg_dmabuf_mr with fd -1: EOPNOTSUPP is "no"), and NCCL_NET_GDR_LEVEL (LOC: off). What it
// proves is the caller's plumbing and its reading of the log, not NCCL's data path.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <infiniband/verbs.h>
#include <poll.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

typedef struct {
  char internal[128];
} ncclUniqueId;
typedef struct {
  int fd, rank, gdr;
} comm_t;
typedef struct {
  comm_t *c;
  void *buf;
  size_t n;
  int send;
} op_t;
static op_t ops[8];
static int nops, grouped;

int ncclGetVersion(int *v) {
  *v = 22703;
  return 0;
}
const char *ncclGetErrorString(int r) {
  return r == 0 ? "no error" : r == 2 ? "system error" : r == 4 ? "invalid argument" : "error";
}
int ncclGetUniqueId(ncclUniqueId *id) {
  static unsigned long k;
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  memset(id, 0, sizeof *id);
  snprintf(id->internal, sizeof id->internal, "fakenccl-%d-%lu-%ld", getpid(), k++, t.tv_nsec);
  return 0;
}
static void *cu_fn(const char *name) {
  void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  return h ? dlsym(h, name) : NULL;
}
// The GPU side: CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED (116) or DMA_BUF_SUPPORTED (124)
static int gpu_gdr(void) {
  int (*attr)(int *, int, int) = cu_fn("cuDeviceGetAttribute");
  int a = 0, b = 0;
  if (!attr || attr(&a, 116, 0)) a = 0;
  if (!attr || attr(&b, 124, 0)) b = 0;
  return a || b;
}
// The NIC side: NCCL's dma-buf probe on the first device
static int nic_dmabuf(void) {
  int n = 0, ok = 0;
  struct ibv_device **l = ibv_get_device_list(&n);
  struct ibv_context *c = l && n > 0 ? ibv_open_device(l[0]) : NULL;
  struct ibv_pd *pd = c ? ibv_alloc_pd(c) : NULL;
  if (pd) {
    errno = 0;
    struct ibv_mr *m = ibv_reg_dmabuf_mr(pd, 0, 0, 0, -1, 0);
    ok = !m && errno != EOPNOTSUPP && errno != EPROTONOSUPPORT;
    if (m) ibv_dereg_mr(m);
    ibv_dealloc_pd(pd);
  }
  if (c) ibv_close_device(c);
  if (l) ibv_free_device_list(l);
  return ok;
}
static void say(comm_t *c) {
  const char *d = getenv("NCCL_DEBUG"), *f = getenv("NCCL_DEBUG_FILE");
  if (!d || strcmp(d, "INFO")) return;
  FILE *o = f ? fopen(f, "a") : stdout;
  if (!o) return;
  char host[64] = "";
  gethostname(host, sizeof host - 1);
  const char *way[2] = {"send", "receive"};
  for (int k = 0; k < 2; k++) {
    int from = k ? 1 - c->rank : c->rank, to = 1 - from;
    fprintf(o, "%s:%d:%d [0] NCCL INFO Channel 00/0 : %d[0] -> %d[0] [%s] via NET/IB/0%s\n", host,
            getpid(), getpid(), from, to, way[k], c->gdr ? "/GDRDMA" : "");
  }
  if (o != stdout) fclose(o);
}
int ncclCommInitRank(comm_t **out, int n, ncclUniqueId id, int rank) {
  if (n != 2 || (rank != 0 && rank != 1)) return 4;
  struct sockaddr_un a = {.sun_family = AF_UNIX};
  snprintf(a.sun_path + 1, sizeof a.sun_path - 1, "%.100s", id.internal);
  socklen_t len =
      (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + strnlen(id.internal, 100));
  int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0), fd = -1;
  if (s < 0) return 2;
  if (rank == 0) {
    struct pollfd p = {.fd = s, .events = POLLIN};
    if (!bind(s, (struct sockaddr *)&a, len) && !listen(s, 1) && poll(&p, 1, 30000) == 1)
      fd = accept4(s, NULL, NULL, SOCK_CLOEXEC);
    close(s);
  } else {
    for (int t = 0; t < 30000 && fd < 0; t++) {
      if (!connect(s, (struct sockaddr *)&a, len))
        fd = s;
      else
        usleep(1000);
    }
    if (fd < 0) close(s);
  }
  if (fd < 0) return 2;
  comm_t *c = calloc(1, sizeof *c);
  c->fd = fd;
  c->rank = rank;
  const char *level = getenv("NCCL_NET_GDR_LEVEL");
  c->gdr = gpu_gdr() && nic_dmabuf() && !(level && !strcmp(level, "LOC"));
  say(c);
  *out = c;
  return 0;
}
int ncclCommDestroy(comm_t *c) {
  if (c) close(c->fd);
  free(c);
  return 0;
}
static int xfer(int fd, void *p, size_t n, int send) {
  for (size_t k = 0; k < n;) {
    ssize_t r = send ? write(fd, (char *)p + k, n - k) : read(fd, (char *)p + k, n - k);
    if (r <= 0) return -1;
    k += (size_t)r;
  }
  return 0;
}
static void *sender(void *o) {
  op_t *op = o;
  return (void *)(intptr_t)xfer(op->c->fd, op->buf, op->n, 1);
}
// The queued operations: the sends on a thread of their own while the receives run here.
static int run_ops(void) {
  int (*dtoh)(void *, uint64_t, size_t) = cu_fn("cuMemcpyDtoH_v2");
  int (*htod)(uint64_t, const void *, size_t) = cu_fn("cuMemcpyHtoD_v2");
  int bad = !dtoh || !htod;
  op_t host[8];
  pthread_t t[8];
  int started[8] = {0};
  for (int i = 0; i < nops; i++) {
    host[i] = ops[i];
    host[i].buf = malloc(ops[i].n ? ops[i].n : 1);
    if (!bad && ops[i].send) bad = dtoh(host[i].buf, (uintptr_t)ops[i].buf, ops[i].n) != 0;
  }
  for (int i = 0; i < nops; i++)
    if (!bad && host[i].send) started[i] = !pthread_create(&t[i], NULL, sender, &host[i]);
  for (int i = 0; i < nops; i++)
    if (!bad && !host[i].send)
      bad = xfer(host[i].c->fd, host[i].buf, host[i].n, 0) ||
            htod((uintptr_t)ops[i].buf, host[i].buf, ops[i].n);
  for (int i = 0; i < nops; i++) {
    void *r = NULL;
    if (started[i]) {
      pthread_join(t[i], &r);
      bad |= r != NULL;
    }
    free(host[i].buf);
  }
  nops = 0;
  return bad ? 2 : 0;
}
static int queue(comm_t *c, void *buf, size_t n, int send) {
  if (nops == 8) return 4;
  ops[nops++] = (op_t){c, buf, n, send};
  return grouped ? 0 : run_ops();
}
// ncclUint8 only (datatype 1): the count is bytes
int ncclSend(const void *buf, size_t n, int type, int peer, comm_t *c, void *stream) {
  (void)stream;
  return type != 1 || peer != 1 - c->rank ? 4 : queue(c, (void *)buf, n, 1);
}
int ncclRecv(void *buf, size_t n, int type, int peer, comm_t *c, void *stream) {
  (void)stream;
  return type != 1 || peer != 1 - c->rank ? 4 : queue(c, buf, n, 0);
}
int ncclGroupStart(void) {
  grouped++;
  return 0;
}
int ncclGroupEnd(void) {
  if (!grouped) return 4;
  return --grouped ? 0 : run_ops();
}
