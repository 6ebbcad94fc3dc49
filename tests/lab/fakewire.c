// The consumer lab's fake wire (ours, test only): the device behind rdma-core's libibverbs.so.1
// (built into the lab's provider, fwprovider.c, which maps rdma-core's operations onto the ibv_*
// functions here, hidden in it) that released consumers (UCX's verbs transports, NIXL through
// UCX, Mooncake's transfer engine, NCCL's net_ib) and rdma-core's own example programs use on a
// machine with no HCA. One device per process (lab
// host N's fwroce_N, fakelab.h), one RoCE v2 port with four GIDs, PDs, CQs with completion
// channels, RC and UD QPs with the kernel's state machine, SRQs, AHs, and MRs through ibv_reg_mr,
// ibv_reg_mr_iova2 and ibv_reg_dmabuf_mr. fakewire_data.c and fakewire_resp.c are what a work
// request does at each end, fakewire_net.c the wire between processes (FAKEWIRE_LAB): RDMA WRITE
// / READ and SEND / RECV move bytes between registered ranges of two processes, each touching only
// its own memory (GPU memory through a copier process of its own: fakewire_copier.c).
//
// GDR is judged as a real inbox kernel without nvidia-peermem judges it: GPU memory registers only
// as a dma-buf MR (an nv_dmabuf fd whose size covers offset + length, iova = the GPU address); a
// plain MR over GPU memory is refused EFAULT ("peermem N" in the fault file, or FAKEWIRE_PEERMEM=1,
// plays a loaded peermem instead; "no-dmabuf N" a kernel without dma-buf MRs: EOPNOTSUPP). Where
// the process's libcuda is the lab's stand-in (labcuda.c), its dma-buf (a memfd it names) stands
// for nv_dmabuf, judged the same way. Every registration is counted by entry point and kind, and
// the wire's work too; the counts are printed at exit ("fakewire: summary ...", stderr and
// appended to $FAKEWIRE_REPORT), with whether gdrshim was loaded in the process.
// Environment: FAKEWIRE_HOST, FAKEWIRE_LAB, FAKEWIRE_FAULTS (fakelab.h), FAKEWIRE_PEERMEM=1,
// FAKEWIRE_RETRY_MS_MAX, FAKEWIRE_RETRY_MS_MIN (fakewire_net.c), FAKEWIRE_REPORT=file,
// FAKEWIRE_LOG=1 (one line per registration), FAKEWIRE_TRACE=PREFIX (every message and GPU copy,
// timed, into PREFIX.<host>.<pid>: where a stalled peer stopped).
#define _GNU_SOURCE
#include "fakewire.h"
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

pthread_mutex_t fw_mu = PTHREAD_MUTEX_INITIALIZER;
// ---- counters, printed at exit ----
static struct {
  unsigned long reg_mr, reg_mr_iova2, reg_dmabuf_mr, dereg;
  unsigned long host, gpu_dmabuf, gpu_peermem;            // accepted, by kind
  // refused: dmabuf_unsupported by a host whose kernel has no dma-buf MRs (the fault), as asked;
  // dmabuf_refused for what the call named (a wrong registration)
  unsigned long gpu_plain_refused, dmabuf_probe, dmabuf_refused, dmabuf_unsupported, bad_args;
  unsigned long ops[3];                                   // write, read, send
  unsigned long long bytes_g2g, bytes_g2h, bytes_h2g, bytes_h2h;
  unsigned long wire_errors, wire[3]; // dropped, corrupted, timed out
} fw_n;
static int fw_env(const char *n) { const char *v = getenv(n); return v && *v && strcmp(v, "0"); }
static void fw_say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void fw_say(const char *fmt, ...) {
  char b[512]; va_list ap; va_start(ap, fmt); vsnprintf(b, sizeof b, fmt, ap); va_end(ap);
  fprintf(stderr, "fakewire: %s\n", b);
}
void fw_count_bytes(int dst_gpu, int src_gpu, uint64_t n, int op) {
  fw_n.ops[op]++;
  if (dst_gpu && src_gpu) fw_n.bytes_g2g += n; else if (src_gpu) fw_n.bytes_g2h += n; else if (dst_gpu) fw_n.bytes_h2g += n; else fw_n.bytes_h2h += n;
}
// ---- the trace (FAKEWIRE_TRACE) ----
// One write(2) per line, so that lines of many threads and a process killed mid-run stay whole;
// opened again in a forked child (its own pid, its own file).
static int trace_fd = -1, trace_pid;
static pthread_mutex_t trace_mu = PTHREAD_MUTEX_INITIALIZER;
int fw_tracing(void) {
  static int on = -1;
  if (on < 0) { const char *p = getenv("FAKEWIRE_TRACE"); on = p && *p; }
  return on;
}
void fw_trace(const char *fmt, ...) {
  if (!fw_tracing()) return;
  int e = errno;
  pthread_mutex_lock(&trace_mu);
  if (trace_pid != getpid()) {
    if (trace_fd >= 0) close(trace_fd);
    char f[600];
    snprintf(f, sizeof f, "%s.%d.%d", getenv("FAKEWIRE_TRACE"), fw_me()->n, getpid());
    trace_fd = open(f, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    trace_pid = getpid();
  }
  pthread_mutex_unlock(&trace_mu);
  if (trace_fd >= 0) {
    char b[600];
    int k = snprintf(b, sizeof b, "%lld tid=%ld ", (long long)fw_now_ms(), (long)syscall(SYS_gettid));
    va_list ap; va_start(ap, fmt); k += vsnprintf(b + k, sizeof b - (size_t)k - 1, fmt, ap); va_end(ap);
    if (k > (int)sizeof b - 2) k = (int)sizeof b - 2;
    b[k++] = '\n';
    if (write(trace_fd, b, (size_t)k) < 0) {}
  }
  errno = e;
}
void fw_count_error(const char *why) { if (fw_n.wire_errors++ < 8) fw_say("wire error: %s", why); }
void fw_count_wire(int what) { fw_n.wire[what]++; }
__attribute__((destructor)) static void fw_report(void) {
  char b[1024];
  void *shim = dlsym(RTLD_DEFAULT, "gdrshim_version"); // gdrshim is in the process
  snprintf(b, sizeof b,
           "fakewire: summary host=%d pid=%d gdrshim=%d reg_mr=%lu reg_mr_iova2=%lu reg_dmabuf_mr=%lu dereg=%lu host_mr=%lu gpu_dmabuf_mr=%lu gpu_peermem_mr=%lu "
           "gpu_plain_refused=%lu dmabuf_probe=%lu dmabuf_refused=%lu dmabuf_unsupported=%lu bad_args=%lu writes=%lu reads=%lu sends=%lu "
           "bytes_g2g=%llu bytes_g2h=%llu bytes_h2g=%llu bytes_h2h=%llu wire_errors=%lu dropped=%lu "
           "corrupted=%lu timeouts=%lu copier_copies=%lu copier_fallbacks=%lu gate_passed=%lu gate_timeouts=%lu\n",
           fw_me()->n, getpid(), shim != NULL, fw_n.reg_mr, fw_n.reg_mr_iova2, fw_n.reg_dmabuf_mr, fw_n.dereg, fw_n.host, fw_n.gpu_dmabuf, fw_n.gpu_peermem,
           fw_n.gpu_plain_refused, fw_n.dmabuf_probe, fw_n.dmabuf_refused, fw_n.dmabuf_unsupported, fw_n.bad_args, fw_n.ops[0], fw_n.ops[1], fw_n.ops[2],
           fw_n.bytes_g2g, fw_n.bytes_g2h, fw_n.bytes_h2g, fw_n.bytes_h2h, fw_n.wire_errors,
           fw_n.wire[0], fw_n.wire[1], fw_n.wire[2], fw_copier_copies, fw_copier_fallbacks, fw_gate_passed, fw_gate_timeouts);
  fputs(b, stderr);
  const char *p = getenv("FAKEWIRE_REPORT");
  FILE *f = p && *p ? fopen(p, "a") : NULL;
  if (f) { fputs(b, f); fclose(f); }
}

// ---- libcuda, only if the process has it loaded (the fake never loads CUDA itself) ----
typedef int (*cu_attr_t)(void *, int, uint64_t);
static cu_attr_t cu_attr;
static int (*cu_memcpy)(uint64_t, uint64_t, size_t);
static int (*cu_sync)(void);
static int (*cu_get_ctx)(void **);
static int (*cu_set_ctx)(void *);
static int (*cu_retain)(void **, int);
static int (*cu_stream_create)(void **, unsigned);
static int (*cu_memcpy_async)(uint64_t, uint64_t, size_t, void *);
static int (*cu_stream_sync)(void *);
static int (*cu_host_alloc)(void **, size_t, unsigned);
static void *cu_lib; // the process's libcuda, global or loaded RTLD_LOCAL (the fleet check's)
static int cu_ready(void) {
  if (cu_attr) return 1;
  void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  if (!h) return 0;
  cu_lib = h;
  cu_memcpy = (int (*)(uint64_t, uint64_t, size_t))dlsym(h, "cuMemcpy");
  cu_sync = (int (*)(void))dlsym(h, "cuCtxSynchronize");
  cu_get_ctx = (int (*)(void **))dlsym(h, "cuCtxGetCurrent");
  cu_set_ctx = (int (*)(void *))dlsym(h, "cuCtxSetCurrent");
  cu_retain = (int (*)(void **, int))dlsym(h, "cuDevicePrimaryCtxRetain");
  if (!cu_memcpy || !cu_sync || !cu_get_ctx || !cu_set_ctx || !cu_retain) return 0;
  cu_stream_create = (int (*)(void **, unsigned))dlsym(h, "cuStreamCreate");
  cu_memcpy_async = (int (*)(uint64_t, uint64_t, size_t, void *))dlsym(h, "cuMemcpyAsync");
  cu_stream_sync = (int (*)(void *))dlsym(h, "cuStreamSynchronize");
  cu_host_alloc = (int (*)(void **, size_t, unsigned))dlsym(h, "cuMemHostAlloc");
  cu_attr = (cu_attr_t)dlsym(h, "cuPointerGetAttribute");
  return cu_attr != NULL;
}
// [a, a+n) is device memory of one allocation (CU_POINTER_ATTRIBUTE_MEMORY_TYPE 2 = DEVICE,
// RANGE_START_ADDR 12, RANGE_SIZE 13); *gpu says whether a is device memory at all.
static int gpu_range(uint64_t a, uint64_t n, int *gpu) {
  unsigned t = 0; uint64_t start = 0; size_t size = 0;
  *gpu = 0;
  if (!cu_ready() || cu_attr(&t, 2, a) || t != 2) return 0;
  *gpu = 1;
  // CU_POINTER_ATTRIBUTE_RANGE_START_ADDR (11), _RANGE_SIZE (12) (cuda.h)
  if (cu_attr(&start, 11, a) || cu_attr(&size, 12, a)) return 0;
  return a >= start && n <= size && a - start <= size - n;
}
static int gpu_copy(void *dst, const void *src, size_t n, int dst_gpu, int src_gpu);
// A GPU copy is traced before and after: a trace that ends at "copy begin" is a copy that never
// returned.
int fw_copy(void *dst, const void *src, size_t n, int dst_gpu, int src_gpu) {
  if (!dst_gpu && !src_gpu) { memcpy(dst, src, n); return 0; }
  const char *dir = dst_gpu && src_gpu ? "g2g" : dst_gpu ? "h2g" : "g2h";
  fw_trace("copy begin %s dst=%p src=%p n=%zu", dir, dst, (void *)src, n);
  int64_t t0 = fw_now_ms();
  int rc;
  if (!fw_copier_copy(dst, src, n, dst_gpu, src_gpu, &rc)) rc = gpu_copy(dst, src, n, dst_gpu, src_gpu);
  fw_trace("copy end %s n=%zu rc=%d ms=%lld", dir, n, rc, (long long)(fw_now_ms() - t0));
  return rc;
}
// The GPU copies are the copier's (fakewire_copier.c). Where it holds no handle to the memory the
// wire copies here, as it did before the GPU showed that no copy of a process finishes while one
// of its threads is blocked in a pageable copy (tests/gpu/blocked_copy.cu), counted as
// copier_fallbacks. That in-process way goes through a pinned bounce buffer, on a stream of its own,
// which keeps it off libcuda's pageable staging buffer but not off what a thread blocked in a
// pageable copy holds: on the GPU it still stalls then (docs/results/h200-run30-hosts), so it is
// only the fallback. The buffer and the stream are made when the first GPU MR is registered
// (fw_gpu_copy_prepare), never inside a copy.
#define FW_BOUNCE (4u << 20)
static pthread_mutex_t copy_mu = PTHREAD_MUTEX_INITIALIZER; // one copy at a time through the buffer
static uint8_t *bounce;
static void *copy_stream, *copy_ctx;
static int ctx_enter(void **prev) { // the copy's context current on this thread; *prev to restore
  *prev = NULL;
  if (cu_get_ctx(prev)) *prev = NULL;
  if (copy_ctx) return *prev == copy_ctx ? 0 : cu_set_ctx(copy_ctx);
  if (*prev) return 0;
  static void *primary; // a consumer's progress thread may have no context: the primary one of device 0
  if (!primary && cu_retain(&primary, 0)) return -1;
  return cu_set_ctx(primary);
}
static void ctx_leave(void *prev) {
  void *cur = NULL;
  if (prev && !cu_get_ctx(&cur) && cur != prev) cu_set_ctx(prev);
}
static void fw_gpu_copy_prepare(void) {
  if (!cu_ready() || !cu_host_alloc || !cu_stream_create || !cu_memcpy_async || !cu_stream_sync) return;
  pthread_mutex_lock(&copy_mu);
  void *prev;
  if (!bounce && !ctx_enter(&prev)) {
    void *ctx = NULL, *s = NULL, *b = NULL;
    cu_get_ctx(&ctx);
    // CU_MEMHOSTALLOC_PORTABLE (1): pinned for every context; CU_STREAM_NON_BLOCKING (1)
    if (ctx && !cu_stream_create(&s, 1) && !cu_host_alloc(&b, FW_BOUNCE, 1)) {
      copy_ctx = ctx; copy_stream = s; bounce = b;
    }
    ctx_leave(prev);
  }
  pthread_mutex_unlock(&copy_mu);
}
static int gpu_copy(void *dst, const void *src, size_t n, int dst_gpu, int src_gpu) {
  if (!cu_ready()) return -1;
  void *prev;
  pthread_mutex_lock(&copy_mu);
  int rc = ctx_enter(&prev);
  if (!rc && bounce) {
    uint8_t *d = dst; const uint8_t *s = src;
    if (dst_gpu && src_gpu) rc = cu_memcpy_async((uint64_t)(uintptr_t)d, (uint64_t)(uintptr_t)s, n, copy_stream) || cu_stream_sync(copy_stream);
    for (size_t off = 0, k; !rc && off < n && !(dst_gpu && src_gpu); off += k) {
      k = n - off < FW_BOUNCE ? n - off : FW_BOUNCE;
      if (dst_gpu) { // host -> bounce -> GPU
        memcpy(bounce, s + off, k);
        rc = cu_memcpy_async((uint64_t)(uintptr_t)(d + off), (uint64_t)(uintptr_t)bounce, k, copy_stream) || cu_stream_sync(copy_stream);
      } else { // GPU -> bounce -> host
        rc = cu_memcpy_async((uint64_t)(uintptr_t)bounce, (uint64_t)(uintptr_t)(s + off), k, copy_stream) || cu_stream_sync(copy_stream);
        if (!rc) memcpy(d + off, bounce, k);
      }
    }
  } else if (!rc) { // no pinned buffer (a libcuda without cuMemHostAlloc): libcuda stages the copy itself
    rc = cu_memcpy((uint64_t)(uintptr_t)dst, (uint64_t)(uintptr_t)src, n) || cu_sync();
  }
  ctx_leave(prev);
  pthread_mutex_unlock(&copy_mu);
  return rc;
}

// ---- memory regions ----
#define FW_MAXMR 65536
static fw_mr *fw_mrs[FW_MAXMR];
static int fw_hi;
static uint32_t fw_next_key = 0x100;
static struct ibv_mr *mr_new(struct ibv_pd *pd, void *addr, uint64_t iova, uint8_t *bytes, size_t len, int access, int fd, int kind) {
  fw_mr *m = calloc(1, sizeof *m);
  if (!m) { errno = ENOMEM; return NULL; }
  m->mr.context = pd->context; m->mr.pd = pd; m->mr.addr = addr; m->mr.length = len;
  m->iova = iova; m->bytes = bytes; m->access = access; m->fd = fd; m->kind = kind;
  m->mr_type = kind == FW_GPU_DMABUF ? 3 : 0; m->mr_access = access; // IBV_MR_TYPE_DMABUF_MR, _MR
  pthread_mutex_lock(&fw_mu);
  int i; for (i = 0; i < FW_MAXMR && fw_mrs[i]; i++) {}
  if (i == FW_MAXMR) { pthread_mutex_unlock(&fw_mu); free(m); errno = ENOMEM; return NULL; }
  m->mr.lkey = fw_next_key++; m->mr.rkey = fw_next_key++ | 0x80000000u; m->mr.handle = (uint32_t)i;
  fw_mrs[i] = m; if (i >= fw_hi) fw_hi = i + 1;
  if (kind == FW_HOST) fw_n.host++; else if (kind == FW_GPU_DMABUF) fw_n.gpu_dmabuf++; else fw_n.gpu_peermem++;
  pthread_mutex_unlock(&fw_mu);
  if (fw_env("FAKEWIRE_LOG"))
    fw_say("MR %s iova=%#lx len=%#zx access=%#x lkey=%#x%s", kind == FW_HOST ? "host" : kind == FW_GPU_DMABUF ? "gpu-dmabuf" : "gpu-peermem",
           (unsigned long)iova, len, access, m->mr.lkey, fd >= 0 ? " (fd held)" : "");
  return &m->mr;
}
fw_mr *fw_find_mr(uint32_t key, int remote, uint64_t a, uint64_t n, int need) {
  for (int i = 0; i < fw_hi; i++) {
    fw_mr *m = fw_mrs[i];
    if (!m || (remote ? m->mr.rkey : m->mr.lkey) != key) continue;
    if (a >= m->iova && n <= m->mr.length && a - m->iova <= m->mr.length - n && (m->access & need) == need) return m;
    return NULL;
  }
  return NULL;
}
// The kernel's access rules (ib_check_mr_access): remote write or atomic needs local write.
static int bad_access(struct ibv_pd *pd, size_t len, int access) {
  if (!pd || !len || ((access & (2 | 8)) && !(access & 1))) { fw_n.bad_args++; errno = EINVAL; return 1; }
  return 0;
}
static struct ibv_mr *reg_plain(struct ibv_pd *pd, void *addr, size_t len, uint64_t iova, int access) {
  if (bad_access(pd, len, access)) return NULL;
  int gpu = 0;
  int whole = gpu_range((uint64_t)(uintptr_t)addr, len, &gpu);
  if (gpu) {
    if (!fw_fault_peermem(fw_me()->n)) { // an inbox kernel without nvidia-peermem cannot pin GPU memory
      pthread_mutex_lock(&fw_mu); unsigned long k = fw_n.gpu_plain_refused++; pthread_mutex_unlock(&fw_mu);
      if (k < 4) fw_say("ibv_reg_mr on GPU memory %p+%#zx refused EFAULT (no peermem: GPU memory registers only as a dma-buf MR)", addr, len);
      errno = EFAULT; return NULL;
    }
    if (!whole) { fw_n.bad_args++; errno = EFAULT; return NULL; }
    if (!fw_copier_register((uint64_t)(uintptr_t)addr, len)) fw_gpu_copy_prepare();
  }
  return mr_new(pd, addr, iova, (uint8_t *)addr, len, access, -1, gpu ? FW_GPU_PEERMEM : FW_HOST);
}
struct ibv_mr *ibv_reg_mr(struct ibv_pd *pd, void *addr, size_t len, int access) {
  __atomic_fetch_add(&fw_n.reg_mr, 1, __ATOMIC_RELAXED);
  return reg_plain(pd, addr, len, (uint64_t)(uintptr_t)addr, access);
}
struct ibv_mr *ibv_reg_mr_iova2(struct ibv_pd *pd, void *addr, size_t len, uint64_t iova, unsigned access) {
  __atomic_fetch_add(&fw_n.reg_mr_iova2, 1, __ATOMIC_RELAXED);
  return reg_plain(pd, addr, len, iova, (int)access);
}
// The exporter of a dma-buf fd (fdinfo's exp_name: the NVIDIA driver's is "nv_dmabuf") and its
// size. Where the process's libcuda is the lab's stand-in, its dma-buf is a memfd it names
// "labcuda-dmabuf:<GPU address at offset 0>" (*base), taken as that stand-in's nv_dmabuf.
static void exporter(int fd, char exp[64], long *size, uint64_t *base) {
  char p[64], line[256];
  *size = -1; *base = 0; exp[0] = 0;
  snprintf(p, sizeof p, "/proc/self/fdinfo/%d", fd);
  FILE *f = fopen(p, "r");
  if (!f) return;
  while (fgets(line, sizeof line, f)) {
    if (!strncmp(line, "exp_name:", 9)) sscanf(line + 9, "%63s", exp);
    if (!strncmp(line, "size:", 5)) *size = atol(line + 5);
  }
  fclose(f);
  char target[128] = "";
  snprintf(p, sizeof p, "/proc/self/fd/%d", fd);
  ssize_t k = readlink(p, target, sizeof target - 1);
  struct stat st;
  if (!exp[0] && k > 0 && cu_ready() && dlsym(cu_lib, "labcuda_gpu") && !fstat(fd, &st) &&
      sscanf(target, "/memfd:labcuda-dmabuf:%lx", (unsigned long *)base) == 1) {
    snprintf(exp, 64, "nv_dmabuf"); *size = st.st_size;
  }
}
struct ibv_mr *ibv_reg_dmabuf_mr(struct ibv_pd *pd, uint64_t off, size_t len, uint64_t iova, int fd, int access) {
  __atomic_fetch_add(&fw_n.reg_dmabuf_mr, 1, __ATOMIC_RELAXED);
  if (fw_fault_no_dmabuf(fw_me()->n)) { // a kernel without dma-buf MRs answers every call so
    __atomic_fetch_add(&fw_n.dmabuf_unsupported, 1, __ATOMIC_RELAXED); errno = EOPNOTSUPP; return NULL;
  }
  if (fd < 0) { __atomic_fetch_add(&fw_n.dmabuf_probe, 1, __ATOMIC_RELAXED); errno = EBADF; return NULL; } // consumers' support probe
  if (bad_access(pd, len, access)) return NULL;
  const char *why = NULL;
  char exp[64]; long size; uint64_t base; int gpu = 0;
  if (fcntl(fd, F_GETFD) < 0) { errno = EBADF; why = "not an open fd"; }
  else {
    exporter(fd, exp, &size, &base);
    if (strcmp(exp, "nv_dmabuf")) { errno = EINVAL; why = "not an NVIDIA dma-buf (fdinfo exp_name)"; }
    else if (size < 0 || off > (uint64_t)size || len > (uint64_t)size - off) { errno = EINVAL; why = "offset + length past the dma-buf"; }
    else if ((off & 0xfff) != (iova & 0xfff)) { errno = EINVAL; why = "iova and offset differ in page offset"; }
    else if (!gpu_range(iova, len, &gpu)) { errno = EINVAL; why = "iova is not the GPU range of one allocation (the fake moves bytes by GPU address)"; }
    else if (base && base + off != iova) { errno = EINVAL; why = "the stand-in's dma-buf at that offset is not the GPU memory at iova"; }
  }
  if (why) {
    pthread_mutex_lock(&fw_mu); unsigned long k = fw_n.dmabuf_refused++; pthread_mutex_unlock(&fw_mu);
    if (k < 4) fw_say("ibv_reg_dmabuf_mr(off=%#lx len=%#zx iova=%#lx fd=%d) refused: %s", (unsigned long)off, len, (unsigned long)iova, fd, why);
    return NULL;
  }
  if (!fw_copier_register(iova, len)) fw_gpu_copy_prepare();
  // the MR holds a reference to the buffer (the RDMA core does), until ibv_dereg_mr
  return mr_new(pd, (void *)(uintptr_t)off, iova, (uint8_t *)(uintptr_t)iova, len, access, fcntl(fd, F_DUPFD_CLOEXEC, 0), FW_GPU_DMABUF);
}
int ibv_dereg_mr(struct ibv_mr *mr) {
  fw_mr *m = (fw_mr *)mr;
  pthread_mutex_lock(&fw_mu);
  int found = 0;
  for (int i = 0; i < fw_hi; i++) if (fw_mrs[i] == m) { fw_mrs[i] = NULL; found = 1; }
  while (fw_hi > 0 && !fw_mrs[fw_hi - 1]) fw_hi--;
  if (found) fw_n.dereg++;
  pthread_mutex_unlock(&fw_mu);
  if (!found) return EINVAL;
  if (m->fd >= 0) close(m->fd);
  free(m);
  return 0;
}

// ---- device, context, port ----
static struct ibv_device fw_dev = {.node_type = 1, .transport_type = 0, .dev_name = "uverbs0",
                                   .dev_path = "/sys/class/infiniband_verbs/uverbs0"};
static uint64_t guid(void) { uint64_t g; memcpy(&g, fw_me()->guid, 8); return g; } // network order, as rdma-core answers
struct ibv_device **ibv_get_device_list(int *n) {
  if (!fw_dev.name[0]) { // this host's device (fakelab.h)
    snprintf(fw_dev.name, sizeof fw_dev.name, "%s", fw_me()->dev);
    snprintf(fw_dev.ibdev_path, sizeof fw_dev.ibdev_path, "/sys/class/infiniband/%s", fw_me()->dev);
  }
  struct ibv_device **l = calloc(2, sizeof *l);
  if (!l) { errno = ENOMEM; return NULL; }
  l[0] = &fw_dev;
  if (n) *n = 1;
  return l;
}
void ibv_free_device_list(struct ibv_device **l) { free(l); }
const char *ibv_get_device_name(struct ibv_device *d) { return d ? d->name : NULL; }
int ibv_get_device_index(struct ibv_device *d) { return d == &fw_dev ? 0 : -1; }
uint64_t ibv_get_device_guid(struct ibv_device *d) { (void)d; return guid(); }
struct ibv_context *ibv_open_device(struct ibv_device *d) {
  if (d != &fw_dev) { errno = ENODEV; return NULL; }
  fw_wire_start();
  struct ibv_context *c = calloc(1, sizeof *c);
  if (!c) { errno = ENOMEM; return NULL; }
  c->device = d; c->num_comp_vectors = 1; c->cmd_fd = -1;
  c->async_fd = eventfd(0, EFD_CLOEXEC); // never signalled: no async events on a fake wire
  pthread_mutex_init(&c->mutex, NULL);
  c->ops.poll_cq = fw_poll_cq; c->ops.req_notify_cq = fw_req_notify_cq; c->ops.post_srq_recv = fw_post_srq_recv;
  c->ops.post_send = fw_post_send; c->ops.post_recv = fw_post_recv;
  return c;
}
int ibv_close_device(struct ibv_context *c) { if (c->async_fd >= 0) close(c->async_fd); free(c); return 0; }
int ibv_query_device(struct ibv_context *c, struct ibv_device_attr *a) {
  (void)c;
  memset(a, 0, sizeof *a);
  snprintf(a->fw_ver, sizeof a->fw_ver, "0.1.fakewire");
  a->node_guid = guid(); a->sys_image_guid = a->node_guid; a->max_mr_size = ~0ull; a->page_size_cap = 0xfffff000;
  a->vendor_id = 0x1d1d; a->vendor_part_id = 0xfa4e; a->hw_ver = 1; // no vendor a consumer special-cases
  a->max_qp = 65536; a->max_qp_wr = 32768; a->device_cap_flags = 0x1 | 0x2 | 0x40 | 0x2000; // resize CQ, bad pkey cntr, port active event, RC RNR NAK gen
  a->max_sge = 16; a->max_sge_rd = 16; a->max_cq = 65536; a->max_cqe = 1 << 22; a->max_mr = FW_MAXMR; a->max_pd = 65536;
  a->max_qp_rd_atom = 16; a->max_res_rd_atom = 1 << 20; a->max_qp_init_rd_atom = 16; a->atomic_cap = 0; // no atomics
  a->max_ah = 1 << 20; a->max_srq = 65536; a->max_srq_wr = 32767; a->max_srq_sge = 16; a->max_pkeys = 1;
  a->local_ca_ack_delay = 16; a->phys_port_cnt = 1; a->max_mcast_grp = 0;
  return 0;
}
int ibv_query_port(struct ibv_context *c, uint8_t port, struct ibv_port_attr *a) {
  (void)c;
  if (port != 1) return EINVAL;
  memset(a, 0, sizeof *a);
  int down = fw_fault_port_down(fw_me()->n);
  a->state = down ? 1 : 4; a->max_mtu = 5; a->active_mtu = 5; a->gid_tbl_len = FW_NGIDS; // ACTIVE (DOWN), 4096
  a->port_cap_flags = (1u << 16) | (1u << 26); // CM supported, IP-based GIDs
  a->max_msg_sz = 1u << 30; a->pkey_tbl_len = 1; a->active_width = 2; a->active_speed = 64; // 4x HDR: 200 Gb/s
  a->phys_state = down ? 3 : 5; a->link_layer = 2; // LinkUp (Disabled), Ethernet: RoCE
  return 0;
}
int ibv_query_gid(struct ibv_context *c, uint8_t port, int index, union ibv_gid *gid) {
  (void)c;
  if (port != 1 || index < 0 || index >= FW_NGIDS) return -1;
  memcpy(gid->raw, fw_me()->gid[index], 16);
  return 0;
}
int _ibv_query_gid_ex(struct ibv_context *c, uint32_t port, uint32_t index, struct ibv_gid_entry *e, uint32_t flags, size_t size) {
  (void)c;
  if (flags || size < sizeof *e) return EINVAL;
  if (port != 1 || index >= FW_NGIDS) return ENODATA;
  memset(e, 0, sizeof *e);
  memcpy(e->gid.raw, fw_me()->gid[index], 16); e->gid_index = index; e->port_num = 1; e->gid_type = (uint32_t)fw_gid_type[index]; e->ndev_ifindex = 1;
  return 0;
}
ssize_t _ibv_query_gid_table(struct ibv_context *c, struct ibv_gid_entry *e, size_t max, uint32_t flags, size_t size) {
  if (flags || size < sizeof *e) return -EINVAL;
  size_t k = 0;
  for (uint32_t i = 0; i < FW_NGIDS && k < max; i++, k++) _ibv_query_gid_ex(c, 1, i, &e[k], 0, sizeof *e);
  return (ssize_t)k;
}
int ibv_query_pkey(struct ibv_context *c, uint8_t port, int index, uint16_t *pkey) {
  (void)c;
  if (port != 1 || index != 0) return -1;
  *pkey = 0xffff;
  return 0;
}
// rdma-core's own programs bind these too (ibv_devinfo: the board id and the GID types;
// ibv_rc_pingpong: the extended QP of its new send API, which a legacy context has not)
int ibv_read_sysfs_file(const char *dir, const char *file, char *buf, size_t size) {
  char p[512];
  snprintf(p, sizeof p, "%s/%s", dir, file);
  int fd = open(p, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  ssize_t len = read(fd, buf, size);
  close(fd);
  if (len > 0) {
    if (buf[len - 1] == '\n') buf[--len] = 0;
    else if ((size_t)len < size) buf[len] = 0;
    else return -1;
  }
  return (int)len;
}
int ibv_query_gid_type(struct ibv_context *c, uint8_t port, unsigned index, int *type) {
  (void)c;
  if (port != 1 || index >= FW_NGIDS) { errno = EINVAL; return -1; }
  *type = fw_gid_type[index] == 2; // IBV_GID_TYPE_SYSFS_ROCE_V2 = 1, _IB_ROCE_V1 = 0
  return 0;
}
void *ibv_qp_to_qp_ex(struct ibv_qp *qp) { (void)qp; return NULL; }
// librdmacm (rdma-core's connection manager, which perftest links) binds these at start. The lab
// has no connection manager and no multicast: a program that gets this far is told so and stops.
static void no_cm(const char *what) {
  fw_say("%s: the lab has no connection manager (exchange addresses out of band)", what);
  abort();
}
void ibv_copy_path_rec_from_kern(void *dst, const void *src) { (void)dst; (void)src; no_cm("ibv_copy_path_rec_from_kern"); }
void ibv_copy_qp_attr_from_kern(void *dst, const void *src) { (void)dst; (void)src; no_cm("ibv_copy_qp_attr_from_kern"); }
void ibv_copy_ah_attr_from_kern(void *dst, const void *src) { (void)dst; (void)src; no_cm("ibv_copy_ah_attr_from_kern"); }
int ibv_get_sysfs_path(char *buf, size_t size) { snprintf(buf, size, "/sys"); return 0; }
int ibv_attach_mcast(struct ibv_qp *qp, const union ibv_gid *gid, uint16_t lid) { (void)qp; (void)gid; (void)lid; return EOPNOTSUPP; }
int ibv_detach_mcast(struct ibv_qp *qp, const union ibv_gid *gid, uint16_t lid) { (void)qp; (void)gid; (void)lid; return EOPNOTSUPP; }
int ibv_get_pkey_index(struct ibv_context *c, uint8_t port, uint16_t pkey) { (void)c; return port == 1 && pkey == 0xffff ? 0 : -1; }
int ibv_fork_init(void) { return 0; }
int ibv_is_fork_initialized(void) { return 2; } // IBV_FORK_UNNEEDED
int ibv_query_ece(struct ibv_qp *qp, void *ece) { (void)qp; (void)ece; return EOPNOTSUPP; }
int ibv_set_ece(struct ibv_qp *qp, void *ece) { (void)qp; (void)ece; return EOPNOTSUPP; }
int ibv_get_async_event(struct ibv_context *c, struct ibv_async_event *e) {
  (void)e; uint64_t v; // blocks (or EAGAIN on a non-blocking fd): nothing ever happens
  ssize_t got = read(c->async_fd, &v, sizeof v);
  (void)got;
  return -1;
}
void ibv_ack_async_event(struct ibv_async_event *e) { (void)e; }
const char *ibv_node_type_str(int t) { return t == 1 ? "InfiniBand channel adapter" : "unknown"; }
const char *ibv_port_state_str(int s) { return s == 4 ? "PORT_ACTIVE" : "PORT_DOWN"; }
const char *ibv_event_type_str(int e) { (void)e; return "fakewire event"; }
const char *ibv_wc_status_str(int s) {
  static const char *n[] = {"success", "local length error", "local QP operation error", "local EE context operation error",
                            "local protection error", "Work Request Flushed Error", "memory management operation error",
                            "bad response error", "local access error", "remote invalid request error", "remote access error",
                            "remote operation error", "transport retry counter exceeded", "RNR retry counter exceeded"};
  return s >= 0 && s < (int)(sizeof n / sizeof *n) ? n[s] : "general error";
}
struct ibv_pd *ibv_alloc_pd(struct ibv_context *c) { struct ibv_pd *p = calloc(1, sizeof *p); if (p) p->context = c; else errno = ENOMEM; return p; }
int ibv_dealloc_pd(struct ibv_pd *p) { free(p); return 0; }
