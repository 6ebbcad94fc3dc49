// The rig's NIC as a program reaches it (ours, test only): under rdma-core's own libibverbs, a PD
// on its one device (the fake NIC as rdma-core's provider, rigprovider.c); under fakeverbs.c as the
// libibverbs (an rdma-core older than 34, or one with ibv_reg_mr_ex), none is needed: any PD will do.
#pragma once
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// rdma-core opens its provider RTLD_LOCAL; the fake NIC's switches and counters (fakeverbs_*,
// found with dlsym(RTLD_DEFAULT) by the programs and the stand-in libmlx5, as with fakeverbs.c as
// the libibverbs) are made global. Its ibv_* stay hidden (rigprovider.map): rdma-core's are seen.
static inline void rig_nic_switches_global(void) {
  const char *drivers = getenv("RDMAV_DRIVERS");
  char path[4096];
  if (!drivers || snprintf(path, sizeof path, "%.*s-rdmav34.so", (int)strcspn(drivers, ":"), drivers) >= (int)sizeof path ||
      !dlopen(path, RTLD_NOW | RTLD_NOLOAD | RTLD_GLOBAL)) {
    fprintf(stderr, "rdma-core's libibverbs: the rig's provider (RDMAV_DRIVERS=%s) is not loaded\n", drivers ? drivers : "");
    exit(2);
  }
}

// The PD every registration names (and its context in *ctx): the NIC's under rdma-core's
// libibverbs `vh`, made as a program makes one; `fallback` where `vh` is fakeverbs.c (no
// ibv_get_device_list). Exits 2 where rdma-core finds no NIC.
static inline void *rig_nic_pd(void *vh, void **ctx, void *fallback) {
  void **(*list)(int *) = (void **(*)(int *))dlvsym(vh, "ibv_get_device_list", "IBVERBS_1.1");
  if (!list) { *ctx = fallback; return fallback; }
  void *(*open_device)(void *) = (void *(*)(void *))dlvsym(vh, "ibv_open_device", "IBVERBS_1.1");
  void *(*alloc_pd)(void *) = (void *(*)(void *))dlvsym(vh, "ibv_alloc_pd", "IBVERBS_1.1");
  int n = 0;
  void **l = list(&n);
  *ctx = l && n == 1 && open_device ? open_device(l[0]) : NULL;
  void *pd = *ctx && alloc_pd ? alloc_pd(*ctx) : NULL;
  if (!pd) { fprintf(stderr, "rdma-core's libibverbs: no PD on the rig's NIC (%d devices)\n", n); exit(2); }
  rig_nic_switches_global();
  return pd;
}
