// The lab's gate (ours, test only): with "gate N" in the fault file, the first request of each
// connected QP waits until N QPs of the whole lab have made theirs, in generations of N. Work that
// should run at once (the fleet's pairs of one round) then passes, and work that runs one pair
// after another waits the gate out: a count proves the overlap, where a clock could only hint at
// it. The count lives in DIR/run/gate, shared by every process of the lab (MAP_SHARED).
#define _GNU_SOURCE
#include "fakewire.h"
#include <fcntl.h>
#include <stdio.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

unsigned long fw_gate_passed, fw_gate_timeouts;

static uint64_t *shared_count(void) {
  static uint64_t *count;
  static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
  pthread_mutex_lock(&mu);
  const char *lab = fw_lab_dir();
  if (!count && lab) {
    char path[512];
    snprintf(path, sizeof path, "%s/run", lab);
    syscall(SYS_mkdirat, AT_FDCWD, path, 0755);
    snprintf(path, sizeof path, "%s/run/gate", lab);
    int fd = (int)syscall(SYS_openat, AT_FDCWD, path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    // every process extends it to the same size: a later one changes nothing of what is counted
    if (fd >= 0 && ftruncate(fd, sizeof *count) == 0) {
      void *m = mmap(NULL, sizeof *count, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
      if (m != MAP_FAILED) count = m;
    }
    if (fd >= 0) close(fd);
  }
  pthread_mutex_unlock(&mu);
  return count;
}

void fw_gate(fw_qp *q) {
  int ms_max;
  int n = fw_fault_gate(&ms_max);
  if (n <= 0 || __atomic_exchange_n(&q->gated, 1, __ATOMIC_RELAXED)) return;
  uint64_t *count = shared_count();
  if (!count) {
    fprintf(stderr, "fakewire: gate %d: no shared count (FAKEWIRE_LAB unset, or its run/ unwritable)\n", n);
    __atomic_fetch_add(&fw_gate_timeouts, 1, __ATOMIC_RELAXED);
    return;
  }
  uint64_t me = __atomic_add_fetch(count, 1, __ATOMIC_SEQ_CST);
  uint64_t open_at = (me + (uint64_t)n - 1) / (uint64_t)n * (uint64_t)n;
  int64_t deadline = fw_now_ms() + ms_max;
  struct timespec ms = {0, 1000000};
  while (__atomic_load_n(count, __ATOMIC_SEQ_CST) < open_at) {
    if (fw_now_ms() > deadline) {
      fprintf(stderr, "fakewire: gate %d: QP %#x was number %llu and waited out the gate at %llu\n", n, q->qp.qp_num,
             (unsigned long long)me, (unsigned long long)__atomic_load_n(count, __ATOMIC_SEQ_CST));
      __atomic_fetch_add(&fw_gate_timeouts, 1, __ATOMIC_RELAXED);
      return;
    }
    nanosleep(&ms, NULL);
  }
  __atomic_fetch_add(&fw_gate_passed, 1, __ATOMIC_RELAXED);
}
