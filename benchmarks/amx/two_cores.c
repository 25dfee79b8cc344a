#include <stdio.h>
#include <time.h>
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
#define CL "xmm2","xmm3","xmm4","xmm5","xmm6","xmm7","xmm8","xmm9","xmm10","xmm11","xmm12","xmm13"
#define R12(OP) OP(2) OP(3) OP(4) OP(5) OP(6) OP(7) OP(8) OP(9) OP(10) OP(11) OP(12) OP(13)
#define DZ(i) "vpdpbusd %%zmm0, %%zmm1, %%zmm" #i "\n\t"
#define AD(i) "add $1, %%rax\n\tadd $1, %%rbx\n\tadd $1, %%rcx\n\tadd $1, %%rdx\n\t"
int main(void){
  for (int rep=0; rep<3; rep++){
  const long n=100000000; double t=now();
  for(long i=0;i<n;i++) __asm__ volatile(R12(DZ):::CL);
  double a=(now()-t)/n/12*1e9;
  t=now();
  for(long i=0;i<n;i++) __asm__ volatile(R12(AD):::"rax","rbx","rcx","rdx");
  double b=(now()-t)/n/48*1e9;
  printf("dpbusd zmm %.3f ns each; scalar add %.3f ns each\n",a,b);}
}
