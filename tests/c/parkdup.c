// Holds one dup2 in the place of libc's (issue 29; ours): preloaded after the shim, so that the
// shim's dup2 hook has called "libc" and waits for it to finish. parkdup_arm() makes the next
// dup2 wait until parkdup_go(); parkdup_wait_parked() returns once it waits.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <semaphore.h>

static sem_t parked, go;
static int armed;

void parkdup_arm(void) { sem_init(&parked, 0, 0); sem_init(&go, 0, 0); __atomic_store_n(&armed, 1, __ATOMIC_SEQ_CST); }
void parkdup_wait_parked(void) { while (sem_wait(&parked)) {} }
void parkdup_go(void) { sem_post(&go); }

int dup2(int old, int new) {
  static int (*real)(int, int);
  if (!real) real = (int (*)(int, int))dlsym(RTLD_NEXT, "dup2");
  if (__atomic_exchange_n(&armed, 0, __ATOMIC_SEQ_CST)) {
    sem_post(&parked);
    while (sem_wait(&go)) {}
  }
  return real(old, new);
}
