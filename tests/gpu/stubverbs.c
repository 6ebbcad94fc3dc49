// Test-only stand-in for the NIC (ours): a libibverbs.so.1 whose registrations always succeed
// and only hand back a fake MR. Versioned like rdma-core, so NCCL-style dlvsym lookups work.
#include <stdint.h>
#include <stdlib.h>
struct ibv_mr { void *context, *pd, *addr; size_t length; uint32_t handle, lkey, rkey; };
static struct ibv_mr *mk(void *addr, size_t len) { struct ibv_mr *m = calloc(1, sizeof *m); m->addr = addr; m->length = len; m->lkey = m->rkey = 0x1234; return m; }
struct ibv_mr *ibv_reg_mr(void *pd, void *addr, size_t len, int access) { (void)pd; (void)access; return mk(addr, len); }
struct ibv_mr *ibv_reg_mr_iova2(void *pd, void *addr, size_t len, uint64_t iova, unsigned access) { (void)pd; (void)iova; (void)access; return mk(addr, len); }
int ibv_dereg_mr(struct ibv_mr *mr) { free(mr); return 0; }
