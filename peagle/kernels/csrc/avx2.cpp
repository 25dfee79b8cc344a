// AVX2 + FMA + F16C (Zen 3 and later, Intel since Haswell): 8 lanes. Chosen at run time; the target
// pragma keeps the rest of the library loadable on any x86-64.
#pragma GCC target("avx2,fma,f16c")
#include <immintrin.h>

#include <cmath>
#include <cstring>
#include <type_traits>

#include "attention_tiles.h"
#include "linear_tiles.h"
#include "vnni_tiles.h"
#include "ymm.h"

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
  static vec load_h(const uint16_t* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
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
  static vec mul(vec a, vec b) { return _mm256_mul_ps(a, b); }
  static vec div(vec a, vec b) { return _mm256_div_ps(a, b); }
  static float max_of(const float* p, int64_t n) {  // the max is exact: any order
    vec r = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
    int64_t i = 0;
    for (; i + LANES <= n; i += LANES) r = _mm256_max_ps(r, _mm256_loadu_ps(p + i));
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(r), _mm256_extractf128_ps(r, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    float m = _mm_cvtss_f32(_mm_max_ss(h, _mm_movehdup_ps(h)));
    for (; i < n; ++i) m = std::max(m, p[i]);
    return m;
  }
  // lane i = hsum(v[i]), the same additions in the same pairs, 8 reductions sharing each shuffle and add:
  // l + l+4 (two vectors a step), then l + l+2, l + l+1 (within 128-bit lanes); key i comes out at lane
  // i / 2 (even) or 4 + i / 2 (odd), put back in order by one permute
  // inlined: called, its 8 accumulators went through the stack (a quarter of one row's attention)
  __attribute__((always_inline)) static vec hsum_many(const vec* v) {
    vec h[4], w[2];
    for (int i = 0; i < 4; ++i)
      h[i] = _mm256_add_ps(_mm256_permute2f128_ps(v[2 * i], v[2 * i + 1], 0x20),
                           _mm256_permute2f128_ps(v[2 * i], v[2 * i + 1], 0x31));
    for (int i = 0; i < 2; ++i)
      w[i] = _mm256_add_ps(_mm256_shuffle_ps(h[2 * i], h[2 * i + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                           _mm256_shuffle_ps(h[2 * i], h[2 * i + 1], _MM_SHUFFLE(3, 2, 3, 2)));
    const vec s = _mm256_add_ps(_mm256_shuffle_ps(w[0], w[1], _MM_SHUFFLE(2, 0, 2, 0)),
                                _mm256_shuffle_ps(w[0], w[1], _MM_SHUFFLE(3, 1, 3, 1)));
    return _mm256_permutevar8x32_ps(s, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
  }
  static vec mask_n(vec x, int64_t c) {
    if (c == LANES) return x;
    alignas(32) float buf[8];
    _mm256_store_ps(buf, x);
    std::fill(buf + c, buf + 8, 0.f);
    return _mm256_load_ps(buf);
  }
  // lanes [first, first + c) to p[0 .. c): a masked store whose masked-off lanes touch no memory
  static void store_lanes(float* p, vec x, int first, int c) {
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const __m256i in = _mm256_and_si256(_mm256_cmpgt_epi32(lane, _mm256_set1_epi32(first - 1)),
                                        _mm256_cmpgt_epi32(_mm256_set1_epi32(first + c), lane));
    _mm256_maskstore_ps(reinterpret_cast<float*>(reinterpret_cast<uintptr_t>(p) - 4 * first), in, x);
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
  static float hsum(vec v) {  // ((0+4)+(2+6)) + ((1+5)+(3+7))
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
  }
};

inline __m256i bcast4(const int8_t* p) {  // four int8 activations in every lane
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm256_set1_epi32(v);
}

// The integer path (kernels.h) on packed GGUF blocks, 8 columns (half a packed group) in the lanes of a
// vector, `maddubs` (uint8 x int8 pairs into int16) then `madd` into int32. Rows [m, m+R) x halves
// [u, u+H) (half u: group u / 2, columns 8 (u % 2) ..). q4: a block's 8 maddubs results add in int16
// (16 products of at most 15 x 127: no overflow); q8_0: |w| x sign(x, w) (at most 128 x 127 a product,
// two per int16), each into int32. At most one packed group (two halves) a tile: four halves (two groups,
// two streams of blocks read in turn) made one row 2.5x slower on Zen 5 (7.0 against 2.8 ms for the default
// model's layer matmuls on one thread).

// An integer sum of a tile of R rows, kept where the source adds it: integer adds reassociate, and in tiles of
// 3 and 4 rows GCC made a tree of a block's 32 maddubs results, spilling them to the stack (Zen 3, 16 Q4_0
// matrices of 8,192 x 3,072 at 8 rows, 2 threads, alternating: 35.6-38.7 against 45.1-60.4 ms). Tiles of 1 and
// 2 rows keep GCC's order: their code is unchanged, as decoding timed it. The sums are the same integers.
template <int R>
__attribute__((always_inline)) inline void in_order(__m256i& sum) {
  if constexpr (R > 2) asm("" : "+x"(sum));
}

// A tile's sums (plus the bias) into y: rows [m, m+R) x units [u, u+G) of 8 columns.
template <int R, int G>
__attribute__((always_inline)) inline void store_tile(const QLinearArgs& a, int64_t m, int64_t u, const __m256 (&acc)[R][G]) {
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < G; ++j) {
      const int64_t n = (u + j) * 8;
      __m256 y = acc[r][j];
      if (a.bias) y = _mm256_add_ps(y, _mm256_loadu_ps(a.bias + n));
      _mm256_storeu_ps(a.y + (m + r) * a.ldy + n, y);
    }
}

// Where the weights stream from memory, Avx2Int's tiles ask for them ahead of their loads (prefetcht1), in one of
// two ways:
// - a tile of a packed group (H == 2: passes of 1-2 rows) for the chunk AHEAD blocks on in its own stream
//   (the next group's first chunks at the end of a group: groups follow each other);
// - a pass of 3-4 rows runs a group as two tiles, one a half (H == 1), and the second reads from L2 what the
//   first brought from memory, so memory idled half the time: each tile asks for its half of the next group's
//   bytes, spread over its blocks. Not in taller passes (two tiles of rows a half): those are bound by the
//   products (8 rows level either way).
// Zen 3, 2 threads, in-process A/B: 48 Q4_0 matrices of 8,192 x 3,072 streamed, 1 / 2 / 3 / 4 rows 0.85-0.92x /
// 0.77-0.95x / 0.74-0.82x / 0.78-0.93x the time without; whole steps of 3B Q4_0 (plain 124.8 -> 112.5 ms, a K=3
// round 225 -> 176) and the default model (plain 9.8 -> 9.0, K=3 16.6 -> 14.1). AHEAD 3-6 level at 3B, 4 best at
// 8B. A prefetch past the weight's end (the last group's) reads and faults nothing.
// A tile that prefetches is its own instantiation (run<..., true>): the 8-row tiles' registers stay as they were
// (with the prefetch pointer in them, GCC spilled the 4-row tile's sums to the stack: 8 rows 1.25x slower).
constexpr int64_t AHEAD = 4;

template <WType T>
struct Avx2Int {
  using Args = QLinearArgs;
  static constexpr int RMAX = 4, RTALL = 4;
  static constexpr int columns(int R) { return R <= 2 ? 2 : 1; }
  static constexpr int stream_columns(int R) { return columns(R); }  // taller: the registers run out (8 rows 3.5 -> 3.9 ms)

  template <int R, int H>
  static void tile(const QLinearArgs& a, int64_t m, int64_t u) {
    if (H == 2 || a.M == R) return run<R, H, true>(a, m, u);
    run<R, H, false>(a, m, u);
  }

  template <int R, int H, bool PREFETCH>
  static void run(const QLinearArgs& a, int64_t m, int64_t u) {
    constexpr int64_t PB = packed_chunk(T), QOFF = packed_quants(T);
    constexpr int64_t CHUNK_LINES = (PB + 63) / 64, HALF_LINES = (PB + 127) / 128;
    const int64_t nb = a.K / QBLOCK;
    const __m256i low = _mm256_set1_epi8(15), ones = _mm256_set1_epi16(1), flip = _mm256_set1_epi8(char(0x80));
    __m256 acc[R][H];
    for (int r = 0; r < R; ++r)
      for (int j = 0; j < H; ++j) acc[r][j] = _mm256_setzero_ps();
    // H == 1: this half's share of the next group, HALF_LINES lines a block (the two halves' shares cover it)
    const uint8_t* next = a.w + (u / 2 + 1) * nb * PB + u % 2 * nb * HALF_LINES * 64;
    for (int64_t b = 0; b < nb; ++b) {
      if constexpr (PREFETCH && H == 2) {
        const uint8_t* ahead = a.w + (u / 2 * nb + b + AHEAD) * PB;
        for (int64_t l = 0; l < CHUNK_LINES; ++l) __builtin_prefetch(ahead + 64 * l, 0, 2);
      }
      if constexpr (PREFETCH && H == 1) {
        for (int64_t l = 0; l < HALF_LINES; ++l) __builtin_prefetch(next + 64 * l, 0, 2);
        next += 64 * HALF_LINES;
      }
      for (int j = 0; j < H; ++j) {
        const int64_t h = (u + j) % 2;
        const uint8_t* s = a.w + ((u + j) / 2 * nb + b) * PB;
        const uint8_t* p = s + QOFF + 32 * h;
        __m256i is[R];
        if constexpr (T == WType::q8_0) {
          for (int r = 0; r < R; ++r) is[r] = _mm256_setzero_si256();
          for (int v = 0; v < 8; ++v) {
            const __m256i wv = _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 64 * v)), flip);
            const __m256i aw = _mm256_abs_epi8(wv);
            for (int r = 0; r < R; ++r) {
              const __m256i xs = _mm256_sign_epi8(bcast4(a.x.q + (m + r) * a.K + b * QBLOCK + 4 * v), wv);
              is[r] = _mm256_add_epi32(is[r], _mm256_madd_epi16(_mm256_maddubs_epi16(aw, xs), ones));
              in_order<R>(is[r]);
            }
          }
        } else {
          __m256i s16[R];
          for (int r = 0; r < R; ++r) s16[r] = _mm256_setzero_si256();
          for (int v = 0; v < 4; ++v) {
            const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 64 * v));
            const __m256i lo = _mm256_and_si256(raw, low), hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), low);
            for (int r = 0; r < R; ++r) {
              const int8_t* x = a.x.q + (m + r) * a.K + b * QBLOCK + 4 * v;
              s16[r] = _mm256_add_epi16(s16[r], _mm256_maddubs_epi16(lo, bcast4(x)));
              s16[r] = _mm256_add_epi16(s16[r], _mm256_maddubs_epi16(hi, bcast4(x + 16)));
              in_order<R>(s16[r]);
            }
          }
          for (int r = 0; r < R; ++r) is[r] = _mm256_madd_epi16(s16[r], ones);
        }
        const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 16 * h)));
        for (int r = 0; r < R; ++r) {
          const int64_t xb = (m + r) * nb + b;
          __m256i isum = is[r];
          if constexpr (T == WType::q4_0) isum = _mm256_add_epi32(isum, _mm256_set1_epi32(a.x.c[xb]));
          const __m256 t = _mm256_mul_ps(_mm256_cvtepi32_ps(isum), _mm256_set1_ps(a.x.d[xb]));
          acc[r][j] = _mm256_fmadd_ps(dw, t, acc[r][j]);
          if constexpr (T == WType::q4_1) {
            const __m256 mw = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 32 + 16 * h)));
            acc[r][j] = _mm256_fmadd_ps(mw, _mm256_set1_ps(a.x.sd[xb]), acc[r][j]);
          }
        }
      }
    }
    store_tile<R, H>(a, m, u, acc);
  }
};

// The other formats' packed quants stay under 64 (5 and 6 bits, a K-quant's 4): maddubs's pairs (at most
// 2 x 63 x 127) never saturate, so maddubs + madd is vpdpbusd exactly and they take the VNNI tile.
// A tall tile's maddubs results add in int16 (pairs of at most 2 x qmax x 127: q4 8 of them, q5 4, q6_k 2)
// before one madd widens them, as Avx2Int's q4 does, instead of a madd and an add each (vnni_tiles.h's STEPS);
// in order (in_order), else GCC's tree of them spilled as in Avx2Int.
struct Ymm2 : YmmBase {
  static ivec dpbusd(ivec acc, ivec w, ivec x) {
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(w, x), _mm256_set1_epi16(1)));
  }
  static constexpr int i16_steps(int qmax) { return 32767 / (2 * qmax * 127); }
  template <int R>  // in a tile of R rows
  static ivec dp16(ivec acc16, ivec w, ivec x) {
    acc16 = _mm256_add_epi16(acc16, _mm256_maddubs_epi16(w, x));
    in_order<R>(acc16);
    return acc16;
  }
  static ivec widen(ivec acc, ivec acc16) { return _mm256_add_epi32(acc, _mm256_madd_epi16(acc16, _mm256_set1_epi16(1))); }
};

// The K-quants' (Q4_K, Q5_K, Q6_K) tiles of 1-4 rows (decoding, short verify passes, where the weights stream
// from memory), as Avx2Int's are built: VnniTiles' split and epilogue (the same bits) with
// - the maddubs results added in int16 (Ymm2::i16_steps at a time, then one madd), in order: with int32 sums, GCC
//   made a tree of the one-row tile's 32 sums a chunk (four units wide) and spilled it to the stack;
// - each unit's super-block found by a pointer that walks its group, not recomputed a chunk;
// - a tile one packed group wide (one read stream: a narrow pass, and every 2-row pass) asking for the chunk
//   AHEAD blocks on (its super-block's header too, at the start of one), as Avx2Int's tiles do.
// Zen 3, 2 threads, in one process against VnniTiles' tiles: one Q4_K matrix of 2,048 x 2,048 in the cache, one
// thread, 129 against 173 us (Q4_0 130); the 1B Q4_K_M file's matrices streamed, one row 40.5-43.7 against
// 52.5-55.5 ms a sweep (one group wide against VnniTiles' fastest, wide), two rows 54.7 against 69.9; plain
// steps 1B 42.9 against 54.0 ms, 3B 115.9 against 132.5. A verify pass of 3 or 4 rows (K=2, K=3) runs each
// packed group as two half tiles, each asking for its half of the next group's lines, as Avx2Int's (VnniTiles'
// 3- and 4-row tiles do not prefetch): under PEAGLE_ISA=avx2 on a
// Sapphire Rapids Xeon, 16 matrices of 8,192 x 3,072 streamed, 2 threads, 4 rows Q4_K 15.6-17.1 against
// 20.5-21.0 ms a sweep, Q6_K 24.9-26.4 against 27.2-27.9, 3 rows 1.25x and 1.17x; a 3B Q4_K_M K=3 round 0.94-0.95x
// the time. Taller passes (5-8 rows, prefill) keep VnniTiles' tiles.
template <WType T>
struct Avx2KQuant : VnniTiles<Ymm2, T> {
  using V = VnniTiles<Ymm2, T>;
  template <int R, int G, bool EX = false>
  static void tile(const QLinearArgs& a, int64_t m, int64_t u) {
    if constexpr (R <= 2 && !EX) {
      rows<R, G>(a, m, u);
    } else {
      if constexpr (!EX) {
        if (a.M == R) {  // a verify pass of 3-4 rows: a half group a tile, as Avx2Int's
          for (int j = 0; j < G; ++j) rows<R, 1>(a, m, u + j);
          return;
        }
      }
      V::template tile<R, G, EX>(a, m, u);
    }
  }

  template <int R, int G>
  static void rows(const QLinearArgs& a, int64_t m, int64_t u) {
    constexpr int SUMS = V::SUMS, VW = V::VW, PLANES = V::F.planes;
    constexpr int64_t PC = packed_chunk(T), PB = packed_bytes(T), QOFF = packed_quants(T), PARTS = V::PARTS;
    constexpr bool PREFETCH = G == PARTS, HALF = R > 2;  // one packed group: one read stream; half of one
    constexpr int64_t HALF_LINES = (PB / 8 + 127) / 128;  // a half tile's share of the next group, a chunk
    static_assert(V::STEPS > 0, "int16 sums");
    const int64_t nb = a.K / QBLOCK, ns = a.K / QK_K;
    const uint8_t* next = a.w + (u / PARTS + 1) * ns * PB + u % PARTS * nb * HALF_LINES * 64;
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 acc[R][G], f[R][G];
    for (int r = 0; r < R; ++r)
      for (int j = 0; j < G; ++j) acc[r][j] = _mm256_setzero_ps();
    const uint8_t* head[G];  // each unit's super-block (a prefetching tile's units: one group's)
    for (int j = 0; j < G; ++j) head[j] = a.w + (u + j) / PARTS * ns * PB;
    for (int64_t b = 0; b < nb; ++b) {
      const int c = int(b % 8);
      if constexpr (PREFETCH) {
        const int64_t ahead = c + AHEAD;  // past the group's end: the next group's (groups follow each other)
        const uint8_t* h = head[0] + ahead / 8 * PB;
        for (int64_t l = 0; l < PC; l += 64) __builtin_prefetch(h + KHEAD + ahead % 8 * PC + l, 0, 2);
        if (ahead % 8 == 0)
          for (int64_t l = 0; l < KHEAD; l += 64) __builtin_prefetch(h + l, 0, 2);
      }
      if constexpr (HALF) {
        for (int64_t l = 0; l < HALF_LINES; ++l) __builtin_prefetch(next + 64 * l, 0, 2);
        next += 64 * HALF_LINES;
      }
      PackedChunk<const uint8_t> pc[G];
      const uint8_t* q[G];
      __m256i planes[G][PLANES > 0 ? PLANES : 1];
      for (int j = 0; j < G; ++j) {
        pc[j] = {head[j] + KHEAD + c * PC, head[j], c};
        q[j] = pc[j].rec + QOFF + 32 * ((u + j) % PARTS);
        V::planes_of(q[j], planes[j]);
      }
      __m256i is[SUMS][R][G], s16[SUMS][R][G];
#pragma GCC unroll 4
      for (int v = 0; v < 4; ++v) {
        __m256i lo[G], hi[G];
        for (int j = 0; j < G; ++j) V::split(q[j], planes[j], v, lo[j], hi[j]);
        for (int r = 0; r < R; ++r) {
          const int8_t* x = a.x.q + (m + r) * a.K + b * QBLOCK + 4 * v;
          const __m256i xl = bcast4(x), xh = bcast4(x + 16);
          const int64_t xb = (m + r) * nb + b;
          for (int j = 0; j < G; ++j) {
            if (v % VW == 0)
              for (int h = 0; h < SUMS; ++h) s16[h][r][j] = _mm256_setzero_si256();
            s16[0][r][j] = _mm256_add_epi16(s16[0][r][j], _mm256_maddubs_epi16(lo[j], xl));
            asm("" : "+x"(s16[0][r][j]));
            s16[SUMS - 1][r][j] = _mm256_add_epi16(s16[SUMS - 1][r][j], _mm256_maddubs_epi16(hi[j], xh));
            asm("" : "+x"(s16[SUMS - 1][r][j]));
            if (v % VW != VW - 1) continue;
            for (int h = 0; h < SUMS; ++h) {  // widened, the first time onto the row's -offset * s (VnniTiles' start)
              const __m256i w = _mm256_madd_epi16(s16[h][r][j], ones);
              const int32_t c0 = SUMS == 1 ? a.x.c[xb] : h == 0 ? a.x.c16[xb] : a.x.c[xb] - a.x.c16[xb];
              is[h][r][j] = _mm256_add_epi32(v < VW ? _mm256_set1_epi32(c0) : is[h][r][j], w);
            }
          }
        }
      }
      V::template fold<R, G>(acc, f, pc, u, is, a.x, m, nb, b);
      if (c == 7)
        for (int j = 0; j < G; ++j) head[j] += PB;
    }
    store_tile<R, G>(a, m, u, acc);
  }
};

// The bf16 dot-product path (kernels.h) where the CPU has no vdpbf16ps: each lane's step as two FMAs, the
// pair's odd element first, on the packed bf16 weights (8 columns a vector: a group's pair is two vectors), with
// vdpbf16ps's flushes from MXCSR: DAZ reads a denormal weight as zero (x's bf16_rows flushed already) and FTZ
// flushes a tiny result. FTZ decides tininess before rounding, the stated arithmetic after (a sum just under
// FLT_MIN that rounds up to it is kept), so a call that raised the underflow flag runs again with the flushes
// in code (FLUSH), MXCSR as it was: a sum of bf16 products that small is rare, and the common case pays
// nothing for it. One packed group streams as one read (the bytes of 16 columns in turn), where the plain
// [N, K] matrix's rows are as many streams as the tile's columns: the default model's 576-wide rows read at
// 8-10 GB/s so, against 21-24 for 3,072-wide ones (Zen 3, 2 threads).
struct Bf16Avx2 {
  using Args = BLinearArgs;
  static constexpr int RMAX = 4, RTALL = 4;
  static constexpr int columns(int R) { return R == 1 ? 2 : 1; }  // 4 or 2R accumulators, 4G weight vectors
  static constexpr int stream_columns(int) { return 1; }

  template <int R, int G>
  static void tile(const BLinearArgs& a, int64_t m, int64_t g) { run<R, G, false>(a, m, g); }

  static __m256 flush(__m256 v) {  // a denormal to a zero of its sign
    const __m256 magnitude = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    const __m256 tiny = _mm256_cmp_ps(_mm256_and_ps(v, magnitude), _mm256_set1_ps(std::numeric_limits<float>::min()), _CMP_LT_OQ);
    return _mm256_andnot_ps(_mm256_and_ps(tiny, magnitude), v);
  }

  // Rows [m, m+R) x groups [g, g+G) into y, without the bias (added after, outside DAZ).
  template <int R, int G, bool FLUSH>
  static void run(const BLinearArgs& a, int64_t m, int64_t g) {
    const int64_t KP = a.K / 2;
    const uint8_t* w = a.w + g * KP * BF16_PAIR_BYTES;
    const uint8_t* next = w + G * KP * BF16_PAIR_BYTES;
    const __m256i top = _mm256_set1_epi32(int(0xffff0000u));
    __m256 acc[R][2 * G];
    for (int r = 0; r < R; ++r)
      for (int j = 0; j < 2 * G; ++j) acc[r][j] = _mm256_setzero_ps();
    for (int64_t p = 0; p < KP; ++p) {
      __m256 even[2 * G], odd[2 * G];
      for (int j = 0; j < G; ++j) {
        const int64_t at = (j * KP + p) * BF16_PAIR_BYTES;
        __builtin_prefetch(R == 1 ? w + at + 16 * BF16_PAIR_BYTES : next + at, 0, 3);
        for (int h = 0; h < 2; ++h) {
          const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + at + 32 * h));
          even[2 * j + h] = _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
          odd[2 * j + h] = _mm256_castsi256_ps(_mm256_and_si256(v, top));
          if constexpr (FLUSH) even[2 * j + h] = flush(even[2 * j + h]), odd[2 * j + h] = flush(odd[2 * j + h]);
        }
      }
      for (int r = 0; r < R; ++r) {
        int32_t pair;
        std::memcpy(&pair, a.x + (m + r) * a.K + 2 * p, 4);
        const __m256i xv = _mm256_set1_epi32(pair);
        const __m256 xe = _mm256_castsi256_ps(_mm256_slli_epi32(xv, 16)), xo = _mm256_castsi256_ps(_mm256_and_si256(xv, top));
        for (int j = 0; j < 2 * G; ++j) {
          acc[r][j] = _mm256_fmadd_ps(odd[j], xo, acc[r][j]);
          if constexpr (FLUSH) acc[r][j] = flush(acc[r][j]);
          acc[r][j] = _mm256_fmadd_ps(even[j], xe, acc[r][j]);
          if constexpr (FLUSH) acc[r][j] = flush(acc[r][j]);
        }
      }
    }
    for (int r = 0; r < R; ++r)
      for (int j = 0; j < 2 * G; ++j) _mm256_storeu_ps(a.y + (m + r) * a.ldy + g * QGROUP + 8 * j, acc[r][j]);
  }
};

// The same tiles with the flushes in code.
struct Bf16Avx2Flushed : Bf16Avx2 {
  template <int R, int G>
  static void tile(const BLinearArgs& a, int64_t m, int64_t g) { run<R, G, true>(a, m, g); }
};

template <WType T>
using Avx2Q = std::conditional_t<simd_block(T), Avx2Int<T>, std::conditional_t<super_packed(T), Avx2KQuant<T>, VnniTiles<Ymm2, T>>>;

}  // namespace

void linear_avx2(const LinearArgs& a, int64_t n0, int64_t n1) { dispatch_wtype<Avx2>(a, n0, n1); }

void qlinear_avx2(const QLinearArgs& a, int64_t g0, int64_t g1) { dispatch_packed<Avx2Q>(a, 2 * g0, 2 * g1); }

void bf16linear_avx2(const BLinearArgs& a, int64_t g0, int64_t g1) {
  constexpr unsigned FTZ = 0x8000, DAZ = 0x40, UNDERFLOW = 0x10;
  BLinearArgs f = a;
  f.bias = nullptr;
  const unsigned csr = _mm_getcsr();
  _mm_setcsr((csr | FTZ | DAZ) & ~UNDERFLOW);
  run_bf16_packed<Bf16Avx2>(f, g0, g1);
  const bool tiny = _mm_getcsr() & UNDERFLOW;
  _mm_setcsr(csr);
  if (tiny) run_bf16_packed<Bf16Avx2Flushed>(f, g0, g1);
  if (a.bias)
    for (int64_t m = 0; m < a.M; ++m)
      for (int64_t n = g0 * QGROUP; n < g1 * QGROUP; ++n) a.y[m * a.ldy + n] += a.bias[n];
}

// quantize_rows_ref's operations, a block of 32 as four vectors (max, the division, the product, rounding
// to nearest even and the integer sum are exact whatever the order)
void quantize_rows_avx2(const float* x, int64_t ldx, int64_t K, int64_t span, int32_t offset, const QRows& out,
                        int64_t m0, int64_t m1) {
  const int64_t nb = K / QBLOCK;
  const __m256 sign = _mm256_set1_ps(-0.f);
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  for (int64_t m = m0; m < m1; ++m)
    for (int64_t b0 = 0; b0 < K; b0 += span) {
      __m256 mx = _mm256_setzero_ps();
      for (int64_t k = b0; k < b0 + span; k += 8) mx = _mm256_max_ps(mx, _mm256_andnot_ps(sign, _mm256_loadu_ps(x + m * ldx + k)));
      __m128 h = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
      h = _mm_max_ps(h, _mm_movehl_ps(h, h));
      const float d = _mm_cvtss_f32(_mm_max_ss(h, _mm_movehdup_ps(h))) / 127.f, id = d != 0.f ? 1.f / d : 0.f;
      for (int64_t b = b0 / QBLOCK; b < (b0 + span) / QBLOCK; ++b) {
        const float* p = x + m * ldx + b * QBLOCK;
        __m256i q[4];
        for (int i = 0; i < 4; ++i) q[i] = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(p + 8 * i), _mm256_set1_ps(id)));
        const __m256i sum = _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
        // int32 -> int8 (in range: no saturation), packs interleave 128-bit halves: put the 4-byte groups back
        const __m256i b8 = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(out.q + m * K + b * QBLOCK), _mm256_permutevar8x32_epi32(b8, order));
        __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(sum), _mm256_extracti128_si256(sum, 1));
        s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4e));
        s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xb1));
        const int32_t s = _mm_cvtsi128_si32(s4);
        __m128i h4 = _mm_add_epi32(_mm256_castsi256_si128(q[0]), _mm256_extracti128_si256(q[0], 1));  // the first 16
        h4 = _mm_add_epi32(h4, _mm_add_epi32(_mm256_castsi256_si128(q[1]), _mm256_extracti128_si256(q[1], 1)));
        h4 = _mm_add_epi32(h4, _mm_shuffle_epi32(h4, 0x4e));
        h4 = _mm_add_epi32(h4, _mm_shuffle_epi32(h4, 0xb1));
        out.d[m * nb + b] = d;
        out.sd[m * nb + b] = d * float(s);
        out.c[m * nb + b] = -offset * s;
        out.c16[m * nb + b] = -offset * _mm_cvtsi128_si32(h4);
        out.s[m * nb + b] = float(s);
      }
    }
}

void attention_avx2(const AttnArgs& a, int64_t i0, int64_t i1) { attention_items<Avx2>(a, i0, i1); }

void argmax_row_avx2(const float* r, int64_t n, float* value, int64_t* index) {
  __m256 m = _mm256_set1_ps(r[0]), zero = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 x = _mm256_loadu_ps(r + i);
    m = _mm256_max_ps(m, x);
    zero = _mm256_add_ps(zero, _mm256_sub_ps(x, x));
  }
  alignas(32) float ml[8], zl[8];
  _mm256_store_ps(ml, m);
  _mm256_store_ps(zl, zero);
  float mx = ml[0], z = 0.f;
  for (int j = 0; j < 8; ++j) mx = ml[j] > mx ? ml[j] : mx, z += zl[j];
  for (int64_t j = i; j < n; ++j) mx = r[j] > mx ? r[j] : mx, z += r[j] - r[j];
  int64_t at = 0;  // the first index holding the max, a vector of compares at a time
  for (; at + 8 <= n; at += 8)
    if (_mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(r + at), _mm256_set1_ps(mx), _CMP_EQ_OQ))) break;
  if (at + 8 <= n) at += __builtin_ctz(_mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(r + at), _mm256_set1_ps(mx), _CMP_EQ_OQ)));
  else
    while (at < n && r[at] != mx) ++at;
  if (at == n) at = 0;  // no element equals the max: a NaN row (flagged below)
  *value = z == 0.f ? mx : std::numeric_limits<float>::quiet_NaN();
  *index = at;
}

// norm_row_ref's operations: eight lanes a vector (lane i % 8 takes x[i]^2 in order), the same tree after.
void norm_row_avx2(const float* x, const float* w, float eps, int64_t n, float* y) {
  __m256 acc = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_loadu_ps(x + i);
    acc = _mm256_add_ps(acc, _mm256_mul_ps(v, v));
  }
  alignas(32) float lane[8];
  _mm256_store_ps(lane, acc);
  for (; i < n; ++i) lane[i % 8] += x[i] * x[i];
  const float ss = ((lane[0] + lane[4]) + (lane[2] + lane[6])) + ((lane[1] + lane[5]) + (lane[3] + lane[7]));
  const float r = 1.f / std::sqrt(ss / float(n) + eps);
  const __m256 rv = _mm256_set1_ps(r);
  for (i = 0; i + 8 <= n; i += 8)
    _mm256_storeu_ps(y + i, _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(x + i), rv), _mm256_loadu_ps(w + i)));
  for (; i < n; ++i) y[i] = (x[i] * r) * w[i];
}

void half_row_avx2(const float* x, uint16_t* out, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT));
  for (; i < n; ++i) out[i] = uint16_t(_cvtss_sh(x[i], _MM_FROUND_TO_NEAREST_INT));
}

void silu_mul_avx2(const float* gu, float* out, int64_t n, int64_t t0, int64_t t1) {
  silu_mul_rows<Avx2>(gu, out, n, t0, t1);
}

}  // namespace peagle
