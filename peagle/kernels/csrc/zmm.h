// The integer path's 512-bit vector traits for vnni_tiles.h (16 columns a vector: a packed group, 32 registers)
// with AVX512-VNNI's vpdpbusd: avx512vnni.cpp's tiles and amx.cpp's nibble split and epilogue. Included after
// an ISA's `#pragma GCC target`; each file compiles its own copy.
#pragma once
#include <immintrin.h>

#include <cstdint>

namespace peagle {
namespace {

// vpdpbusd's latency (~5 cycles at two a cycle) wants about 12 independent sums in flight: R x G as near
// 12 as 32 registers allow (R * G int32 vectors, the weights' 2G, two broadcasts; the float32 sums, touched
// once a chunk, may live on the stack). A verification pass of 5-8 rows is one tile 2 units wide: each weight
// vector split once for all its rows, where two tiles of 4 x 3 split it twice, and the split's and-shift-and
// share the two vector ports with vpdpbusd (Emerald Rapids, one core, a 512 x 4,096 matrix from L2: 8 rows
// 1.08-1.12x the products a second in Q4_0, Q4_K, Q6_K, Q8_0 0.94-1.01x; 5 rows 1.14-1.24x; a 3B K=7 round
// 0.88-1.02x the time, median 0.98x, in Q4_0, 0.92-0.96x in Q4_K_M). Prefill (RTALL) keeps tiles of 4 rows,
// each tile's weights then read from L1 (Zen 5, the default model's layer matmuls on one thread: 4 rows
// 3.0 -> 2.3 ms, 8 rows 4.2 -> 3.9 ms against tiles of 8 x 1). Streamed one unit wide (the narrow tiles), 8 rows
// are one tile too, each weight vector split once for all 8 (Zen 4, the default model's layer matmuls at 8 rows,
// two threads: 6.36 -> 5.67 ms against two tiles of 4; Emerald Rapids from L2: Q5_K 1.17-1.20x, Q6_K 1.26x).
struct Zmm {
  static constexpr int LANES = 16, RMAX = 8, RTALL = 4;
  static constexpr int columns(int R) { return R <= 1 ? 4 : R <= 4 ? 3 : 2; }
  using ivec = __m512i;
  using fvec = __m512;
  static constexpr int i16_steps(int) { return 0; }  // dpbusd into int32 each (vnni_tiles.h's STEPS)
  static ivec set1_i32(int32_t v) { return _mm512_set1_epi32(v); }
  static ivec set1_i8(char v) { return _mm512_set1_epi8(v); }
  static ivec load(const uint8_t* p) { return _mm512_loadu_si512(p); }
  static void store_i(uint8_t* p, ivec v) { _mm512_storeu_si512(p, v); }
  static void nibbles(ivec raw, ivec& lo, ivec& hi) {
    lo = _mm512_and_si512(raw, _mm512_set1_epi8(15));
    hi = _mm512_and_si512(_mm512_srli_epi16(raw, 4), _mm512_set1_epi8(15));
  }
  static ivec slli16(ivec v, int n) { return _mm512_sll_epi16(v, _mm_cvtsi32_si128(n)); }
  static ivec srli16(ivec v, int n) { return _mm512_srl_epi16(v, _mm_cvtsi32_si128(n)); }
  static ivec and_(ivec a, ivec b) { return _mm512_and_si512(a, b); }
  static ivec or_(ivec a, ivec b) { return _mm512_or_si512(a, b); }
  static ivec dpbusd(ivec acc, ivec w, ivec x) { return _mm512_dpbusd_epi32(acc, w, x); }
  static fvec zero_f() { return _mm512_setzero_ps(); }
  static fvec set1_f(float v) { return _mm512_set1_ps(v); }
  static fvec cvt_f(ivec v) { return _mm512_cvtepi32_ps(v); }
  static fvec mul(fvec a, fvec b) { return _mm512_mul_ps(a, b); }
  static fvec add(fvec a, fvec b) { return _mm512_add_ps(a, b); }
  static fvec fma(fvec a, fvec b, fvec c) { return _mm512_fmadd_ps(a, b, c); }
  static fvec load_ph(const uint8_t* p) { return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))); }
  static fvec load_u8_f(const uint8_t* p) {
    return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
  }
  static fvec load_i8_f(const uint8_t* p) {
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
  }
  static fvec load_f(const float* p) { return _mm512_loadu_ps(p); }
  static void store(float* p, fvec v) { _mm512_storeu_ps(p, v); }
};

}  // namespace
}  // namespace peagle
