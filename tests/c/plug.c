// A plugin linked against libibverbs (ours), like an external NCCL net plugin: dlopen'ed with
// RTLD_LOCAL, its ibv_reg_mr binds to gdrshim's export; unloading it unloads libibverbs.
#include <stddef.h>
extern void *ibv_reg_mr(void *pd, void *addr, size_t len, int access);
extern int ibv_dereg_mr(void *mr);
void *plug_reg(void *addr, size_t len) { return ibv_reg_mr(0, addr, len, 0xf); }
int plug_dereg(void *mr) { return ibv_dereg_mr(mr); }
