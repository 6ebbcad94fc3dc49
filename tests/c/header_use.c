// Uses every function of include/gdrshim.h through its dlsym wrappers (ours). With argument
// "VA LEN" it also registers and unregisters that range. Prints one key=value line.
#include "../../include/gdrshim.h"
#include <stdio.h>
#include <stdlib.h>
int main(int argc, char **argv) {
  const char *v = gdrshim_dl_version();
  struct gdrshim_backing b = {0};
  struct gdrshim_counters c = {0};
  int host = 0;
  int lk = gdrshim_dl_lookup((uint64_t)(uintptr_t)&host, 4, &b);
  int64_t hreg = gdrshim_dl_register((uint64_t)(uintptr_t)&host, 4);
  int64_t reg = 0; int unreg = 0, unreg_again = 0;
  if (argc == 3) {
    reg = gdrshim_dl_register(strtoull(argv[1], 0, 16), strtoull(argv[2], 0, 16));
    unreg = gdrshim_dl_unregister(reg);
    unreg_again = gdrshim_dl_unregister(reg);
  }
  int cn = gdrshim_dl_counters(&c, sizeof c);
  gdrshim_dl_mark("header_use");
  printf("version=%s mode=%d active=%d lookup_host=%d register_host=%lld register=%lld unregister=%d unregister_again=%d counters=%d registered=%llu unregistered=%llu abi=%d\n",
         v ? v : "none", gdrshim_dl_mode(), gdrshim_dl_gdr_active(), lk, (long long)hreg, (long long)reg, unreg, unreg_again, cn,
         (unsigned long long)c.registered, (unsigned long long)c.unregistered, GDRSHIM_QUERY_ABI);
  return 0;
}
