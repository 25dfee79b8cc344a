// Attention over the paged cache for every ISA, over vector traits V (see linear_tiles.h); the scalar
// reference instantiates it with scalar traits of the same lane order, so the two give the same bits.
#pragma once
#include <algorithm>
#include <cmath>
#include <limits>

#include "kernels.h"

namespace peagle {

// q . k over d, in V's lane order (zero-padded tail), as linear_tiles.h accumulates.
template <class V>
static inline float dot(const float* q, const float* k, int64_t d) {
  constexpr int L = V::LANES;
  const int64_t dl = d - d % L;
  typename V::vec acc = V::zero();
  for (int64_t i = 0; i < dl; i += L) acc = V::fma(V::load_x(q + i), V::load_x(k + i), acc);
  if (dl < d) acc = V::fma(V::load_x_tail(q + dl, d - dl), V::load_x_tail(k + dl, d - dl), acc);
  return V::hsum(acc);
}

template <class V>
static void attention_items(const AttnArgs& a, int64_t i0, int64_t i1) {
  const int64_t g = a.H / a.Hkv, d = a.d, bs = a.block_size;
  float s[MAX_GROUP][KEY_BLOCK], m[MAX_GROUP], l[MAX_GROUP];
  alignas(64) float acc[MAX_GROUP][MAX_HEAD_DIM];
  for (int64_t i = i0; i < i1; ++i) {
    const int64_t r = a.rows[i / a.Hkv], h = i % a.Hkv, p = a.pos[r];
    const int64_t lo = a.window > 0 ? std::max<int64_t>(0, p - a.window + 1) : 0;
    const int64_t* blocks = a.table + a.seq[r] * a.table_stride;
    const float* q = a.q + r * a.q_stride + h * g * d;
    for (int64_t gi = 0; gi < g; ++gi) {
      const bool sink = a.sinks != nullptr;
      m[gi] = sink ? a.sinks[h * g + gi] : -std::numeric_limits<float>::infinity();
      l[gi] = sink ? 1.f : 0.f;
      std::fill(acc[gi], acc[gi] + d, 0.f);
    }
    for (int64_t j0 = lo - lo % KEY_BLOCK; j0 <= p; j0 += KEY_BLOCK) {
      const int64_t jb = std::max(j0, lo), je = std::min(j0 + KEY_BLOCK, p + 1);
      for (int64_t j = jb; j < je; ++j) {
        const float* kj = a.k + ((blocks[j / bs] * bs + j % bs) * a.Hkv + h) * d;
        for (int64_t gi = 0; gi < g; ++gi) s[gi][j - jb] = dot<V>(q + gi * d, kj, d) * a.scale;
      }
      for (int64_t gi = 0; gi < g; ++gi) {
        float mb = m[gi];
        for (int64_t j = 0; j < je - jb; ++j) mb = std::max(mb, s[gi][j]);
        const float corr = std::exp(m[gi] - mb);
        l[gi] *= corr;
        V::scale(acc[gi], corr, d);
        for (int64_t j = jb; j < je; ++j) {
          const float pj = std::exp(s[gi][j - jb] - mb);
          l[gi] += pj;
          V::axpy(acc[gi], pj, a.v + ((blocks[j / bs] * bs + j % bs) * a.Hkv + h) * d, d);
        }
        m[gi] = mb;
      }
    }
    for (int64_t gi = 0; gi < g; ++gi) {
      float* o = a.out + r * a.H * d + (h * g + gi) * d;
      for (int64_t e = 0; e < d; ++e) o[e] = acc[gi][e] / l[gi];
    }
  }
}

}  // namespace peagle
