// NVSHMEM between two PEs that are lab hosts of their own (issue 37 B; ours): host-initiated puts
// over the IBRC transport on the lab's wire (tests/gpu/run-h200-hosts-nvshmem.sh). The PEs meet
// through NVSHMEM's unique-id bootstrap; PE 0 writes the id into RDV/uid, PE 1 reads it.
// Each PE puts 1 MiB of its pattern into the other's symmetric buffer, then checks what it got.
//   hosts_nvshmem RDV PE NPES     prints "hosts_nvshmem pe P: put ok|FAILED bytes=N"; exit 0 iff ok
#include <cuda_runtime.h>
#include <nvshmem.h>
#include <nvshmemx.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int main(int argc, char **argv) {
  if (argc != 4) { fprintf(stderr, "usage: hosts_nvshmem RDV PE NPES\n"); return 2; }
  int pe = atoi(argv[2]), npes = atoi(argv[3]);
  char path[512];
  snprintf(path, sizeof path, "%s/uid", argv[1]);
  nvshmemx_uniqueid_t id = NVSHMEMX_UNIQUEID_INITIALIZER;
  if (pe == 0) {
    nvshmemx_get_uniqueid(&id);
    char tmp[520];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "wb");
    if (!f || fwrite(&id, sizeof id, 1, f) != 1 || fclose(f) || rename(tmp, path)) { perror("uid"); return 1; }
  } else {
    FILE *f = NULL;
    for (int i = 0; i < 20000 && !(f = fopen(path, "rb")); i++) usleep(1000);
    if (!f || fread(&id, sizeof id, 1, f) != 1) { fprintf(stderr, "hosts_nvshmem: no id from PE 0\n"); return 1; }
    fclose(f);
  }
  nvshmemx_init_attr_t attr = NVSHMEMX_INIT_ATTR_INITIALIZER;
  nvshmemx_set_attr_uniqueid_args(pe, npes, &id, &attr);
  if (nvshmemx_init_attr(NVSHMEMX_INIT_WITH_UNIQUEID, &attr)) { fprintf(stderr, "hosts_nvshmem: init failed\n"); return 1; }
  const size_t n = 1 << 20;
  unsigned char *src = (unsigned char *)nvshmem_malloc(n), *dst = (unsigned char *)nvshmem_malloc(n);
  unsigned char *h = (unsigned char *)malloc(n);
  if (!src || !dst || !h) { fprintf(stderr, "hosts_nvshmem: no symmetric memory\n"); return 1; }
  for (size_t i = 0; i < n; i++) h[i] = (unsigned char)(i * 7 + nvshmem_my_pe() * 31 + 1);
  cudaMemcpy(src, h, n, cudaMemcpyHostToDevice);
  cudaMemset(dst, 0, n);
  nvshmem_barrier_all();
  int peer = (nvshmem_my_pe() + 1) % nvshmem_n_pes(), from = (nvshmem_my_pe() + nvshmem_n_pes() - 1) % nvshmem_n_pes();
  nvshmem_putmem(dst, src, n, peer);
  nvshmem_quiet();
  nvshmem_barrier_all();
  cudaMemcpy(h, dst, n, cudaMemcpyDeviceToHost);
  size_t bad = 0;
  for (size_t i = 0; i < n; i++) bad += h[i] != (unsigned char)(i * 7 + from * 31 + 1);
  printf("hosts_nvshmem pe %d: put %s bytes=%zu wrong=%zu\n", nvshmem_my_pe(), bad ? "FAILED" : "ok", n, bad);
  nvshmem_free(src);
  nvshmem_free(dst);
  nvshmem_finalize();
  return bad != 0;
}
