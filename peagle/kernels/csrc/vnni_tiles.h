// The integer path's vpdpbusd tile (kernels.h) over vector traits W, shared by AVX512-VNNI (16 columns a
// vector: a packed group) and AVX-VNNI (8: half a group), each instantiated in its ISA's file after its
// `#pragma GCC target`. W supplies: LANES, RMAX, columns(R), ivec/fvec, set1_i32, set1_f, zero_f, load
// (LANES * 4 bytes), nibbles(raw, lo, hi), dpbusd(acc, w, x), cvt_f, mul, fma, load_ph (LANES fp16), add,
// store. A unit is LANES columns: group unit / (QGROUP / LANES), the part unit % (QGROUP / LANES) of it.
#pragma once
#include <cstring>

#include "linear_tiles.h"

namespace peagle {

template <class W, WType T>
struct VnniTiles {
  using Args = QLinearArgs;
  static constexpr int RMAX = W::RMAX, RTALL = W::RMAX;
  static constexpr int columns(int R) { return W::columns(R); }

  static typename W::ivec bcast4(const int8_t* p) {  // four int8 activations in every lane
    int32_t v;
    std::memcpy(&v, p, 4);
    return W::set1_i32(v);
  }

  // Rows [m, m+R) x units [u, u+G): R*G int32 vectors per block (starting from the row's -offset * s, so
  // they end at the weight's own dot product), R*G float32 accumulators; each weight vector is loaded (and
  // its nibbles split) once for all R rows, and the next tile's weights prefetched while these compute.
  template <int R, int G>
  static void tile(const QLinearArgs& a, int64_t m, int64_t u) {
    constexpr int64_t PB = packed_bytes(T), QOFF = packed_scales(T), PARTS = QGROUP / W::LANES;
    const int64_t nb = a.K / QBLOCK;
    typename W::fvec acc[R][G];
    for (int r = 0; r < R; ++r)
      for (int j = 0; j < G; ++j) acc[r][j] = W::zero_f();
    for (int64_t b = 0; b < nb; ++b) {
      typename W::ivec is[R][G];
      for (int r = 0; r < R; ++r) {
        const typename W::ivec c = W::set1_i32(a.x.c[(m + r) * nb + b]);
        for (int j = 0; j < G; ++j) is[r][j] = c;
      }
      for (int j = 0; j < G; ++j) {
        const int64_t part = (u + j) % PARTS;
        const uint8_t* s = a.w + ((u + j) / PARTS * nb + b) * PB;
        const uint8_t* next = a.w + ((u + G + j) / PARTS * nb + b) * PB;  // every 64-byte line holds each part
        for (int64_t l = 0; l < PB; l += 64) __builtin_prefetch(next + l, 0, 3);
        const uint8_t* p = s + QOFF + 4 * W::LANES * part;
        if constexpr (T == WType::q8_0) {
          for (int v = 0; v < 8; ++v) {
            const typename W::ivec wv = W::load(p + 64 * v);
            for (int r = 0; r < R; ++r)
              is[r][j] = W::dpbusd(is[r][j], wv, bcast4(a.x.q + (m + r) * a.K + b * QBLOCK + 4 * v));
          }
        } else {
          for (int v = 0; v < 4; ++v) {
            typename W::ivec lo, hi;
            W::nibbles(W::load(p + 64 * v), lo, hi);
            for (int r = 0; r < R; ++r) {
              const int8_t* x = a.x.q + (m + r) * a.K + b * QBLOCK + 4 * v;
              is[r][j] = W::dpbusd(is[r][j], lo, bcast4(x));
              is[r][j] = W::dpbusd(is[r][j], hi, bcast4(x + 16));
            }
          }
        }
      }
      for (int j = 0; j < G; ++j) {
        const int64_t part = (u + j) % PARTS;
        const uint8_t* s = a.w + ((u + j) / PARTS * nb + b) * PB + 2 * W::LANES * part;
        const typename W::fvec dw = W::load_ph(s);
        for (int r = 0; r < R; ++r) {
          const int64_t xb = (m + r) * nb + b;
          acc[r][j] = W::fma(dw, W::mul(W::cvt_f(is[r][j]), W::set1_f(a.x.d[xb])), acc[r][j]);
          if constexpr (T == WType::q4_1) acc[r][j] = W::fma(W::load_ph(s + 32), W::set1_f(a.x.sd[xb]), acc[r][j]);
        }
      }
    }
    for (int r = 0; r < R; ++r)
      for (int j = 0; j < G; ++j) {
        const int64_t n = (u + j) * W::LANES;
        typename W::fvec y = acc[r][j];
        if (a.bias) y = W::add(y, W::load_f(a.bias + n));
        W::store(a.y + (m + r) * a.ldy + n, y);
      }
  }
};

}  // namespace peagle
