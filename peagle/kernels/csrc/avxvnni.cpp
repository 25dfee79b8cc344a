// AVX-VNNI (Intel since Alder Lake, Zen 5; the VEX form of vpdpbusd, for CPUs without AVX-512): the
// integer path (kernels.h) on packed GGUF blocks, half a packed group's columns (8) in the lanes of a
// 256-bit vector. The same tile as AVX512-VNNI (vnni_tiles.h), in 16 registers. Chosen at run time.
#pragma GCC target("avx2,fma,f16c,avxvnni")
#include <immintrin.h>

#include "vnni_tiles.h"

namespace peagle {
namespace {

struct Ymm {
  static constexpr int LANES = 8, RMAX = 4;
  static constexpr int columns(int R) { return R == 1 ? 4 : R == 2 ? 2 : 1; }
  using ivec = __m256i;
  using fvec = __m256;
  static ivec set1_i32(int32_t v) { return _mm256_set1_epi32(v); }
  static ivec load(const uint8_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }
  static void nibbles(ivec raw, ivec& lo, ivec& hi) {
    lo = _mm256_and_si256(raw, _mm256_set1_epi8(15));
    hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), _mm256_set1_epi8(15));
  }
  static ivec dpbusd(ivec acc, ivec w, ivec x) { return _mm256_dpbusd_avx_epi32(acc, w, x); }
  static fvec zero_f() { return _mm256_setzero_ps(); }
  static fvec set1_f(float v) { return _mm256_set1_ps(v); }
  static fvec cvt_f(ivec v) { return _mm256_cvtepi32_ps(v); }
  static fvec mul(fvec a, fvec b) { return _mm256_mul_ps(a, b); }
  static fvec add(fvec a, fvec b) { return _mm256_add_ps(a, b); }
  static fvec fma(fvec a, fvec b, fvec c) { return _mm256_fmadd_ps(a, b, c); }
  static fvec load_ph(const uint8_t* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
  static fvec load_f(const float* p) { return _mm256_loadu_ps(p); }
  static void store(float* p, fvec v) { _mm256_storeu_ps(p, v); }
};

template <WType T>
using VnniAvx = VnniTiles<Ymm, T>;

}  // namespace

void qlinear_avxvnni(const QLinearArgs& a, int64_t g0, int64_t g1) { dispatch_packed<VnniAvx>(a, 2 * g0, 2 * g1); }

}  // namespace peagle
