// The integer path's vpdpbusd tile (kernels.h) over vector traits W and a packed format T (packed_format:
// scales, mins, high bits, nibbles or bytes), shared by AVX512-VNNI (16 columns a vector: a packed group),
// AVX-VNNI (8: half a group) and AVX2 for the formats whose packed quants stay under 64 (vpdpbusd as maddubs
// + madd: exact there), each instantiated in its ISA's file after its `#pragma GCC target`. W supplies:
// LANES, RMAX, RTALL, columns(R), ivec/fvec, set1_i32, set1_i8, set1_f, zero_f, load (LANES * 4 bytes),
// store_i, nibbles(raw, lo, hi), slli16, srli16, and_, or_, dpbusd(acc, w, x), cvt_f, mul, fma, load_ph (LANES fp16),
// load_u8_f and load_i8_f (LANES uint8 / int8 as float), load_f, add, store. A unit is LANES columns: group unit / (QGROUP / LANES), the part unit % (QGROUP / LANES).
#pragma once
#include <algorithm>
#include <cstring>

#include "linear_tiles.h"

namespace peagle {

template <class W, WType T>
struct VnniTiles {
  using Args = QLinearArgs;
  using ivec = typename W::ivec;
  using fvec = typename W::fvec;
  static constexpr PackedFormat F = packed_format(T);
  static constexpr int SUMS = F.scales;  // integer sums a chunk (q6_k: weights 0..15 and 16..31 apart)
  // A nibble format's products added in int16 (AVX2's maddubs results) for STEPS at a time before one widening
  // into int32, VW vectors v (two products a sum and a v where SUMS is 1), in tiles of 3 or more rows; else (and
  // STEPS 0) W's dpbusd into int32 each. Zen 3, 16 matrices of 8,192 x 3,072 streamed, 2 threads, medians of 4
  // alternating runs: 8 rows Q4_K 52.4 against 62.9 ms, Q5_K 53.5 against 65.5, Q6_K 72.2 against 73.8; 4 rows
  // 1.1x; one row 3-9% slower in all three (18.5 against 17.9 ms in Q4_K), so 1 and 2 rows keep their code (AVX2's
  // K-quants run avx2.cpp's own tiles there).
  static constexpr int STEPS = W::i16_steps((16 << F.planes) - 1);
  static constexpr int VW = std::max(1, std::min(4, STEPS * SUMS / 2));
  static_assert(4 % VW == 0, "a widening between a chunk's halves");
  static constexpr int RMAX = W::RMAX, RTALL = W::RTALL;
  static constexpr int64_t PARTS = QGROUP / W::LANES;  // units a packed group
  static constexpr int stream_columns(int) { return QGROUP / W::LANES; }  // one packed group
  // The sums' registers, but passes of 1 and 2 rows on 16 lanes keep W's width (32 registers hold q6_k's 2RG sums
  // there): a memory-bound pass reads as many streams as the tile is wide, and q6_k two wide waited on memory
  // (Emerald Rapids, 2 threads, the builds alternating: ffn_down's 3,072 x 8,192 streamed at one row read 71-78%
  // -> 81-91% of Q4_0's GB/s, at two rows 80-81% -> 90-95%; an LM head's 49,152 x 3,072 at one row 82-89% ->
  // 96-100%; from L3 every format ran at one rate). One row on AVX-VNNI's 8 lanes too (16 registers hold its 8
  // int32 sums; not AVX2's, whose int16 sums would need 8 more): there q6_k is bound by its arithmetic, and 4
  // units' independent sums hide more of vpdpbusd's latency than 2 (the same Xeon under PEAGLE_ISA=avxvnni,
  // 3 alternating pairs, one thread from L3: 7.1-7.5 -> 7.5-7.9 GB/s; 2 threads streamed, 67-69% -> 67-72% of
  // Q4_0's rate; 1B Q4_K_M decoding 0.97-1.07x, median 1.07x, 3 pairs).
  static constexpr int columns(int R) {
    return (R == 1 && STEPS == 0) || (R <= 2 && W::LANES == 16) ? W::columns(R) : (W::columns(R) + SUMS - 1) / SUMS;
  }
  // Whether a tile prefetches the next tile's weights: not where one read stream (one packed group wide) feeds
  // fewer than 6 rows, which the hardware prefetcher keeps ahead of alone, the software's requests only adding
  // to it (Zen 4, engine steps, the two builds alternating: 1 row 0.95-0.99x, 2-3 rows 0.93-0.96x, 4-6 rows
  // level, 8 rows 1.09x without them)
  static constexpr bool prefetches(int R, int G) { return G > stream_columns(R) || R >= 6; }

  static ivec bcast4(const int8_t* p) {  // four int8 activations in every lane
    int32_t v;
    std::memcpy(&v, p, 4);
    return W::set1_i32(v);
  }
  // The F.planes bits at ``from`` of every byte moved to bit 4 (within the byte), the others cleared.
  static ivec high_bits(ivec h, int from) {
    const ivec at4 = from < 4 ? W::slli16(h, 4 - from) : from > 4 ? W::srli16(h, from - 4) : h;
    return W::and_(at4, W::set1_i8(char(((1 << F.planes) - 1) << 4)));
  }
  // The column scales (fp16) and mins (the min negated) of a part's LANES columns of a 32-weight format's chunk.
  static fvec scales(const PackedChunk<const uint8_t>& pc, int64_t part) { return W::load_ph(pc.rec + 2 * W::LANES * part); }
  static fvec mins(const PackedChunk<const uint8_t>& pc, int64_t part) { return W::load_ph(pc.rec + 2 * (QGROUP + W::LANES * part)); }
  // A K-quant chunk's integer scales of half h (q6_k: 0 and 1) as float32, a part's LANES columns (the header's sc).
  static fvec kscales(const PackedChunk<const uint8_t>& pc, int64_t part, int h) {
    if constexpr (T == WType::q6_k) return W::load_i8_f(pc.head + 32 + QGROUP * (2 * pc.j + h) + W::LANES * part);
    else return W::load_u8_f(pc.head + 64 + QGROUP * pc.j + W::LANES * part);
  }
  // The high-bit vectors of a chunk whose (part's) quants start at q: they lie just before them.
  static void planes_of(const uint8_t* q, ivec* planes) {
    for (int h = 0; h < F.planes; ++h) planes[h] = W::load(q - 64 * (F.planes - h));
  }
  // Packed vector v at q split into each column's weights 4v + i (lo) and 16 + 4v + i (hi), their high bits
  // added (high_at): a uint8 weight a byte.
  static void split(const uint8_t* q, const ivec* planes, int v, ivec& lo, ivec& hi) {
    W::nibbles(W::load(q + 64 * v), lo, hi);
    if constexpr (F.planes > 0) {
      const HighAt l = high_at(T, v, 0), h = high_at(T, v, 1);
      lo = W::or_(lo, high_bits(planes[l.vec], l.at));
      hi = W::or_(hi, high_bits(planes[h.vec], h.at));
    }
  }
  // acc plus a 32-weight format's chunk: its integer sums is[0 .. SUMS) scaled by the part's column scales
  // (and its min), the row's d (and d times its sum, sd).
  static fvec epilogue(fvec acc, const PackedChunk<const uint8_t>& pc, int64_t part, const ivec* is, float d, float sd) {
    const fvec dx = W::set1_f(d);
    for (int h = 0; h < SUMS; ++h) acc = W::fma(scales(pc, part), W::mul(W::cvt_f(is[h]), dx), acc);
    if constexpr (F.min) acc = W::fma(mins(pc, part), W::set1_f(sd), acc);
    return acc;
  }
  // Chunk b's integer sums is (rows m .. m+R of x, units u .. u+G, chunks pc) into the tile's results: a 32-weight
  // format's epilogue into acc; a K-quant's (Q8_K's arithmetic, kernels.h) scaled by its integer scales into its
  // super-block's f, and at the super-block's last chunk f and the mins into acc, each unit's scales and mins
  // made once for the R rows. The mins' sum is of integers under 2^24: exact in any order.
  template <int R, int G>
  static void fold(fvec (&acc)[R][G], fvec (&f)[R][G], const PackedChunk<const uint8_t> (&pc)[G], int64_t u,
                   const ivec (&is)[SUMS][R][G], const QRows& x, int64_t m, int64_t nb, int64_t b) {
    const int c = int(b % 8);  // the chunk's place in its super-block (every unit's: one branch, not G)
#pragma GCC unroll 8  // else GCC kept this loop rolled, its sums and results on the stack (Q4_K, one row)
    for (int j = 0; j < G; ++j) {
      const int64_t part = (u + j) % PARTS;
      if constexpr (!super_packed(T)) {
        for (int r = 0; r < R; ++r) {
          ivec sums[SUMS];
          for (int h = 0; h < SUMS; ++h) sums[h] = is[h][r][j];
          acc[r][j] = epilogue(acc[r][j], pc[j], part, sums, x.d[(m + r) * nb + b], x.sd[(m + r) * nb + b]);
        }
      } else {
        fvec sc[SUMS];
        for (int h = 0; h < SUMS; ++h) sc[h] = kscales(pc[j], part, h);
        for (int r = 0; r < R; ++r) {
          if (c == 0) f[r][j] = W::zero_f();
          for (int h = 0; h < SUMS; ++h) f[r][j] = W::fma(sc[h], W::cvt_f(is[h][r][j]), f[r][j]);
        }
        if (c != 7) continue;
        const fvec d = W::load_ph(pc[j].head + 2 * W::LANES * part);
        fvec mn[F.min ? 8 : 1], dmin = W::zero_f();
        if constexpr (F.min) {
          for (int k = 0; k < 8; ++k) mn[k] = W::load_u8_f(pc[j].head + 192 + QGROUP * k + W::LANES * part);
          dmin = W::mul(W::load_ph(pc[j].head + 32 + 2 * W::LANES * part), W::set1_f(-1.f));
        }
        for (int r = 0; r < R; ++r) {
          const int64_t xb = (m + r) * nb + b;
          const fvec dx = W::set1_f(x.d[xb]);
          acc[r][j] = W::fma(d, W::mul(dx, f[r][j]), acc[r][j]);
          if constexpr (F.min) {
            fvec t = W::zero_f();
            for (int k = 0; k < 8; ++k) t = W::fma(mn[k], W::set1_f(x.s[xb - 7 + k]), t);
            acc[r][j] = W::fma(dmin, W::mul(dx, t), acc[r][j]);
          }
        }
      }
    }
  }
  // Column group g's quants, every chunk, split into a uint8 weight a byte (the high bits added) at out: Q8_0's
  // packed quants (vector v: weights 4v .. 4v+3 of each column), EXPANDED bytes a chunk. A pass of many rows
  // (prefill) splits each group once so, where its tiles would split it again for every RMAX rows: a Q6_K
  // matrix at 512 rows did twice Q4_0's work a row (two bit planes then, two sums; docs/real-sizes.md). Only for
  // formats with high bits: a plain nibble split costs less than reading twice the bytes from L2 for every
  // tile (one 8,192 x 3,072 matrix at 512 rows, 2 threads, Sapphire Rapids: Q5_K 1.26x and Q6_K 1.34x faster
  // expanded; Q4_0 and Q4_K 1.1-1.25x slower, in a first version).
  static constexpr bool expands = F.planes > 0;
  static constexpr int64_t EXPANDED = 512;
  static void expand(const QLinearArgs& a, int64_t g, uint8_t* out) {
    for (int64_t b = 0; b < a.K / QBLOCK; ++b, out += EXPANDED) {
      const uint8_t* rec = packed_chunk_at(a.w, T, g, b, a.K).rec + packed_quants(T);
      for (int64_t part = 0; part < PARTS; ++part) {
        const uint8_t* q = rec + 4 * W::LANES * part;
        ivec planes[F.planes > 0 ? F.planes : 1];
        planes_of(q, planes);
        for (int v = 0; v < 4; ++v) {
          ivec lo, hi;
          split(q, planes, v, lo, hi);
          W::store_i(out + 64 * v + 4 * W::LANES * part, lo);
          W::store_i(out + 64 * (v + 4) + 4 * W::LANES * part, hi);
        }
      }
    }
  }

  // The same tiles on weights expand split (QLinearArgs::ex): blocks<> over it runs them.
  struct Expanded {
    using Args = QLinearArgs;
    static constexpr int RMAX = VnniTiles::RMAX, RTALL = VnniTiles::RTALL;
    static constexpr int columns(int R) { return VnniTiles::columns(R); }
    template <int R, int G>
    static void tile(const QLinearArgs& a, int64_t m, int64_t u) { VnniTiles::tile<R, G, true>(a, m, u); }
  };

  // The next tile's chunk b (and, at a super-block's start, its header) on its way to the cache. Inlined always:
  // GCC takes a function of prefetches alone for one without effects and drops its calls (its IPA pure-const
  // pass), which it had done to every call of this one on AVX512-VNNI and AVX-VNNI until 2026-12-01.
  [[gnu::always_inline]] static inline void prefetch(const uint8_t* group, const ChunkOffsets& o) {
    for (int64_t l = 0; l < packed_chunk(T); l += 64) __builtin_prefetch(group + o.rec + l, 0, 3);
    if (super_packed(T) && o.j == 0)
      for (int64_t l = 0; l < KHEAD; l += 64) __builtin_prefetch(group + o.head + l, 0, 3);
  }

  // Rows [m, m+R) x units [u, u+G): R*G (q6_k: 2R*G) int32 vectors per chunk (starting from the row's
  // -offset * s, so they end at the weight's own dot product), R*G float32 accumulators; each weight vector
  // is loaded (its nibbles split, its high bits added) once for all R rows, and the next tile's weights
  // prefetched while these compute (where prefetches(R, G)).
  template <int R, int G, bool EX = false>
  static void tile(const QLinearArgs& a, int64_t m, int64_t u) {
    constexpr int64_t QOFF = packed_quants(T);
    const int64_t nb = a.K / QBLOCK, GB = packed_group_bytes(T, a.K);
    fvec acc[R][G], f[R][G];
    for (int r = 0; r < R; ++r)
      for (int j = 0; j < G; ++j) acc[r][j] = W::zero_f();
    for (int64_t b = 0; b < nb; ++b) {
      ivec is[SUMS][R][G];
      for (int r = 0; r < R; ++r) {
        const int64_t xb = (m + r) * nb + b;
        const ivec c = W::set1_i32(SUMS == 2 ? a.x.c16[xb] : a.x.c[xb]), c2 = W::set1_i32(a.x.c[xb] - a.x.c16[xb]);
        for (int j = 0; j < G; ++j) {
          is[0][r][j] = c;
          if constexpr (SUMS == 2) is[SUMS - 1][r][j] = c2;
        }
      }
      const uint8_t* p[G];  // each unit's quants in this block (split already where a.ex holds them)
      PackedChunk<const uint8_t> pc[G];
      const ChunkOffsets o = packed_chunk_offsets(T, b);
      for (int j = 0; j < G; ++j) {
        const int64_t part = (u + j) % PARTS;
        const uint8_t* group = a.w + (u + j) / PARTS * GB;
        pc[j] = {group + o.rec, group + o.head, o.j};
        if constexpr (prefetches(R, G) && !EX) prefetch(a.w + (u + G + j) / PARTS * GB, o);  // every 64-byte line holds each part
        if constexpr (EX) p[j] = a.ex + (((u + j) / PARTS - a.ex_group) * (a.K / QBLOCK) + b) * EXPANDED + 4 * W::LANES * part;
        else p[j] = pc[j].rec + QOFF + 4 * W::LANES * part;
      }
      // each weight vector loaded (and split) once for the R rows, each row's four activations broadcast
      // once for the G units: the integer sums are exact, so the order of the products changes nothing
      if constexpr (!F.nibbles || EX) {  // bytes: weights 4v .. 4v+3 in vector v; q6_k's 0 .. 15 and 16 .. 31 apart
        const auto bytes = [&](int v, ivec (&sums)[R][G]) {
          ivec wv[G];
          for (int j = 0; j < G; ++j) wv[j] = W::load(p[j] + 64 * v);
          for (int r = 0; r < R; ++r) {
            const ivec x = bcast4(a.x.q + (m + r) * a.K + b * QBLOCK + 4 * v);
            for (int j = 0; j < G; ++j) sums[r][j] = W::dpbusd(sums[r][j], wv[j], x);
          }
        };
        if constexpr (SUMS == 1) {  // one loop: q8_0's one-row passes ran 1.1-1.4x slower split in two
          for (int v = 0; v < 8; ++v) bytes(v, is[0]);
        } else {
          for (int v = 0; v < 4; ++v) bytes(v, is[0]);
          for (int v = 4; v < 8; ++v) bytes(v, is[1]);
        }
      } else {
        ivec planes[G][F.planes > 0 ? F.planes : 1];
        for (int j = 0; j < G; ++j) planes_of(p[j], planes[j]);
        if constexpr (STEPS > 0 && R > 2) {  // W's maddubs results in int16, widened every VW vectors
          ivec s16[SUMS][R][G];
#pragma GCC unroll 4  // else GCC left this loop rolled (Q4_K, 4 rows), its sums read from the stack
          for (int v = 0; v < 4; ++v) {
            ivec lo[G], hi[G];
            for (int j = 0; j < G; ++j) split(p[j], planes[j], v, lo[j], hi[j]);
            for (int r = 0; r < R; ++r) {
              const int8_t* x = a.x.q + (m + r) * a.K + b * QBLOCK + 4 * v;
              const ivec xl = bcast4(x), xh = bcast4(x + 16);
              for (int j = 0; j < G; ++j) {
                for (int h = 0; h < SUMS; ++h)
                  if (v % VW == 0) s16[h][r][j] = W::set1_i32(0);
                s16[0][r][j] = W::template dp16<R>(s16[0][r][j], lo[j], xl);
                s16[SUMS - 1][r][j] = W::template dp16<R>(s16[SUMS - 1][r][j], hi[j], xh);
                if (v % VW == VW - 1)
                  for (int h = 0; h < SUMS; ++h) is[h][r][j] = W::widen(is[h][r][j], s16[h][r][j]);
              }
            }
          }
        } else {  // vpdpbusd into int32: the loop the VNNI tiles were timed with, kept apart from the one above
          // (a shared body through a lambda changed their instructions, and GCC 12 takes no template-dependent
          // unroll count); the two differ in the sums, not in the split or the broadcasts
#pragma GCC unroll 4  // else GCC left it rolled for the high-bit formats: shifts by a register, sums on the stack
          for (int v = 0; v < 4; ++v) {
            ivec lo[G], hi[G];
            for (int j = 0; j < G; ++j) split(p[j], planes[j], v, lo[j], hi[j]);
            for (int r = 0; r < R; ++r) {
              const int8_t* x = a.x.q + (m + r) * a.K + b * QBLOCK + 4 * v;
              const ivec xl = bcast4(x), xh = bcast4(x + 16);
              for (int j = 0; j < G; ++j) {
                is[0][r][j] = W::dpbusd(is[0][r][j], lo[j], xl);
                is[SUMS - 1][r][j] = W::dpbusd(is[SUMS - 1][r][j], hi[j], xh);
              }
            }
          }
        }
      }
      fold<R, G>(acc, f, pc, u, is, a.x, m, nb, b);
    }
    for (int r = 0; r < R; ++r)
      for (int j = 0; j < G; ++j) {
        const int64_t n = (u + j) * W::LANES;
        fvec y = acc[r][j];
        if (a.bias) y = W::add(y, W::load_f(a.bias + n));
        W::store(a.y + (m + r) * a.ldy + n, y);
      }
  }
};

}  // namespace peagle
