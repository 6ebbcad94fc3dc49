// A copy of libgdrshim.so loaded with dlopen instead of preloaded (ours): its hooks see nothing,
// so it must never claim to register. Prints what its own query functions answer.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
int main(int argc, char **argv) {
  if (argc < 2) return 2;
  void *h = dlopen(argv[1], RTLD_NOW | (argc > 2 ? RTLD_GLOBAL : RTLD_LOCAL));
  if (!h) { fprintf(stderr, "%s\n", dlerror()); return 2; }
  int (*mode)(void) = (int (*)(void))dlsym(h, "gdrshim_mode");
  int (*active)(void) = (int (*)(void))dlsym(h, "gdrshim_gdr_active");
  int m = mode(), a = active();
  printf("dlopened mode=%d gdr_active=%d\n", m, a);
  return 0;
}
