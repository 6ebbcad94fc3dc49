// A library that links one copy of libibverbs and calls it directly (ours): -DUSER=1 links the
// system's copy, -DUSER=2 the wheel's (tests/c/twoverbs.c). Its calls bind to gdrshim's exported
// hooks (preloaded, in the global scope); without gdrshim they would reach its own copy, and so
// they must with it.
#include <stddef.h>
#include <stdint.h>
struct ibv_pd;
struct ibv_mr;
struct ibv_pd *ibv_alloc_pd(void *context);
struct ibv_mr *ibv_reg_mr(struct ibv_pd *pd, void *addr, size_t len, int access);
int ibv_rereg_mr(struct ibv_mr *mr, int flags, struct ibv_pd *pd, void *addr, size_t len, int access);
int ibv_dereg_mr(struct ibv_mr *mr);
struct ibv_pd *user_pd(void) { return ibv_alloc_pd(NULL); }
struct ibv_mr *user_reg(struct ibv_pd *pd, void *addr, size_t len) { return ibv_reg_mr(pd, addr, len, 0xf); }
int user_rereg(struct ibv_mr *mr, struct ibv_pd *pd, void *addr, size_t len) { return ibv_rereg_mr(mr, 1, pd, addr, len, 0xf); }
int user_dereg(struct ibv_mr *mr) { return ibv_dereg_mr(mr); }
