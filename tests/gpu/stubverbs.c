// Test-only stand-in for the NIC (ours): a libibverbs.so.1 whose registrations succeed and hand
// back an MR. ibv_reg_dmabuf_mr plays the kernel's checks a real one makes on the buffer: it
// must be an nv_dmabuf (fdinfo exp_name) at least offset+len long, with the iova's page offset;
// the MR holds its own reference (a dup of the fd) until ibv_dereg_mr, as the RDMA core does, so
// the buffer (and the GPU memory RM keeps for it) lives exactly as long as the MR. Versioned like
// rdma-core, so NCCL-style dlvsym lookups work.
// For gdrshim-tool selftest it is also the HCA of tests/c/selftestqp.c (one RoCE port, CQ, RC QP
// connected to itself), whose RDMA WRITE/READ copy between the registered ranges with libcuda
// (cuMemcpyHtoD/DtoH/DtoD by each address's memory type, then cuCtxSynchronize): real GPU memory,
// every byte checked by the tool. Its port says EDR 1x (25 Gb/s) unless SELFTESTVERBS_SPEED/_WIDTH.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#define ST_DEF_SPEED 32 // EDR
#define ST_DEF_WIDTH 1  // 1x
#include "../c/selftestqp.c"

typedef int (*cu_ptr_attr_t)(void *, int, uint64_t);
typedef int (*cu_copy_t)(uint64_t, uint64_t, size_t);
typedef int (*cu_sync_t)(void);
static cu_ptr_attr_t cu_attr;
static cu_copy_t cu_htod, cu_dtoh, cu_dtod; // (dst, src, n) as integers: HtoD's src and DtoH's dst are host pointers
static cu_sync_t cu_sync;
static int cu_ready(void) {
  if (cu_attr) return 1;
  void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  if (!h) return 0;
  cu_htod = (cu_copy_t)dlsym(h, "cuMemcpyHtoD_v2"); cu_dtoh = (cu_copy_t)dlsym(h, "cuMemcpyDtoH_v2");
  cu_dtod = (cu_copy_t)dlsym(h, "cuMemcpyDtoD_v2"); cu_sync = (cu_sync_t)dlsym(h, "cuCtxSynchronize");
  if (!cu_htod || !cu_dtoh || !cu_dtod || !cu_sync) return 0;
  cu_attr = (cu_ptr_attr_t)dlsym(h, "cuPointerGetAttribute");
  return cu_attr != NULL;
}
// CU_POINTER_ATTRIBUTE_MEMORY_TYPE (2) is CU_MEMORYTYPE_DEVICE (2); host memory CUDA does not know is an error
static int on_gpu(const void *p) { unsigned t = 0; return !cu_attr(&t, 2, (uint64_t)(uintptr_t)p) && t == 2; }
static int COPY(void *dst, const void *src, size_t n) {
  if (!cu_ready()) return -1; // no libcuda in this process: nothing can move GPU memory
  int d = on_gpu(dst), s = on_gpu(src), r;
  uint64_t D = (uint64_t)(uintptr_t)dst, S = (uint64_t)(uintptr_t)src;
  if (!d && !s) { memcpy(dst, src, n); return 0; }
  r = d && s ? cu_dtod(D, S, n) : d ? cu_htod(D, S, n) : cu_dtoh(D, S, n);
  return r || cu_sync();
}

struct ibv_mr *ibv_reg_mr(void *pd, void *addr, size_t len, int access) { return st_mr_new(pd, addr, (uint64_t)(uintptr_t)addr, len, access, -1); }
struct ibv_mr *ibv_reg_mr_iova2(void *pd, void *addr, size_t len, uint64_t iova, unsigned access) { return st_mr_new(pd, addr, iova, len, (int)access, -1); }
struct ibv_mr *ibv_reg_dmabuf_mr(void *pd, uint64_t off, size_t len, uint64_t iova, int fd, int access) {
  if (fd < 0) { errno = EBADF; return NULL; }
  if ((access & 0x40) || (off & 0xfff) != (iova & 0xfff)) { errno = EINVAL; return NULL; }
  char p[64], line[256], exp[64] = ""; long size = -1; snprintf(p, sizeof p, "/proc/self/fdinfo/%d", fd);
  FILE *f = fopen(p, "r"); if (!f) { errno = EBADF; return NULL; }
  while (fgets(line, sizeof line, f)) { if (!strncmp(line, "exp_name:", 9)) sscanf(line + 9, "%63s", exp); if (!strncmp(line, "size:", 5)) size = atol(line + 5); }
  fclose(f);
  if (strcmp(exp, "nv_dmabuf") || size < 0 || off + len > (uint64_t)size) { errno = EINVAL; return NULL; }
  // mr->addr is the offset, as rdma-core sets it; the QP addresses the MR by iova
  return st_mr_new(pd, (void *)(uintptr_t)off, iova, len, access, fcntl(fd, F_DUPFD_CLOEXEC, 0));
}
int ibv_dereg_mr(struct ibv_mr *mr) { st_mr_free(mr); return 0; }
