// Replays a gdrshim capture as a program would issue it (ours): each recorded ioctl is issued on
// the matching fake device node with a zeroed argument (and a zeroed parameter buffer behind the
// parameter pointer), so everything the shim decodes comes from the fake driver; each recorded
// user allocation is made through libcuda's cuGetProcAddress_v2, reached with dlopen + dlsym as
// cudart does.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <unistd.h>

typedef int (*gpa_t)(const char *, void **, int, uint64_t, int *);
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
  while (getline(&line, &cap, f) > 0) {
    n++;
    if (line[0] == 'I') {
      char dev[8]; int fd, rc, off = 0; unsigned long req;
      if (sscanf(line, "I %7s %d %lx %d %n", dev, &fd, &req, &rc, &off) < 4) continue;
      size_t an = strcspn(line + off, " \n") / 2;
      uint8_t *arg = calloc(an + 8, 1); uint8_t *params = NULL;
      char *pp = strstr(line + off, " P ");
      if (pp) { long po; int o2; if (sscanf(pp, " P %ld %n", &po, &o2) == 1) { size_t pn = strcspn(pp + o2, " \n") / 2; params = calloc(pn + 8, 1); uint64_t v = (uintptr_t)params; memcpy(arg + po, &v, 8); } }
      int use = dev[0] == 'u' ? uvm : dev[0] == 'g' ? gpu : (ioctls % 2 ? ctl2 : ctl);
      int r = ioctl(use, req, arg);
      if (r != rc) failures++;
      ioctls++;
      free(arg); free(params);
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
  printf("player lines=%ld ioctls=%ld rc_mismatch=%ld\n", n, ioctls, failures);
  return failures ? 1 : 0;
}
