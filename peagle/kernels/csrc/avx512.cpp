// AVX-512 (Zen 4/5, Intel Xeon since Skylake-SP): 16 lanes, 32 registers. Chosen at run time.
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,fma,f16c")
#include <immintrin.h>

#include <cmath>
#include <cstring>

#include "attention_tiles.h"
#include "linear_tiles.h"

namespace peagle {
namespace {

struct Avx512 {
  static constexpr int LANES = 16;
  static constexpr int RMAX = 8, RWIDE = 6;
  static constexpr int columns(int R) { return R <= 2 ? 8 : R <= 6 ? 4 : 2; }
  using vec = __m512;
  static vec zero() { return _mm512_setzero_ps(); }
  static vec load_x(const float* p) { return _mm512_loadu_ps(p); }
  static vec load_x_tail(const float* p, int64_t n) { return _mm512_maskz_loadu_ps(__mmask16((1u << n) - 1), p); }
  static vec load_h(const uint16_t* p) { return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))); }
  template <WType T>
  static vec load_w(const uint8_t* row, int64_t k) {
    if constexpr (T == WType::f32) {
      return _mm512_loadu_ps(reinterpret_cast<const float*>(row) + k);
    } else {
      __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(reinterpret_cast<const uint16_t*>(row) + k));
      if constexpr (T == WType::f16) return _mm512_cvtph_ps(h);
      return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));  // bf16: a float's top half
    }
  }
  // Block b of a packed row as two vectors (weights 0..15, 16..31), as kernels.h says.
  template <WType T>
  static void load_block(const uint8_t* row, int64_t b, vec* out) {
    const QBlock p = qblock(row, T, b);
    const vec d = _mm512_set1_ps(_cvtsh_ss(p.d));
    if constexpr (T == WType::q8_0) {
      for (int s = 0; s < 2; ++s) {
        const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p.q + s * 16));
        out[s] = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q)), d);
      }
    } else {
      const __m512i q = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p.q)));
      const __m512i nib[2] = {_mm512_and_si512(q, _mm512_set1_epi32(15)), _mm512_srli_epi32(q, 4)};
      for (int s = 0; s < 2; ++s) {
        if constexpr (T == WType::q4_0)
          out[s] = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(nib[s], _mm512_set1_epi32(8))), d);
        else
          out[s] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(nib[s]), d, _mm512_set1_ps(_cvtsh_ss(p.m)));
      }
    }
  }
  template <WType T>
  static vec load_w_tail(const uint8_t* row, int64_t k, int64_t n) {
    constexpr int B = T == WType::f32 ? 4 : 2;
    alignas(64) uint8_t buf[64] = {0};
    std::memcpy(buf, row + k * B, n * B);
    return load_w<T>(buf, 0);
  }
  static vec fma(vec a, vec b, vec c) { return _mm512_fmadd_ps(a, b, c); }
  // acc *= c over d floats, elementwise (the same bits as scalar mul)
  static void scale(float* acc, float c, int64_t d) {
    int64_t e = 0;
    for (; e + LANES <= d; e += LANES) _mm512_storeu_ps(acc + e, _mm512_mul_ps(_mm512_loadu_ps(acc + e), _mm512_set1_ps(c)));
    for (; e < d; ++e) acc[e] *= c;
  }
  static vec set1(float x) { return _mm512_set1_ps(x); }
  static vec add(vec a, vec b) { return _mm512_add_ps(a, b); }
  static vec sub(vec a, vec b) { return _mm512_sub_ps(a, b); }
  static vec mul(vec a, vec b) { return _mm512_mul_ps(a, b); }
  static vec div(vec a, vec b) { return _mm512_div_ps(a, b); }
  static float max_of(const float* p, int64_t n) {  // the max is exact: any order
    vec r = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
    for (int64_t i = 0; i < n; i += LANES)
      r = _mm512_max_ps(r, _mm512_mask_loadu_ps(r, __mmask16(n - i >= LANES ? 0xffff : (1u << (n - i)) - 1), p + i));
    return _mm512_reduce_max_ps(r);
  }
  // lane i = hsum(v[i]), the same additions in the same pairs, 16 reductions sharing each shuffle and add:
  // l + l+8 (two vectors a step), then l + l+4, l + l+2, l + l+1 (within 128-bit lanes); the sums come out
  // with key 4t + j at lane 4j + t, put back in order by one permute
  // inlined: called, its 16 accumulators went through the stack (a quarter of one row's attention)
  __attribute__((always_inline)) static vec hsum_many(const vec* v) {
    vec h[8], w[4], z[2];
    for (int i = 0; i < 8; ++i)
      h[i] = _mm512_add_ps(_mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                           _mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], _MM_SHUFFLE(3, 2, 3, 2)));
    for (int i = 0; i < 4; ++i)
      w[i] = _mm512_add_ps(_mm512_shuffle_f32x4(h[2 * i], h[2 * i + 1], _MM_SHUFFLE(2, 0, 2, 0)),
                           _mm512_shuffle_f32x4(h[2 * i], h[2 * i + 1], _MM_SHUFFLE(3, 1, 3, 1)));
    for (int i = 0; i < 2; ++i)
      z[i] = _mm512_add_ps(_mm512_shuffle_ps(w[2 * i], w[2 * i + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                           _mm512_shuffle_ps(w[2 * i], w[2 * i + 1], _MM_SHUFFLE(3, 2, 3, 2)));
    const vec s = _mm512_add_ps(_mm512_shuffle_ps(z[0], z[1], _MM_SHUFFLE(2, 0, 2, 0)),
                                _mm512_shuffle_ps(z[0], z[1], _MM_SHUFFLE(3, 1, 3, 1)));
    return _mm512_permutexvar_ps(_mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15), s);
  }
  static vec mask_n(vec x, int64_t c) { return _mm512_maskz_mov_ps(__mmask16((1u << c) - 1), x); }
  static void store_n(float* p, vec x, int64_t c) { _mm512_mask_storeu_ps(p, __mmask16((1u << c) - 1), x); }
  // lanes [first, first + c) to p[0 .. c): a masked store whose masked-off lanes touch no memory
  static void store_lanes(float* p, vec x, int first, int c) {
    _mm512_mask_storeu_ps(reinterpret_cast<float*>(reinterpret_cast<uintptr_t>(p) - 4 * first),
                          __mmask16(((1u << c) - 1) << first), x);
  }
  static float exp1(float x) { return exp_scalar(x); }
  static vec exp(vec x) {  // exp_scalar in every lane
    const __mmask16 zero = _mm512_cmp_ps_mask(x, set1(EXP_LO), _CMP_LT_OQ);
    x = _mm512_min_ps(_mm512_max_ps(x, set1(EXP_LO)), set1(EXP_HI));
    const vec n = _mm512_roundscale_ps(_mm512_mul_ps(x, set1(LOG2E)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    vec r = _mm512_fmadd_ps(n, set1(-LN2_HI), x);
    r = _mm512_fmadd_ps(n, set1(-LN2_LO), r);
    vec p = set1(EXP_POLY[0]);
    for (int i = 1; i < 6; ++i) p = _mm512_fmadd_ps(p, r, set1(EXP_POLY[i]));
    const vec y = _mm512_mul_ps(_mm512_add_ps(_mm512_fmadd_ps(p, _mm512_mul_ps(r, r), r), set1(1.f)), _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23)));
    return _mm512_maskz_mov_ps(__mmask16(~zero), y);
  }
  static float hsum(vec v) {  // (l + l+8) for l < 8, then the 8-lane tree of linear_avx2.cpp
    __m256 h = _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
  }
};

}  // namespace

void linear_avx512(const LinearArgs& a, int64_t n0, int64_t n1) { dispatch_wtype<Avx512>(a, n0, n1); }

// quantize_rows_ref's operations, a block of 32 as two vectors (max, the division, the product, rounding to
// nearest even and the integer sum are exact whatever the order)
void quantize_rows_avx512(const float* x, int64_t ldx, int64_t K, int64_t span, int32_t offset, const QRows& out,
                          int64_t m0, int64_t m1) {
  const int64_t nb = K / QBLOCK;
  const __m512 sign = _mm512_set1_ps(-0.f);
  for (int64_t m = m0; m < m1; ++m)
    for (int64_t b0 = 0; b0 < K; b0 += span) {
      __m512 mx = _mm512_setzero_ps();
      for (int64_t k = b0; k < b0 + span; k += 16) mx = _mm512_max_ps(mx, _mm512_andnot_ps(sign, _mm512_loadu_ps(x + m * ldx + k)));
      const float d = _mm512_reduce_max_ps(mx) / 127.f, id = d != 0.f ? 1.f / d : 0.f;
      for (int64_t b = b0 / QBLOCK; b < (b0 + span) / QBLOCK; ++b) {
        const float* p = x + m * ldx + b * QBLOCK;
        const __m512i q0 = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(p), _mm512_set1_ps(id)));
        const __m512i q1 = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(p + 16), _mm512_set1_ps(id)));
        int8_t* q = out.q + m * K + b * QBLOCK;
        _mm_storeu_si128(reinterpret_cast<__m128i*>(q), _mm512_cvtepi32_epi8(q0));
        _mm_storeu_si128(reinterpret_cast<__m128i*>(q + 16), _mm512_cvtepi32_epi8(q1));
        const int32_t s = _mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1));
        out.d[m * nb + b] = d;
        out.sd[m * nb + b] = d * float(s);
        out.c[m * nb + b] = -offset * s;
        out.c16[m * nb + b] = -offset * _mm512_reduce_add_epi32(q0);
        out.s[m * nb + b] = float(s);
      }
    }
}

void attention_avx512(const AttnArgs& a, int64_t i0, int64_t i1) { attention_items<Avx512>(a, i0, i1); }

void argmax_row_avx512(const float* r, int64_t n, float* value, int64_t* index) {
  __m512 m = _mm512_set1_ps(r[0]), zero = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 x = _mm512_loadu_ps(r + i);
    m = _mm512_max_ps(m, x);
    zero = _mm512_add_ps(zero, _mm512_sub_ps(x, x));
  }
  float mx = _mm512_reduce_max_ps(m), z = _mm512_reduce_add_ps(zero);
  for (int64_t j = i; j < n; ++j) mx = r[j] > mx ? r[j] : mx, z += r[j] - r[j];
  int64_t at = 0;  // the first index holding the max, a vector of compares at a time
  for (; at + 16 <= n; at += 16) {
    const __mmask16 hit = _mm512_cmp_ps_mask(_mm512_loadu_ps(r + at), _mm512_set1_ps(mx), _CMP_EQ_OQ);
    if (hit) break;
  }
  if (at + 16 <= n) at += __builtin_ctz(_mm512_cmp_ps_mask(_mm512_loadu_ps(r + at), _mm512_set1_ps(mx), _CMP_EQ_OQ));
  else
    while (at < n && r[at] != mx) ++at;
  if (at == n) at = 0;  // no element equals the max: a NaN row (flagged below)
  *value = z == 0.f ? mx : std::numeric_limits<float>::quiet_NaN();
  *index = at;
}

void silu_mul_avx512(const float* gu, float* out, int64_t n, int64_t t0, int64_t t1) {
  silu_mul_rows<Avx512>(gu, out, n, t0, t1);
}

}  // namespace peagle
