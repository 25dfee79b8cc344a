// peagle's CPU kernels, float32 arithmetic, batch-invariant by construction: a row's result is the same
// bits however many rows share the pass and wherever it sits in it.
//
// linear: y[M,N] = x[M,K] @ W[N,K]^T (+ bias), x and y float32, W float32, float16 or bfloat16
// (row-major [N,K]) or GGUF blocks (q8_0, q4_0, q4_1: see QBLOCK), de-quantized in registers to the exact
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

enum class WType { f32, f16, bf16, q8_0, q4_0, q4_1 };

// GGUF's block formats, as the file stores them: a row of K = 32 * nb weights is nb blocks of
// block_bytes(t), each [d: fp16][m: fp16, q4_1 only][quants: 16 bytes (q4) or 32 int8 (q8_0)]; a q4
// block's byte j holds weight j in its low nibble and weight j + 16 in its high one. Values: q8_0 q * d,
// q4_0 (q - 8) * d, q4_1 q * d + m (one rounding: fma). The weight tensor is uint8 [N, nb, block_bytes]:
// its last dimension names the format (weight_view), so every caller of linear passes it as it is.
constexpr int64_t QBLOCK = 32;
constexpr bool quantized(WType t) { return t == WType::q8_0 || t == WType::q4_0 || t == WType::q4_1; }
constexpr int64_t block_bytes(WType t) { return t == WType::q8_0 ? 34 : t == WType::q4_0 ? 18 : 20; }
// Bytes per row of a K-wide weight.
constexpr int64_t row_bytes(WType t, int64_t K) {
  return quantized(t) ? K / QBLOCK * block_bytes(t) : K * (t == WType::f32 ? 4 : 2);
}
// Block b of a row: its scale, min (q4_1) and quants.
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

struct LinearArgs {
  const float* x;     // [M, K], row stride ldx
  const void* w;      // [N, row_bytes(wtype, K)] bytes, contiguous
  const float* bias;  // [N] or nullptr
  float* y;           // [M, N], row stride ldy
  int64_t M, N, K, ldx, ldy;
  WType wtype;
};

// A linear's weight as the kernels read it (ops.cpp): a float32/float16/bfloat16 [N, K] matrix, or GGUF
// blocks, uint8 [N, K / 32, block_bytes]; checked.
struct WeightView {
  const void* w;
  WType wtype;
  int64_t N, K;
};
WeightView weight_view(const at::Tensor& w);

// Columns [n0, n1) of every row.
void linear_ref(const LinearArgs& a, int64_t n0, int64_t n1, int lanes);
void linear_avx2(const LinearArgs& a, int64_t n0, int64_t n1);
void linear_avx512(const LinearArgs& a, int64_t n0, int64_t n1);

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

struct AttnArgs {
  const float* q;          // [*, H, d]: row r at q + r * q_stride
  int64_t q_stride;
  const float* k;          // the pools [slots, Hkv, d]
  const float* v;
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
  float scale;
};

// Work items [i0, i1): item i is (tile i / Hkv, KV head i % Hkv).
void attention_ref(const AttnArgs& a, int64_t i0, int64_t i1, int lanes);
void attention_avx2(const AttnArgs& a, int64_t i0, int64_t i1);
void attention_avx512(const AttnArgs& a, int64_t i0, int64_t i1);

}  // namespace peagle
