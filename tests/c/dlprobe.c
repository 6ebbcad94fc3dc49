// A program probing whether CUDA or verbs is loaded (ours): dlsym(RTLD_DEFAULT, NAME) for each
// name gdrshim hooks, before and after the fake libcuda and libibverbs are loaded into the global
// scope. Prints one line per name and phase: "NAME before|after found|none DLERROR".
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

static const char *names[] = {"cuMemAlloc_v2", "cuGetProcAddress", "cuGetProcAddress_v2", "ibv_reg_mr",
                              "ibv_reg_dmabuf_mr", "mlx5dv_devx_umem_reg", NULL};

static void probe(const char *phase) {
  for (int i = 0; names[i]; i++) {
    dlerror();
    void *p = dlsym(RTLD_DEFAULT, names[i]);
    const char *e = dlerror();
    printf("%s %s %s %s\n", names[i], phase, p ? "found" : "none", e ? e : "-");
  }
}

int main(void) {
  probe("before");
  const char *cuda = getenv("FAKE_LIBCUDA");
  if (!cuda || !dlopen(cuda, RTLD_NOW | RTLD_GLOBAL) || !dlopen("libibverbs.so.1", RTLD_NOW | RTLD_GLOBAL) ||
      !dlopen("libmlx5.so.1", RTLD_NOW | RTLD_GLOBAL)) {
    fprintf(stderr, "dlopen: %s\n", dlerror());
    return 2;
  }
  probe("after");
  return 0;
}
