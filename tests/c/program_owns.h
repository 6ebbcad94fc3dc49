// A test program's mapping becomes an allocation of the program's own, as a CUDA program's does:
// through cuMemMap, which gdrshim hooks (ours). The fake drivers (fakerm.c, scalefake.c) stand in
// for libcuda's cuMemMap and cuMemUnmap; memory a test maps without this is CUDA's own memory to
// gdrshim, which it never registers or exports.
#pragma once
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
typedef int (*program_owns_t)(uint64_t, size_t, size_t, uint64_t, unsigned long long);
static void program_owns(uint64_t base, uint64_t len) {
  static program_owns_t cu_mem_map;
  if (!cu_mem_map) cu_mem_map = (program_owns_t)dlsym(RTLD_DEFAULT, "cuMemMap");
  if (!cu_mem_map || cu_mem_map(base, len, 0, 0, 0)) { fprintf(stderr, "no cuMemMap stand-in in the fake driver\n"); exit(2); }
}
