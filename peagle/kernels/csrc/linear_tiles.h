// The tiling every SIMD path shares, over an ISA's vector traits V (included by linear_<isa>.cpp after
// its `#pragma GCC target`). V supplies: LANES, RMAX (the tallest tile), RWIDE (the tile height for
// passes taller than RMAX), columns(R) (a tile's width for
// R rows, within the registers), vec, zero(), load_x(p), load_x_tail(p, n),
// load_w<T>(row, k) (weights k .. k+LANES-1 of a float row), load_w_tail<T>(row, k, n),
// load_block<T>(row, b, out) (block b of a row of GGUF blocks: QBLOCK / LANES vectors, float32),
// fma(a, b, c) and hsum(v) (lanes reduced as reference.cpp).
#pragma once
#include "kernels.h"

namespace peagle {

// Rows [m, m+R) x columns [n, n+NB): R*NB independent accumulators; each weight vector is converted
// once and used by R rows, each x vector loaded once and used by NB columns. The tail (K % LANES) enters zero-padded: zero lanes add +0
// to their sums, as the reference adds nothing. The next column block's weights are prefetched while
// this one computes: the first touch of a weight is the one that waits for memory.
template <class V, WType T, int R, int NB>
static void tile(const LinearArgs& a, int64_t m, int64_t n) {
  constexpr int L = V::LANES, B = T == WType::f32 ? 4 : 2;
  const int64_t K = a.K, KL = K - K % L, RB = row_bytes(T, K);  // quantized: K % QBLOCK == 0, no tail
  const float* x = a.x + m * a.ldx;
  const uint8_t* w = static_cast<const uint8_t*>(a.w) + n * RB;
  const uint8_t* next = w + NB * RB;
  typename V::vec acc[R][NB];
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < NB; ++j) acc[r][j] = V::zero();
  if constexpr (quantized(T)) {
    // a block per step, its scales and quants loaded once for the QBLOCK / L vectors it gives
    for (int64_t b = 0; b < K / QBLOCK; ++b) {
      typename V::vec wv[NB][QBLOCK / L];
      for (int j = 0; j < NB; ++j) {
        __builtin_prefetch(next + j * RB + b * block_bytes(T), 0, 3);
        V::template load_block<T>(w + j * RB, b, wv[j]);
      }
      for (int s = 0; s < QBLOCK / L; ++s) {
        typename V::vec xv[R];
        for (int r = 0; r < R; ++r) xv[r] = V::load_x(x + r * a.ldx + b * QBLOCK + s * L);
        for (int j = 0; j < NB; ++j)
          for (int r = 0; r < R; ++r) acc[r][j] = V::fma(wv[j][s], xv[r], acc[r][j]);
      }
    }
  } else {
    for (int64_t k = 0; k < KL; k += L) {
      typename V::vec xv[R];
      for (int r = 0; r < R; ++r) {
        xv[r] = V::load_x(x + r * a.ldx + k);
        asm("" : "+v"(xv[r]));  // keep x in a register for all NB columns (not re-loaded per FMA)
      }
      for (int j = 0; j < NB; ++j) {
        __builtin_prefetch(next + (j * K + k) * B, 0, 3);
        typename V::vec wv = V::template load_w<T>(w + j * RB, k);
        for (int r = 0; r < R; ++r) acc[r][j] = V::fma(wv, xv[r], acc[r][j]);
      }
    }
    if (KL < K) {
      for (int j = 0; j < NB; ++j) {
        typename V::vec wv = V::template load_w_tail<T>(w + j * RB, KL, K - KL);
        for (int r = 0; r < R; ++r) acc[r][j] = V::fma(wv, V::load_x_tail(x + r * a.ldx + KL, K - KL), acc[r][j]);
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < NB; ++j) {
      float s = V::hsum(acc[r][j]);
      a.y[(m + r) * a.ldy + n + j] = a.bias ? s + a.bias[n + j] : s;
    }
}

// The rows [m, M) left over by full tiles of RMAX (fewer than RMAX), in one tile.
template <class V, WType T, int NB, int R = V::RMAX - 1>
static void rest(const LinearArgs& a, int64_t m, int64_t n) {
  if constexpr (R > 0) {
    if (a.M - m == R) return tile<V, T, R, NB>(a, m, n);
    rest<V, T, NB, R - 1>(a, m, n);
  }
}

// Columns [n0, n1) of all rows: column blocks of NB, each block's rows in tiles of R (<= RMAX: every
// row of a verification pass shares one read of the weights).
template <class V, WType T, int R>
static void blocks(const LinearArgs& a, int64_t n0, int64_t n1) {
  constexpr int NB = V::columns(R);
  int64_t n = n0;
  for (; n + NB <= n1; n += NB) {
    int64_t m = 0;
    for (; m + R <= a.M; m += R) tile<V, T, R, NB>(a, m, n);
    if (m < a.M) rest<V, T, NB>(a, m, n);
  }
  for (; n < n1; ++n) {
    int64_t m = 0;
    for (; m + R <= a.M; m += R) tile<V, T, R, 1>(a, m, n);
    if (m < a.M) rest<V, T, 1>(a, m, n);
  }
}

// Tiles as tall as the pass up to RMAX rows (every row of a verification pass shares one read of the
// weights), as wide as the registers then allow; taller passes (prefill) in tiles of RWIDE rows, or of
// RMAX for quantized weights (each tile de-quantizes the weights again: fewer, taller tiles pay).
template <class V, WType T, int R = V::RMAX>
static void run_tiles(const LinearArgs& a, int64_t n0, int64_t n1) {
  if constexpr (R == V::RMAX) {
    if (a.M > R) return blocks<V, T, quantized(T) ? V::RMAX : V::RWIDE>(a, n0, n1);
  }
  if constexpr (R > 1) {
    if (a.M < R) return run_tiles<V, T, R - 1>(a, n0, n1);
  }
  blocks<V, T, R>(a, n0, n1);
}

// The tiles for the weight's type.
template <class V>
static void dispatch_wtype(const LinearArgs& a, int64_t n0, int64_t n1) {
  switch (a.wtype) {
    case WType::f32: return run_tiles<V, WType::f32>(a, n0, n1);
    case WType::f16: return run_tiles<V, WType::f16>(a, n0, n1);
    case WType::bf16: return run_tiles<V, WType::bf16>(a, n0, n1);
    case WType::q8_0: return run_tiles<V, WType::q8_0>(a, n0, n1);
    case WType::q4_0: return run_tiles<V, WType::q4_0>(a, n0, n1);
    case WType::q4_1: return run_tiles<V, WType::q4_1>(a, n0, n1);
  }
}

}  // namespace peagle
