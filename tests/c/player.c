// Replays a gdrshim capture as a program would issue it (ours): each recorded ioctl is issued on
// the matching fake device node with the recorded argument as input and a zeroed parameter buffer
// behind the parameter pointer, so every parameter the shim decodes comes from the fake driver; each recorded
// user allocation is made through libcuda's cuGetProcAddress_v2, reached with dlopen + dlsym as
// cudart does.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <unistd.h>
#include "../../include/gdrshim.h"

typedef int (*gpa_t)(const char *, void **, int, uint64_t, int *);
// Verbs consumers: linked directly (like perftest) and through dlopen + dlvsym (like NCCL).
extern void *ibv_reg_mr(void *pd, void *addr, size_t len, int access) __attribute__((weak));
extern int ibv_dereg_mr(void *mr) __attribute__((weak));
typedef void *(*reg_t)(void *, void *, size_t, int);
typedef void *(*reg2_t)(void *, void *, size_t, uint64_t, unsigned);
typedef void *(*dmabuf_t)(void *, uint64_t, size_t, uint64_t, int, int);
typedef int (*dereg_t)(void *);
typedef int (*rereg_t)(void *, int, void *, void *, size_t, int);
int main(int argc, char **argv) {
  if (argc < 3) { fprintf(stderr, "usage: player CAPTURE FAKE_LIBCUDA\n"); return 2; }
  const char *d = getenv("GDRSHIM_TEST_DEV_DIR"); char p[4096];
  snprintf(p, sizeof p, "%s/nvidiactl", d); int ctl = open(p, O_RDWR);
  snprintf(p, sizeof p, "%s/nvidia-uvm", d); int uvm = open(p, O_RDWR);
  snprintf(p, sizeof p, "%s/nvidia0", d); int gpu = openat(AT_FDCWD, p, O_RDWR);
  int ctl2 = dup(ctl); // the shim must follow dups
  void *cu = dlopen(argv[2], RTLD_NOW | RTLD_LOCAL);
  if (!cu) { fprintf(stderr, "dlopen: %s\n", dlerror()); return 2; }
  gpa_t gpa = (gpa_t)dlsym(cu, "cuGetProcAddress_v2");
  void (*set_next)(uint64_t) = (void (*)(uint64_t))dlsym(cu, "fakecuda_set_next");
  FILE *f = fopen(argv[1], "r"); if (!f) return 2;
  char *line = NULL; size_t cap = 0; long n = 0, ioctls = 0, failures = 0;
  rereg_t vrereg = NULL;
  void *vh = NULL; reg_t vreg = NULL; reg2_t vreg2 = NULL; dereg_t vdereg = NULL; dmabuf_t vdmabuf = NULL;
  void *mrs[256] = {0}; int nmr = 0; long verbs_ok = 0, verbs_bad = 0;
  static char host_buf[1 << 16] __attribute__((aligned(4096)));
  while (getline(&line, &cap, f) > 0) {
    n++;
    if (line[0] == 'I') {
      char dev[8]; int fd, rc, off = 0; unsigned long req;
      if (sscanf(line, "I %7s %d %lx %d %n", dev, &fd, &req, &rc, &off) < 4) continue;
      size_t an = strcspn(line + off, " \n") / 2;
      // The input a program would pass is what the call's record shows (inputs stay as given);
      // the fake driver then writes the recorded results over it.
      uint8_t *arg = calloc(an + 8, 1); uint8_t *params = NULL;
      for (size_t i = 0; i < an; i++) { unsigned v; sscanf(line + off + 2 * i, "%2x", &v); arg[i] = v; }
      char *pp = strstr(line + off, " P ");
      if (pp) { long po; int o2; if (sscanf(pp, " P %ld %n", &po, &o2) == 1) { size_t pn = strcspn(pp + o2, " \n") / 2; params = calloc(pn + 8, 1); uint64_t v = (uintptr_t)params; memcpy(arg + po, &v, 8); } }
      int use = dev[0] == 'u' ? uvm : dev[0] == 'g' ? gpu : (ioctls % 2 ? ctl2 : ctl);
      int r = ioctl(use, req, arg);
      if (r != rc) failures++;
      ioctls++;
      free(arg); free(params);
    } else if (line[0] == 'R' || line[0] == 'D' || line[0] == 'X' || line[0] == 'E') {
      if (!vh) {
        vh = dlopen("libibverbs.so.1", RTLD_NOW | RTLD_LOCAL);
        if (!vh) { fprintf(stderr, "dlopen libibverbs.so.1: %s\n", dlerror()); return 2; }
        vreg = (reg_t)dlvsym(vh, "ibv_reg_mr", "IBVERBS_1.1");
        vreg2 = (reg2_t)dlvsym(vh, "ibv_reg_mr_iova2", "IBVERBS_1.8");
        vdereg = (dereg_t)dlvsym(vh, "ibv_dereg_mr", "IBVERBS_1.1");
        vdmabuf = (dmabuf_t)dlvsym(vh, "ibv_reg_dmabuf_mr", "IBVERBS_1.12");
        vrereg = (rereg_t)dlvsym(vh, "ibv_rereg_mr", "IBVERBS_1.1");
      }
      char how[16], expect[16]; unsigned long long ptr, len; int id;
      if (line[0] == 'R' && sscanf(line, "R %d %15s %llx %llx %15s", &id, how, &ptr, &len, expect) == 5 && id >= 0 && id < 256) {
        void *addr = !strcmp(how, "host") ? (void *)host_buf : (void *)(uintptr_t)ptr;
        void *mr = !strcmp(how, "direct") || !strcmp(how, "host") ? ibv_reg_mr(0, addr, len, 0xf)
                 : !strcmp(how, "iova2") ? vreg2(0, addr, len, (uint64_t)(uintptr_t)addr, 0x10000f)
                 : vreg(0, addr, len, 0xf);
        int ok = mr != NULL;
        if (!strcmp(expect, "any") || ok == !strcmp(expect, "ok")) verbs_ok++; else { verbs_bad++; fprintf(stderr, "UNEXPECTED %s", line); }
        mrs[id] = mr;
      } else if (line[0] == 'E' && sscanf(line, "E %d %llx %llx %15s", &id, &ptr, &len, expect) == 4 && id >= 0 && id < 256 && mrs[id]) {
        int r = vrereg(mrs[id], 1, 0, (void *)(uintptr_t)ptr, len, 0xf);
        if (!strcmp(expect, "any") || (r == 0) == !strcmp(expect, "ok")) verbs_ok++; else { verbs_bad++; fprintf(stderr, "UNEXPECTED %s", line); }
      } else if (line[0] == 'D' && sscanf(line, "D %d", &id) == 1 && id >= 0 && id < 256 && mrs[id]) {
        if (vdereg(mrs[id])) verbs_bad++;
        mrs[id] = NULL;
      } else if (line[0] == 'X') {
        // the program's own dma-buf MR goes to the NIC unchanged: fd 3 is no buffer of the
        // driver's, and the NIC's refusal (EINVAL) comes back as it is
        errno = 0;
        void *mr = vdmabuf(0, 0, 4096, 0, 3, 0xf);
        if (mr) { verbs_bad++; vdereg(mr); } else if (errno != EINVAL) verbs_bad++;
      }
    } else if (line[0] == 'P') {
      // the explicit interface of include/gdrshim.h on a recorded allocation
      unsigned long long ptr, len;
      if (sscanf(line, "P %llx %llx", &ptr, &len) == 2) {
        int64_t h = gdrshim_dl_register(ptr, len);
        struct gdrshim_backing b = {0};
        int lk = gdrshim_dl_lookup(ptr, len, &b);
        int u = gdrshim_dl_unregister(h), u2 = gdrshim_dl_unregister(h);
        printf("explicit handle=%lld lookup=%d offset=%llu unregister=%d again=%d\n", (long long)h, lk, (unsigned long long)b.offset, u, u2);
      }
    } else if (line[0] == 'G') {
      // NCCL's two GDR probes: the driver attribute through cuGetProcAddress, the peer-memory file
      void *fn = NULL; int st = 0, v = -1;
      gpa("cuDeviceGetAttribute", &fn, 13000, 0, &st);
      int r = fn ? ((int (*)(int *, int, int))fn)(&v, 116, 0) : -1;
      errno = 777;
      int a = access("/sys/kernel/mm/memory_peers/nv_mem/version", F_OK);
      int ea = errno;
      printf("gdr_probe rc=%d attr=%d access=%d errno_after=%d\n", r, v, a, ea);
    } else if (line[0] == 'A') {
      char api[64]; unsigned long long ptr, len;
      if (sscanf(line, "A %63s %llx %llx", api, &ptr, &len) != 3) continue;
      set_next(ptr);
      void *fn = NULL; int st = 0; uint64_t out = 0; size_t pitch = 0;
      if (!strcmp(api, "cuMemAlloc_v2")) { gpa("cuMemAlloc", &fn, 13000, 0, &st); ((int (*)(uint64_t *, size_t))fn)(&out, len); }
      else if (!strcmp(api, "cuMemAllocPitch_v2")) { gpa("cuMemAllocPitch", &fn, 13000, 0, &st); ((int (*)(uint64_t *, size_t *, size_t, size_t, unsigned))fn)(&out, &pitch, len, 1, 4); }
      else if (!strcmp(api, "cuMemAllocAsync")) { gpa("cuMemAllocAsync", &fn, 13000, 0, &st); ((int (*)(uint64_t *, size_t, void *))fn)(&out, len, 0); }
      else if (!strcmp(api, "cuMemAllocFromPoolAsync")) { gpa("cuMemAllocFromPoolAsync", &fn, 13000, 0, &st); ((int (*)(uint64_t *, size_t, void *, void *))fn)(&out, len, 0, 0); }
      else if (!strcmp(api, "cuMemSetAccess")) { gpa("cuMemSetAccess", &fn, 13000, 0, &st); ((int (*)(uint64_t, size_t, const void *, size_t))fn)(ptr, len, 0, 1); }
    }
  }
  close(gpu); close(ctl2); close(uvm); close(ctl);
  int (*live)(void) = (int (*)(void))dlsym(RTLD_DEFAULT, "fakenv_live_registrations");
  unsigned long *p2p_err = (unsigned long *)dlsym(RTLD_DEFAULT, "fakenv_p2p_errors");
  printf("player lines=%ld ioctls=%ld rc_mismatch=%ld verbs_ok=%ld verbs_unexpected=%ld kernel_registrations_left=%d kernel_p2p_errors=%lu\n", n, ioctls, failures,
         verbs_ok, verbs_bad, live ? live() : -1, p2p_err ? *p2p_err : 0);
  return failures || verbs_bad ? 1 : 0;
}
