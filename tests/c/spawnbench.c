// Start-up cost of a preload library (ours): posix_spawn + wait of PROG, N times per round, in
// ROUNDS rounds (default 10); each round times no preload, MINIMAL_SO, GDRSHIM_SO and (if given)
// FLOOR_SO, in an order that rotates from round to round, so that all see the same machine state.
// Prints the mean microseconds per spawn and the ratios of the totals, then the median of the
// per-round ratios with their quartiles: on a shared machine a burst of load lands in a few
// rounds, which moves the totals but hardly the median.
//   spawnbench N PROG MINIMAL_SO GDRSHIM_SO [FLOOR_SO [ROUNDS]]
#define _GNU_SOURCE
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
extern char **environ;
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
static int cmp(const void *a, const void *b) { double x = *(const double *)a, y = *(const double *)b; return (x > y) - (x < y); }
// median and quartiles of r[0..n) (sorted in place)
static void quart(double *r, int n, const char *name) {
  qsort(r, n, sizeof *r, cmp);
  printf("  %-16s median %.3f  quartiles [%.3f, %.3f]\n", name, r[n / 2], r[n / 4], r[(3 * n) / 4]);
}
int main(int argc, char **argv) {
  if (argc < 5) return 2;
  int n = atoi(argv[1]); char *prog = argv[2];
  const char *libs[4] = {"", argv[3], argv[4], argc > 5 ? argv[5] : NULL};
  int kinds = argc > 5 ? 4 : 3;
  int rounds = argc > 6 ? atoi(argv[6]) : 10;
  if (n < 1 || rounds < 4 || rounds > 10000) return 2;
  double tot[4] = {0};
  double *per = calloc((size_t)rounds * 4, sizeof *per);
  if (!per) return 1;
  for (int round = 0; round < rounds; round++)
    for (int j = 0; j < kinds; j++) {
      int k = (j + round) % kinds;
      char pre[4096]; snprintf(pre, sizeof pre, "LD_PRELOAD=%s", libs[k]);
      char *env[] = {pre, "PATH=/usr/bin:/bin", NULL};
      char *av[] = {prog, NULL};
      double t0 = now();
      for (int i = 0; i < n; i++) {
        pid_t p;
        if (posix_spawn(&p, prog, NULL, NULL, av, env)) return 1;
        int st; waitpid(p, &st, 0);
        if (!WIFEXITED(st) || WEXITSTATUS(st)) return 1;
      }
      double dt = now() - t0;
      tot[k] += dt; per[round * 4 + k] = dt;
    }
  double us = 1e6 / ((double)rounds * n);
  printf("none %.1f us  minimal %.1f us  gdrshim %.1f us  gdrshim/minimal %.3f  minimal/none %.3f\n", tot[0] * us, tot[1] * us, tot[2] * us, tot[2] / tot[1], tot[1] / tot[0]);
  if (kinds == 4)
    printf("rust floor %.1f us  floor/minimal %.3f  gdrshim/floor %.3f\n", tot[3] * us, tot[3] / tot[1], tot[2] / tot[3]);
  printf("per-round ratios (%d rounds of %d spawns each):\n", rounds, n);
  double *r = calloc((size_t)rounds, sizeof *r);
  if (!r) return 1;
  for (int i = 0; i < rounds; i++) r[i] = per[i * 4 + 2] / per[i * 4 + 1];
  quart(r, rounds, "gdrshim/minimal");
  if (kinds == 4) {
    for (int i = 0; i < rounds; i++) r[i] = per[i * 4 + 3] / per[i * 4 + 1];
    quart(r, rounds, "floor/minimal");
    for (int i = 0; i < rounds; i++) r[i] = per[i * 4 + 2] / per[i * 4 + 3];
    quart(r, rounds, "gdrshim/floor");
  }
  return 0;
}
