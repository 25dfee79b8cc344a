// The tiling every SIMD path shares (included by each ISA's file after its `#pragma GCC target`): the
// float32 path's tile over an ISA's vector traits V, and one driver for it and the integer path. V
// supplies: LANES, RMAX (the tallest tile), RWIDE (the tile height for passes taller than RMAX),
// columns(R) (a tile's width for R rows, within the registers), vec, zero(), load_x(p),
// load_x_tail(p, n), load_w<T>(row, k) (weights k .. k+LANES-1 of a float row), load_w_tail<T>(row, k,
// n), load_block<T>(row, b, out) (block b of a row of q8_0, q4_0 or q4_1 blocks (simd_block): QBLOCK /
// LANES vectors, float32; the other formats' chunks are de-quantized by chunk_values, then loaded as x is),
// fma(a, b, c) and hsum(v) (lanes reduced as reference.cpp).
#pragma once
#include <algorithm>
#include <type_traits>
#include <vector>

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
    // a block of 32 per step, its scales and quants loaded once for the QBLOCK / L vectors it gives
    for (int64_t b = 0; b < K / QBLOCK; ++b) {
      typename V::vec wv[NB][QBLOCK / L];
      for (int j = 0; j < NB; ++j) {
        __builtin_prefetch(next + j * RB + b * QBLOCK / block_weights(T) * block_bytes(T), 0, 3);
        if constexpr (simd_block(T)) {
          V::template load_block<T>(w + j * RB, b, wv[j]);
        } else {
          alignas(64) float chunk[QBLOCK];
          chunk_values<T>(w + j * RB, b, chunk);
          for (int s = 0; s < QBLOCK / L; ++s) wv[j][s] = V::load_x(chunk + s * L);
        }
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
        if constexpr (!std::is_class_v<typename V::vec>)  // a SIMD register (not the scalar path's lanes):
          asm("" : "+v"(xv[r]));                            // kept there for all NB columns, not re-loaded per FMA
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

// The tiling driver both linear paths share, over a kernel K: K::Args (with M), K::RMAX (the tallest
// tile), K::RTALL (the tile height for passes taller than RMAX), K::columns(R) (a tile's width for R rows,
// in K's column units, within the registers) and K::tile<R, NB>(a, m, n) (rows [m, m+R) x units [n, n+NB)).
// The rows [m, M) left over by full tiles (fewer than RMAX), in one tile.
template <class K, int NB, int R>
static void rest(const typename K::Args& a, int64_t m, int64_t n) {
  if constexpr (R > 0) {
    if (a.M - m == R) return K::template tile<R, NB>(a, m, n);
    rest<K, NB, R - 1>(a, m, n);
  }
}

// Units [n0, n1) of all rows: column blocks of NB, each block's rows in tiles of R (<= RMAX: every
// row of a verification pass shares one read of the weights). NARROW: K::stream_columns(R), a packed group at
// most (see run_packed).
template <class K, int R, bool NARROW = false>
static void blocks(const typename K::Args& a, int64_t n0, int64_t n1) {
  constexpr int NB = [] {
    if constexpr (NARROW) return K::stream_columns(R);
    else return K::columns(R);
  }();
  int64_t n = n0;
  for (; n + NB <= n1; n += NB) {
    int64_t m = 0;
    for (; m + R <= a.M; m += R) K::template tile<R, NB>(a, m, n);
    if (m < a.M) rest<K, NB, R - 1>(a, m, n);
  }
  for (; n < n1; ++n) {
    int64_t m = 0;
    for (; m + R <= a.M; m += R) K::template tile<R, 1>(a, m, n);
    if (m < a.M) rest<K, 1, R - 1>(a, m, n);
  }
}

// Tiles as tall as the pass up to RMAX rows (every row of a verification pass shares one read of the
// weights), as wide as the registers then allow; taller passes (prefill) in tiles of RTALL rows. NARROW
// (streamed weights, one unit wide): taller passes in tiles of RMAX rows too.
template <class K, bool NARROW = false, int R = K::RMAX>
static void run_tiles(const typename K::Args& a, int64_t n0, int64_t n1) {
  if constexpr (R == K::RMAX) {
    if (a.M > R) return blocks<K, NARROW ? K::RMAX : K::RTALL, NARROW>(a, n0, n1);
  }
  if constexpr (R > 1) {
    if (a.M < R) return run_tiles<K, NARROW, R - 1>(a, n0, n1);
  }
  blocks<K, R, NARROW>(a, n0, n1);
}

// The float32 path over vector traits V for weights of type T, in columns; taller passes in tiles of
// RWIDE rows, or of RMAX for quantized weights (each tile de-quantizes the weights again: fewer, taller
// tiles pay).
template <class V, WType T>
struct FloatTiles {
  using Args = LinearArgs;
  static constexpr int RMAX = V::RMAX, RTALL = quantized(T) ? V::RMAX : V::RWIDE;
  static constexpr int columns(int R) { return V::columns(R); }
  template <int R, int NB>
  static void tile(const LinearArgs& a, int64_t m, int64_t n) { peagle::tile<V, T, R, NB>(a, m, n); }
};

// The tiles for the weight's type.
template <class V>
static void dispatch_wtype(const LinearArgs& a, int64_t n0, int64_t n1) {
  switch (a.wtype) {
    case WType::f32: return run_tiles<FloatTiles<V, WType::f32>>(a, n0, n1);
    case WType::f16: return run_tiles<FloatTiles<V, WType::f16>>(a, n0, n1);
    case WType::bf16: return run_tiles<FloatTiles<V, WType::bf16>>(a, n0, n1);
    case WType::q8_0: return run_tiles<FloatTiles<V, WType::q8_0>>(a, n0, n1);
    case WType::q4_0: return run_tiles<FloatTiles<V, WType::q4_0>>(a, n0, n1);
    case WType::q4_1: return run_tiles<FloatTiles<V, WType::q4_1>>(a, n0, n1);
    case WType::q5_0: return run_tiles<FloatTiles<V, WType::q5_0>>(a, n0, n1);
    case WType::q5_1: return run_tiles<FloatTiles<V, WType::q5_1>>(a, n0, n1);
    case WType::q4_k: return run_tiles<FloatTiles<V, WType::q4_k>>(a, n0, n1);
    case WType::q5_k: return run_tiles<FloatTiles<V, WType::q5_k>>(a, n0, n1);
    case WType::q6_k: return run_tiles<FloatTiles<V, WType::q6_k>>(a, n0, n1);
  }
}

// A pass of EXPAND_ROWS rows or more (prefill) on a format whose quants have high bits (K::expands): the units
// in slabs of a wide tile's width, each slab's column groups split once into bytes (K::expand, a thread's own
// buffer, in L2) and every row tile run on them (3B Q5_K_M and Q6_K files: pp512 1.23-1.24x). The sums are the
// same integers either way: results do not change. From 32 rows: 40 such 8,192 x 3,072 matrices streamed from
// memory (Sapphire Rapids, 2 threads) ran level at 16 rows, 1.05-1.12x faster expanded at 32, 1.15-1.3x at 64;
// at 8 rows (a verify pass) 1.15-1.3x slower.
constexpr int64_t EXPAND_ROWS = 32;
template <class K>
static void run_expanded(const QLinearArgs& a, int64_t n0, int64_t n1) {
  constexpr int64_t SLAB = K::columns(K::RTALL);
  const int64_t bytes = (a.K / QBLOCK) * K::EXPANDED;  // a column group's
  thread_local std::vector<uint8_t> buf;
  QLinearArgs e = a;
  for (int64_t n = n0; n < n1; n += SLAB) {
    const int64_t end = std::min(n + SLAB, n1), g0 = n / K::PARTS, g1 = (end - 1) / K::PARTS + 1;
    if (int64_t(buf.size()) < (g1 - g0) * bytes) buf.resize((g1 - g0) * bytes);
    for (int64_t g = g0; g < g1; ++g) K::expand(a, g, buf.data() + (g - g0) * bytes);
    e.ex = buf.data();
    e.ex_group = g0;
    blocks<typename K::Expanded, K::RTALL>(e, n, end);
  }
}

// A packed weight larger than the caches streams from memory on every pass (an LM head: Gemma 3 270M's
// 262,144 x 640 Q8_0 is 170 MB): there tiles one unit wide (one read stream, which the hardware prefetcher
// keeps ahead of) beat the wider ones that hide vpdpbusd's latency for weights in cache (Zen 5, that head,
// CPU time of one thread: 1 row 6.3 -> 4.8 ms, 2 rows 7.2 -> 5.0, 4 rows 6.1 -> 5.0). One
// packed group wide, not one unit: with 8 lanes (AVX2, AVX-VNNI) a group is two units sharing every cache
// line, and a tile of one read each line twice (the default model's Q8_0 head, one row: AVX2 0.87 -> 0.67 ms,
// AVX-VNNI 0.74 -> 0.50). Where that starts is the CPU's, timed at start-up (stream_bytes, kernels.h:
// on a Zen 4 every layer matrix runs faster so). A column's sum is the same whatever the tile's shape:
// results do not change.
template <class K, WType T>
static void run_packed(const QLinearArgs& a, int64_t n0, int64_t n1) {
  if constexpr (requires { K::expands; }) {
    if constexpr (K::expands) {
      if (a.M >= EXPAND_ROWS) return run_expanded<K>(a, n0, n1);
    }
  }
  if (a.N / QGROUP * (a.K / block_weights(T)) * packed_bytes(T) > stream_bytes(a.M == 1)) return run_tiles<K, true>(a, n0, n1);
  run_tiles<K>(a, n0, n1);
}

// The bf16 path's tiles K for a packed bf16 weight, by run_packed's rule: one packed group wide where it streams.
template <class K>
static void run_bf16_packed(const BLinearArgs& a, int64_t g0, int64_t g1) {
  if (a.N * a.K * 2 > stream_bytes(a.M == 1)) return run_tiles<K, true>(a, g0, g1);
  run_tiles<K>(a, g0, g1);
}

// The integer path's tiles (kernels.h) for a packed weight: Q<T> a kernel as above, in the ISA's column units.
template <template <WType> class Q>
static void dispatch_packed(const QLinearArgs& a, int64_t n0, int64_t n1) {
  switch (a.wtype) {
    case WType::q8_0: return run_packed<Q<WType::q8_0>, WType::q8_0>(a, n0, n1);
    case WType::q4_0: return run_packed<Q<WType::q4_0>, WType::q4_0>(a, n0, n1);
    case WType::q4_1: return run_packed<Q<WType::q4_1>, WType::q4_1>(a, n0, n1);
    case WType::q5_0: return run_packed<Q<WType::q5_0>, WType::q5_0>(a, n0, n1);
    case WType::q5_1: return run_packed<Q<WType::q5_1>, WType::q5_1>(a, n0, n1);
    case WType::q4_k: return run_packed<Q<WType::q4_k>, WType::q4_k>(a, n0, n1);
    case WType::q5_k: return run_packed<Q<WType::q5_k>, WType::q5_k>(a, n0, n1);
    case WType::q6_k: return run_packed<Q<WType::q6_k>, WType::q6_k>(a, n0, n1);
    default: return;
  }
}

}  // namespace peagle
