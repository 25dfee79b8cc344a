// AVX512_BF16 (Zen 4/5, Intel since Cooper Lake): the bf16 dot-product path (kernels.h) on packed bf16
// weights, a group's 16 columns in the lanes of a vector, vdpbf16ps (two bf16 products a lane into
// float32). Chosen at run time; its own file so that no other path is compiled for AVX512_BF16.
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16")
#include <immintrin.h>

#include <cstring>

#include "linear_tiles.h"

namespace peagle {
namespace {

// R rows x G groups: R * G accumulators and G weight vectors in the 32 registers, each weight vector
// loaded once for all R rows; beside it the next tile's line prefetched, or for one row (reading memory at
// its pace) the line 16 pairs on in the same group (measured ~0.9x the time). 4 groups up to 4 rows, 3 for 5 to
// 8 (measured on Zen 5, one thread, a 256 x 1536 weight in L2: 0.16-0.18 ns a vdpbf16ps at 8-16 rows; 6 or
// 8 groups for 1-2 rows measured no faster).
struct Bf16Tiles {
  using Args = BLinearArgs;
  static constexpr int RMAX = 8, RTALL = 8;
  static constexpr int columns(int R) { return R <= 4 ? 4 : 3; }
  // one read stream where weights stream (run_packed's rule, stream_bytes); taller tiles keep 3 (Zen 4, the
  // default model's layers in bf16, two threads: 8 rows 11.4 -> 12.9 ms one group wide)
  static constexpr int stream_columns(int R) { return R <= 4 ? 1 : columns(R); }

  template <int R, int G>
  static void tile(const BLinearArgs& a, int64_t m, int64_t g) {
    const int64_t KP = a.K / 2;
    const uint8_t* w = a.w + g * KP * BF16_PAIR_BYTES;
    const uint8_t* next = w + G * KP * BF16_PAIR_BYTES;
    __m512 acc[R][G];
    for (int r = 0; r < R; ++r)
      for (int j = 0; j < G; ++j) acc[r][j] = _mm512_setzero_ps();
    for (int64_t p = 0; p < KP; ++p) {
      __m512i wv[G];
      for (int j = 0; j < G; ++j) {
        const int64_t at = (j * KP + p) * BF16_PAIR_BYTES;
        __builtin_prefetch(R == 1 ? w + at + 16 * BF16_PAIR_BYTES : next + at, 0, 3);
        wv[j] = _mm512_loadu_si512(w + at);
      }
      for (int r = 0; r < R; ++r) {
        int32_t pair;
        std::memcpy(&pair, a.x + (m + r) * a.K + 2 * p, 4);
        const __m512bh xv = (__m512bh)_mm512_set1_epi32(pair);
        for (int j = 0; j < G; ++j) acc[r][j] = _mm512_dpbf16_ps(acc[r][j], (__m512bh)wv[j], xv);
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

void bf16_rows_avx512bf16(const float* x, int64_t ldx, int64_t K, uint16_t* out, int64_t m0, int64_t m1) {
  for (int64_t m = m0; m < m1; ++m)
    for (int64_t k = 0; k < K; k += 16) {
      const __mmask16 live = K - k >= 16 ? __mmask16(0xffff) : __mmask16((1u << (K - k)) - 1);
      const __m256bh h = _mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(live, x + m * ldx + k));
      _mm256_mask_storeu_epi16(out + m * K + k, live, (__m256i)h);
    }
}

void bf16linear_avx512bf16(const BLinearArgs& a, int64_t g0, int64_t g1) { run_bf16_packed<Bf16Tiles>(a, g0, g1); }

}  // namespace peagle
