// Host-memory registration cost with and without gdrshim (ours); see docs/results/history/local/.
// cc -O1 -o hostbench hostbench.c -Wl,--no-as-needed -L<dir of a libibverbs.so.1> -l:libibverbs.so.1
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
void *ibv_reg_mr(void *pd, void *addr, size_t len, int access);
int ibv_dereg_mr(void *mr);
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
int main(){ static char buf[1<<20]; double best=1e9; for(int r=0;r<9;r++){ double t0=now(); for(int i=0;i<200000;i++) ibv_dereg_mr(ibv_reg_mr(0,buf,1<<20,0xf)); double ns=(now()-t0)*1e9/200000; if(ns<best)best=ns;} printf("%.1f\n",best); return 0;}
