// A fake libcuda.so.1 for gdrshim's integration tests (ours): cuGetProcAddress_v2 and the
// allocation entry points the shim wraps. Allocations return the pointer set by
// fakecuda_set_next() (the calling thread's), so a player can reproduce a capture's user
// allocations.
// FAKECUDA_ATTRS="75=12,76=0,118=100" overrides device attributes (another GPU than the default
// GeForce sm_89); FAKECUDA_CREATE says what cuMemCreate does: accept (default), flag (refuse
// gpuDirectRDMACapable=1 with 801, as a GeForce), oom (refuse everything with 2), all (refuse
// everything with 801). fakecuda_create_calls counts cuMemCreate calls. Contexts (below): primary
// ones retained and released per device, reset, created, destroyed, each thread's current one,
// and what their ends free; cuDeviceGetUuid_v2 the fake driver's UUIDs.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
typedef int CUresult;
static __thread uint64_t next_ptr;
void fakecuda_set_next(uint64_t p) { next_ptr = p; }
CUresult cuMemAlloc_v2(uint64_t *d, size_t n) { (void)n; *d = next_ptr; return 0; }
CUresult cuMemAllocPitch_v2(uint64_t *d, size_t *pitch, size_t w, size_t h, unsigned e) { (void)h; (void)e; *d = next_ptr; *pitch = w; return 0; }
CUresult cuMemAllocAsync(uint64_t *d, size_t n, void *s) { (void)n; (void)s; *d = next_ptr; return 0; }
CUresult cuMemAllocFromPoolAsync(uint64_t *d, size_t n, void *p, void *s) { (void)n; (void)p; (void)s; *d = next_ptr; return 0; }
CUresult cuMemSetAccess(uint64_t p, size_t n, const void *desc, size_t c) { (void)p; (void)n; (void)desc; (void)c; return 0; }
CUresult cuMemFree_v2(uint64_t p) { (void)p; return 0; }
// A GeForce: no GPUDirect RDMA (attribute 116); compute capability 8.9; unless FAKECUDA_ATTRS says
CUresult cuDeviceGetAttribute(int *v, int attr, int dev) {
  (void)dev;
  *v = attr == 75 ? 8 : attr == 76 ? 9 : 0;
  const char *o = getenv("FAKECUDA_ATTRS");
  for (char *p = (char *)o; p && *p;) {
    char *end; long a = strtol(p, &end, 10);
    if (*end != '=') break;
    long val = strtol(end + 1, &end, 10);
    if (a == attr) *v = (int)val;
    p = *end == ',' ? end + 1 : end;
    if (*end != ',') break;
  }
  return 0;
}
// cuMemCreate: CUmemAllocationProp's allocFlags.gpuDirectRDMACapable is byte 25 (cuda.h)
int fakecuda_create_calls;
CUresult cuMemCreate(uint64_t *h, size_t n, const unsigned char *prop, unsigned long long flags) {
  (void)flags;
  fakecuda_create_calls++;
  const char *m = getenv("FAKECUDA_CREATE");
  if (m && !strcmp(m, "oom")) return 2;
  if (m && !strcmp(m, "all")) return 801;
  if (m && !strcmp(m, "flag") && prop[25]) return 801;
  *h = 0x4000 + n;
  return 0;
}
CUresult cuMemAlloc(unsigned *d, unsigned n) { (void)n; *d = 0x1000; return 0; } // v1 ABI: never wrapped
// A GeForce refuses dma-bufs (CUDA_ERROR_NOT_SUPPORTED) and reports DMA_BUF_SUPPORTED 0.
CUresult cuMemGetHandleForAddressRange(void *h, uint64_t p, size_t n, int type, unsigned long long flags) { (void)h; (void)p; (void)n; (void)type; (void)flags; return 801; }
// Contexts: a primary context per device with a reference count (Retain/Release), a reset, a
// destroy; the UUID of device d is the fake driver's (fakerm_uuid, when it is loaded). Each
// thread has a current context (cuCtxSetCurrent; cuCtxCreate pushes the new one, cuCtxDestroy
// pops it where it is current), which cuCtxGetCurrent answers. A context's end frees its memory
// as CUDA frees it: a test that plays libcuda's part in an allocation says how
// (fakecuda_at_end(ctx, fn, arg)), and the destroy, the reset or the last release runs it (RM and
// UVM frees, through the hooked ioctl as libcuda's are).
// (thread-safe: the stress retains and releases from every thread)
static int primary_refs[2];
static uintptr_t created;
static __thread void *current[16];
static __thread int depth;
static void *primary_of(int dev) { return (void *)(uintptr_t)(0xc0 + dev); }
static struct { void *ctx; void (*fn)(void *); void *arg; } ends[256];
static int nends;
static pthread_mutex_t ends_mu = PTHREAD_MUTEX_INITIALIZER;
int fakecuda_at_end(void *ctx, void (*fn)(void *), void *arg) {
  pthread_mutex_lock(&ends_mu);
  int ok = nends < 256;
  if (ok) { ends[nends].ctx = ctx; ends[nends].fn = fn; ends[nends++].arg = arg; }
  pthread_mutex_unlock(&ends_mu);
  return ok ? 0 : -1;
}
// The end of `ctx`: what was allocated in it is freed, in the order it was allocated.
static void context_ends(void *ctx) {
  for (;;) {
    void (*fn)(void *) = NULL;
    void *arg = NULL;
    pthread_mutex_lock(&ends_mu);
    for (int i = 0; i < nends && !fn; i++)
      if (ends[i].ctx == ctx) {
        fn = ends[i].fn, arg = ends[i].arg;
        memmove(&ends[i], &ends[i + 1], (size_t)(nends - i - 1) * sizeof ends[0]);
        nends--;
      }
    pthread_mutex_unlock(&ends_mu);
    if (!fn) return;
    fn(arg);
  }
}
CUresult cuCtxGetCurrent(void **ctx) { *ctx = depth ? current[depth - 1] : NULL; return 0; }
CUresult cuCtxSetCurrent(void *ctx) {
  if (!depth) depth = 1;
  current[depth - 1] = ctx;
  return 0;
}
CUresult cuDevicePrimaryCtxRetain(void **ctx, int dev) { if (dev < 0 || dev > 1) return 101; __atomic_add_fetch(&primary_refs[dev], 1, __ATOMIC_SEQ_CST); *ctx = primary_of(dev); return 0; }
CUresult cuDevicePrimaryCtxRelease_v2(int dev) {
  if (dev < 0 || dev > 1) return 101;
  int n = __atomic_load_n(&primary_refs[dev], __ATOMIC_SEQ_CST);
  do { if (!n) return 101; } while (!__atomic_compare_exchange_n(&primary_refs[dev], &n, n - 1, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST));
  if (n == 1) context_ends(primary_of(dev));
  return 0;
}
CUresult cuDevicePrimaryCtxReset_v2(int dev) { if (dev < 0 || dev > 1) return 101; __atomic_store_n(&primary_refs[dev], 0, __ATOMIC_SEQ_CST); context_ends(primary_of(dev)); return 0; }
CUresult cuDevicePrimaryCtxGetState(int dev, unsigned *flags, int *active) { if (dev < 0 || dev > 1) return 101; *flags = 0; *active = __atomic_load_n(&primary_refs[dev], __ATOMIC_SEQ_CST) > 0; return 0; }
CUresult cuCtxCreate_v2(void **ctx, unsigned flags, int dev) {
  (void)flags;
  if (dev < 0 || dev > 1 || depth == 16) return 101;
  *ctx = (void *)(0xc100 + 2 * __atomic_add_fetch(&created, 1, __ATOMIC_SEQ_CST) + (uintptr_t)dev);
  current[depth++] = *ctx;
  return 0;
}
CUresult cuCtxDestroy_v2(void *ctx) {
  if (!ctx) return 201;
  if (depth && current[depth - 1] == ctx) depth--;
  context_ends(ctx);
  return 0;
}
CUresult cuDeviceGetUuid_v2(unsigned char *uuid, int dev) {
  uint8_t (*u)[16] = (uint8_t (*)[16])dlsym(RTLD_DEFAULT, "fakerm_uuid");
  if (!u || dev < 0 || dev > 1) return 101;
  memcpy(uuid, u[dev], 16);
  return 0;
}
CUresult cuGetProcAddress_v2(const char *sym, void **pfn, int ver, uint64_t flags, int *status) {
  (void)flags;
  void *f = 0;
  if (!strcmp(sym, "cuMemAlloc")) f = ver >= 3020 ? (void *)cuMemAlloc_v2 : (void *)cuMemAlloc;
  else if (!strcmp(sym, "cuMemAllocPitch")) f = (void *)cuMemAllocPitch_v2;
  else if (!strcmp(sym, "cuMemAllocAsync")) f = (void *)cuMemAllocAsync;
  else if (!strcmp(sym, "cuMemAllocFromPoolAsync")) f = (void *)cuMemAllocFromPoolAsync;
  else if (!strcmp(sym, "cuMemSetAccess")) f = (void *)cuMemSetAccess;
  else if (!strcmp(sym, "cuMemFree")) f = (void *)cuMemFree_v2;
  else if (!strcmp(sym, "cuDeviceGetAttribute")) f = (void *)cuDeviceGetAttribute;
  else if (!strcmp(sym, "cuMemCreate") && ver >= 10020) f = (void *)cuMemCreate;
  else if (!strcmp(sym, "cuMemGetHandleForAddressRange") && ver >= 11070) f = (void *)cuMemGetHandleForAddressRange;
  else if (!strcmp(sym, "cuDevicePrimaryCtxRetain")) f = (void *)cuDevicePrimaryCtxRetain;
  else if (!strcmp(sym, "cuDevicePrimaryCtxRelease") && ver >= 11000) f = (void *)cuDevicePrimaryCtxRelease_v2;
  else if (!strcmp(sym, "cuDevicePrimaryCtxReset") && ver >= 11000) f = (void *)cuDevicePrimaryCtxReset_v2;
  else if (!strcmp(sym, "cuCtxCreate") && ver >= 3020) f = (void *)cuCtxCreate_v2;
  else if (!strcmp(sym, "cuCtxDestroy") && ver >= 4000) f = (void *)cuCtxDestroy_v2;
  else if (!strcmp(sym, "cuCtxGetCurrent") && ver >= 4000) f = (void *)cuCtxGetCurrent;
  else if (!strcmp(sym, "cuCtxSetCurrent") && ver >= 4000) f = (void *)cuCtxSetCurrent;
  if (status) *status = f ? 0 : 1;
  *pfn = f;
  return f ? 0 : 500;
}
