// DIR/bin/fwcopier LIBCUDA (ours, test only): the copier of one lab process, started by its wire
// (fakewire_copier.c) with posix_spawn when its first GPU MR is registered. It does that
// process's GPU copies in a CUDA context of its own, in a process of its own: on the GPU, no copy
// of the program's own process (another stream, another context) finishes while a thread of it is
// blocked in a pageable copy behind a kernel that waits for the very bytes (tests/gpu/
// blocked_copy.cu), and a NIC writes GPU memory without the program's CUDA at all. LIBCUDA is
// the path of the libcuda the program loaded (the real one, or the lab's stand-in in CI).
// fd 3 is its end of a SOCK_SEQPACKET socketpair (fwcopier.h says what is said), fd 4 the staging
// memfd the wire maps too. Each allocation the wire hands over (a CUDA IPC handle, or a VMM
// allocation's POSIX fd) is mapped here once; copies name program addresses, which the table
// turns into this process's. It ends when the wire's end closes (the program exited).
#define _GNU_SOURCE
#include "fwcopier.h"
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

typedef unsigned long long dptr_t; // CUdeviceptr, CUmemGenericAllocationHandle
typedef struct {
  char reserved[64];
} ipc_handle; // CUipcMemHandle, passed by value
typedef struct {
  int type, id;  // CUmemLocation: CU_MEM_LOCATION_TYPE_DEVICE (1), the ordinal
  unsigned flags; // CU_MEM_ACCESS_FLAGS_PROT_READWRITE (3)
} access_desc; // CUmemAccessDesc
static int (*cu_init)(unsigned);
static int (*cu_retain)(void **, int);
static int (*cu_set_ctx)(void *);
static int (*cu_stream_create)(void **, unsigned);
static int (*cu_memcpy_async)(dptr_t, dptr_t, size_t, void *);
static int (*cu_stream_sync)(void *);
static int (*cu_host_register)(void *, size_t, unsigned);
static int (*cu_ipc_open)(dptr_t *, ipc_handle, unsigned);
static int (*cu_ipc_close)(dptr_t);
static int (*cu_import)(dptr_t *, void *, int, unsigned long long);
static int (*cu_reserve)(dptr_t *, size_t, size_t, dptr_t, unsigned long long);
static int (*cu_map)(dptr_t, size_t, size_t, dptr_t, unsigned long long);
static int (*cu_set_access)(dptr_t, size_t, const access_desc *, size_t);
static int (*cu_unmap)(dptr_t, size_t);
static int (*cu_release)(dptr_t);
static int (*cu_addr_free)(dptr_t, size_t);

#define MAXDEV 64
static struct {
  void *ctx, *stream;
} dev[MAXDEV];
static uint8_t *staging;
// The program's allocations this process has mapped: program base -> its address here.
#define MAXIMP 4096
static struct {
  uint64_t base, size, here, vmm; // vmm: the imported allocation handle (0: an IPC mapping)
  int device;
} imp[MAXIMP];

static int on_device(int d) { // d's primary context current, with its stream; 0 or a CUresult
  if (d < 0 || d >= MAXDEV) return 101; // CUDA_ERROR_INVALID_DEVICE
  int rc = 0;
  if (!dev[d].ctx) {
    void *c = NULL, *s = NULL;
    // CU_STREAM_NON_BLOCKING (1); the staging area pinned for every context (PORTABLE, 1)
    if ((rc = cu_retain(&c, d)) || (rc = cu_set_ctx(c)) || (rc = cu_stream_create(&s, 1))) return rc;
    static int pinned;
    if (!pinned && cu_host_register) pinned = !cu_host_register(staging, FWC_STAGING, 1);
    dev[d].ctx = c;
    dev[d].stream = s;
  }
  return cu_set_ctx(dev[d].ctx);
}
static int slot_of(uint64_t a, uint64_t n) {
  for (int i = 0; i < MAXIMP; i++)
    if (imp[i].size && a >= imp[i].base && n <= imp[i].size && a - imp[i].base <= imp[i].size - n)
      return i;
  return -1;
}
static void forget(int i) { // an import of the same base, replaced (the program freed and reallocated)
  if (on_device(imp[i].device)) return;
  if (imp[i].vmm) {
    cu_unmap(imp[i].here, imp[i].size);
    cu_release(imp[i].vmm);
    cu_addr_free(imp[i].here, imp[i].size);
  } else {
    cu_ipc_close(imp[i].here);
  }
  imp[i].size = 0;
}
static int import(const fwc_req *q, int fd) {
  for (int i = 0; i < MAXIMP; i++)
    if (imp[i].size && imp[i].base == q->base) forget(i);
  int i, rc;
  for (i = 0; i < MAXIMP && imp[i].size; i++) {
  }
  if (i == MAXIMP) return 2; // CUDA_ERROR_OUT_OF_MEMORY
  if ((rc = on_device(q->device))) return rc;
  dptr_t here = 0, h = 0;
  if (q->op == FWC_IMPORT_IPC) {
    ipc_handle ih;
    memcpy(ih.reserved, q->ipc, 64);
    rc = cu_ipc_open(&here, ih, 1); // CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS
  } else if (!cu_import || !cu_reserve || !cu_map || !cu_set_access) {
    rc = 500; // CUDA_ERROR_NOT_FOUND: this libcuda has no VMM
  } else {
    access_desc a = {1, q->device, 3};
    // CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR (1): the fd is the handle
    rc = cu_import(&h, (void *)(uintptr_t)fd, 1, 0);
    if (!rc && (rc = cu_reserve(&here, q->size, 0, 0, 0))) cu_release(h);
    else if (!rc && ((rc = cu_map(here, q->size, 0, h, 0)) || (rc = cu_set_access(here, q->size, &a, 1)))) {
      cu_unmap(here, q->size);
      cu_release(h);
      cu_addr_free(here, q->size);
    }
  }
  if (!rc) {
    imp[i].base = q->base;
    imp[i].size = q->size;
    imp[i].here = here;
    imp[i].vmm = h;
    imp[i].device = q->device;
  }
  return rc;
}
// The program's [a, a+n) here, its device current: 0 where no import holds it.
static dptr_t here_of(uint64_t a, uint64_t n, int *device) {
  int i = slot_of(a, n);
  if (i < 0) return 0;
  *device = imp[i].device;
  return imp[i].here + (a - imp[i].base);
}
static int copy(const fwc_req *q) {
  int d = -1, d2 = -1, rc;
  dptr_t dst = q->op == FWC_G2H ? (uintptr_t)staging : here_of(q->dst, q->n, &d);
  dptr_t src = q->op == FWC_H2G ? (uintptr_t)staging : here_of(q->src, q->n, &d2);
  if (d < 0) d = d2;
  if (!dst || !src || q->n > (q->op == FWC_G2G ? ~0ull : FWC_STAGING)) return -1;
  if ((rc = on_device(d))) return rc;
  if ((rc = cu_memcpy_async(dst, src, q->n, dev[d].stream))) return rc;
  return cu_stream_sync(dev[d].stream);
}
static void *sym(void *lib, const char *a, const char *b) {
  void *f = dlsym(lib, a);
  return f || !b ? f : dlsym(lib, b);
}
int main(int argc, char **argv) {
  void *lib = argc == 2 ? dlopen(argv[1], RTLD_NOW | RTLD_LOCAL) : NULL;
  if (!lib) {
    fprintf(stderr, "fwcopier: usage: fwcopier LIBCUDA (%s)\n", dlerror());
    return 2;
  }
  *(void **)&cu_init = sym(lib, "cuInit", NULL);
  *(void **)&cu_retain = sym(lib, "cuDevicePrimaryCtxRetain", NULL);
  *(void **)&cu_set_ctx = sym(lib, "cuCtxSetCurrent", NULL);
  *(void **)&cu_stream_create = sym(lib, "cuStreamCreate", NULL);
  *(void **)&cu_memcpy_async = sym(lib, "cuMemcpyAsync", NULL);
  *(void **)&cu_stream_sync = sym(lib, "cuStreamSynchronize", NULL);
  *(void **)&cu_host_register = sym(lib, "cuMemHostRegister_v2", "cuMemHostRegister");
  *(void **)&cu_ipc_open = sym(lib, "cuIpcOpenMemHandle_v2", "cuIpcOpenMemHandle");
  *(void **)&cu_ipc_close = sym(lib, "cuIpcCloseMemHandle", NULL);
  *(void **)&cu_import = sym(lib, "cuMemImportFromShareableHandle", NULL);
  *(void **)&cu_reserve = sym(lib, "cuMemAddressReserve", NULL);
  *(void **)&cu_map = sym(lib, "cuMemMap", NULL);
  *(void **)&cu_set_access = sym(lib, "cuMemSetAccess", NULL);
  *(void **)&cu_unmap = sym(lib, "cuMemUnmap", NULL);
  *(void **)&cu_release = sym(lib, "cuMemRelease", NULL);
  *(void **)&cu_addr_free = sym(lib, "cuMemAddressFree", NULL);
  staging = mmap(NULL, FWC_STAGING, PROT_READ | PROT_WRITE, MAP_SHARED, FWC_STAGING_FD, 0);
  if (!cu_init || !cu_retain || !cu_set_ctx || !cu_stream_create || !cu_memcpy_async ||
      !cu_stream_sync || !cu_ipc_open || !cu_ipc_close || staging == MAP_FAILED || cu_init(0)) {
    fprintf(stderr, "fwcopier: %s has not what a copier needs, or no staging area\n", argv[1]);
    return 1;
  }
  for (;;) {
    fwc_req q;
    int fd = -1;
    char cbuf[CMSG_SPACE(sizeof(int))];
    struct iovec io = {&q, sizeof q};
    struct msghdr m = {.msg_iov = &io, .msg_iovlen = 1, .msg_control = cbuf, .msg_controllen = sizeof cbuf};
    ssize_t k = recvmsg(FWC_SOCK_FD, &m, MSG_CMSG_CLOEXEC);
    if (k <= 0) return 0; // the program is gone
    struct cmsghdr *c = CMSG_FIRSTHDR(&m);
    if (c && c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) memcpy(&fd, CMSG_DATA(c), sizeof fd);
    fwc_rsp r = {-1};
    if (k == sizeof q && (q.op == FWC_IMPORT_IPC || q.op == FWC_IMPORT_FD)) r.rc = import(&q, fd);
    else if (k == sizeof q && q.op >= FWC_H2G && q.op <= FWC_G2G) r.rc = copy(&q);
    if (fd >= 0) close(fd); // an imported allocation keeps its memory; the fd is not needed
    if (send(FWC_SOCK_FD, &r, sizeof r, MSG_NOSIGNAL) != sizeof r) return 0;
  }
}
