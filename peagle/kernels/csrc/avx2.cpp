// AVX2 + FMA + F16C (Zen 3 and later, Intel since Haswell): 8 lanes. Chosen at run time; the target
// pragma keeps the rest of the library loadable on any x86-64.
#pragma GCC target("avx2,fma,f16c")
#include <immintrin.h>

#include <cmath>
#include <cstring>

#include "attention_tiles.h"
#include "linear_tiles.h"

namespace peagle {
namespace {

struct Avx2 {
  static constexpr int LANES = 8;
  static constexpr int RMAX = 6, RWIDE = 3;
  static constexpr int columns(int R) { return R == 1 ? 8 : R <= 3 ? 4 : 2; }
  using vec = __m256;
  static vec zero() { return _mm256_setzero_ps(); }
  static vec load_x(const float* p) { return _mm256_loadu_ps(p); }
  static vec load_x_tail(const float* p, int64_t n) {
    alignas(32) float buf[8] = {0};
    std::memcpy(buf, p, n * 4);
    return _mm256_load_ps(buf);
  }
  template <WType T>
  static vec load_w(const uint8_t* row, int64_t k) {
    if constexpr (T == WType::f32) {
      return _mm256_loadu_ps(reinterpret_cast<const float*>(row) + k);
    } else {
      __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(reinterpret_cast<const uint16_t*>(row) + k));
      if constexpr (T == WType::f16) return _mm256_cvtph_ps(h);
      return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));  // bf16: a float's top half
    }
  }
  // Block b of a packed row as four vectors (weights 0..7, 8..15, 16..23, 24..31), as kernels.h says.
  template <WType T>
  static void load_block(const uint8_t* row, int64_t b, vec* out) {
    const QBlock p = qblock(row, T, b);
    const vec d = _mm256_set1_ps(_cvtsh_ss(p.d));
    if constexpr (T == WType::q8_0) {
      for (int s = 0; s < 4; ++s) {
        const __m128i q = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p.q + s * 8));
        out[s] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q)), d);
      }
    } else {
      __m256i nib[4];
      for (int h = 0; h < 2; ++h) {  // bytes 0..7 and 8..15: low nibbles weights 8h.., high ones 16 + 8h..
        const __m256i q = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p.q + h * 8)));
        nib[h] = _mm256_and_si256(q, _mm256_set1_epi32(15));
        nib[2 + h] = _mm256_srli_epi32(q, 4);
      }
      for (int s = 0; s < 4; ++s) {
        if constexpr (T == WType::q4_0)
          out[s] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(nib[s], _mm256_set1_epi32(8))), d);
        else
          out[s] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(nib[s]), d, _mm256_set1_ps(_cvtsh_ss(p.m)));
      }
    }
  }
  template <WType T>
  static vec load_w_tail(const uint8_t* row, int64_t k, int64_t n) {
    constexpr int B = T == WType::f32 ? 4 : 2;
    alignas(32) uint8_t buf[32] = {0};
    std::memcpy(buf, row + k * B, n * B);
    return load_w<T>(buf, 0);
  }
  static vec fma(vec a, vec b, vec c) { return _mm256_fmadd_ps(a, b, c); }
  // acc *= c over d floats, elementwise (the same bits as scalar mul)
  static void scale(float* acc, float c, int64_t d) {
    int64_t e = 0;
    for (; e + LANES <= d; e += LANES) _mm256_storeu_ps(acc + e, _mm256_mul_ps(_mm256_loadu_ps(acc + e), _mm256_set1_ps(c)));
    for (; e < d; ++e) acc[e] *= c;
  }
  static vec set1(float x) { return _mm256_set1_ps(x); }
  static vec add(vec a, vec b) { return _mm256_add_ps(a, b); }
  static vec sub(vec a, vec b) { return _mm256_sub_ps(a, b); }
  static vec mask_n(vec x, int64_t c) {
    if (c == LANES) return x;
    alignas(32) float buf[8];
    _mm256_store_ps(buf, x);
    std::fill(buf + c, buf + 8, 0.f);
    return _mm256_load_ps(buf);
  }
  static void store_n(float* p, vec x, int64_t c) {
    if (c == LANES) return _mm256_storeu_ps(p, x);
    alignas(32) float buf[8];
    _mm256_store_ps(buf, x);
    std::memcpy(p, buf, c * 4);
  }
  static float exp1(float x) { return exp_scalar(x); }
  static vec exp(vec x) {  // exp_scalar in every lane
    const vec zero = _mm256_cmp_ps(x, set1(EXP_LO), _CMP_LT_OQ);
    x = _mm256_min_ps(_mm256_max_ps(x, set1(EXP_LO)), set1(EXP_HI));
    const vec n = _mm256_round_ps(_mm256_mul_ps(x, set1(LOG2E)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    vec r = _mm256_fmadd_ps(n, set1(-LN2_HI), x);
    r = _mm256_fmadd_ps(n, set1(-LN2_LO), r);
    vec p = set1(EXP_POLY[0]);
    for (int i = 1; i < 6; ++i) p = _mm256_fmadd_ps(p, r, set1(EXP_POLY[i]));
    const vec y = _mm256_mul_ps(_mm256_add_ps(_mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r), set1(1.f)), _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23)));
    return _mm256_andnot_ps(zero, y);
  }
  static void weighted_sum(float (*acc)[MAX_HEAD_DIM], const float (*p)[KEY_BLOCK], const float* const* vrow,
                           int64_t n, int64_t g, int64_t d) {
    int64_t e = 0;
    for (; e + LANES <= d; e += LANES) {
      vec a[MAX_QUERIES];
      for (int64_t gi = 0; gi < g; ++gi) a[gi] = _mm256_loadu_ps(acc[gi] + e);
      for (int64_t j = 0; j < n; ++j) {
        const vec vj = _mm256_loadu_ps(vrow[j] + e);
        for (int64_t gi = 0; gi < g; ++gi) a[gi] = _mm256_fmadd_ps(set1(p[gi][j]), vj, a[gi]);
      }
      for (int64_t gi = 0; gi < g; ++gi) _mm256_storeu_ps(acc[gi] + e, a[gi]);
    }
    weighted_sum_scalar(acc, p, vrow, n, g, e, d);
  }
  static float hsum(vec v) {  // ((0+4)+(2+6)) + ((1+5)+(3+7))
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
  }
};

}  // namespace

void linear_avx2(const LinearArgs& a, int64_t n0, int64_t n1) { dispatch_wtype<Avx2>(a, n0, n1); }

void attention_avx2(const AttnArgs& a, int64_t i0, int64_t i1) { attention_items<Avx2>(a, i0, i1); }

}  // namespace peagle
