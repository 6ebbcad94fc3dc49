// One region's life in a worker of tests/c/stress.c (included once): its memory made, a random
// run of operations, then everything released in one of the orders CUDA uses or an odd one.
#pragma once

#define MB 0x100000ull

static uint64_t rbase(const lay_t *l) { return RBASE + (uint64_t)l->reg * RSIZE; }

// CUDA's 2 MiB chunk at R, carved; maybe a second one beside it whose first bytes are allocated
// (a range may run from one into the other); an exact allocation or an import of all or half
// of a mapping at R+4M; a VMM-like handle at R+6M; CUDA's own memory at R+5.5M.
static void build(lay_t *l) {
  uint64_t b = rbase(l);
  int gm = rnd(4) ? 1 << rnd(2) : 3;
  int a = new_chunk(l, b, MB2, gm, 0, 1);
  for (int i = 0, k = 1 + (int)rnd(4); a >= 0 && i < k; i++) carve(l);
  if (rnd(2)) {
    int c = new_chunk(l, b + MB2, MB2, gm, 0, 1);
    if (c >= 0) new_alloc(l, c, 0, page(1 + rnd(16)), (int)rnd(6), 0);
  }
  if (rnd(2)) {
    uint64_t len = K64 * (1 + rnd(16));
    int e = new_chunk(l, b + 4 * MB, len, 1 << rnd(2), 0, 1), how = (int)rnd(3);
    if (e >= 0) new_alloc(l, e, 0, how == 2 ? len / 2 : len, how ? 6 : (int)rnd(2), how != 0);
  }
  l->vmm = -1;
  if (rnd(2)) {
    l->vmm = new_chunk(l, b + 6 * MB, 8 * K64, 1 << rnd(2), 0, 1);
    if (l->vmm >= 0) new_alloc(l, l->vmm, 0, 8 * K64, 6 + (int)rnd(2), 1);
  }
  if (!rnd(4)) new_chunk(l, b + 5 * MB + MB / 2, 4 * K64, 1 << rnd(2), 1, 1);
}

// The program frees one allocation (cuMemFree, or cuMemUnmap of an import), mostly after its MRs.
static void free_one(lay_t *l) {
  int i = (int)rnd((unsigned)l->na);
  pal_t *a = &l->a[i];
  if (!a->live) return;
  freeing(l->reg, 1);
  if (rnd(10)) unreg_over(l, a->va, a->reach - a->va);
  cu_release(a->va, a->len, a->import);
  a->live = 0;
  freeing(l->reg, 0);
}

// The VMM handle: moved (cuMemUnmap, UVM unmap, mapped and cuMemMap'ed at the other place), or
// other memory (CUDA's) mapped over its middle.
static void vmm_op(lay_t *l) {
  if (l->vmm < 0) return;
  chunk_t *c = &l->c[l->vmm];
  int ai = -1;
  for (int i = 0; i < l->na; i++)
    if (l->a[i].live && l->a[i].chunk == l->vmm) ai = i;
  if (ai < 0) return;
  count(K_REMAP);
  freeing(l->reg, 1);
  if (rnd(5)) unreg_over(l, c->va, c->len);
  if (rnd(2) && l->nr < 12) {
    uint64_t to = c->va == rbase(l) + 6 * MB ? rbase(l) + 7 * MB : rbase(l) + 6 * MB;
    cu_release(c->va, c->len, 1);
    l->a[ai].live = 0;
    for (int g = 0; g < 2; g++)
      if (c->gmask & (1 << g)) t_unmap(g, c->va, c->len);
    t_range(to, c->len);
    l->rg[l->nr][0] = to;
    l->rg[l->nr++][1] = c->len;
    t_map(to, c->len, 0, c->gmask, c->slot);
    c->va = to;
    freeing(l->reg, 0);
    new_alloc(l, l->vmm, 0, c->len, 6 + (int)rnd(2), 1);
    return;
  }
  // CUDA's memory over [va+2*64K, +2*64K): the allocation's middle is the program's no longer
  int slot = l->slots++;
  if (l->nc < 10 && !t_mem(c->gmem, 2 * K64, l->reg, slot)) {
    t_map(c->va + 2 * K64, 2 * K64, 0, c->gmask, slot);
    truth_end_range(c->va + 2 * K64, c->va + 4 * K64);
    l->c[l->nc++] = (chunk_t){c->va + 2 * K64, 2 * K64, slot, c->gmask, c->gmem, 1, 1};
    l->a[ai].live = 0; // (its two ends stay the program's until released)
  }
  freeing(l->reg, 0);
}

// Registrations and exports over each allocation the region had: the oracle judges them.
static void probe_all(lay_t *l) {
  for (int i = 0; i < l->na; i++) {
    reg_range(l, l->a[i].va, l->a[i].len, 0);
    if (dmabuf_route && rnd(2)) export_range(l, l->a[i].va, l->a[i].len, 0);
  }
}
// A free region: nothing there is the program's, whatever was before.
static void probe_free_region(void) {
  int reg = (int)rnd(REGIONS), z = 0;
  if (!__atomic_compare_exchange_n(&rstate[reg], &z, 2, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
    return;
  uint64_t b = RBASE + (uint64_t)reg * RSIZE;
  reg_range(NULL, b + page(rnd(512)), page(1 + rnd(16)), 0);
  if (dmabuf_route) export_range(NULL, b + page(rnd(512)), page(1 + rnd(16)), 0);
  __atomic_store_n(&rstate[reg], 0, __ATOMIC_RELEASE);
}

static void release_ranges(lay_t *l) {
  for (int i = 0; i < l->nr; i++) {
    t_uvm_free(l->rg[i][0], l->rg[i][1]);
    truth_end_range(l->rg[i][0], l->rg[i][0] + l->rg[i][1]);
  }
  l->nr = 0;
}
static void release_mems(lay_t *l) {
  for (int i = 0; i < l->nc; i++)
    if (l->c[i].live) {
      t_free_mem(l->c[i].gmem, l->reg, l->c[i].slot);
      l->c[i].live = 0;
    }
}
static void release_program(lay_t *l) {
  for (int i = 0; i < l->na; i++)
    if (l->a[i].live) {
      cu_release(l->a[i].va, l->a[i].len, l->a[i].import);
      l->a[i].live = 0;
    }
  if (l->vmm >= 0) cu_release(l->c[l->vmm].va, l->c[l->vmm].len, 1); // the ends of one mapped over
}
// CUDA's own memory mapped at chunk c's VA on the GPUs of gmask.
static void cuda_over(lay_t *l, int c, int gmask) {
  int slot = l->slots++;
  if (l->nc == 10 || t_mem(gmask == 2 ? 1 : 0, l->c[c].len, l->reg, slot)) return;
  t_map(l->c[c].va, l->c[c].len, 0, gmask, slot);
  truth_end_range(l->c[c].va, l->c[c].va + l->c[c].len);
  l->c[l->nc++] = (chunk_t){l->c[c].va, l->c[c].len, slot, gmask, gmask == 2 ? 1 : 0, 1, 1};
}

// Everything goes: mostly MRs first; then the program's releases, the UVM ranges and RM's memory
// in CUDA's order, or the driver's first (the program's releases late), or RM's free before any
// unmap with CUDA's memory mapped there after, or one GPU at a time with CUDA's memory mapped on
// the first before the second unmaps; probes between the odd steps.
static void teardown(lay_t *l) {
  freeing(l->reg, 1);
  if (rnd(10)) unreg_over(l, 0, 0);
  unsigned order = rnd(100);
  if (order < 50) {
    release_program(l);
    release_ranges(l);
    release_mems(l);
  } else if (order < 65) {
    release_ranges(l);
    release_mems(l);
    release_program(l);
  } else if (order < 82 || l->nc == 0 || l->c[0].gmask != 3) {
    int n = l->nc;
    for (int i = 0; i < n; i++)
      if (l->c[i].live) {
        t_free_mem(l->c[i].gmem, l->reg, l->c[i].slot);
        l->c[i].live = 0;
      }
    if (rnd(2) && n && !l->c[0].cuda) cuda_over(l, 0, l->c[0].gmask);
    probe_all(l);
    release_ranges(l);
    release_mems(l);
    release_program(l);
  } else {
    t_unmap(0, l->c[0].va, l->c[0].len);
    probe_all(l);
    cuda_over(l, 0, 1);
    probe_all(l);
    t_unmap(1, l->c[0].va, l->c[0].len);
    probe_all(l);
    release_ranges(l);
    release_mems(l);
    release_program(l);
  }
  unreg_over(l, 0, 0); // (the region stays `freeing` until it is free: stress_main.h's worker)
}

static void cycle(int reg) {
  lay_t L;
  memset(&L, 0, sizeof L);
  L.reg = reg;
  lay_t *l = &L;
  truth_clear(reg);
  build(l);
  for (int i = 0, n = 6 + (int)rnd(24); i < n && now() < deadline; i++) {
    alive();
    uint64_t va, len;
    unsigned r = rnd(100);
    if (r < 38) {
      int e = pick(l, &va, &len);
      reg_range(l, va, len, e);
    } else if (r < 50) {
      if (l->nh) {
        int k = (int)rnd((unsigned)l->nh);
        unreg(&l->held[k]);
        l->held[k] = l->held[--l->nh];
      }
    } else if (r < 54) {
      pick(l, &va, &len);
      rereg(l, va, len);
    } else if (r < 66) {
      if (dmabuf_route) {
        int e = pick(l, &va, &len);
        export_range(l, va, len, e);
      }
    } else if (r < 73) free_one(l);
    else if (r < 81) carve(l);
    else if (r < 86) vmm_op(l);
    else if (r < 87) {
      if (fork_on) fork_op();
    } else if (r < 88) {
      if (spawn_on) spawn_op();
    } else if (r < 90) {
      if (closes_on) own_closes();
    } else if (r < 91) ctx_op(l);
    else if (r < 97) borrow();
    else probe_free_region();
  }
  teardown(l);
  count(K_CYCLE);
}
