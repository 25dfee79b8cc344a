// peagle's CPU kernels, float32 arithmetic, batch-invariant by construction: a row's result is the same
// bits however many rows share the pass and wherever it sits in it.
//
// linear: y[M,N] = x[M,K] @ W[N,K]^T (+ bias), x and y float32, W float32, float16 or bfloat16
// (row-major [N,K]) or GGUF blocks (q8_0, q4_0, q4_1, q5_0, q5_1, q4_k, q5_k, q6_k: see QBLOCK), de-quantized to the exact
// float32 values gguf's dequantize gives, so a quantized weight's result is the bits of the same kernel
// on the de-quantized float32 matrix. Every output y[m,n] is one dot product accumulated in the same
// order whatever M is and whichever tile computes it: L lanes (the ISA's vector width: 8 for AVX2, 16
// for AVX-512), lane l summing k = l, l+L, ... with FMA, then lane l+8 added to lane l (16 lanes) and the
// eight lanes added as ((0+4)+(2+6)) + ((1+5)+(3+7)). So a row's result never depends on how many rows
// share the pass, and the scalar reference (reference.cpp) with the same L gives the same bits.
#pragma once
#include <cstdint>

namespace at {
class Tensor;
}

namespace peagle {

enum class WType { f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, q4_k, q5_k, q6_k };

// GGUF's block formats, as the file stores them: a row of K = 32 * nb weights is nb blocks of
// block_bytes(t), each [d: fp16][m: fp16, q4_1 only][quants: 16 bytes (q4) or 32 int8 (q8_0)]; a q4
// block's byte j holds weight j in its low nibble and weight j + 16 in its high one. Values: q8_0 q * d,
// q4_0 (q - 8) * d, q4_1 q * d + m (one rounding: fma). The weight tensor is uint8 [N, nb, block_bytes]:
// its last dimension names the format (weight_view), so every caller of linear passes it as it is.
// The others:
//     q5_0 [d][qh: 32 high bits][qs: 16 bytes]: (q - 16) * d, q = nibble | high bit << 4 (qs as q4's);
//     q5_1 [d][m][qh][qs]: q * d + m (one rounding);
//     q4_k, q5_k: super-blocks of 256, [d][dmin][12 bytes: 8 six-bit scales and mins][q5_k: qh, 32 bytes]
//       [qs: 128 bytes]; chunk c: (d * sc_c) * q - dmin * m_c, q the low (c even) or high nibble of qs bytes
//       32 (c / 2) .. +31 (q5_k: + 16 if bit c of qh[l]);
//     q6_k: super-blocks of 256, [ql: 128][qh: 64][16 int8 scales][d]; (d * sc) * (q - 32) per 16 weights.
// Every format reads as chunks of 32 weights (sub_block): integers q and float32 scales s (and a min m),
// value k = q[k] * s[k / 16], or fma(q[k], s, m) with a min. The K-quants' scales d * sc and mins
// -(dmin * m) are exact float32 products (11-bit halves times 6- or 8-bit integers), and so is s * q: one
// rounding, as gguf's (d * sc) * q - dmin * m.
constexpr int64_t QBLOCK = 32;
constexpr int64_t QK_K = 256;  // weights per K-quant super-block
constexpr bool quantized(WType t) { return t != WType::f32 && t != WType::f16 && t != WType::bf16; }
// The formats whose float path de-quantizes in SIMD registers (the ISA's load_block); the others through sub_block.
constexpr bool simd_block(WType t) { return t == WType::q8_0 || t == WType::q4_0 || t == WType::q4_1; }
constexpr bool has_min(WType t) { return t == WType::q4_1 || t == WType::q5_1 || t == WType::q4_k || t == WType::q5_k; }
constexpr int64_t block_weights(WType t) { return t == WType::q4_k || t == WType::q5_k || t == WType::q6_k ? QK_K : QBLOCK; }
constexpr int64_t block_bytes(WType t) {
  switch (t) {
    case WType::q8_0: return 34;
    case WType::q4_0: return 18;
    case WType::q4_1: return 20;
    case WType::q5_0: return 22;
    case WType::q5_1: return 24;
    case WType::q4_k: return 144;
    case WType::q5_k: return 176;
    case WType::q6_k: return 210;
    default: return 0;
  }
}
// Bytes per row of a K-wide weight.
constexpr int64_t row_bytes(WType t, int64_t K) {
  return quantized(t) ? K / block_weights(t) * block_bytes(t) : K * (t == WType::f32 ? 4 : 2);
}
// Block b of a row of q8_0, q4_0 or q4_1: its scale, min (q4_1) and quants (the SIMD float path's load_block).
struct QBlock {
  uint16_t d, m;
  const uint8_t* q;
};
inline QBlock qblock(const uint8_t* row, WType t, int64_t b) {
  const uint8_t* p = row + b * block_bytes(t);
  uint16_t h[2];
  __builtin_memcpy(h, p, t == WType::q4_1 ? 4 : 2);
  return {h[0], t == WType::q4_1 ? h[1] : uint16_t(0), p + (t == WType::q4_1 ? 4 : 2)};
}
// A chunk of 32 weights as integers and scales (above): q8_0 q, q4_0 q - 8, q5_0 q - 16, q6_k q - 32, the
// formats with a min q >= 0; s[1] (weights 16..31) is s[0] but for q6_k; m 0 without a min.
struct SubBlock {
  float s[2], m;
  int8_t q[QBLOCK];
  float d, dmin;   // a K-quant's super-block scales (fp16 as float32; q6_k: dmin 0)
  int sc[2], mn;   // and this chunk's integer scales (sc[1] q6_k's weights 16..31, else sc[0]) and min
};
float half_to_float(uint16_t h);
// Chunk j's 6-bit scale and min of a q4_k / q5_k super-block at p (llama.cpp's get_scale_min_k4).
inline void kquant_scale_min(const uint8_t* p, int j, int& s, int& m) {
  const uint8_t* sc = p + 4;
  s = j < 4 ? sc[j] & 63 : (sc[j + 4] & 15) | (sc[j - 4] >> 6) << 4;
  m = j < 4 ? sc[j + 4] & 63 : (sc[j + 4] >> 4) | (sc[j] >> 6) << 4;
}
// Chunk c (weights 32c .. 32c+31) of a row of GGUF blocks of type T. Static: each ISA's file compiles its
// own copy for its target (no definition shared across targets).
template <WType T>
static inline SubBlock sub_block(const uint8_t* row, int64_t c) {
  const uint8_t* p = row + c * QBLOCK / block_weights(T) * block_bytes(T);  // the chunk's block
  auto f16 = [](const uint8_t* b) { uint16_t h; __builtin_memcpy(&h, b, 2); return half_to_float(h); };
  SubBlock out{};
  if constexpr (T == WType::q8_0) {
    out.s[0] = f16(p);
    for (int k = 0; k < QBLOCK; ++k) out.q[k] = int8_t(p[2 + k]);
  } else if constexpr (block_weights(T) == QBLOCK) {  // q4_0, q4_1, q5_0, q5_1
    constexpr bool five = T == WType::q5_0 || T == WType::q5_1;
    constexpr int head = has_min(T) ? 4 : 2, offset = T == WType::q4_0 ? 8 : T == WType::q5_0 ? 16 : 0;
    out.s[0] = f16(p);
    out.m = has_min(T) ? f16(p + 2) : 0.f;
    uint32_t qh = 0;
    if (five) __builtin_memcpy(&qh, p + head, 4);
    const uint8_t* qs = p + head + (five ? 4 : 0);
    for (int k = 0; k < QBLOCK; ++k)
      out.q[k] = int8_t((((qs[k % 16] >> (k & 16) / 4) & 15) | ((qh >> k) & 1) << 4) - offset);
  } else if constexpr (T == WType::q4_k || T == WType::q5_k) {
    const int j = int(c % 8);
    int s, mn;
    kquant_scale_min(p, j, s, mn);
    out.d = f16(p), out.dmin = f16(p + 2), out.sc[0] = out.sc[1] = s, out.mn = mn;
    out.s[0] = out.d * float(s);
    out.m = -(out.dmin * float(mn));
    const uint8_t* qh = p + 16;
    const uint8_t* qs = p + (T == WType::q5_k ? 48 : 16) + 32 * (j / 2);
    for (int l = 0; l < QBLOCK; ++l) {
      int q = (qs[l] >> 4 * (j % 2)) & 15;
      if constexpr (T == WType::q5_k) q |= ((qh[l] >> j) & 1) << 4;
      out.q[l] = int8_t(q);
    }
  } else {  // q6_k
    const int j = int(c % 8), h = j / 4, v = j % 4;
    const uint8_t* ql = p + 64 * h + 32 * (v % 2);
    const uint8_t* qh = p + 128 + 32 * h;
    const int8_t* sc = reinterpret_cast<const int8_t*>(p + 192) + 2 * j;
    const float d = f16(p + 208);
    out.d = d, out.sc[0] = sc[0], out.sc[1] = sc[1];
    out.s[0] = d * float(sc[0]);
    out.s[1] = d * float(sc[1]);
    for (int l = 0; l < QBLOCK; ++l) out.q[l] = int8_t((((ql[l] >> 4 * (v / 2)) & 15) | ((qh[l] >> 2 * v) & 3) << 4) - 32);
  }
  if constexpr (T != WType::q6_k) out.s[1] = out.s[0];
  return out;
}
// Weights 32c .. 32c+31 of a row of GGUF blocks of type T as float32, gguf's values (the float path).
template <WType T>
static inline void chunk_values(const uint8_t* row, int64_t c, float* out) {
  const SubBlock b = sub_block<T>(row, c);
  for (int k = 0; k < QBLOCK; ++k)
    out[k] = has_min(T) ? __builtin_fmaf(float(b.q[k]), b.s[0], b.m) : float(b.q[k]) * b.s[k / 16];
}

// sub_block for a type known at run time (reference.cpp).
SubBlock sub_block(const uint8_t* row, WType t, int64_t c);
// chunk_values for a type known at run time (reference.cpp).
void chunk_values(const uint8_t* row, WType t, int64_t c, float* out);
// Weight k of a row of row_bytes(t, K) bytes as float32: gguf's value for blocks (q * d exact, + m rounded
// once), the SIMD paths' conversion for 16-bit weights (reference.cpp).
float weight_at(const uint8_t* row, WType t, int64_t k);

struct LinearArgs {
  const float* x;     // [M, K], row stride ldx
  const void* w;      // [N, row_bytes(wtype, K)] bytes, contiguous
  const float* bias;  // [N] or nullptr
  float* y;           // [M, N], row stride ldy
  int64_t M, N, K, ldx, ldy;
  WType wtype;
};

// A linear's weight as the kernels read it (ops.cpp): a float32/float16/bfloat16 [N, K] matrix, GGUF
// blocks, uint8 [N, K / 32, block_bytes], packed blocks, uint8 [N / 16, K / 32, packed_bytes], or a packed
// bf16 matrix, uint8 [N / 16, K / 2, BF16_PAIR_BYTES] (wtype bf16, packed); checked.
struct WeightView {
  const void* w;
  WType wtype;
  int64_t N, K;
  bool packed;
};
WeightView weight_view(const at::Tensor& w);

// Columns [n0, n1) of every row.
void linear_ref(const LinearArgs& a, int64_t n0, int64_t n1, int lanes);
void linear_scalar(const LinearArgs& a, int64_t n0, int64_t n1);  // the scalar ISA: the tiles over plain lanes
void linear_avx2(const LinearArgs& a, int64_t n0, int64_t n1);
void linear_avx512(const LinearArgs& a, int64_t n0, int64_t n1);

// The integer path (``--compute fast``, the default on GGUF blocks), llama.cpp's arithmetic: each row of
// x quantized once per call to 8 bits, one scale a span of 32 (Q8_0's) or, for the K-quants, of 256 (Q8_K's)
// (quantize_rows: d = max|x| over the span / 127, q = nearbyint(x * (d ? 1 / d : 0)) in [-127, 127]; per block
// of 32, s = the sum of its q and sd = d * float(s)), then for every output
//     acc = 0; for each chunk b of 32 in order (sub_block's q, s, m):
//         acc = fma(s, dx * float(isum), acc)   [with a min: then acc = fma(m, sd, acc)]
//     y = acc (+ bias)
// and for the K-quants (q4_k, q5_k, q6_k), llama.cpp's Q8_K arithmetic: per super-block of 256, its chunks'
// integer scales first, one float scaling after (sub_block's d, dmin, sc, mn; D the span's d)
//     f = 0; for each chunk of the super-block: f = fma(float(sc), float(isum), f)
//         [q6_k: f = fma(float(sc[0]), float(isum_lo), f); f = fma(float(sc[1]), float(isum_hi), f)]
//     acc = fma(d, D * f, acc)   [with a min: then acc = fma(-dmin, D * float(sum of mn * s), acc)]
// where isum = the chunk's integer dot product of the weight's q with x's (isum_lo, isum_hi: weights 0..15
// and 16..31), exact in int32, and the mins' sum (at most 8 x 63 x 32 x 127) is exact in float32 too. Each
// output is one column's own sequence of float32 operations (no lanes across k): every path, SIMD or scalar,
// gives the same bits, whatever the pass. Bit-equality with the de-quantized float32 matrix is given up
// (``--compute exact`` keeps it). A K-quant's per-chunk float scaling cost more than its products' split
// (its scale d * sc and min dmin * mn made and applied at every chunk: Q4_K ran at 84-92% of Q4_0's rate at
// one row, 1.08-1.16x with them removed; docs/real-sizes.md): Q8_K's spans leave one scaling a super-block.
//
// The SIMD paths read the weights packed (pack, ops.cpp): groups of QGROUP columns interleaved so that a
// vector's lanes are columns and one weight load serves every row of a tile. uint8
// [N / 16, K / block_weights, packed_bytes]. A chunk of 32 weights of a group is a record of packed_chunk
// bytes: the bits above its nibbles (q5: bit 4, q6_k: bits 4-5) in vectors of 64 bytes (q5: 1, q6_k: 2), those
// of column c's weights 4v + i and 16 + 4v + i in a byte 4c + i (high_at: which vector, which bits), then its quants:
//     q8_0: 8 vectors j of 64 bytes, column c's weights 4j .. 4j+3 at 4c, each q + 128 (as uint8);
//     the others: 4 vectors v of 64 bytes, byte 4c + i holding column c's weight 4v + i in its low nibble and
//       16 + 4v + i in its high one (q + offset's low 4 bits; for q4_0/q4_1 the file block's byte 4v + i).
// Its scales: for the 32-weight formats, 16 fp16 d (column c's at 2c), then 16 fp16 m (q4_1, q5_1), before the
// high bits in the chunk's own record; for the K-quants, the file's own integers in a header of KHEAD bytes before
// a super-block's 8 chunk records (packed_bytes = KHEAD + 8 records, within 3% of the file's bytes, where float
// scales would add a third):
//     q4_k, q5_k: d [16 fp16], dmin [16 fp16], sc [8 chunks x 16 uint8], mn [8 x 16 uint8]: s = d * sc and
//       m = -(dmin * mn), the exact products sub_block makes;
//     q6_k: d [16 fp16], sc [16 halves x 16 int8] (chunk j's halves 2j, 2j + 1), 32 bytes unused: s = d * sc.
// The last dimension names the packed format as the block size names the file's.
constexpr int64_t QGROUP = 16;
constexpr int64_t KHEAD = 320;  // a packed K-quant super-block's header (a multiple of 64: records stay aligned)
constexpr bool super_packed(WType t) { return t == WType::q4_k || t == WType::q5_k || t == WType::q6_k; }
struct PackedFormat {
  int scales;       // scale vectors a chunk (q6_k: 2)
  bool min;
  int planes;       // vectors of the bits above the nibbles (high_at), as many as those bits
  bool nibbles;     // else a byte a weight (q8_0)
  int32_t offset;   // the packed quants over the weight's q: q8_0 128, q4_0 8, q5_0 16, q6_k 32
};
constexpr PackedFormat packed_format(WType t) {
  switch (t) {
    case WType::q8_0: return {1, false, 0, false, 128};
    case WType::q4_0: return {1, false, 0, true, 8};
    case WType::q4_1: return {1, true, 0, true, 0};
    case WType::q5_0: return {1, false, 1, true, 16};
    case WType::q5_1: return {1, true, 1, true, 0};
    case WType::q4_k: return {1, true, 0, true, 0};
    case WType::q5_k: return {1, true, 1, true, 0};
    case WType::q6_k: return {2, false, 2, true, 32};
    default: return {0, false, 0, false, 0};
  }
}
// Bytes of a chunk record before its quants (the 32-weight formats' fp16 scales and mins, then the high bits),
// a chunk record's bytes, and the packed tensor's last dimension (a block's: one chunk, or a K-quant super-block).
constexpr int64_t packed_quants(WType t) {
  return (super_packed(t) ? 0 : QGROUP * (1 + packed_format(t).min) * 2) + 64 * packed_format(t).planes;
}
constexpr int64_t packed_chunk(WType t) { return packed_quants(t) + (packed_format(t).nibbles ? 256 : 512); }
constexpr int64_t packed_bytes(WType t) { return super_packed(t) ? KHEAD + 8 * packed_chunk(t) : packed_chunk(t); }
// Where the bits above the nibbles of packed vector v's weights lie (half 0: weights 4v + i, the low nibbles;
// half 1: 16 + 4v + i): in high-bit vector ``vec``, from bit ``at`` of the byte 4c + i. q5: a bit plane, bit v
// and 4 + v. q6_k: two bits each (as llama.cpp's qh), vector v / 2, bits 4-5 and 6-7 for an even v, 0-1 and 2-3
// for an odd one: a split moves each pair into place with one shift at most (none for half 0 of an even v),
// where two bit planes took a shift, an and and an or each. One 512 x 4,096 Q6_K matrix from L2, one thread
// (Sapphire Rapids, against the bit planes, the builds alternating): AVX512-VNNI 1 / 4 / 8 rows 1.11-1.19x /
// 1.13x / 1.06x faster, AVX2 1.25-1.27x / 1.03-1.09x / 1.11x, AVX-VNNI 1.16-1.19x / 1.08-1.11x / 1.10x. Streamed
// on 2 threads it waits on memory either way (docs/real-sizes.md).
struct HighAt {
  int vec, at;
};
constexpr HighAt high_at(int planes, int v, int half) {
  return planes == 1 ? HighAt{0, v + 4 * half} : HighAt{v / 2, 4 - 4 * (v % 2) + 2 * half};
}
constexpr HighAt high_at(WType t, int v, int half) { return high_at(packed_format(t).planes, v, half); }
// Chunk b (weights 32b .. 32b+31) of packed group g of a K-wide weight: its record (quants at rec +
// packed_quants) and where its scales lie (the record itself, or its super-block's header and its index there).
template <class P>
struct PackedChunk {
  P* rec;
  P* head;
  int j;
};
// Chunk b's record and header as offsets from its packed group's start (groups packed_group_bytes apart): the
// same in every group, so a tile over several groups makes them once a chunk and its loads add them to each
// group's base (Q4_K's one-row tile had computed each unit's pointers apart, from the group and the chunk).
struct ChunkOffsets {
  int64_t rec, head;
  int j;
};
constexpr ChunkOffsets packed_chunk_offsets(WType t, int64_t b) {
  if (!super_packed(t)) return {b * packed_chunk(t), b * packed_chunk(t), 0};
  return {b / 8 * packed_bytes(t) + KHEAD + b % 8 * packed_chunk(t), b / 8 * packed_bytes(t), int(b % 8)};
}
constexpr int64_t packed_group_bytes(WType t, int64_t K) { return K / block_weights(t) * packed_bytes(t); }
template <class P>
inline PackedChunk<P> packed_chunk_at(P* w, WType t, int64_t g, int64_t b, int64_t K) {
  P* base = w + g * packed_group_bytes(t, K);
  const ChunkOffsets o = packed_chunk_offsets(t, b);
  return {base + o.rec, base + o.head, o.j};
}
// Column c's scale of half h (q6_k's weights 16..31: 1) and min of a packed chunk, as sub_block gives them.
inline float packed_scale(const PackedChunk<const uint8_t>& pc, WType t, int64_t c, int h) {
  auto f16 = [](const uint8_t* b) { uint16_t v; __builtin_memcpy(&v, b, 2); return half_to_float(v); };
  if (!super_packed(t)) return f16(pc.rec + 2 * c);
  if (t == WType::q6_k) return f16(pc.head + 2 * c) * float(int8_t(pc.head[32 + QGROUP * (2 * pc.j + h) + c]));
  return f16(pc.head + 2 * c) * float(pc.head[64 + QGROUP * pc.j + c]);
}
inline float packed_min(const PackedChunk<const uint8_t>& pc, WType t, int64_t c) {
  auto f16 = [](const uint8_t* b) { uint16_t v; __builtin_memcpy(&v, b, 2); return half_to_float(v); };
  if (!super_packed(t)) return f16(pc.rec + 2 * (QGROUP + c));
  return -(f16(pc.head + 32 + 2 * c) * float(pc.head[192 + QGROUP * pc.j + c]));
}

// x quantized (quantize_rows): row m's quants at q + m * K; its block b's d (its span's), d * s, c = -offset *
// s (the start of a SIMD path's integer sum, whose packed quants are the weight's plus ``offset``), c16, c's
// part from the block's first 16 q (q6_k's two sums), and s as float32 (exact), at [m * K / 32 + b].
struct QRows {
  int8_t* q;
  float* d;
  float* sd;
  int32_t* c;
  int32_t* c16;
  float* s;
};
// The weights that share one scale of x: a K-quant's super-block (Q8_K), else a block (Q8_0).
constexpr int64_t quant_span(WType t) { return super_packed(t) ? QK_K : QBLOCK; }

struct QLinearArgs {
  QRows x;
  const uint8_t* w;   // packed, or the file's blocks for the reference
  const float* bias;  // [N] or nullptr
  float* y;           // [M, N], row stride ldy
  int64_t M, N, K, ldy;
  WType wtype;
  // A tall pass's weights split once into bytes (vnni_tiles.h's expand): groups [ex_group, ...) of the weight,
  // Q8_0's packed quants a chunk (EXPANDED bytes), or nullptr: the packed quants themselves
  const uint8_t* ex = nullptr;
  int64_t ex_group = 0;
};

// Rows [m0, m1) of x [*, K] (row stride ldx) into ``out``, one scale a ``span`` (quant_span; K a multiple of it):
// the same bits on every path.
void quantize_rows_ref(const float* x, int64_t ldx, int64_t K, int64_t span, int32_t offset, const QRows& out,
                       int64_t m0, int64_t m1);
void quantize_rows_avx2(const float* x, int64_t ldx, int64_t K, int64_t span, int32_t offset, const QRows& out,
                        int64_t m0, int64_t m1);
void quantize_rows_avx512(const float* x, int64_t ldx, int64_t K, int64_t span, int32_t offset, const QRows& out,
                          int64_t m0, int64_t m1);
// The offset of a path's packed quants over the weight's: vpdpbusd multiplies uint8 weights (packed_format's);
// AVX2's maddubs takes q8_0 as |q| x sign(x, q) (offset 0).
constexpr int32_t vnni_offset(WType t) { return packed_format(t).offset; }
constexpr int32_t avx2_offset(WType t) { return t == WType::q8_0 ? 0 : vnni_offset(t); }
// Column groups [g0, g1) of every row: the packed SIMD paths (AVX512-VNNI and AVX-VNNI vpdpbusd, the
// vnni_offset; AVX2 maddubs).
void qlinear_avx512vnni(const QLinearArgs& a, int64_t g0, int64_t g1);
void qlinear_avxvnni(const QLinearArgs& a, int64_t g0, int64_t g1);
void qlinear_avx2(const QLinearArgs& a, int64_t g0, int64_t g1);
// AMX-INT8 tiles for the products (amx.cpp; the vnni_offset, AVX512-VNNI's epilogue and its one-row passes),
// and the same kernel over a C++ model of the tile instructions (tests, on any AVX512-VNNI CPU). amx_ready:
// the CPU has AMX-INT8 and the OS has granted this process the tile state.
void qlinear_amx(const QLinearArgs& a, int64_t g0, int64_t g1);
void qlinear_amx_model(const QLinearArgs& a, int64_t g0, int64_t g1);
bool amx_ready();
// Packed weights of more bytes than this stream in tiles one packed group wide (linear_tiles.h, run_packed),
// for passes of one row or taller: 16 MiB (LM heads) unless set_stream_bytes (peagle.kernels.tune_streaming,
// timed on the model's own weights at start-up) chose otherwise. The tile's shape never changes a result.
int64_t stream_bytes(bool one_row);
// Columns [n0, n1) of every row, from the file's blocks: the scalar reference of the arithmetic above.
void qlinear_ref(const QLinearArgs& a, int64_t n0, int64_t n1);

// The bf16 dot-product path (``--compute fast`` on bfloat16 weights; AVX512_BF16, or its steps in FMAs on AVX2):
// each row of x rounded to bfloat16 once per call (bf16_rows: round to nearest even; a denormal to a zero
// of its sign; a NaN quieted, its sign and top payload kept: vcvtneps2bf16, measured), then for every
// output
//     acc = 0; for each pair (k, k+1) in order: acc = ftz(fma(w_k, x_k, ftz(fma(w_k+1, x_k+1, acc))))
//     y = acc (+ bias)
// with w and x bf16 values as float32, a denormal one read as zero, fma rounded once (RNE) and ftz a
// denormal result flushed to a zero of its sign: vdpbf16ps on one lane (the odd element added first;
// measured on Zen 5 against Intel's definition). Each output is one column's own sequence of operations:
// every path gives the same bits, whatever the pass; bit-equality with float32 arithmetic on the bf16
// matrix (``--compute exact``) is given up.
//
// The SIMD path reads the weight packed (quant.py's pack_bf16): uint8 [N / 16, K / 2, 64], group g's pair
// p one vector, column c's weights 2p, 2p+1 (bf16) at bytes 4c .. 4c+3, so that x's pair, broadcast, and one
// vdpbf16ps advance 16 columns by two k (AVX2: two 8-column halves, two FMAs each). The last dimension (64)
// names the format, as for GGUF blocks.
constexpr int64_t BF16_PAIR_BYTES = QGROUP * 4;

struct BLinearArgs {
  const uint16_t* x;  // [M, K] bf16 (bf16_rows)
  const uint8_t* w;   // packed, or the plain bf16 [N, K] for the reference
  const float* bias;  // [N] or nullptr
  float* y;           // [M, N], row stride ldy
  int64_t M, N, K, ldy;
};

// Rows [m0, m1) of x [*, K] (row stride ldx) into out [*, K] (the same bits on every path).
void bf16_rows_ref(const float* x, int64_t ldx, int64_t K, uint16_t* out, int64_t m0, int64_t m1);
void bf16_rows_avx512bf16(const float* x, int64_t ldx, int64_t K, uint16_t* out, int64_t m0, int64_t m1);
// Column groups [g0, g1) of every row, packed (vdpbf16ps).
void bf16linear_avx512bf16(const BLinearArgs& a, int64_t g0, int64_t g1);
// The same on AVX2 + FMA (two FMAs a pair, the flushes from MXCSR: avx2.cpp), where there is no AVX512_BF16.
void bf16linear_avx2(const BLinearArgs& a, int64_t g0, int64_t g1);
// The same through AMX-BF16 tiles (amx.cpp; passes of one row on AVX512_BF16), and over the C++ model of the
// tile instructions (tests, on any AVX512_BF16 CPU). amx_bf16_ready: the CPU has AMX-BF16 and the OS grants tiles.
void bf16linear_amx(const BLinearArgs& a, int64_t g0, int64_t g1);
void bf16linear_amx_model(const BLinearArgs& a, int64_t g0, int64_t g1);
bool amx_bf16_ready();
// Columns [n0, n1) of every row, from the plain bf16 matrix: the scalar reference of the arithmetic above.
void bf16linear_ref(const BLinearArgs& a, int64_t n0, int64_t n1);

// attention: each row's query heads over its own sequence's keys in the paged cache, keys p-window+1 .. p
// visible to the row at position p (all of 0 .. p without a window). Keys go in blocks of KEY_BLOCK
// aligned to absolute key positions, one online-softmax step per block; scores are the linear's lane-
// order dot products times the scale, exponentials scalar (std::exp). A row's result depends on its
// query, its keys and nothing else. Optional sinks (GPT-OSS) join every row's softmax denominator.
// Token trees (tree speculative decoding): a row may read its keys from base on through a map of its own,
// logical key i >= base at KV index map[i - base]; positions, windows and key blocks stay logical, so a
// tree node gets the bits of its root-to-node path run alone as a chain.
constexpr int64_t KEY_BLOCK = 64;
constexpr int64_t MAX_GROUP = 16;   // query heads per KV head
constexpr int64_t MAX_QUERIES = 32; // query vectors (rows x heads of a KV head) one work item attends
constexpr int64_t MAX_HEAD_DIM = 256;
constexpr int64_t MAX_SPAN_ROWS = 64;  // a sequence's rows attended whole (decoding, verifying, drafting)
constexpr int64_t MAX_TREE_NODES = MAX_SPAN_ROWS - 1;  // a token tree's nodes, its root beside them in one span

struct AttnArgs {
  const float* q;          // [*, H, d]: row r at q + r * q_stride
  int64_t q_stride;
  const void* k;           // the pools [slots, Hkv, d]: float32, or IEEE half where kv_half
  const void* v;
  bool kv_half;
  const int64_t* table;    // [B, table_stride] block ids
  int64_t table_stride;
  const int64_t* rows;     // the rows to compute [R] (into q, out, seq, pos)
  const int64_t* tiles;    // [num_tiles + 1]: tile t is rows[tiles[t] .. tiles[t+1]), one sequence
  const int64_t* seq;      // each row's sequence (a row of table)
  const int64_t* pos;      // each row's position
  const int64_t* tree_base;  // each row's first remapped key (pos + 1: none), or nullptr: no trees
  const int64_t* tree_map;   // [*, tree_stride]: row r's logical key i >= tree_base[r] at KV index tree_map[r][i - base]
  int64_t tree_stride;
  const float* sinks;      // [H] or nullptr
  float* out;              // [*, H * d]
  int64_t H, Hkv, d, block_size, window;
  int64_t parts;           // the parts each KV head's query heads are cut into, an item each (1 or 2)
  float scale;
};

// Work items [i0, i1): item i is (tile i / (Hkv * parts), KV head i / parts % Hkv, part i % parts of its query
// heads: heads h * g + [part * g / parts, (part + 1) * g / parts), g = H / Hkv).
void attention_ref(const AttnArgs& a, int64_t i0, int64_t i1, int lanes);  // a row at a time, code of its own
void attention_scalar(const AttnArgs& a, int64_t i0, int64_t i1);          // the scalar ISA: the tiles, plain lanes
void attention_avx2(const AttnArgs& a, int64_t i0, int64_t i1);
void attention_avx512(const AttnArgs& a, int64_t i0, int64_t i1);

// SwiGLU, rows [t0, t1) of gu [rows, 2n] (gate | up) into out [rows, n] (attention_tiles.h: the same bits
// on every path).
using SiluRows = void (*)(const float* gu, float* out, int64_t n, int64_t t0, int64_t t1);
void silu_mul_ref(const float* gu, float* out, int64_t n, int64_t t0, int64_t t1);
void silu_mul_avx2(const float* gu, float* out, int64_t n, int64_t t0, int64_t t1);
void silu_mul_avx512(const float* gu, float* out, int64_t n, int64_t t0, int64_t t1);
// The widest of them this CPU runs (ops.cpp).
SiluRows silu_rows();

// A row's largest value and the first index holding it; NaN as the value where the row holds a NaN or an
// infinity (x - x summed: exact zeros unless one is there).
using ArgmaxRow = void (*)(const float* r, int64_t n, float* value, int64_t* index);
void argmax_row_ref(const float* r, int64_t n, float* value, int64_t* index);
void argmax_row_avx2(const float* r, int64_t n, float* value, int64_t* index);
void argmax_row_avx512(const float* r, int64_t n, float* value, int64_t* index);
ArgmaxRow argmax_row();

// rms_norm's row: y = x / sqrt(mean(x^2) + eps) * w, the squares summed in eight fixed lanes (lane i % 8, then
// a fixed tree), every product and sum rounded on its own: the same bits on every path.
using NormRow = void (*)(const float* x, const float* w, float eps, int64_t n, float* y);
void norm_row_ref(const float* x, const float* w, float eps, int64_t n, float* y);
void norm_row_avx2(const float* x, const float* w, float eps, int64_t n, float* y);  // AVX-512 CPUs too
NormRow norm_row();

// n floats to IEEE half rounded to nearest even (torch's .to(float16)): the 16-bit KV cache's writes.
using HalfRow = void (*)(const float* x, uint16_t* out, int64_t n);
void half_row_ref(const float* x, uint16_t* out, int64_t n);
void half_row_avx2(const float* x, uint16_t* out, int64_t n);  // F16C, AVX-512 CPUs too
HalfRow half_row();

}  // namespace peagle
