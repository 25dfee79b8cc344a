// peagle's CPU kernels, float32 arithmetic, batch-invariant by construction: a row's result is the same
// bits however many rows share the pass and wherever it sits in it.
//
// linear: y[M,N] = x[M,K] @ W[N,K]^T (+ bias), x and y float32, W float32, float16 or bfloat16
// (row-major [N,K]). Every output y[m,n] is one dot product accumulated in the same
// order whatever M is and whichever tile computes it: L lanes (the ISA's vector width: 8 for AVX2, 16
// for AVX-512), lane l summing k = l, l+L, ... with FMA, then lane l+8 added to lane l (16 lanes) and the
// eight lanes added as ((0+4)+(2+6)) + ((1+5)+(3+7)). So a row's result never depends on how many rows
// share the pass, and the scalar reference (linear_ref.cpp) with the same L gives the same bits.
#pragma once
#include <cstdint>

namespace peagle {

enum class WType { f32, f16, bf16 };

struct LinearArgs {
  const float* x;     // [M, K], row stride ldx
  const void* w;      // [N, K], contiguous
  const float* bias;  // [N] or nullptr
  float* y;           // [M, N], row stride ldy
  int64_t M, N, K, ldx, ldy;
  WType wtype;
};

// Columns [n0, n1) of every row.
void linear_ref(const LinearArgs& a, int64_t n0, int64_t n1, int lanes);
void linear_avx2(const LinearArgs& a, int64_t n0, int64_t n1);
void linear_avx512(const LinearArgs& a, int64_t n0, int64_t n1);

// attention: each row's query heads over its own sequence's keys in the paged cache, keys p-window+1 .. p
// visible to the row at position p (all of 0 .. p without a window). Keys go in blocks of KEY_BLOCK
// aligned to absolute key positions, one online-softmax step per block; scores are the linear's lane-
// order dot products times the scale, exponentials scalar (std::exp). A row's result depends on its
// query, its keys and nothing else. Optional sinks (GPT-OSS) join every row's softmax denominator.
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
