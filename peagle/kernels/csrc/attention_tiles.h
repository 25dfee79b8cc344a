// Attention over the paged cache for every ISA, over vector traits V (see linear_tiles.h; here also
// set1, add, sub, mul, exp, exp1, store_n, store_lanes (lanes first .. first+c to p), mask_n, scale, load_h (L halves), max_of (the largest of n floats)
// and hsum_many: lane i the hsum of vector i); the scalar reference instantiates it with scalar traits of the same lane order and the same
// operations, so the two give the same bits.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

#include "kernels.h"

namespace peagle {

// L elements of a pool's row as float32: a float32 pool's as they lie, a half pool's converted exactly.
template <class V>
static inline typename V::vec load_row(const float* p) { return V::load_x(p); }
template <class V>
static inline typename V::vec load_row(const uint16_t* p) { return V::load_h(p); }
inline float row_value(float x) { return x; }
inline float row_value(uint16_t x) { return half_to_float(x); }

// out[qi][j] = (q_qi . k_j) * scale for NQ queries and the n keys k_j: each dot product over d in V's lane
// order (zero-padded tail), as linear_tiles.h accumulates, and its lanes reduced by hsum_many, which adds every
// vector's lanes in the same pairs: L / NQ keys of each query share a reduction, so one key load serves NQ
// queries and a score's bits do not depend on NQ (the reference reduces a key alone). out rows hold KEY_BLOCK
// floats: the last group writes up to L / NQ of them past n, scores of zero keys that no one reads. Keys are
// float32 rows, or a half pool's rows where d is whole vectors (attend_tiles: converted as they are loaded).
template <class V, int NQ, class E>
static inline void scores(const float* const* q, const E* const* k, int64_t n, int64_t d, float scale,
                          float* const* out) {
  constexpr int L = V::LANES, KJ = L / NQ;
  static_assert(L % NQ == 0 && KEY_BLOCK % KJ == 0);
  static const E none[MAX_HEAD_DIM] = {};  // the keys past n: every lane a whole vector (in registers)
  const int64_t dl = d - d % L;
  for (int64_t j = 0; j < n; j += KJ) {
    const E* kj[KJ];
    for (int i = 0; i < KJ; ++i) kj[i] = j + i < n ? k[j + i] : none;
    typename V::vec acc[L];
    for (int i = 0; i < L; ++i) acc[i] = V::zero();
    for (int64_t e = 0; e < dl; e += L) {
      typename V::vec qv[NQ];
      for (int qi = 0; qi < NQ; ++qi) qv[qi] = V::load_x(q[qi] + e);
      for (int i = 0; i < KJ; ++i) {
        const typename V::vec kv = load_row<V>(kj[i] + e);
        for (int qi = 0; qi < NQ; ++qi) acc[qi * KJ + i] = V::fma(qv[qi], kv, acc[qi * KJ + i]);
      }
    }
    if constexpr (std::is_same_v<E, float>) if (dl < d) {
      typename V::vec qv[NQ];
      for (int qi = 0; qi < NQ; ++qi) qv[qi] = V::load_x_tail(q[qi] + dl, d - dl);
      for (int i = 0; i < KJ; ++i) {
        const typename V::vec kv = V::load_x_tail(kj[i] + dl, d - dl);
        for (int qi = 0; qi < NQ; ++qi) acc[qi * KJ + i] = V::fma(qv[qi], kv, acc[qi * KJ + i]);
      }
    }
    const typename V::vec sums = V::mul(V::hsum_many(acc), V::set1(scale));
    for (int qi = 0; qi < NQ; ++qi) V::store_lanes(out[qi] + j, sums, qi * KJ, KJ);
  }
}

// The scores of Q queries, as many at a time as V's registers hold (4 with 16 lanes, 2 with 8), then fewer.
template <class V, int NQ = (V::LANES >= 16 ? 4 : 2), class E>
static inline void scores_of(const float* const* q, int64_t Q, const E* const* k, int64_t n, int64_t d,
                             float scale, float* const* out) {
  int64_t qi = 0;
  for (; qi + NQ <= Q; qi += NQ) scores<V, NQ>(q + qi, k, n, d, scale, out + qi);
  if constexpr (NQ > 1) {
    if (qi < Q) scores_of<V, NQ / 2>(q + qi, Q - qi, k, n, d, scale, out + qi);
  }
}

// exp(x) with the same IEEE operations in every lane width (so SIMD paths and the scalar reference give
// the same bits): x = n ln2 + r, |r| <= ln2/2, Cephes' degree-5 polynomial for e^r, 2^n put in the
// exponent. 0 below -87 (softmax weights of masked or far-off scores); about 1 ulp elsewhere (x <= 0 here).
constexpr float EXP_LO = -87.0f, EXP_HI = 88.0f, LOG2E = 1.44269504088896341f, LN2_HI = 0.693359375f,
                LN2_LO = -2.12194440e-4f;
constexpr float EXP_POLY[6] = {1.9875691500e-4f, 1.3981999507e-3f, 8.3334519073e-3f,
                               4.1665795894e-2f, 1.6666665459e-1f, 5.0000001201e-1f};

static inline float exp_scalar(float x) {
  const bool zero = x < EXP_LO;
  x = x > EXP_LO ? x : EXP_LO;  // as max_ps(x, lo): NaN -> lo
  x = x < EXP_HI ? x : EXP_HI;
  const float n = std::nearbyint(x * LOG2E);
  float r = std::fma(n, -LN2_HI, x);
  r = std::fma(n, -LN2_LO, r);
  float p = EXP_POLY[0];
  for (int i = 1; i < 6; ++i) p = std::fma(p, r, EXP_POLY[i]);
  const float y = std::fma(p, r * r, r) + 1.f;
  const int32_t bits = (int32_t(n) + 127) << 23;
  float two_n;
  std::memcpy(&two_n, &bits, 4);
  return zero ? 0.f : y * two_n;
}

// SwiGLU's rows [t0, t1) of gu [rows, 2n] (gate | up) into out [rows, n]: silu(gate) * up = gate / (1 +
// exp(-gate)) * up, exp_scalar's bits in every lane (so every path gives the same bits).
template <class V>
static void silu_mul_rows(const float* gu, float* out, int64_t n, int64_t t0, int64_t t1) {
  constexpr int L = V::LANES;
  const typename V::vec one = V::set1(1.f);
  for (int64_t t = t0; t < t1; ++t)
    for (int64_t i = 0; i < n; i += L) {
      const int64_t c = std::min<int64_t>(L, n - i);
      const typename V::vec a = V::load_x_tail(gu + t * 2 * n + i, c), u = V::load_x_tail(gu + t * 2 * n + n + i, c);
      const typename V::vec e = V::exp(V::sub(V::zero(), a));
      V::store_n(out + t * n + i, V::mul(V::div(a, V::add(one, e)), u), c);
    }
}

// acc[gi][e] += p[gi][j] * v_j[e] for keys j = 0 .. n-1 in order (elementwise fma: any lane width, the
// same bits).
template <class E>
static inline void weighted_sum_scalar(float (*acc)[MAX_HEAD_DIM], const float (*p)[KEY_BLOCK],
                                       const E* const* vrow, int64_t n, int64_t g, int64_t e0, int64_t d) {
  if (e0 >= d) return;  // no tail (the SIMD paths' usual case): g x n empty loops cost 15% of 8 rows' attention
  for (int64_t gi = 0; gi < g; ++gi)
    for (int64_t j = 0; j < n; ++j)
      for (int64_t e = e0; e < d; ++e) acc[gi][e] = std::fma(p[gi][j], row_value(vrow[j][e]), acc[gi][e]);
}

// The same in vectors: C d-chunks of NQ queries' accumulators in registers across the keys, each value
// vector loaded once for the NQ queries (each accumulator still takes its keys' products in key order).
template <class V, int NQ, int C, class E>
static inline void weighted_chunk(float (*acc)[MAX_HEAD_DIM], const float (*p)[KEY_BLOCK], const E* const* vrow,
                                  int64_t n, int64_t e) {
  constexpr int L = V::LANES;
  typename V::vec a[NQ][C];
  for (int i = 0; i < NQ; ++i)
    for (int c = 0; c < C; ++c) a[i][c] = V::load_x(acc[i] + e + c * L);
  for (int64_t j = 0; j < n; ++j) {
    typename V::vec vj[C];
    for (int c = 0; c < C; ++c) vj[c] = load_row<V>(vrow[j] + e + c * L);
    for (int i = 0; i < NQ; ++i) {
      const typename V::vec pj = V::set1(p[i][j]);
      for (int c = 0; c < C; ++c) a[i][c] = V::fma(pj, vj[c], a[i][c]);
    }
  }
  for (int i = 0; i < NQ; ++i)
    for (int c = 0; c < C; ++c) V::store_n(acc[i] + e + c * L, a[i][c], L);
}

// The g queries of C d-chunks from e, NQ at a time (the last ones fewer).
template <class V, int NQ, int C, class E>
static inline void weighted_queries(float (*acc)[MAX_HEAD_DIM], const float (*p)[KEY_BLOCK], const E* const* vrow,
                                    int64_t n, int64_t g, int64_t e) {
  int64_t gi = 0;
  for (; gi + NQ <= g; gi += NQ) weighted_chunk<V, NQ, C>(acc + gi, p + gi, vrow, n, e);
  if constexpr (NQ > 1) {
    if (gi < g) weighted_queries<V, NQ - 1, C>(acc + gi, p + gi, vrow, n, g - gi, e);
  }
}

// weighted_sum for the SIMD traits: four d-chunks of LANES / 4 queries in registers at a time (16 or 8
// accumulators, four value vectors), the chunks left over one at a time for 8 queries, the tail in scalars.
template <class V, class E>
static inline void weighted_sum_simd(float (*acc)[MAX_HEAD_DIM], const float (*p)[KEY_BLOCK], const E* const* vrow,
                                     int64_t n, int64_t g, int64_t d) {
  constexpr int L = V::LANES;
  int64_t e = 0;
  for (; e + 4 * L <= d; e += 4 * L) weighted_queries<V, L / 4, 4>(acc, p, vrow, n, g, e);
  for (; e + L <= d; e += L) weighted_queries<V, 8, 1>(acc, p, vrow, n, g, e);
  weighted_sum_scalar(acc, p, vrow, n, g, e, d);
}

// acc[gi] += the weights p[gi] times the value rows, in vectors on the SIMD paths, elementwise on the scalar one
// (the same bits).
template <class V, class E>
static inline void weighted_sum(float (*acc)[MAX_HEAD_DIM], const float (*p)[KEY_BLOCK], const E* const* vrow,
                                int64_t n, int64_t g, int64_t d) {
  if constexpr (std::is_class_v<typename V::vec>) weighted_sum_scalar(acc, p, vrow, n, g, 0, d);
  else weighted_sum_simd<V>(acc, p, vrow, n, g, d);
}

// Rows src[0 .. n) of a half pool (the 16-bit KV cache), d elements, converted into float32 rows in buf, exactly
// (for keys whose d leaves a tail: scores then read them as float32 rows).
template <class V>
static inline void as_float(const uint16_t* const* src, int64_t n, int64_t d, float* buf, const float** out) {
  constexpr int L = V::LANES;
  const int64_t dl = d - d % L;
  for (int64_t j = 0; j < n; ++j) {
    float* row = buf + j * d;
    for (int64_t e = 0; e < dl; e += L) V::store_n(row + e, V::load_h(src[j] + e), L);
    for (int64_t e = dl; e < d; ++e) row[e] = half_to_float(src[j][e]);
    out[j] = row;
  }
}

// One work item: a tile of rows of one sequence (its verification or drafting rows: the same keys) and one
// KV head. Every key is loaded once for the tile's R*g queries; each row still sees exactly the keys it
// would alone, in the same blocks and lanes (its own range within each block), and the keys outside its
// range add exact zeros: a row's bits do not depend on the tile it shares. A key block that reaches a
// tree row's remapped keys is computed row by row instead (each row its own keys, the same steps in the
// same order), which gives every row the same bits again.
template <class V, class E>
static void attend_tiles(const AttnArgs& a, int64_t i0, int64_t i1) {
  constexpr int L = V::LANES;
  const int64_t G = a.H / a.Hkv, d = a.d, bs = a.block_size;  // G: query heads a KV head serves
  const E *K = static_cast<const E*>(a.k), *Vp = static_cast<const E*>(a.v);
  alignas(64) float s[MAX_QUERIES][KEY_BLOCK];
  float m[MAX_QUERIES], l[MAX_QUERIES];
  alignas(64) float acc[MAX_QUERIES][MAX_HEAD_DIM];
  const E* vsrc[KEY_BLOCK];
  const E* ksrc[KEY_BLOCK];
  const float* krow[KEY_BLOCK];
  alignas(64) static thread_local float kbuf[KEY_BLOCK * MAX_HEAD_DIM];
  // the scores of nq queries over a block's nk keys (ksrc), a half pool's rows converted as the products load
  // them: the same values as converting them first, without a copy (converting first cost 41% of the attention's
  // samples); into kbuf first only where d leaves a tail of a vector
  auto key_scores = [&](const float* const* qq, int64_t nq, int64_t nk, float* const* out) {
    if constexpr (std::is_same_v<E, uint16_t>) {
      if (d % L) {
        as_float<V>(ksrc, nk, d, kbuf, krow);
        return scores_of<V>(qq, nq, krow, nk, d, a.scale, out);
      }
    }
    scores_of<V>(qq, nq, ksrc, nk, d, a.scale, out);
  };
  // query qi's online-softmax step over its scores s[qi][o .. o+nr) of a block's n (nr > 0): the weights
  // e^(s - mb) in place, zeros around them, their sum in L lanes from its first key (zero-padded)
  auto softmax_step = [&](int64_t qi, int64_t o, int64_t nr, int64_t n) {
    float* sq = s[qi];
    const float mb = std::max(m[qi], V::max_of(sq + o, nr));
    const float corr = V::exp1(m[qi] - mb);
    typename V::vec sum = V::zero();
    for (int64_t j = 0; j < nr; j += L) {
      const int64_t c = std::min<int64_t>(L, nr - j);
      typename V::vec e = V::exp(V::sub(V::load_x_tail(sq + o + j, c), V::set1(mb)));
      V::store_n(sq + o + j, e, c);
      sum = V::add(sum, V::mask_n(e, c));
    }
    std::fill(sq, sq + o, 0.f);
    std::fill(sq + o + nr, sq + n, 0.f);
    l[qi] = l[qi] * corr + V::hsum(sum);
    V::scale(acc[qi], corr, d);
    m[qi] = mb;
  };
  for (int64_t i = i0; i < i1; ++i) {
    const int64_t t = i / (a.Hkv * a.parts), h = i / a.parts % a.Hkv, part = i % a.parts;
    const int64_t q0 = h * G + part * G / a.parts, g = h * G + (part + 1) * G / a.parts - q0;  // its query heads
    const int64_t R = a.tiles[t + 1] - a.tiles[t], Q = R * g;
    const int64_t* rows = a.rows + a.tiles[t];
    const int64_t* blocks = a.table + a.seq[rows[0]] * a.table_stride;
    int64_t lo[MAX_QUERIES], hi[MAX_QUERIES], base[MAX_QUERIES];  // per row: logical keys lo .. hi-1, remapped from base
    int64_t LO = INT64_MAX, HI = 0;
    for (int64_t r = 0; r < R; ++r) {
      const int64_t p = a.pos[rows[r]];
      lo[r] = a.window > 0 ? std::max<int64_t>(0, p - a.window + 1) : 0;
      hi[r] = p + 1;
      base[r] = a.tree_base != nullptr ? a.tree_base[rows[r]] : hi[r];
      LO = std::min(LO, lo[r]);
      HI = std::max(HI, hi[r]);
    }
    const float* qs[MAX_QUERIES];  // query qi = r * g + gi, and its scores' row
    float* srow[MAX_QUERIES];
    for (int64_t qi = 0; qi < Q; ++qi) qs[qi] = a.q + rows[qi / g] * a.q_stride + (q0 + qi % g) * d, srow[qi] = s[qi];
    for (int64_t qi = 0; qi < Q; ++qi) {
      const bool sink = a.sinks != nullptr;
      m[qi] = sink ? a.sinks[q0 + qi % g] : -std::numeric_limits<float>::infinity();
      l[qi] = sink ? 1.f : 0.f;
      std::fill(acc[qi], acc[qi] + d, 0.f);
    }
    for (int64_t j0 = LO - LO % KEY_BLOCK; j0 < HI; j0 += KEY_BLOCK) {
      bool remapped = false;
      for (int64_t r = 0; r < R; ++r) remapped |= base[r] < std::min(j0 + KEY_BLOCK, hi[r]);
      if (remapped) {  // row by row: logical key j at KV index j below the row's base, else through its map
        for (int64_t r = 0; r < R; ++r) {
          const int64_t jb = std::max(j0, lo[r]), nr = std::min(j0 + KEY_BLOCK, hi[r]) - jb;
          if (nr <= 0) continue;  // as a block of zero weights leaves the row's state
          const int64_t* map = a.tree_map + rows[r] * a.tree_stride;
          for (int64_t j = 0; j < nr; ++j) {
            const int64_t key = jb + j < base[r] ? jb + j : map[jb + j - base[r]];
            const int64_t slot = (blocks[key / bs] * bs + key % bs) * a.Hkv + h;
            vsrc[j] = Vp + slot * d;
            ksrc[j] = K + slot * d;
          }
          key_scores(qs + r * g, g, nr, srow + r * g);
          for (int64_t gi = 0; gi < g; ++gi) softmax_step(r * g + gi, 0, nr, nr);
          weighted_sum<V>(acc + r * g, s + r * g, vsrc, nr, g, d);
        }
        continue;
      }
      const int64_t ju = std::max(j0, LO), n = std::min(j0 + KEY_BLOCK, HI) - ju;
      int64_t blk = ju / bs, off = ju % bs;  // walked, not divided, key by key
      // Memory is read ahead of the arithmetic: a head's rows lie a slot apart, a stride the hardware's
      // streams follow late, and one row's attention waited on memory more than it computed.
      // This block's values (read after its scores), its keys on the first block, the next block's keys
      // and values (its values too: decoding after 1,024 / 3,072 tokens 1.10x / 1.13x).
      const bool first = j0 == LO - LO % KEY_BLOCK;
      for (int64_t j = 0; j < n; ++j, ++off) {
        if (off == bs) ++blk, off = 0;
        const int64_t slot = (blocks[blk] * bs + off) * a.Hkv + h;
        ksrc[j] = K + slot * d;
        vsrc[j] = Vp + slot * d;
        for (int64_t e = 0; e < d; e += 64 / sizeof(E)) {
          __builtin_prefetch(vsrc[j] + e, 0, 3);
          if (first) __builtin_prefetch(ksrc[j] + e, 0, 3);
        }
      }
      for (int64_t j = 0, m = std::min(j0 + 2 * KEY_BLOCK, HI) - (j0 + KEY_BLOCK); j < m; ++j, ++off) {
        if (off == bs) ++blk, off = 0;
        const int64_t slot = (blocks[blk] * bs + off) * a.Hkv + h;
        const E *next = K + slot * d, *next_v = Vp + slot * d;
        for (int64_t e = 0; e < d; e += 64 / sizeof(E)) {
          __builtin_prefetch(next + e, 0, 2);
          __builtin_prefetch(next_v + e, 0, 2);
        }
      }
      key_scores(qs, Q, n, srow);
      for (int64_t r = 0; r < R; ++r) {
        const int64_t jb = std::max(j0, lo[r]), nr = std::min(j0 + KEY_BLOCK, hi[r]) - jb;
        for (int64_t gi = 0; gi < g; ++gi) {
          if (nr > 0)
            softmax_step(r * g + gi, jb - ju, nr, n);
          else  // none of this row's keys in the block
            std::fill(s[r * g + gi], s[r * g + gi] + n, 0.f);
        }
      }
      weighted_sum<V>(acc, s, vsrc, n, Q, d);
    }
    for (int64_t r = 0; r < R; ++r)
      for (int64_t gi = 0; gi < g; ++gi) {
        float* out = a.out + rows[r] * a.H * d + (q0 + gi) * d;
        for (int64_t e = 0; e < d; ++e) out[e] = acc[r * g + gi][e] / l[r * g + gi];
      }
  }
}

template <class V>
static void attention_items(const AttnArgs& a, int64_t i0, int64_t i1) {
  if (a.kv_half)
    attend_tiles<V, uint16_t>(a, i0, i1);
  else
    attend_tiles<V, float>(a, i0, i1);
}

}  // namespace peagle
