// The integer path's 256-bit vector traits for vnni_tiles.h (8 columns a vector, 16 registers), all but
// dpbusd: AVX-VNNI's vpdpbusd (avxvnni.cpp) or AVX2's maddubs + madd (avx2.cpp). Included after an ISA's
// `#pragma GCC target`; each file compiles its own copy.
#pragma once
#include <immintrin.h>

#include <cstdint>

namespace peagle {
namespace {

struct YmmBase {
  static constexpr int LANES = 8, RMAX = 4, RTALL = 4;
  static constexpr int columns(int R) { return R == 1 ? 4 : R == 2 ? 2 : 1; }
  using ivec = __m256i;
  using fvec = __m256;
  static constexpr int i16_steps(int) { return 0; }  // dpbusd into int32 each (vnni_tiles.h's STEPS)
  static ivec set1_i32(int32_t v) { return _mm256_set1_epi32(v); }
  static ivec set1_i8(char v) { return _mm256_set1_epi8(v); }
  static ivec load(const uint8_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }
  static void store_i(uint8_t* p, ivec v) { _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), v); }
  static void nibbles(ivec raw, ivec& lo, ivec& hi) {
    lo = _mm256_and_si256(raw, _mm256_set1_epi8(15));
    hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), _mm256_set1_epi8(15));
  }
  static ivec slli16(ivec v, int n) { return _mm256_sll_epi16(v, _mm_cvtsi32_si128(n)); }
  static ivec srli16(ivec v, int n) { return _mm256_srl_epi16(v, _mm_cvtsi32_si128(n)); }
  static ivec and_(ivec a, ivec b) { return _mm256_and_si256(a, b); }
  static ivec or_(ivec a, ivec b) { return _mm256_or_si256(a, b); }
  static fvec zero_f() { return _mm256_setzero_ps(); }
  static fvec set1_f(float v) { return _mm256_set1_ps(v); }
  static fvec cvt_f(ivec v) { return _mm256_cvtepi32_ps(v); }
  static fvec mul(fvec a, fvec b) { return _mm256_mul_ps(a, b); }
  static fvec add(fvec a, fvec b) { return _mm256_add_ps(a, b); }
  static fvec fma(fvec a, fvec b, fvec c) { return _mm256_fmadd_ps(a, b, c); }
  static fvec load_ph(const uint8_t* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
  static fvec load_u8_f(const uint8_t* p) {
    return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
  }
  static fvec load_i8_f(const uint8_t* p) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
  }
  static fvec load_f(const float* p) { return _mm256_loadu_ps(p); }
  static void store(float* p, fvec v) { _mm256_storeu_ps(p, v); }
};

}  // namespace
}  // namespace peagle
