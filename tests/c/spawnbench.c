// Start-up cost of a preload library (ours): posix_spawn + wait of PROG, N times per round, in 10
// rounds that alternate no preload, MINIMAL_SO and GDRSHIM_SO, so that all three see the same
// machine state. Prints microseconds per spawn and the ratios.
//   spawnbench N PROG MINIMAL_SO GDRSHIM_SO
#define _GNU_SOURCE
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
extern char **environ;
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
int main(int argc, char **argv) {
  if (argc < 5) return 2;
  int n = atoi(argv[1]); char *prog = argv[2];
  const char *libs[3] = {"", argv[3], argv[4]};
  double tot[3] = {0};
  for (int round = 0; round < 10; round++)
    for (int k = 0; k < 3; k++) {
      char pre[4096]; snprintf(pre, sizeof pre, "LD_PRELOAD=%s", libs[k]);
      char *env[] = {pre, "PATH=/usr/bin:/bin", NULL};
      char *av[] = {prog, NULL};
      double t0 = now();
      for (int i = 0; i < n; i++) { pid_t p; posix_spawn(&p, prog, NULL, NULL, av, env); int st; waitpid(p, &st, 0); }
      tot[k] += now() - t0;
    }
  printf("none %.1f us  minimal %.1f us  gdrshim %.1f us  gdrshim/minimal %.3f  minimal/none %.3f\n", tot[0] / (10.0 * n) * 1e6, tot[1] / (10.0 * n) * 1e6, tot[2] / (10.0 * n) * 1e6, tot[2] / tot[1], tot[1] / tot[0]);
}
