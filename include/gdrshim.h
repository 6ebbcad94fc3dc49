/* gdrshim: the interface of libgdrshim.so (LD_PRELOAD) for applications and NCCL patches.
 *
 * Nothing needs to link against the shim: the gdrshim_dl_* inline functions below find each
 * function with dlsym(RTLD_DEFAULT, ...) and answer -ENOSYS (or NULL) when the shim is not
 * loaded, so one binary works with and without it. Link with -ldl on glibc < 2.34.
 *
 * Environment (read once, at the first NVIDIA call; a bad value gives one warning naming the
 * variable, then the default):
 *   GDRSHIM_MODE           off | trace | shadow | register (default register; shadow before; a value
 *                          not understood: shadow, with the warning). off: pure pass-through;
 *                          trace: decode and log every RM/UVM call; shadow: also decide (and log)
 *                          what would be registered, register nothing; register: make GPU memory
 *                          reachable for the NIC by the route below at each verbs registration.
 *   GDRSHIM_ROUTE          auto | dmabuf | nv503c (default auto). dmabuf: export the exact memory as
 *                          a dma-buf, register it with ibv_reg_dmabuf_mr, and serve
 *                          cuMemGetHandleForAddressRange (inbox RDMA stack). nv503c: register with
 *                          NV50_THIRD_PARTY_P2P before the verbs call (needs nvidia-peermem, so
 *                          MLNX_OFED/DOCA-OFED). auto: dmabuf where the GPU and libibverbs support it,
 *                          else nv503c where nvidia-peermem is loaded, else none (one warning).
 *   GDRSHIM_LOG_LEVEL      error | warn | info | debug | trace (default warn; info in trace mode).
 *   GDRSHIM_LOG_FILE       log file instead of stderr; %h host, %p pid. Opened without following a
 *                          link in any component; a new file 0600; an existing one only if it is
 *                          a regular file of this user with one link (else stderr, one warning).
 *   GDRSHIM_CAPTURE        raw capture of every NVIDIA ioctl (the fixture format); %h, %p.
 *   GDRSHIM_SUMMARY        1 (default): one "gdrshim: summary key=value ..." line at exit.
 *   GDRSHIM_EAGER          1: register every user allocation when CUDA returns it (for verbs
 *                          users the shim does not intercept); register mode only.
 *   GDRSHIM_ADVERTISE_GDR  1 (default; 0 before): answer CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED
 *                          yes where libcuda says no (stock NCCL's GPU-side gate), only while a
 *                          route registers; never with NCCL_GDR_FLUSH_DISABLE set; on sm_90 and
 *                          later without native write ordering (attribute 118 below OWNER) only
 *                          with NCCL_NET_FORCE_FLUSH=1. 0: never. (DMA_BUF_SUPPORTED is answered yes
 *                          whenever the DMA-BUF route serves, GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED
 *                          whenever a route registers.)
 * The tests' and benchmarks' variables (GDRSHIM_TEST_*, GDRSHIM_TIMING, GDRSHIM_BENCH_PAUSE,
 * GDRSHIM_APPLY_THREAD) work only in test builds (the `knobs` feature); a release build ignores
 * them with one warning.
 * Under secure execution (AT_SECURE) and in a child made by fork() after the shim is up, the shim is
 * inert: every call is the real one and every query answers -ENOSYS (mode 0).
 */
#ifndef GDRSHIM_H
#define GDRSHIM_H
#include <dlfcn.h>
#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#ifdef __cplusplus
extern "C" {
#endif

#define GDRSHIM_VERSION_MAJOR 0
#define GDRSHIM_VERSION_MINOR 3
#define GDRSHIM_VERSION_PATCH 0
#define GDRSHIM_VERSION_STRING "0.3.0"
#define GDRSHIM_QUERY_ABI 1            /* layout of struct gdrshim_backing */
#define GDRSHIM_GPU_PAGE_SIZE (64u << 10) /* NV503C registers in 64 KiB units */

enum gdrshim_mode { GDRSHIM_MODE_OFF = 0, GDRSHIM_MODE_TRACE = 1, GDRSHIM_MODE_SHADOW = 2, GDRSHIM_MODE_REGISTER = 3 };
enum gdrshim_route { GDRSHIM_ROUTE_NONE = 0, GDRSHIM_ROUTE_DMABUF = 1, GDRSHIM_ROUTE_NV503C = 2 };

struct gdrshim_backing {
  uint32_t struct_version; /* GDRSHIM_QUERY_ABI */
  uint32_t h_client, h_memory, h_device, device_id;
  int32_t ctl_fd;          /* the /dev/nvidiactl fd the client was allocated on */
  uint64_t offset;         /* offset of va inside h_memory */
  uint64_t map_base, map_length; /* the UVM mapping the range lies in */
};

/* The counters of the exit summary. New fields are only ever added at the end. */
struct gdrshim_counters {
  uint64_t nv_ioctls, native, matched, mismatched, unpredicted;
  uint64_t pass0_hits, pass0_misses, registered, unregistered, rm_errors;
  uint64_t live_registrations, host_mrs, stood_aside;
  /* Added in 0.3.0: the DMA-BUF route. Exports made (for MRs and for CUDA's callers) and MRs that reused a
   * buffer already exported for the same pieces; buffers of ours alive under MRs; bytes of GPU
   * memory in our dma-buf MRs (one count per MR) and in those buffers (one count per buffer:
   * what takes BAR1 without static BAR1), live and the most at once. Read size bytes you know. */
  uint64_t dmabuf_exports, dmabuf_reused, dmabuf_buffers;
  uint64_t registered_bytes, registered_peak_bytes, exported_bytes, exported_peak_bytes;
  /* Added in 0.3.0: the smallest BAR1 (bytes) of the GPUs gdrshim exported on, and 1 when all
   * of them have static BAR1 (exports take no BAR1 space of their own), 0 when one has not;
   * UINT64_MAX: unknown (nothing exported yet, or RM and sysfs could not tell). */
  uint64_t bar1_bytes, bar1_static;
};

const char *gdrshim_version(void);   /* "0.3.0" */
int gdrshim_mode(void);              /* enum gdrshim_mode; a query, not a GPU touch: wakes nothing, prints nothing */
int gdrshim_gdr_active(void);        /* 1: registers GPU memory for verbs here (register mode, known ABI, a route that works) */
int gdrshim_gdr_route(void);         /* the route it registers by: 1 DMA-BUF, 2 NV503C, 0 none */
/* A dma-buf fd of exactly the GPU memory behind [va, va+len) (host-page aligned, one GPU, this
 * process's own memory), as cuMemGetHandleForAddressRange gives one: the fd (close it), -ENOENT
 * not covered exactly, -EACCES not this program's own device memory (a byte outside its CUDA
 * allocations, a hole, host or imported memory),
 * -EPERM not register mode or not the DMA-BUF route, -ENOSYS no shim. */
int gdrshim_export_dmabuf(uint64_t va, uint64_t len);
/* Exact lookup of [va, va+len): 0 on a hit inside one memory object; -ENOENT miss (also in a
 * process that has touched no GPU: answered without waking the shim); -EXDEV spans memory
 * objects; -ENOSYS nothing tracked (off mode or unknown driver). */
int gdrshim_lookup(uint64_t va, uint64_t len, struct gdrshim_backing *out);
/* Register the GPU memory behind [va, va+len) as a verbs registration of it would: a handle > 0;
 * 0 nothing needed (native registration); -EINVAL host memory; -ENOENT no exact GPU mapping;
 * -EXDEV spans memory objects; -EPERM not register mode; -ENOSYS unknown ABI or shim off. */
int64_t gdrshim_register(uint64_t va, uint64_t len);
int gdrshim_unregister(int64_t handle); /* 0, or -ENOENT for a handle not held */
/* Copies at most size bytes of the counters; returns the bytes written, or -ENOSYS (no shim, off).
 * A process that has touched no GPU gets the counts of a shim that has seen nothing (0, the BAR1
 * fields UINT64_MAX), without waking it. */
int gdrshim_counters(struct gdrshim_counters *out, size_t size);
void gdrshim_mark(const char *text);  /* a mark line in the capture file */

/* ---- the same through dlsym: work with or without the shim loaded ---- */
#define GDRSHIM_DL_(name) ((__typeof__(&name))dlsym(RTLD_DEFAULT, #name))
static inline const char *gdrshim_dl_version(void) {
  const char *(*f)(void) = GDRSHIM_DL_(gdrshim_version);
  return f ? f() : NULL;
}
static inline int gdrshim_dl_mode(void) {
  int (*f)(void) = GDRSHIM_DL_(gdrshim_mode);
  return f ? f() : -ENOSYS;
}
static inline int gdrshim_dl_gdr_active(void) {
  int (*f)(void) = GDRSHIM_DL_(gdrshim_gdr_active);
  return f ? f() : 0;
}
static inline int gdrshim_dl_gdr_route(void) {
  int (*f)(void) = GDRSHIM_DL_(gdrshim_gdr_route);
  return f ? f() : 0;
}
static inline int gdrshim_dl_export_dmabuf(uint64_t va, uint64_t len) {
  int (*f)(uint64_t, uint64_t) = GDRSHIM_DL_(gdrshim_export_dmabuf);
  return f ? f(va, len) : -ENOSYS;
}
static inline int gdrshim_dl_lookup(uint64_t va, uint64_t len, struct gdrshim_backing *out) {
  int (*f)(uint64_t, uint64_t, struct gdrshim_backing *) = GDRSHIM_DL_(gdrshim_lookup);
  return f ? f(va, len, out) : -ENOSYS;
}
static inline int64_t gdrshim_dl_register(uint64_t va, uint64_t len) {
  int64_t (*f)(uint64_t, uint64_t) = GDRSHIM_DL_(gdrshim_register);
  return f ? f(va, len) : -ENOSYS;
}
static inline int gdrshim_dl_unregister(int64_t handle) {
  int (*f)(int64_t) = GDRSHIM_DL_(gdrshim_unregister);
  return f ? f(handle) : -ENOSYS;
}
static inline int gdrshim_dl_counters(struct gdrshim_counters *out, size_t size) {
  int (*f)(struct gdrshim_counters *, size_t) = GDRSHIM_DL_(gdrshim_counters);
  return f ? f(out, size) : -ENOSYS;
}
static inline void gdrshim_dl_mark(const char *text) {
  void (*f)(const char *) = GDRSHIM_DL_(gdrshim_mark);
  if (f) f(text);
}

#ifdef __cplusplus
}
#endif
#endif
