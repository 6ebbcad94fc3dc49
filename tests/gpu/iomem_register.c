// Does cuMemHostRegister(CU_MEMHOSTREGISTER_IOMEMORY) of a PCI device's BAR page work on this
// GPU, and under which conditions (docs/gpu-initiated-networking.md)? Maps one page of
// /sys/bus/pci/devices/BDF/resourceN (root, as a NIC doorbell page is mapped for GPU-initiated
// networking), registers it with libcuda as I/O memory and asks for its device pointer.
// Prints one line: "iomem bdf=... bar=... register=CUresult devptr=CUresult|0x..." (0 = works).
//   cc -O1 -o iomem_register tests/gpu/iomem_register.c -ldl
//   sudo ./iomem_register 0000:3b:00.0 0
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>
#define CU_MEMHOSTREGISTER_DEVICEMAP 0x02
#define CU_MEMHOSTREGISTER_IOMEMORY 0x04
typedef int (*init_t)(unsigned);
typedef int (*dev_t_)(int *, int);
typedef int (*ctx_t)(void **, unsigned, int);
typedef int (*reg_t)(void *, size_t, unsigned);
typedef int (*ptr_t)(uint64_t *, void *, unsigned);
typedef int (*unreg_t)(void *);
int main(int argc, char **argv) {
  if (argc < 3) { fprintf(stderr, "usage: %s PCI_BDF BAR\n", argv[0]); return 2; }
  char path[256]; snprintf(path, sizeof path, "/sys/bus/pci/devices/%s/resource%s", argv[1], argv[2]);
  int fd = open(path, O_RDWR | O_SYNC);
  if (fd < 0) { perror(path); return 2; }
  long page = sysconf(_SC_PAGESIZE);
  void *bar = mmap(NULL, page, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0); // a VM_IO | VM_PFNMAP VMA
  if (bar == MAP_FAILED) { perror("mmap"); return 2; }
  void *cu = dlopen("libcuda.so.1", RTLD_NOW);
  if (!cu) { fprintf(stderr, "%s\n", dlerror()); return 2; }
  init_t init = (init_t)dlsym(cu, "cuInit"); dev_t_ get = (dev_t_)dlsym(cu, "cuDeviceGet");
  ctx_t ctx = (ctx_t)dlsym(cu, "cuDevicePrimaryCtxRetain"); reg_t reg = (reg_t)dlsym(cu, "cuMemHostRegister_v2");
  ptr_t dptr = (ptr_t)dlsym(cu, "cuMemHostGetDevicePointer_v2"); unreg_t unreg = (unreg_t)dlsym(cu, "cuMemHostUnregister");
  int (*setctx)(void *) = (int (*)(void *))dlsym(cu, "cuCtxSetCurrent");
  int dev = 0; void *c = NULL;
  if (init(0) || get(&dev, 0) || ctx(&c, 0, dev) || setctx(c)) { fprintf(stderr, "no CUDA device\n"); return 2; }
  int r = reg(bar, page, CU_MEMHOSTREGISTER_IOMEMORY | CU_MEMHOSTREGISTER_DEVICEMAP);
  uint64_t d = 0; int rp = r ? -1 : dptr(&d, bar, 0);
  printf("iomem bdf=%s bar=%s register=%d devptr=%d va=%#llx\n", argv[1], argv[2], r, rp, (unsigned long long)d);
  if (!r) unreg(bar);
  return r != 0;
}
