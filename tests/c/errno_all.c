// Every hooked call with errno set to a marker before it (ours): prints rc and errno after each,
// so a run without the shim and a run with it can be compared line by line.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/ioctl.h>
#include <unistd.h>
#include "rignic.h"
extern void *ibv_reg_mr(void *pd, void *addr, size_t len, int access);
extern int ibv_dereg_mr(void *mr);
#define MARK 12345
#define CALL(name, expr) do { errno = MARK; long r_ = (long)(expr); printf("%-22s rc=%ld errno=%d\n", name, r_ < 0 ? r_ : (r_ > 0 ? 1L : 0L), errno); } while (0)
int main(int argc, char **argv) {
  (void)argc;
  const char *d = getenv("GDRSHIM_TEST_DEV_DIR"); char p[4096];
  snprintf(p, sizeof p, "%s/nvidiactl", d);
  int ctl;
  CALL("open nvidiactl", (ctl = open(p, O_RDWR)) >= 0);
  CALL("open missing", open("/nonexistent/x", O_RDONLY));
  CALL("open64 missing", open64("/nonexistent/x", O_RDONLY));
  CALL("openat missing", openat(AT_FDCWD, "/nonexistent/x", O_RDONLY));
  CALL("openat64 missing", openat64(AT_FDCWD, "/nonexistent/x", O_RDONLY));
  CALL("close bad", close(-1));
  CALL("dup bad", dup(-1));
  CALL("dup2 bad", dup2(-1, 50));
  CALL("dup3 same", dup3(ctl, ctl, 0));
  CALL("fcntl dupfd bad", fcntl(-1, F_DUPFD, 0));
  int c2;
  CALL("fcntl dupfd ok", (c2 = fcntl(ctl, F_DUPFD_CLOEXEC, 10)) >= 0);
  unsigned char a[32] = {0};
  CALL("ioctl bad fd", ioctl(-1, 0xC020462A, a));
  CALL("ioctl nv refused", ioctl(ctl, 0xC020462A, a));
  CALL("ioctl nv dup refused", ioctl(c2, 0xC020462A, a));
  CALL("access missing", access("/nonexistent/x", F_OK));
  CALL("access nv_mem", access("/sys/kernel/mm/memory_peers/nv_mem/version", F_OK));
  CALL("access ok", access("/", F_OK));
  void *cu = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  CALL("dlsym missing", dlsym(RTLD_DEFAULT, "no_such_symbol_anywhere") != NULL);
  CALL("dlvsym missing", dlvsym(RTLD_DEFAULT, "ibv_reg_mr", "NO_SUCH_VERSION") != NULL);
  int (*gpa)(const char *, void **, int, uint64_t, int *) = (int (*)(const char *, void **, int, uint64_t, int *))dlsym(cu, "cuGetProcAddress_v2");
  void *fn = NULL; int st = 0;
  CALL("cuGetProcAddress", gpa("cuMemAlloc", &fn, 13000, 0, &st));
  uint64_t dp = 0;
  CALL("cuMemAlloc", ((int (*)(uint64_t *, size_t))fn)(&dp, 4096));
  gpa("cuDeviceGetAttribute", &fn, 13000, 0, &st);
  int v = -1;
  CALL("cuDeviceGetAttribute", ((int (*)(int *, int, int))fn)(&v, 116, 0));
  static char host[4096] __attribute__((aligned(4096)));
  void *mr, *nic = NULL;
  // the PD of the rig's NIC, through rdma-core's libibverbs (the one this program is linked to)
  void *pd = rig_nic_pd(dlopen("libibverbs.so.1", RTLD_NOW | RTLD_NOLOAD), &nic, NULL);
  CALL("ibv_reg_mr host", (mr = ibv_reg_mr(pd, host, sizeof host, 0xf)) != NULL);
  CALL("ibv_dereg_mr", ibv_dereg_mr(mr));
  CALL("ibv_reg_mr gpu miss", ibv_reg_mr(pd, (void *)0x7f0000000000ull, 4096, 0xf) != NULL);
  CALL("close ok", close(c2));
  CALL("close ctl", close(ctl));
  return 0;
}
