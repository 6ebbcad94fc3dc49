// A plugin linked against libibverbs (ours), like an external NCCL net plugin: dlopen'ed with
// RTLD_LOCAL, its ibv_reg_mr binds to gdrshim's export; unloading it unloads libibverbs. Its PD is
// the NIC's through its own libibverbs where that is rdma-core's (fakeverbs.c has no devices).
#include <stddef.h>
extern void *ibv_reg_mr(void *pd, void *addr, size_t len, int access);
extern int ibv_dereg_mr(void *mr);
extern void **ibv_get_device_list(int *n) __attribute__((weak));
extern void *ibv_open_device(void *device) __attribute__((weak));
extern void *ibv_alloc_pd(void *context) __attribute__((weak));
void *plug_pd(void) {
  int n = 0;
  void **l = ibv_get_device_list ? ibv_get_device_list(&n) : NULL;
  void *ctx = l && n == 1 ? ibv_open_device(l[0]) : NULL;
  return ctx ? ibv_alloc_pd(ctx) : NULL;
}
void *plug_reg(void *pd, void *addr, size_t len) { return ibv_reg_mr(pd, addr, len, 0xf); }
int plug_dereg(void *mr) { return ibv_dereg_mr(mr); }
