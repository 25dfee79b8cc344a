// float -> bf16 as vcvtne2ps2bf16 / vcvtneps2bf16 do, against a candidate scalar rule.
#pragma GCC target("avx512f,avx512bf16,avx512bw,avx512vl")
#include <immintrin.h>
#include <cstdio>
#include <cstring>
#include <cstdint>
#include <random>
static uint16_t cand(float f) {
  uint32_t u; memcpy(&u, &f, 4);
  if ((u & 0x7fffffff) > 0x7f800000) return uint16_t((u >> 16) | 0x40);  // NaN: quiet, sign and top payload kept
  if ((u & 0x7f800000) == 0) return uint16_t((u >> 16) & 0x8000);       // zero / denormal: signed zero
  return uint16_t((u + 0x7fff + ((u >> 16) & 1)) >> 16);                // RNE (overflow to inf by carry)
}
int main() {
  std::mt19937 g(1);
  long bad2 = 0, bad1 = 0, n = 0, den = 0, nan = 0;
  for (int it = 0; it < 400000; ++it) {
    uint32_t u[32];
    for (int i = 0; i < 32; ++i) {
      uint32_t r = g();
      switch (g() % 6) {
        case 0: u[i] = r & 0x807fffff; break;                 // denormal / zero
        case 1: u[i] = (r & 0x807fffff) | 0x7f800000; break;  // inf / NaN (sNaN, qNaN)
        case 2: u[i] = (r & 0xffff0000) | 0x8000; break;     // exact ties
        case 3: u[i] = (r & 0x80000000) | 0x7f7f8000 | (r & 0x7fff); break;  // near overflow
        default: u[i] = r;
      }
      if ((u[i] & 0x7f800000) == 0 && (u[i] & 0x7fffff)) den++;
      if ((u[i] & 0x7fffffff) > 0x7f800000) nan++;
    }
    float f[32]; memcpy(f, u, 128);
    __m512bh h2 = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(f + 16), _mm512_loadu_ps(f));  // low half: f[0..15]
    __m256bh h1 = _mm512_cvtneps_pbh(_mm512_loadu_ps(f));
    uint16_t o2[32], o1[16]; memcpy(o2, &h2, 64); memcpy(o1, &h1, 32);
    for (int i = 0; i < 32; ++i) { n++; if (o2[i] != cand(f[i])) { if (bad2++ < 5) printf("2ps %08x -> %04x, cand %04x\n", u[i], o2[i], cand(f[i])); } }
    for (int i = 0; i < 16; ++i) if (o1[i] != cand(f[i])) bad1++;
  }
  printf("%ld values (%ld denormal, %ld NaN): vcvtne2ps2bf16 mismatches %ld, vcvtneps2bf16 %ld\n", n, den, nan, bad2, bad1);
}
