// AVX512-VNNI (Intel Xeon since Cascade Lake, Zen 4/5): the integer path (kernels.h) on packed GGUF
// blocks, 16 columns in the lanes of a vector, vpdpbusd (uint8 weights x int8 activations, four products
// a lane into int32). Chosen at run time; its own file so that no other path is compiled for VNNI.
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,fma,f16c")
#include <immintrin.h>

#include <cstring>

#include "linear_tiles.h"

namespace peagle {
namespace {

inline __m512i bcast4(const int8_t* p) {  // four int8 activations in every lane
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm512_set1_epi32(v);
}

// Rows [m, m+R) x column groups [g, g+G): R*G int32 vectors per block (starting from the row's -offset * s,
// so they end at the weight's own dot product), R*G float32 accumulators. Each weight vector is loaded (and
// its nibbles split) once for all R rows.
// vpdpbusd's latency (~5 cycles at two a cycle) wants about 12 independent sums in flight: R x G as near
// 12 as 32 registers allow (R * G int32 and float32 vectors, and the weights' 2G). Taller passes go in tiles
// of 4 x 3 (measured on a Xeon: 0.38 ns a vpdpbusd with weights in cache, against 0.46 for 8 x 1).
template <WType T>
struct Vnni512 {
  using Args = QLinearArgs;
  static constexpr int RMAX = 8, RTALL = 8;
  static constexpr int columns(int R) { return R <= 2 ? 4 : R <= 4 ? 3 : R <= 6 ? 2 : 1; }

  template <int R, int G>
  static void tile(const QLinearArgs& a, int64_t m, int64_t g) {
    constexpr int64_t PB = packed_bytes(T), QOFF = packed_scales(T);
    const int64_t nb = a.K / QBLOCK;
    const uint8_t* w = a.w + g * nb * PB;
    const uint8_t* next = w + G * nb * PB;  // the next tile's groups: prefetched while these compute
    const __m512i low = _mm512_set1_epi8(15);
    __m512 acc[R][G];
    for (int r = 0; r < R; ++r)
      for (int j = 0; j < G; ++j) acc[r][j] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; ++b) {
      __m512i is[R][G];
      for (int r = 0; r < R; ++r) {
        const __m512i c = _mm512_set1_epi32(a.x.c[(m + r) * nb + b]);
        for (int j = 0; j < G; ++j) is[r][j] = c;
      }
      for (int j = 0; j < G; ++j) {
        for (int64_t l = 0; l < PB; l += 64) __builtin_prefetch(next + (j * nb + b) * PB + l, 0, 3);
        const uint8_t* p = w + (j * nb + b) * PB + QOFF;
        if constexpr (T == WType::q8_0) {
          for (int v = 0; v < 8; ++v) {
            const __m512i wv = _mm512_loadu_si512(p + 64 * v);
            for (int r = 0; r < R; ++r)
              is[r][j] = _mm512_dpbusd_epi32(is[r][j], wv, bcast4(a.x.q + (m + r) * a.K + b * QBLOCK + 4 * v));
          }
        } else {
          for (int v = 0; v < 4; ++v) {
            const __m512i raw = _mm512_loadu_si512(p + 64 * v);
            const __m512i lo = _mm512_and_si512(raw, low), hi = _mm512_and_si512(_mm512_srli_epi16(raw, 4), low);
            for (int r = 0; r < R; ++r) {
              const int8_t* x = a.x.q + (m + r) * a.K + b * QBLOCK + 4 * v;
              is[r][j] = _mm512_dpbusd_epi32(is[r][j], lo, bcast4(x));
              is[r][j] = _mm512_dpbusd_epi32(is[r][j], hi, bcast4(x + 16));
            }
          }
        }
      }
      for (int j = 0; j < G; ++j) {
        const uint8_t* s = w + (j * nb + b) * PB;
        const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(s)));
        for (int r = 0; r < R; ++r) {
          const int64_t xb = (m + r) * nb + b;
          const __m512 t = _mm512_mul_ps(_mm512_cvtepi32_ps(is[r][j]), _mm512_set1_ps(a.x.d[xb]));
          acc[r][j] = _mm512_fmadd_ps(dw, t, acc[r][j]);
          if constexpr (T == WType::q4_1) {
            const __m512 mw = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + 32)));
            acc[r][j] = _mm512_fmadd_ps(mw, _mm512_set1_ps(a.x.sd[xb]), acc[r][j]);
          }
        }
      }
    }
    for (int r = 0; r < R; ++r)
      for (int j = 0; j < G; ++j) {
        const int64_t n = (g + j) * QGROUP;
        __m512 y = acc[r][j];
        if (a.bias) y = _mm512_add_ps(y, _mm512_loadu_ps(a.bias + n));
        _mm512_storeu_ps(a.y + (m + r) * a.ldy + n, y);
      }
  }
};

}  // namespace

void qlinear_avx512vnni(const QLinearArgs& a, int64_t g0, int64_t g1) { dispatch_packed<Vnni512>(a, g0, g1); }

}  // namespace peagle
