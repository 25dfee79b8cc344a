// Which AVX-512 instructions share vpdpbusd's execution pipes (BENCHMARKS.md §34): cycles a loop iteration of
// 16 independent vpdpbusd (8 accumulators, each twice) plus 8 other independent instructions, against the
// 16 alone; the clock from a chain of dependent adds (one a cycle). An instruction that adds nothing runs
// on other pipes; one that adds ~0.5 cycle each competes.
//   gcc -O2 -mavx512f -o /tmp/pipes docs/results/pipes/pipes.c && taskset -c 0 /tmp/pipes
#include <stdio.h>
#include <time.h>

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}
static char mem[4096] __attribute__((aligned(64)));
static double ns_per_cycle;

#define CL "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10", "xmm11", "xmm12", "xmm13", \
           "xmm14", "xmm15", "xmm16", "xmm17", "xmm18", "xmm19", "xmm20", "xmm21"
#define D(i) "vpdpbusd %%zmm0, %%zmm1, %%zmm" #i "\n\t"
#define D16 D(2) D(3) D(4) D(5) D(6) D(7) D(8) D(9) D(2) D(3) D(4) D(5) D(6) D(7) D(8) D(9)
#define D12 D(2) D(3) D(4) D(5) D(6) D(7) D(8) D(9) D(10) D(11) D(12) D(13)
#define X8(OP) OP(14) OP(15) OP(16) OP(17) OP(18) OP(19) OP(20) OP(21)
#define CVT(o) "vcvtdq2ps %%zmm1, %%zmm" #o "\n\t"
#define MUL(o) "vmulps %%zmm0, %%zmm1, %%zmm" #o "\n\t"
#define ADD(o) "vaddps %%zmm0, %%zmm1, %%zmm" #o "\n\t"
#define FMA(o) "vfmadd231ps %%zmm0, %%zmm1, %%zmm" #o "\n\t"
#define PADD(o) "vpaddd %%zmm0, %%zmm1, %%zmm" #o "\n\t"
#define AND(o) "vpandd %%zmm0, %%zmm1, %%zmm" #o "\n\t"
#define SRL(o) "vpsrlw $4, %%zmm1, %%zmm" #o "\n\t"
#define MOV(o) "vmovdqa32 %%zmm1, %%zmm" #o "\n\t"
#define BCM(o) "vpbroadcastd (%0), %%zmm" #o "\n\t"
#define BCR(o) "vpbroadcastd %%xmm1, %%zmm" #o "\n\t"
#define CVTPH(o) "vcvtph2ps %%ymm1, %%zmm" #o "\n\t"
#define PF(o) "prefetcht0 " #o "(%0)\n\t"
#define RUN(name, per, body)                                                              \
  {                                                                                        \
    const long n = 50000000;                                                               \
    double t = now();                                                                      \
    for (long i = 0; i < n; i++) __asm__ volatile(body ::"r"(mem) : CL);                   \
    printf("%-34s %6.2f cycles\n", name, (now() - t) / n / per * 1e9 / ns_per_cycle);       \
  }

int main(void) {
  const long n = 1000000000;
  double t = now();
  for (long i = 0, k = 0; i < n; i++) __asm__ volatile("add $1, %0" : "+r"(k));
  ns_per_cycle = (now() - t) / n * 1e9;
  printf("clock: %.2f GHz (a dependent add a cycle)\n", 1 / ns_per_cycle);
  RUN("12 independent vpdpbusd, a dpbusd", 12, D12)
  RUN("12 independent vfmadd231ps, a fma", 12, X8(FMA) FMA(2) FMA(3) FMA(4) FMA(5))
  RUN("16 vpdpbusd", 1, D16)
  RUN("16 vpdpbusd + 8 vcvtdq2ps", 1, D16 X8(CVT))
  RUN("16 vpdpbusd + 8 vmulps", 1, D16 X8(MUL))
  RUN("16 vpdpbusd + 8 vfmadd231ps", 1, D16 X8(FMA))
  RUN("16 vpdpbusd + 8 vaddps", 1, D16 X8(ADD))
  RUN("16 vpdpbusd + 8 vpaddd", 1, D16 X8(PADD))
  RUN("16 vpdpbusd + 8 vpandd", 1, D16 X8(AND))
  RUN("16 vpdpbusd + 8 vpsrlw", 1, D16 X8(SRL))
  RUN("16 vpdpbusd + 8 vmovdqa32", 1, D16 X8(MOV))
  RUN("16 vpdpbusd + 8 vpbroadcastd (mem)", 1, D16 X8(BCM))
  RUN("16 vpdpbusd + 8 vpbroadcastd (xmm)", 1, D16 X8(BCR))
  RUN("16 vpdpbusd + 8 vcvtph2ps", 1, D16 X8(CVTPH))
  RUN("16 vpdpbusd + 8 prefetcht0", 1, D16 PF(0) PF(64) PF(128) PF(192) PF(256) PF(320) PF(384) PF(448))
  return 0;
}
