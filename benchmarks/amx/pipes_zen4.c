#include <stdio.h>
#include <time.h>
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
static char mem[4096] __attribute__((aligned(64)));
static double nspc;
#define CL "xmm2","xmm3","xmm4","xmm5","xmm6","xmm7","xmm8","xmm9","xmm10","xmm11","xmm12","xmm13","xmm14","xmm15","xmm16","xmm17","xmm18","xmm19","xmm20","xmm21"
#define R12(OP) OP(2) OP(3) OP(4) OP(5) OP(6) OP(7) OP(8) OP(9) OP(10) OP(11) OP(12) OP(13)
#define X8(OP) OP(14) OP(15) OP(16) OP(17) OP(18) OP(19) OP(20) OP(21)
#define DZ(i) "vpdpbusd %%zmm0, %%zmm1, %%zmm" #i "\n\t"
#define DY(i) "vpdpbusd %%ymm0, %%ymm1, %%ymm" #i "\n\t"
#define DZB(i) "vpdpbusd (%0)%{1to16%}, %%zmm1, %%zmm" #i "\n\t"
#define MUBZ(i) "vpmaddubsw %%zmm0, %%zmm1, %%zmm" #i "\n\t"
#define MWDZ(i) "vpmaddwd %%zmm0, %%zmm1, %%zmm" #i "\n\t"
#define MUBY(i) "vpmaddubsw %%ymm0, %%ymm1, %%ymm" #i "\n\t"
#define FMAZ(o) "vfmadd231ps %%zmm0, %%zmm1, %%zmm" #o "\n\t"
#define MULZ(o) "vmulps %%zmm0, %%zmm1, %%zmm" #o "\n\t"
#define CVTZ(o) "vcvtdq2ps %%zmm1, %%zmm" #o "\n\t"
#define PADDW(o) "vpaddw %%zmm0, %%zmm1, %%zmm" #o "\n\t"
#define ANDZ(o) "vpandd %%zmm0, %%zmm1, %%zmm" #o "\n\t"
#define SRLZ(o) "vpsrlw $4, %%zmm1, %%zmm" #o "\n\t"
#define GF(o) "vgf2p8affineqb $0, %%zmm0, %%zmm1, %%zmm" #o "\n\t"
#define RUN(name, per, body) { const long n=30000000; double t=now(); for(long i=0;i<n;i++) __asm__ volatile(body::"r"(mem):CL); printf("%-40s %6.2f cycles\n",name,(now()-t)/n/per*1e9/nspc);}
int main(void){
  const long n=1000000000; double t=now();
  for(long i=0,k=0;i<n;i++) __asm__ volatile("add $1, %0":"+r"(k));
  nspc=(now()-t)/n*1e9; printf("clock: %.2f GHz\n",1/nspc);
  RUN("12 indep vpdpbusd zmm, each",12,R12(DZ))
  RUN("12 indep vpdpbusd ymm, each",12,R12(DY))
  RUN("12 indep vpdpbusd zmm bcast-mem, each",12,R12(DZB))
  RUN("12 indep vpmaddubsw zmm, each",12,R12(MUBZ))
  RUN("12 indep vpmaddwd zmm, each",12,R12(MWDZ))
  RUN("12 indep vpmaddubsw ymm, each",12,R12(MUBY))
  RUN("12 indep vfmadd231ps zmm, each",12,R12(FMAZ))
  RUN("12 dpbusd zmm (loop)",1,R12(DZ))
  RUN("12 dpbusd + 8 fma",1,R12(DZ) X8(FMAZ))
  RUN("12 dpbusd + 8 mul",1,R12(DZ) X8(MULZ))
  RUN("12 dpbusd + 8 cvt",1,R12(DZ) X8(CVTZ))
  RUN("12 dpbusd + 8 and",1,R12(DZ) X8(ANDZ))
  RUN("12 dpbusd + 8 srlw",1,R12(DZ) X8(SRLZ))
  RUN("12 dpbusd + 8 paddw",1,R12(DZ) X8(PADDW))
  RUN("12 dpbusd + 8 gf2p8affine",1,R12(DZ) X8(GF))
  RUN("12 maddubs zmm + 8 paddw",1,R12(MUBZ) X8(PADDW))
  RUN("12 maddubs zmm + 8 fma",1,R12(MUBZ) X8(FMAZ))
  return 0;
}
