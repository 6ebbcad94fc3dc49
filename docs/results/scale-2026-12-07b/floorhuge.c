// floor.c (docs/results/scale-2026-12-07) with the buffer 2 MiB-aligned and, given "huge", advised
// MADV_HUGEPAGE before it is first written: one random read, p50 and p99 of 2000.
//   gcc -O2 -o floorhuge floorhuge.c && for n in 4 40 400; do ./floorhuge $n; ./floorhuge $n huge; done
#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
#include <string.h>
#include <time.h>
#include <sys/mman.h>
static uint64_t now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec*1000000000ull+t.tv_nsec;}
static int cmp(const void*a,const void*b){uint64_t x=*(uint64_t*)a,y=*(uint64_t*)b;return (x>y)-(x<y);}
int main(int c,char**v){size_t mb=atoi(v[1]);size_t n=mb<<20;char*p=aligned_alloc(2<<20,n);
if(c>2&&!strcmp(v[2],"huge"))madvise(p,n,MADV_HUGEPAGE);
for(size_t i=0;i<n;i+=64)p[i]=i;
uint64_t s=88172645463325252ull,t[2000];volatile char x;
for(int k=0;k<2000;k++){s^=s<<13;s^=s>>7;s^=s<<17;size_t i=(s%(n/40))*40;uint64_t a=now();x=p[i];t[k]=now()-a;}
qsort(t,2000,8,cmp);printf("%zu MB %s: p50 %lu p99 %lu\n",mb,c>2?v[2]:"4k",t[1000],t[1980]);
FILE*f=fopen("/proc/self/smaps_rollup","r");char l[256];while(fgets(l,256,f))if(strstr(l,"AnonHuge"))fputs(l,stdout);}
