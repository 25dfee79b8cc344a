// Does a streamed buffer evict a resident one from L3, and can prefetchnta / clflushopt stop it? (BENCHMARKS §35)
//   gcc -O2 -fopenmp -mclflushopt -o /tmp/nt docs/results/glue/nt.c && OMP_NUM_THREADS=2 /tmp/nt RESIDENT_MB STREAM_MB MODE
//   MODE 0: plain loads, 1: prefetchnta ahead, 2: clflushopt after, 3: prefetcht0 ahead
#include <immintrin.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <omp.h>
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
int main(int argc,char**argv){
  size_t R=(size_t)atoi(argv[1])<<20, S=(size_t)atoi(argv[2])<<20; int mode=atoi(argv[3]);
  char* r=aligned_alloc(4096,R); char* s=aligned_alloc(4096,S);
  memset(r,1,R); memset(s,2,S);
  volatile long sink=0;
  for(int it=0;it<12;it++){
    double t0=now(); long a=0;
    #pragma omp parallel for reduction(+:a) schedule(static)
    for(size_t i=0;i<R;i+=64) a+=r[i]+r[i+32];
    double t1=now(); long b=0;
    #pragma omp parallel for reduction(+:b) schedule(static)
    for(size_t i=0;i<S;i+=64){
      if(mode==1) _mm_prefetch(s+i+4096,_MM_HINT_NTA);
      if(mode==3) _mm_prefetch(s+i+4096,_MM_HINT_T0);
      b+=s[i]+s[i+32];
      if(mode==2) _mm_clflushopt(s+i);
    }
    double t2=now(); sink+=a+b;
    if(it>=4) printf("mode %d resident %zu MB: %.3f ms (%.1f GB/s)  stream %zu MB: %.3f ms (%.1f GB/s)\n",mode,R>>20,(t1-t0)*1e3,R/(t1-t0)/1e9,S>>20,(t2-t1)*1e3,S/(t2-t1)/1e9);
  }
  return 0;
}
