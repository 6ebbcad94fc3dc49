// fork() while another thread is inside the shim's locks (ours): a thread calls the shim's
// counters (which take its core lock) in a loop while the main thread forks; every child takes
// the same lock (gdrshim_lookup blocks on it) and must exit promptly. The first forks race the
// shim's one-time initialisation in those threads.
#define _GNU_SOURCE
#include "../../include/gdrshim.h"
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>
static volatile int stop;
// resolved once: dlsym itself takes the loader's lock, which is glibc's business at fork, not ours
static int (*counters)(struct gdrshim_counters *, size_t);
static int (*lookup)(uint64_t, uint64_t, struct gdrshim_backing *);
static void *spin(void *p) {
  (void)p;
  struct gdrshim_counters c;
  while (!stop) counters(&c, sizeof c);
  return NULL;
}
int main(int argc, char **argv) {
  int n = argc > 1 ? atoi(argv[1]) : 200;
  counters = GDRSHIM_DL_(gdrshim_counters);
  lookup = GDRSHIM_DL_(gdrshim_lookup);
  if (!counters || !lookup) { printf("shim not loaded\n"); return 2; }
  pthread_t t[4];
  for (int i = 0; i < 4; i++) pthread_create(&t[i], NULL, spin, NULL);
  int ok = 0;
  for (int i = 0; i < n; i++) {
    pid_t pid = fork();
    if (pid == 0) {
      struct gdrshim_backing b;
      struct gdrshim_counters c;
      int r = lookup(0x7f0000000000ull, 4096, &b);
      int k = counters(&c, sizeof c);
      // inert (the parent's shim was up: the child may have inherited its locks), or, when the
      // fork came before the parent's shim was first used, a fresh shim of the child's own
      _exit((r == -ENOSYS && k == -ENOSYS) || (r == -ENOENT && k > 0) ? 0 : 3);
    }
    int st = 0;
    waitpid(pid, &st, 0);
    if (WIFEXITED(st) && WEXITSTATUS(st) == 0) ok++;
  }
  stop = 1;
  for (int i = 0; i < 4; i++) pthread_join(t[i], NULL);
  struct gdrshim_counters c;
  struct gdrshim_backing b;
  printf("forks=%d children_ok=%d parent_counters=%d parent_lookup=%d\n", n, ok, counters(&c, sizeof c), lookup(0x7f0000000000ull, 4096, &b));
  return ok == n ? 0 : 1;
}
