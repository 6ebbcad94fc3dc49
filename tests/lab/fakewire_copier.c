// The wire's side of its copier (ours, test only; the copier is fwcopier.c, what they say
// fwcopier.h). On the GPU no copy of a process finishes while one of its threads is blocked in a
// pageable copy behind a kernel that waits for the bytes the wire must write (`t.cpu()` after a
// collective; tests/gpu/blocked_copy.cu): not on a stream of its own, not from a second context.
// A copy from another process does. So each lab process that registers GPU memory starts a copier
// (DIR/bin/fwcopier, posix_spawn: fork and exec, CUDA in this process is not fork-safe) at its
// first GPU MR, hands it each allocation that holds an MR (a CUDA IPC handle of cuMemAlloc memory,
// or the POSIX fd of a VMM allocation, NCCL's cuMem memory, over SCM_RIGHTS), and asks it for
// every GPU copy, the bytes through a shared staging memfd. Every CUDA call of ours happens at
// registration; a copy is socket messages only. Where no handle can be had the wire copies in
// this process as before (fakewire.c), counted: copier_fallbacks.
#define _GNU_SOURCE
#include "fakewire.h"
#include "fwcopier.h"
#include <dlfcn.h>
#include <fcntl.h>
#include <libgen.h>
#include <link.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

extern char **environ;
unsigned long fw_copier_copies, fw_copier_fallbacks;
static pthread_mutex_t copier_mu = PTHREAD_MUTEX_INITIALIZER; // one request at a time
static int copier_sock = -1, copier_state; // 0 not started, 1 running, -1 none (failed or gone)
static uint8_t *staging;
#define MAXSENT 4096
static struct {
  uint64_t base, size;
} sent[MAXSENT]; // the allocations the copier holds

// The path of the libcuda.so.1 this process loaded (the copier loads the same one) and of
// DIR/bin/fwcopier beside the lab's provider, DIR/provider/.
static int paths(char *lib, char *prog, size_t n) {
  void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  struct link_map *lm = NULL;
  Dl_info self;
  int ok = h && !dlinfo(h, RTLD_DI_LINKMAP, &lm) && lm && lm->l_name && lm->l_name[0] &&
           dladdr((void *)paths, &self) && self.dli_fname;
  if (ok) {
    char d[4096];
    snprintf(lib, n, "%s", lm->l_name);
    snprintf(d, sizeof d, "%s", self.dli_fname);
    snprintf(prog, n, "%s/../bin/fwcopier", dirname(d));
  }
  if (h) dlclose(h);
  return ok;
}
// Starts the copier: 1, or 0 (no copier for this process). FAKEWIRE_COPIER=0: none (the old way).
static int copier_start(void) {
  const char *off = getenv("FAKEWIRE_COPIER");
  char lib[4096], prog[4096];
  if ((off && !strcmp(off, "0")) || !paths(lib, prog, sizeof lib)) return 0;
  int sv[2], mfd = memfd_create("fakewire-staging", MFD_CLOEXEC);
  if (mfd < 0) return 0;
  if (ftruncate(mfd, FWC_STAGING) || socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv)) {
    close(mfd);
    return 0;
  }
  staging = mmap(NULL, FWC_STAGING, PROT_READ | PROT_WRITE, MAP_SHARED, mfd, 0);
  // The child's fds 3 and 4, from numbers above them (dup2 onto its own number keeps CLOEXEC)
  int cs = fcntl(sv[1], F_DUPFD_CLOEXEC, 10), cm = fcntl(mfd, F_DUPFD_CLOEXEC, 10);
  close(sv[1]);
  close(mfd);
  // Its environment is ours without LD_PRELOAD: it needs libcuda only, not gdrshim or the lab's
  int ne = 0, k = 0;
  while (environ[ne]) ne++;
  char **env = calloc((size_t)ne + 1, sizeof *env);
  for (int i = 0; env && i < ne; i++)
    if (strncmp(environ[i], "LD_PRELOAD=", 11)) env[k++] = environ[i];
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, cs, FWC_SOCK_FD);
  posix_spawn_file_actions_adddup2(&fa, cm, FWC_STAGING_FD);
  char *argv[] = {prog, lib, NULL};
  pid_t pid;
  int bad = staging == MAP_FAILED || cs < 0 || cm < 0 || !env ||
            posix_spawn(&pid, prog, &fa, NULL, argv, env);
  posix_spawn_file_actions_destroy(&fa);
  free(env);
  if (cs >= 0) close(cs);
  if (cm >= 0) close(cm);
  if (bad) {
    close(sv[0]);
    if (staging != MAP_FAILED) munmap(staging, FWC_STAGING);
    staging = NULL;
    return 0;
  }
  copier_sock = sv[0];
  fw_trace("copier started pid=%d lib=%s", (int)pid, lib);
  return 1;
}
// One request, and fd with it if >= 0: the copier's answer (0, or its error), -1 if it is gone.
static int ask(const fwc_req *q, int fd) {
  char cbuf[CMSG_SPACE(sizeof(int))];
  struct iovec io = {(void *)q, sizeof *q};
  struct msghdr m = {.msg_iov = &io, .msg_iovlen = 1};
  if (fd >= 0) {
    memset(cbuf, 0, sizeof cbuf);
    m.msg_control = cbuf;
    m.msg_controllen = sizeof cbuf;
    struct cmsghdr *c = CMSG_FIRSTHDR(&m);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(c), &fd, sizeof fd);
  }
  fwc_rsp r;
  if (sendmsg(copier_sock, &m, MSG_NOSIGNAL) != (ssize_t)sizeof *q ||
      recv(copier_sock, &r, sizeof r, 0) != (ssize_t)sizeof r) {
    copier_state = -1; // gone: what it held is copied here from now on
    memset(sent, 0, sizeof sent);
    return -1;
  }
  return r.rc;
}
typedef int (*cu_attr_t)(void *, int, uint64_t);
// The allocation of this process's libcuda that holds [a, a+n) goes to the copier: 1 if it holds
// it now, 0 if not (the wire copies it here, and says so in copier_fallbacks).
int fw_copier_register(uint64_t a, uint64_t n) {
  void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  if (!h) return 0;
  cu_attr_t attr = (cu_attr_t)dlsym(h, "cuPointerGetAttribute");
  int (*ipc_get)(void *, uint64_t) = (int (*)(void *, uint64_t))dlsym(h, "cuIpcGetMemHandle");
  int (*retain)(uint64_t *, void *) = (int (*)(uint64_t *, void *))dlsym(h, "cuMemRetainAllocationHandle");
  int (*export)(void *, uint64_t, int, unsigned long long) =
      (int (*)(void *, uint64_t, int, unsigned long long))dlsym(h, "cuMemExportToShareableHandle");
  int (*release)(uint64_t) = (int (*)(uint64_t))dlsym(h, "cuMemRelease");
  // The CUDA calls first, outside copier_mu: a registration that waits in libcuda (another
  // thread of the program blocked there) must not hold up the copies of memory already handed over
  fwc_req q = {0};
  int fd = -1, ok = 0, ordinal = 0;
  // CU_POINTER_ATTRIBUTE_RANGE_START_ADDR (11), _RANGE_SIZE (12), _DEVICE_ORDINAL (9)
  if (attr && !attr(&q.base, 11, a) && !attr(&q.size, 12, a)) {
    if (!attr(&ordinal, 9, a)) q.device = ordinal;
    uint64_t vmm = 0;
    if (ipc_get && !ipc_get(q.ipc, q.base)) {
      q.op = FWC_IMPORT_IPC;
    } else if (retain && export && release && !retain(&vmm, (void *)(uintptr_t)a)) {
      // a VMM allocation: its own mapping (_MAPPING_BASE_ADDR 19, _MAPPING_SIZE 18) where
      // libcuda says it; its POSIX fd (CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 1)
      uint64_t mb = 0, ms = 0;
      if (!attr(&mb, 19, a) && !attr(&ms, 18, a) && ms) q.base = mb, q.size = ms;
      if (!export(&fd, vmm, 1, 0)) q.op = FWC_IMPORT_FD;
      else fd = -1;
      release(vmm);
    }
  }
  dlclose(h);
  pthread_mutex_lock(&copier_mu);
  if (!copier_state) copier_state = copier_start() ? 1 : -1;
  ok = copier_state > 0 && q.op && a >= q.base && n <= q.size && a - q.base <= q.size - n && !ask(&q, fd);
  if (ok) {
    int i, free_at = -1;
    for (i = 0; i < MAXSENT && !(sent[i].size && sent[i].base == q.base); i++)
      if (!sent[i].size && free_at < 0) free_at = i;
    if (i == MAXSENT) i = free_at;
    if (i >= 0) sent[i].base = q.base, sent[i].size = q.size;
    ok = i >= 0;
  }
  if (!ok) fw_copier_fallbacks++;
  pthread_mutex_unlock(&copier_mu);
  if (fd >= 0) close(fd); // ours: the export just made it
  return ok;
}
static int held(const void *p, uint64_t n) { // under copier_mu
  uint64_t a = (uintptr_t)p;
  for (int i = 0; i < MAXSENT; i++)
    if (sent[i].size && a >= sent[i].base && n <= sent[i].size && a - sent[i].base <= sent[i].size - n)
      return 1;
  return 0;
}
// A GPU copy by the copier: 1 and *rc (0, or it failed) if the copier holds its GPU memory, else 0.
int fw_copier_copy(void *dst, const void *src, size_t n, int dst_gpu, int src_gpu, int *rc) {
  pthread_mutex_lock(&copier_mu);
  int mine = copier_state > 0 && (!dst_gpu || held(dst, n)) && (!src_gpu || held(src, n));
  if (mine) {
    fw_copier_copies++;
    *rc = 0;
    fwc_req q = {.op = dst_gpu && src_gpu ? FWC_G2G : dst_gpu ? FWC_H2G : FWC_G2H};
    if (q.op == FWC_G2G) {
      q.dst = (uintptr_t)dst, q.src = (uintptr_t)src, q.n = n;
      *rc = ask(&q, -1);
    }
    for (size_t off = 0, k; !*rc && q.op != FWC_G2G && off < n; off += k) {
      k = n - off < FWC_STAGING ? n - off : FWC_STAGING;
      q.dst = (uintptr_t)dst + off, q.src = (uintptr_t)src + off, q.n = k;
      if (q.op == FWC_H2G) memcpy(staging, (const uint8_t *)src + off, k);
      if (!(*rc = ask(&q, -1)) && q.op == FWC_G2H) memcpy((uint8_t *)dst + off, staging, k);
    }
  }
  pthread_mutex_unlock(&copier_mu);
  return mine;
}
