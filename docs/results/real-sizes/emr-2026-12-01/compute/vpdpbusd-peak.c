#include <immintrin.h>
#include <stdio.h>
#include <time.h>
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
int main(void){
  __m512i a[12]; __m512i w=_mm512_set1_epi8(3), x=_mm512_set1_epi8(5);
  for(int i=0;i<12;i++) a[i]=_mm512_set1_epi32(i);
  long n=400000000L/12;
  for (int rep=0; rep<3; rep++){
  double t=now();
  for(long i=0;i<n;i++){
#pragma GCC unroll 12
    for(int j=0;j<12;j++) a[j]=_mm512_dpbusd_epi32(a[j],w,x);
    __asm__ volatile("" : "+v"(w));
  }
  t=now()-t;
  __m512i s=a[0]; for(int i=1;i<12;i++) s=_mm512_add_epi32(s,a[i]);
  printf("%.2f G vpdpbusd zmm/s (%d)\n", n*12/t/1e9, _mm512_reduce_add_epi32(s)&1);
  }
  // the latency: one chain
  double t=now(); __m512i c=a[0];
  for(long i=0;i<n;i++){ c=_mm512_dpbusd_epi32(c,w,x); }
  t=now()-t; printf("one chain: %.3f ns each (%d)\n", t/n*1e9, _mm512_reduce_add_epi32(c)&1);
  // an FMA chain for the clock: 4 cycles latency on Golden Cove
  __m512 f=_mm512_set1_ps(1.0f), m=_mm512_set1_ps(0.999999f);
  t=now(); for(long i=0;i<n;i++){ f=_mm512_fmadd_ps(f,m,m); } t=now()-t;
  printf("one fma chain: %.3f ns each (%f)\n", t/n*1e9, _mm512_reduce_add_ps(f));
  return 0;}
