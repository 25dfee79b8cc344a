#include <immintrin.h>
#include <chrono>
#include <cstdio>
#define R12(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11)
template<class F> double tm(F f, long N){ auto t0=std::chrono::steady_clock::now(); f(); auto t1=std::chrono::steady_clock::now(); return std::chrono::duration<double,std::nano>(t1-t0).count()/N; }
int main(){
  const long N=600000000;
#define BENCH(T, SET, OP, NAME, MACS) { \
    R12(DECL_##T) T w = SET; \
    double ns=tm([&]{ for(long i=0;i<N/12;i++){ R12(OP) asm volatile("" :: "v"(a0),"v"(a1),"v"(a2),"v"(a3),"v"(a4),"v"(a5),"v"(a6),"v"(a7),"v"(a8),"v"(a9),"v"(a10),"v"(a11)); } },N); \
    R12(SINK) printf("%s %.3f ns -> %.1f G/s\n", NAME, ns, MACS/ns); }
#define SINK(i) asm volatile("" :: "v"(a##i));
#define DECL___m512i(i) __m512i a##i = _mm512_set1_epi32(i);
#define DECL___m256i(i) __m256i a##i = _mm256_set1_epi32(i);
#define DPZ(i) a##i = _mm512_dpbusd_epi32(a##i, w, w);
#define DPY(i) a##i = _mm256_dpbusd_epi32(a##i, w, w);
#define ADDZ(i) a##i = _mm512_add_epi32(a##i, w);
#define MADY(i) a##i = _mm256_maddubs_epi16(w, a##i);
  BENCH(__m512i, _mm512_set1_epi8(3), DPZ, "dpbusd zmm", 64)
  BENCH(__m256i, _mm256_set1_epi8(3), DPY, "dpbusd ymm", 32)
  BENCH(__m512i, _mm512_set1_epi8(3), ADDZ, "add zmm", 1)
  BENCH(__m256i, _mm256_set1_epi8(3), MADY, "maddubs ymm", 32)
}
