// gdrshim's exported cuMemAlloc_v2 while libcuda is loaded only RTLD_LOCAL, as cudart loads it
// (ours): the export must reach libcuda's own definition, which RTLD_NEXT cannot see.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
int main(int argc, char **argv) {
  if (argc < 2) return 2;
  void *h = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  void (*set_next)(uint64_t) = h ? (void (*)(uint64_t))dlsym(h, "fakecuda_set_next") : NULL;
  if (!set_next) return 2;
  set_next(0x1234000);
  int (*alloc)(uint64_t *, size_t) = (int (*)(uint64_t *, size_t))dlsym(RTLD_DEFAULT, "cuMemAlloc_v2");
  uint64_t p = 0;
  int rc = alloc ? alloc(&p, 4096) : -1;
  printf("rc=%d ptr=%#lx\n", rc, (unsigned long)p);
  return 0;
}
