// The program's-own-memory rule against libcuda, case by case (ours; built on the GPU machine with
// nvcc). Each case asks cuMemGetHandleForAddressRange(DMA_BUF_FD) for one range and prints
//   case NAME [ptr, +size) r=RC
// Without gdrshim that is libcuda's own answer (the oracle). Under gdrshim in GeForce emulation
// (GDRSHIM_TEST_HIDE_DMABUF=1: libcuda is asked first, its answer kept, then refused as a GeForce
// does) it is gdrshim's; gdrshim counts in its summary whether each answer equals libcuda's
// (export_oracle_agree / _code_differs / _disagree) and names every disagreement in a WARN line.
// Then, with the stub NIC, the same ranges through ibv_reg_mr: gdrshim's pass0 hits and misses.
// Among the cases: a carved allocation whose chunk neighbour was freed (freed-neighbour-*): how
// far libcuda counts the live one after its neighbour's free, which gdrshim follows.
//   owned cases            every case once
//   owned ipc-child HANDLE (internal) the other process of the IPC case
#include "common.h"
#include <cuda_runtime.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include <vector>

static const size_t MB2 = 2 << 20;
struct Case { const char *name; CUdeviceptr p; size_t n; };
static std::vector<Case> cases;
static void add(const char *name, CUdeviceptr p, size_t n) { cases.push_back({name, p, n}); }

static int ask(const Case &c) {
  int fd = -1;
  CUresult r = cuMemGetHandleForAddressRange(&fd, c.p, c.n, CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0);
  printf("case %-28s [%#llx, +%#zx) r=%d\n", c.name, (unsigned long long)c.p, c.n, (int)r);
  if (r == CUDA_SUCCESS) close(fd);
  return r;
}

// VA the map of gdrshim (or, without it, nobody) holds and no allocation of the program covers:
// CUDA's own memory after a large cudaMalloc, found as the H200 showed it.
static void internal_granules(CUdeviceptr after, int want) {
  int found = 0;
  for (int k = 0; k < 512 && found < want; k++) {
    CUdeviceptr va = after + (CUdeviceptr)k * MB2, base = 0; size_t size = 0;
    if (cuMemGetAddressRange(&base, &size, va) != CUDA_ERROR_NOT_FOUND) continue;
    struct gdrshim_backing b;
    int hit = gdrshim_dl_lookup(va, MB2, &b);
    // without gdrshim there is no map: take the granules cuMemGetAddressRange does not know
    if (hit == 0 || hit == -ENOSYS) { char n[40]; snprintf(n, sizeof n, "internal-%d", k); add(strdup(n), va, MB2); found++; }
  }
  printf("internal granules tried: %d\n", found);
}

static int ipc_child(const char *hex) {
  cudaIpcMemHandle_t h; for (int i = 0; i < 64; i++) sscanf(hex + 2 * i, "%2hhx", &h.reserved[i]);
  CKRT(cudaSetDevice(0));
  void *p = nullptr; CKRT(cudaIpcOpenMemHandle(&p, h, cudaIpcMemLazyEnablePeerAccess));
  add("ipc-opened-whole", (CUdeviceptr)p, 4 * MB2);
  add("ipc-opened-past-end", (CUdeviceptr)p, 6 * MB2);
  for (auto &c : cases) ask(c);
  CKRT(cudaIpcCloseMemHandle(p));
  add("ipc-after-close", (CUdeviceptr)p, MB2);
  ask(cases.back());
  return 0;
}

int main(int argc, char **argv) {
  if (argc > 2 && !strcmp(argv[1], "ipc-child")) return ipc_child(argv[2]);
  CKRT(cudaSetDevice(0)); CKRT(cudaFree(0));
  CUdevice dev; CK(cuDeviceGet(&dev, 0));
  // 1. cudaMalloc, whole, a sub-range, running past its end, after its free
  void *big; CKRT(cudaMalloc(&big, 64 << 20)); CUdeviceptr b = (CUdeviceptr)big;
  add("cudamalloc-whole", b, 64 << 20);
  add("cudamalloc-sub", b + MB2, MB2);
  add("cudamalloc-past-end-4m", b, (64 << 20) + 2 * MB2);
  add("cudamalloc-page-before", b - 4096, 8192);
  internal_granules(b + (64 << 20), 96);
  // 1b. allocations of odd sizes (UCX asks cuMemAlloc for 1 byte and exports its first page, to
  // probe dma-buf support): how far libcuda counts them, against what cuMemGetAddressRange says
  const size_t odd[] = {1, 100, 5000, (3 << 20) + 1};
  const char *odd_names[][4] = {{"odd-1-page", "odd-1-2pages", "odd-1-64k", "odd-1-2m"},
                                {"odd-100-page", "odd-100-2pages", "odd-100-64k", "odd-100-2m"},
                                {"odd-5000-page", "odd-5000-2pages", "odd-5000-64k", "odd-5000-2m"},
                                {"odd-3m1-4kup", "odd-3m1-4m", "odd-3m1-6m", "odd-3m1-2m"}};
  for (int i = 0; i < 4; i++) {
    CUdeviceptr p; CK(cuMemAlloc(&p, odd[i]));
    CUdeviceptr base = 0; size_t size = 0; CK(cuMemGetAddressRange(&base, &size, p));
    printf("range %zu bytes at %#llx: cuMemGetAddressRange base=%#llx size=%#zx\n", odd[i], (unsigned long long)p, (unsigned long long)base, size);
    if (i < 3) {
      add(odd_names[i][0], p, 4096); add(odd_names[i][1], p, 8192); add(odd_names[i][2], p, 64 << 10); add(odd_names[i][3], p, MB2);
    } else {
      add(odd_names[i][0], p, ((3 << 20) + 4096)); add(odd_names[i][1], p, 4 << 20); add(odd_names[i][2], p, 6 << 20); add(odd_names[i][3], p, MB2);
    }
  }
  // 2. neighbours: cudaMallocs side by side (found among a few)
  std::vector<void *> small(8);
  for (auto &s : small) CKRT(cudaMalloc(&s, MB2));
  for (int i = 0; i + 1 < 8; i++)
    if ((char *)small[i + 1] == (char *)small[i] + MB2) { add("cudamalloc-two-adjacent", (CUdeviceptr)small[i], 2 * MB2); break; }
  void *gone; CKRT(cudaMalloc(&gone, 4 * MB2)); CKRT(cudaFree(gone));
  add("cudamalloc-freed", (CUdeviceptr)gone, MB2);
  // 2b. two small allocations carved from one chunk, the upper freed: does libcuda still export
  // the lower one's chunk to its end, over the freed neighbour's bytes (gdrshim counts it so)?
  CUdeviceptr lo = 0, hi = 0;
  CK(cuMemAlloc(&lo, 4096)); CK(cuMemAlloc(&hi, 4096));
  CUdeviceptr chunk_end = (lo & ~(CUdeviceptr)(MB2 - 1)) + MB2;
  printf("carved pair: lower %#llx upper %#llx chunk end %#llx\n", (unsigned long long)lo, (unsigned long long)hi, (unsigned long long)chunk_end);
  if (hi > lo && hi < chunk_end) {
    CK(cuMemFree(hi));
    add("freed-neighbour-lower-to-chunk-end", lo, chunk_end - lo);
    add("freed-neighbour-lower-through-upper", lo, hi + 4096 - lo);
    add("freed-neighbour-upper-itself", hi, 4096);
  }
  // 3. a stream-ordered pool: two blocks, each and side by side
  cudaStream_t st; CKRT(cudaStreamCreate(&st));
  void *pa, *pb; CKRT(cudaMallocAsync(&pa, MB2, st)); CKRT(cudaMallocAsync(&pb, MB2, st)); CKRT(cudaStreamSynchronize(st));
  add("pool-block", (CUdeviceptr)pa, MB2);
  if ((char *)pb == (char *)pa + MB2) add("pool-two-adjacent", (CUdeviceptr)pa, 2 * MB2);
  if ((char *)pa == (char *)pb + MB2) add("pool-two-adjacent", (CUdeviceptr)pb, 2 * MB2);
  add("pool-block-past-end", (CUdeviceptr)pa, 8 * MB2);
  // 4. VMM: two handles in one reservation, two adjacent reservations, one handle mapped twice,
  // a reservation half mapped
  CUmemAllocationProp prop = {}; prop.type = CU_MEM_ALLOCATION_TYPE_PINNED; prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE; prop.location.id = 0;
  CUmemAccessDesc acc = {}; acc.location = prop.location; acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  CUmemGenericAllocationHandle h1, h2; CK(cuMemCreate(&h1, MB2, &prop, 0)); CK(cuMemCreate(&h2, MB2, &prop, 0));
  CUdeviceptr r1; CK(cuMemAddressReserve(&r1, 2 * MB2, MB2, 0, 0));
  CK(cuMemMap(r1, MB2, 0, h1, 0)); CK(cuMemMap(r1 + MB2, MB2, 0, h2, 0)); CK(cuMemSetAccess(r1, 2 * MB2, &acc, 1));
  add("vmm-two-handles-one-reservation", r1, 2 * MB2);
  CUdeviceptr r2 = 0, r3 = 0; CK(cuMemAddressReserve(&r2, MB2, MB2, 0, 0)); CK(cuMemAddressReserve(&r3, MB2, MB2, r2 + MB2, 0));
  CUmemGenericAllocationHandle h3, h4; CK(cuMemCreate(&h3, MB2, &prop, 0)); CK(cuMemCreate(&h4, MB2, &prop, 0));
  CK(cuMemMap(r2, MB2, 0, h3, 0)); CK(cuMemSetAccess(r2, MB2, &acc, 1));
  CK(cuMemMap(r3, MB2, 0, h4, 0)); CK(cuMemSetAccess(r3, MB2, &acc, 1));
  if (r3 == r2 + MB2) add("vmm-two-adjacent-reservations", r2, 2 * MB2);
  CUdeviceptr r4; CK(cuMemAddressReserve(&r4, 2 * MB2, MB2, 0, 0));
  CK(cuMemMap(r4, MB2, 0, h1, 0)); CK(cuMemMap(r4 + MB2, MB2, 0, h1, 0)); CK(cuMemSetAccess(r4, 2 * MB2, &acc, 1));
  add("vmm-one-handle-mapped-twice", r4, 2 * MB2);
  CUdeviceptr r5; CK(cuMemAddressReserve(&r5, 2 * MB2, MB2, 0, 0));
  CK(cuMemMap(r5, MB2, 0, h2, 0)); CK(cuMemSetAccess(r5, MB2, &acc, 1));
  add("vmm-half-mapped-reservation", r5, 2 * MB2);
  CUdeviceptr r6; CK(cuMemAddressReserve(&r6, MB2, MB2, 0, 0));
  CK(cuMemMap(r6, MB2, 0, h3, 0)); CK(cuMemSetAccess(r6, MB2, &acc, 1)); CK(cuMemUnmap(r6, MB2));
  add("vmm-unmapped", r6, MB2);
  // 5. managed and host memory, as CUDA treats them
  void *managed; CKRT(cudaMallocManaged(&managed, MB2));
  add("managed", (CUdeviceptr)managed, MB2);
  void *pinned; CKRT(cudaMallocHost(&pinned, MB2));
  add("host-pinned", (CUdeviceptr)pinned, MB2);
  void *reg = aligned_alloc(MB2, MB2); CKRT(cudaHostRegister(reg, MB2, cudaHostRegisterDefault));
  void *regdev; CKRT(cudaHostGetDevicePointer(&regdev, reg, 0));
  add("host-registered", (CUdeviceptr)regdev, MB2);
  for (auto &c : cases) ask(c);
  // 6. the verbs path (stub NIC): each range through ibv_reg_mr; gdrshim's pass0 hits and misses
  void *vh = dlopen("libibverbs.so.1", RTLD_NOW | RTLD_GLOBAL);
  typedef void *(*reg_t)(void *, void *, size_t, int); typedef int (*dereg_t)(void *);
  reg_t reg_mr = vh ? (reg_t)dlvsym(vh, "ibv_reg_mr", "IBVERBS_1.1") : nullptr;
  dereg_t dereg = vh ? (dereg_t)dlvsym(vh, "ibv_dereg_mr", "IBVERBS_1.1") : nullptr;
  struct gdrshim_counters c0 = {}, c1 = {};
  if (reg_mr && dereg && gdrshim_dl_counters(&c0, sizeof c0) >= 0) {
    for (auto &c : cases) {
      void *mr = reg_mr(nullptr, (void *)c.p, c.n, 0xf);
      gdrshim_dl_counters(&c1, sizeof c1);
      printf("verbs %-28s hits=%llu misses=%llu\n", c.name, (unsigned long long)(c1.pass0_hits - c0.pass0_hits), (unsigned long long)(c1.pass0_misses - c0.pass0_misses));
      c0 = c1;
      if (mr) dereg(mr);
    }
  }
  // 7. IPC: memory of another process, opened by a child (a process cannot open its own handle)
  void *shared; CKRT(cudaMalloc(&shared, 4 * MB2));
  cudaIpcMemHandle_t ih; CKRT(cudaIpcGetMemHandle(&ih, shared));
  char hex[129]; for (int i = 0; i < 64; i++) snprintf(hex + 2 * i, 3, "%02x", (unsigned char)ih.reserved[i]);
  fflush(stdout);
  pid_t pid = fork();
  if (pid == 0) { execl("/proc/self/exe", argv[0], "ipc-child", hex, (char *)nullptr); _exit(127); }
  int status = 0; waitpid(pid, &status, 0);
  printf("ipc child exit=%d\n", WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status));
  printf("cases %zu done\n", cases.size());
  return 0;
}
