// Test-only stand-in for the NIC (ours): a libibverbs.so.1 whose registrations succeed and hand
// back a fake MR. ibv_reg_dmabuf_mr plays the kernel's checks a real one makes on the buffer: it
// must be an nv_dmabuf (fdinfo exp_name) at least offset+len long, with the iova's page offset;
// the MR holds its own reference (a dup of the fd) until ibv_dereg_mr, as the RDMA core does, so
// the buffer (and the GPU memory RM keeps for it) lives exactly as long as the MR. Versioned like
// rdma-core, so NCCL-style dlvsym lookups work.
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
struct ibv_mr { void *context, *pd, *addr; size_t length; uint32_t handle, lkey, rkey; };
struct held { struct ibv_mr mr; int fd; };
static struct ibv_mr *mk(void *addr, size_t len, int fd) {
  struct held *h = calloc(1, sizeof *h); h->fd = fd;
  h->mr.addr = addr; h->mr.length = len; h->mr.lkey = h->mr.rkey = 0x1234; return &h->mr;
}
struct ibv_mr *ibv_reg_mr(void *pd, void *addr, size_t len, int access) { (void)pd; (void)access; return mk(addr, len, -1); }
struct ibv_mr *ibv_reg_mr_iova2(void *pd, void *addr, size_t len, uint64_t iova, unsigned access) { (void)pd; (void)iova; (void)access; return mk(addr, len, -1); }
struct ibv_mr *ibv_reg_dmabuf_mr(void *pd, uint64_t off, size_t len, uint64_t iova, int fd, int access) {
  (void)pd;
  if (fd < 0) { errno = EBADF; return NULL; }
  if ((access & 0x40) || (off & 0xfff) != (iova & 0xfff)) { errno = EINVAL; return NULL; }
  char p[64], line[256], exp[64] = ""; long size = -1; snprintf(p, sizeof p, "/proc/self/fdinfo/%d", fd);
  FILE *f = fopen(p, "r"); if (!f) { errno = EBADF; return NULL; }
  while (fgets(line, sizeof line, f)) { if (!strncmp(line, "exp_name:", 9)) sscanf(line + 9, "%63s", exp); if (!strncmp(line, "size:", 5)) size = atol(line + 5); }
  fclose(f);
  if (strcmp(exp, "nv_dmabuf") || size < 0 || off + len > (uint64_t)size) { errno = EINVAL; return NULL; }
  return mk((void *)(uintptr_t)off, len, fcntl(fd, F_DUPFD_CLOEXEC, 0));
}
int ibv_dereg_mr(struct ibv_mr *mr) { struct held *h = (struct held *)mr; if (h->fd >= 0) close(h->fd); free(h); return 0; }
