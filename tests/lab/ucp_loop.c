// The consumer lab's UCX program (ours; built against a UCX wheel's headers, never committed
// built): two UCP workers of one context, an endpoint from one to the other over the fake wire,
// ucp_put_nbx then ucp_get_nbx of SIZE bytes between buffers of the kinds asked, every byte
// checked. GPU memory is cuMemAlloc'ed through libcuda (dlopen), so no CUDA toolkit is needed.
//   ucp_loop SRC DST [SIZE]   SRC/DST: host | gpu     (prints the endpoint's lanes: the transport)
// Output: "ucp_loop SRC->DST: put ok get ok bytes=N" or "... FAILED: why"; exit 0 only when both match.
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <ucp/api/ucp.h>

static int (*cu_init)(unsigned), (*cu_retain)(void **, int), (*cu_set)(void *), (*cu_alloc)(uint64_t *, size_t);
static int (*cu_htod)(uint64_t, const void *, size_t), (*cu_dtoh)(void *, uint64_t, size_t);
static void cuda(void) {
  void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
  if (!h) { printf("ucp_loop: FAILED: no libcuda.so.1\n"); exit(1); }
  cu_init = dlsym(h, "cuInit"); cu_retain = dlsym(h, "cuDevicePrimaryCtxRetain"); cu_set = dlsym(h, "cuCtxSetCurrent");
  cu_alloc = dlsym(h, "cuMemAlloc_v2"); cu_htod = dlsym(h, "cuMemcpyHtoD_v2"); cu_dtoh = dlsym(h, "cuMemcpyDtoH_v2");
  void *ctx;
  if (cu_init(0) || cu_retain(&ctx, 0) || cu_set(ctx)) { printf("ucp_loop: FAILED: CUDA init\n"); exit(1); }
}
static void *buf(int gpu, size_t n) {
  if (!gpu) return aligned_alloc(4096, n);
  uint64_t p = 0;
  if (cu_alloc(&p, n)) { printf("ucp_loop: FAILED: cuMemAlloc\n"); exit(1); }
  return (void *)(uintptr_t)p;
}
static void put_bytes(void *d, int gpu, const void *s, size_t n) { if (gpu) cu_htod((uint64_t)(uintptr_t)d, s, n); else memcpy(d, s, n); }
static void get_bytes(void *d, const void *s, int gpu, size_t n) { if (gpu) cu_dtoh(d, (uint64_t)(uintptr_t)s, n); else memcpy(d, s, n); }

static ucp_worker_h wa, wb;
static ucs_status_t wait_req(void *r) {
  if (r == NULL) return UCS_OK;
  if (UCS_PTR_IS_ERR(r)) return UCS_PTR_STATUS(r);
  ucs_status_t st;
  for (long i = 0; (st = ucp_request_check_status(r)) == UCS_INPROGRESS; i++) {
    ucp_worker_progress(wa); ucp_worker_progress(wb);
    if (i > 200000000L) return UCS_ERR_TIMED_OUT;
  }
  ucp_request_free(r);
  return st;
}
static ucp_mem_h map(ucp_context_h c, void *p, size_t n, int gpu) {
  ucp_mem_map_params_t mp = {.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH | UCP_MEM_MAP_PARAM_FIELD_MEMORY_TYPE,
                             .address = p, .length = n, .memory_type = gpu ? UCS_MEMORY_TYPE_CUDA : UCS_MEMORY_TYPE_HOST};
  ucp_mem_h m;
  ucs_status_t st = ucp_mem_map(c, &mp, &m);
  if (st != UCS_OK) { printf("ucp_loop: FAILED: ucp_mem_map(%s): %s\n", gpu ? "cuda" : "host", ucs_status_string(st)); exit(1); }
  return m;
}

int main(int argc, char **argv) {
  if (argc < 3) { fprintf(stderr, "usage: ucp_loop host|gpu host|gpu [size]\n"); return 2; }
  int sg = !strcmp(argv[1], "gpu"), dg = !strcmp(argv[2], "gpu");
  size_t n = argc > 3 ? strtoul(argv[3], NULL, 0) : (1 << 20);
  unsigned maj, min, rel; ucp_get_version(&maj, &min, &rel);
  printf("ucp_loop: UCX %u.%u.%u, %s -> %s, %zu bytes\n", maj, min, rel, argv[1], argv[2], n);
  if (sg || dg) cuda();
  ucp_params_t p = {.field_mask = UCP_PARAM_FIELD_FEATURES, .features = UCP_FEATURE_RMA};
  ucp_context_h ctx;
  ucs_status_t st = ucp_init(&p, NULL, &ctx);
  if (st != UCS_OK) { printf("ucp_loop: FAILED: ucp_init: %s\n", ucs_status_string(st)); return 1; }
  ucp_worker_params_t wp = {.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE, .thread_mode = UCS_THREAD_MODE_SINGLE};
  if (ucp_worker_create(ctx, &wp, &wa) != UCS_OK || ucp_worker_create(ctx, &wp, &wb) != UCS_OK) { printf("ucp_loop: FAILED: workers\n"); return 1; }
  ucp_address_t *addr; size_t alen;
  ucp_worker_get_address(wb, &addr, &alen);
  ucp_ep_params_t ep = {.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS, .address = addr};
  ucp_ep_h e;
  if ((st = ucp_ep_create(wa, &ep, &e)) != UCS_OK) { printf("ucp_loop: FAILED: ucp_ep_create: %s\n", ucs_status_string(st)); return 1; }

  uint8_t *pat = malloc(n), *back = malloc(n), *zero = calloc(1, n);
  for (size_t i = 0; i < n; i++) pat[i] = (uint8_t)(i * 131 + 7);
  void *src = buf(sg, n), *dst = buf(dg, n), *src2 = buf(sg, n);
  put_bytes(src, sg, pat, n); put_bytes(dst, dg, zero, n); put_bytes(src2, sg, zero, n);
  ucp_mem_h ms = map(ctx, src, n, sg), md = map(ctx, dst, n, dg), ms2 = map(ctx, src2, n, sg);
  void *rk_buf; size_t rk_len; ucp_rkey_h rk;
  if (ucp_rkey_pack(ctx, md, &rk_buf, &rk_len) != UCS_OK || ucp_ep_rkey_unpack(e, rk_buf, &rk) != UCS_OK) { printf("ucp_loop: FAILED: rkey\n"); return 1; }
  ucp_request_param_t rp = {.op_attr_mask = UCP_OP_ATTR_FIELD_MEMORY_TYPE, .memory_type = sg ? UCS_MEMORY_TYPE_CUDA : UCS_MEMORY_TYPE_HOST};
  st = wait_req(ucp_put_nbx(e, src, n, (uint64_t)(uintptr_t)dst, rk, &rp));
  if (st == UCS_OK) st = wait_req(ucp_ep_flush_nbx(e, &(ucp_request_param_t){0}));
  get_bytes(back, dst, dg, n);
  int put_ok = st == UCS_OK && !memcmp(back, pat, n);
  printf("ucp_loop: put %s (%s)\n", put_ok ? "ok" : "FAILED", ucs_status_string(st));
  st = wait_req(ucp_get_nbx(e, src2, n, (uint64_t)(uintptr_t)dst, rk, &rp));
  if (st == UCS_OK) st = wait_req(ucp_ep_flush_nbx(e, &(ucp_request_param_t){0}));
  get_bytes(back, src2, sg, n);
  int get_ok = st == UCS_OK && !memcmp(back, pat, n);
  printf("ucp_loop: get %s (%s)\n", get_ok ? "ok" : "FAILED", ucs_status_string(st));
  ucp_ep_print_info(e, stdout);
  printf("ucp_loop %s->%s: put %s get %s bytes=%zu\n", argv[1], argv[2], put_ok ? "ok" : "FAILED", get_ok ? "ok" : "FAILED", n);
  fflush(stdout);
  // no UCX teardown (the verdict is printed), but exit, not _exit: the exit-time reports (the fake
  // wire's counts, gdrshim's summary) are written by destructors and atexit handlers
  exit(put_ok && get_ok ? 0 : 1);
}
