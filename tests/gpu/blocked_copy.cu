// Which copies into GPU memory finish while another thread of the process is blocked in a
// pageable cudaMemcpy (ours; issue 47: the lab's wire stalled while `t.cpu()` waited). A kernel
// on the legacy stream spins until a flag in GPU memory is set; thread A then makes a pageable
// device-to-host copy behind it (blocked, as `t.cpu()` after a collective is); thread B tries to
// set the flag one way. Each way, in a process of its own:
//   same      B: cuMemcpyHtoDAsync from pinned memory on a non-blocking stream of the same context
//   ctx2      B: the same from a second context of cuCtxCreate in this process, on its own
//             non-blocking stream (the flag's address is unified: the copy finds the memory)
//   proc      B: another process (forked before CUDA starts) that opens the flag's IPC handle and
//             copies into it from pinned memory in its own context
// Prints "blocked_copy WAY: flag set in MS ms, the blocked copy returned in MS ms" or "... never
// (10 s)". Exit 0 always (a table, not a test).
#include "common.h"
#include <cuda_runtime.h>
#include <pthread.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

__global__ void wait_flag(volatile int *flag) {
  while (*flag == 0) {
  }
}

static double now_ms(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

static int *flag;
static CUcontext primary;
static volatile double returned_at;
static double t0;

static void *blocked(void *) {
  CK(cuCtxSetCurrent(primary));
  static char host[1 << 20]; // pageable
  cudaMemcpy(host, flag, 4, cudaMemcpyDeviceToHost);
  returned_at = now_ms() - t0;
  return nullptr;
}

// the flag set by B, one way, with what it needs made before the kernel started (as the wire
// makes its buffer and stream at the first GPU MR); the time it took, or -1 (10 s)
struct Setter { const char *way; double done; int *pinned; CUstream st; CUcontext ctx2; };
static void *set_flag(void *arg) {
  Setter *s = (Setter *)arg;
  if (!strcmp(s->way, "same")) {
    CK(cuCtxSetCurrent(primary));
    CK(cuMemcpyHtoDAsync((CUdeviceptr)flag, s->pinned, 4, s->st));
    CK(cuStreamSynchronize(s->st));
  } else if (!strcmp(s->way, "ctx2")) {
    CK(cuCtxSetCurrent(s->ctx2));
    CK(cuMemcpyHtoDAsync((CUdeviceptr)flag, s->pinned, 4, s->st));
    CK(cuStreamSynchronize(s->st));
  }
  s->done = now_ms() - t0;
  return nullptr;
}

int main(int argc, char **argv) {
  const char *way = argc > 1 ? argv[1] : "same";
  int fds[2];
  if (pipe(fds)) return 1;
  pid_t child = -1;
  if (!strcmp(way, "proc")) {
    child = fork();
    if (child == 0) { // before any CUDA call in this process
      cudaIpcMemHandle_t h;
      if (read(fds[0], &h, sizeof h) != sizeof h) _exit(1);
      int *remote, *pinned;
      CKRT(cudaIpcOpenMemHandle((void **)&remote, h, cudaIpcMemLazyEnablePeerAccess));
      CKRT(cudaHostAlloc((void **)&pinned, 4, 0));
      *pinned = 1;
      usleep(300000); // the parent's thread is blocked by then
      CKRT(cudaMemcpy(remote, pinned, 4, cudaMemcpyHostToDevice));
      _exit(0);
    }
  }
  CK(cuInit(0));
  CUdevice d; CK(cuDeviceGet(&d, 0));
  CK(cuDevicePrimaryCtxRetain(&primary, d)); CK(cuCtxSetCurrent(primary));
  CKRT(cudaMalloc((void **)&flag, 2 << 20));
  CKRT(cudaMemset(flag, 0, 4));
  CKRT(cudaDeviceSynchronize());
  if (child > 0) {
    cudaIpcMemHandle_t h;
    CKRT(cudaIpcGetMemHandle(&h, flag));
    if (write(fds[1], &h, sizeof h) != sizeof h) return 1;
  }
  Setter s = {way, -1, nullptr, nullptr, nullptr};
  CKRT(cudaHostAlloc((void **)&s.pinned, 4, cudaHostAllocPortable));
  *s.pinned = 1;
  if (!strcmp(way, "ctx2")) {
#if CUDA_VERSION >= 13000
    CK(cuCtxCreate(&s.ctx2, nullptr, 0, d));
#else
    CK(cuCtxCreate(&s.ctx2, 0, d));
#endif
    CK(cuStreamCreate(&s.st, CU_STREAM_NON_BLOCKING));
    CK(cuCtxSetCurrent(primary));
  } else {
    CK(cuStreamCreate(&s.st, CU_STREAM_NON_BLOCKING));
  }
  t0 = now_ms();
  wait_flag<<<1, 1>>>(flag); // the legacy stream
  pthread_t a, b;
  pthread_create(&a, nullptr, blocked, nullptr);
  usleep(200000);
  if (child < 0) pthread_create(&b, nullptr, set_flag, &s);
  for (int i = 0; i < 1000 && !returned_at; i++) usleep(10000);
  if (returned_at) printf("blocked_copy %s: the blocked copy returned in %.0f ms (flag set at %.0f ms)\n", way, returned_at, s.done);
  else printf("blocked_copy %s: the blocked copy never returned (10 s); flag setter done=%.0f ms\n", way, s.done);
  fflush(stdout);
  _exit(0); // a thread may still be stuck inside libcuda
}
