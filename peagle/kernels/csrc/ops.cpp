// The torch operators. peagle::linear and peagle::attention run the widest path this CPU has (or the one
// named: tests run each); the *_ref operators are the scalar references of a path's lane order. Work is
// split across torch's threads (the same OpenMP team as every other op).
#include <ATen/Parallel.h>
#include <ATen/core/Dict.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <torch/library.h>

#include <cpuid.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <atomic>
#include <functional>
#include <string>
#include <type_traits>
#include <vector>

#include "kernels.h"
#include "ops.h"
#include "team.h"

namespace peagle {

static constexpr int64_t ROW_CHUNK = 64;  // rows whose activations (<= 64 x 1536 floats) stay in L2
static constexpr int64_t COL_GRAIN = 64;  // columns per thread task at least

using Kernel = std::function<void(const LinearArgs&, int64_t, int64_t)>;
using AttnKernel = std::function<void(const AttnArgs&, int64_t, int64_t)>;

static bool has_avx2() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
}

static bool has_avx512() {
  return has_avx2() && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
}

static bool has_avx512vnni() { return has_avx512() && __builtin_cpu_supports("avx512vnni"); }

static bool has_avx512bf16() { return has_avx512() && __builtin_cpu_supports("avx512bf16"); }

// Asked once: CPUID serialises the core, and under a hypervisor it traps to it (a VM exit). Asked at every
// AVX-VNNI linear, it took 40% of a one-row 512 x 4,096 Q4_0 pass (65 against 40 us, Sapphire Rapids under KVM).
static bool has_avxvnni() {  // __builtin_cpu_supports knows no avxvnni in gcc 12: CPUID leaf 7 subleaf 1, EAX bit 4
  static const bool has = [] {
    unsigned a, b, c, d;
    return has_avx2() && __get_cpuid_count(7, 1, &a, &b, &c, &d) && (a >> 4 & 1);
  }();
  return has;
}

// The instruction sets, narrowest first: a cap (set_isa, PEAGLE_ISA; tests run the whole engine on each
// path) names the widest the operators use. The float path runs avx512 or avx2 (scalar below); the
// integer path (packed blocks) the widest of amx, avx512vnni, avxvnni, avx2 at or under the cap that this CPU
// has ("avx512" covers AVX512-VNNI), none on scalar; amx only while set_amx allows it (peagle.kernels turns
// it off where `python -m peagle.kernels`'s probe found it inexact or slower than avx512vnni; the same for the
// bf16 path's AMX-BF16 tiles against avx512bf16).
static const char* const ISA_NAMES[5] = {"scalar", "avx2", "avxvnni", "avx512", "amx"};
enum Level { SCALAR, AVX2, AVXVNNI, AVX512, AMX };
static bool has_level(int level) {
  static const bool has[5] = {true, has_avx2(), has_avxvnni(), has_avx512(), has_avx512vnni() && amx_ready()};
  return has[level];
}
// AMX-BF16 under the amx level (the bf16 path's tiles beside the integer path's)
static bool has_amx_bf16() { return has_level(AMX) && has_avx512bf16() && amx_bf16_ready(); }
static std::atomic<int> isa_cap{AMX};
static std::atomic<bool> amx_int8_on{true}, amx_bf16_on{true};
static int cap() { return isa_cap.load(std::memory_order_relaxed); }
// The float path's level: 2 avx512, 1 avx2, 0 scalar (the index of the row ops' tables: silu_rows, argmax_row ...).
static int float_level() { return cap() >= AVX512 && has_level(AVX512) ? 2 : cap() >= AVX2 && has_level(AVX2) ? 1 : 0; }
static std::string best_isa() { return std::array<const char*, 3>{"scalar", "avx2", "avx512"}[float_level()]; }

// The integer path this CPU runs packed blocks on under the cap: avx512vnni, avxvnni, avx2, or none (the
// file's blocks stay there).
static std::string best_int_isa() {
  if (cap() >= AMX && has_level(AMX) && amx_int8_on.load(std::memory_order_relaxed)) return "amx";
  if (cap() >= AVX512 && has_avx512vnni()) return "avx512vnni";
  if (cap() >= AVXVNNI && has_level(AVXVNNI)) return "avxvnni";
  return cap() >= AVX2 && has_level(AVX2) ? "avx2" : "none";
}

// The bf16 dot-product path this CPU runs packed bf16 weights on under the cap: amx (AMX-BF16 tiles),
// avx512bf16, avx2 (its steps in FMAs) where the float path is AVX2's, or none (bf16 weights stay plain,
// float32 arithmetic: on AVX-512 CPUs without AVX512_BF16, whose float path has twice AVX2's lanes, and on scalar).
static std::string best_bf16_isa() {
  if (cap() >= AMX && has_amx_bf16() && amx_bf16_on.load(std::memory_order_relaxed)) return "amx";
  if (cap() >= AVX512 && has_avx512bf16()) return "avx512bf16";
  return float_level() == 1 ? "avx2" : "none";
}

// Every bf16 path this CPU has, widest first (tests run each).
static std::vector<std::string> bf16_isas() {
  std::vector<std::string> out;
  if (has_amx_bf16()) out.push_back("amx");
  if (has_avx512bf16()) out.push_back("avx512bf16");
  if (has_level(AVX2)) out.push_back("avx2");
  return out;
}

// Every integer path this CPU has, widest first (tests run each).
static std::vector<std::string> int_isas() {
  std::vector<std::string> out;
  if (has_level(AMX)) out.push_back("amx");
  if (has_avx512vnni()) out.push_back("avx512vnni");
  if (has_avxvnni()) out.push_back("avxvnni");
  if (has_avx2()) out.push_back("avx2");
  return out;
}

// The GGUF block formats the kernels read, by GGUF's name (weight_view's lookup, formats()).
static constexpr std::pair<const char*, WType> GGUF_TYPES[] = {
    {"q8_0", WType::q8_0}, {"q4_0", WType::q4_0}, {"q4_1", WType::q4_1}, {"q5_0", WType::q5_0},
    {"q5_1", WType::q5_1}, {"q4_k", WType::q4_k}, {"q5_k", WType::q5_k}, {"q6_k", WType::q6_k}};

// kernels.h's block layouts, published for the Python side (peagle.kernels.published_block_sizes): a format's
// [bytes a file block, bytes a packed group's block, weights a block]; "bf16" [0, a packed (group, k pair), 2]
// and "group" [columns a packed group interleaves, 0, 0] beside them.
static c10::Dict<std::string, std::vector<int64_t>> formats() {
  c10::Dict<std::string, std::vector<int64_t>> out;
  for (const auto& [name, t] : GGUF_TYPES) out.insert(std::string(name), std::vector<int64_t>{block_bytes(t), packed_bytes(t), block_weights(t)});
  out.insert("bf16", std::vector<int64_t>{0, BF16_PAIR_BYTES, 2});
  out.insert("group", std::vector<int64_t>{QGROUP, 0, 0});
  return out;
}

// The limits above, published for the Python side (peagle.kernels.limits): one source for both.
static c10::Dict<std::string, int64_t> limits() {
  c10::Dict<std::string, int64_t> out;
  out.insert("head_dim", MAX_HEAD_DIM);
  out.insert("group", MAX_GROUP);
  out.insert("span_rows", MAX_SPAN_ROWS);
  out.insert("tree_nodes", MAX_TREE_NODES);
  return out;
}

static void set_isa(c10::string_view isa) {
  const std::string name(isa);
  const auto* it = std::find(ISA_NAMES, ISA_NAMES + 5, name);
  TORCH_CHECK(name.empty() || it != ISA_NAMES + 5, "peagle::set_isa: unknown instruction set '", name,
              "' (amx, avx512, avxvnni, avx2, scalar, or empty: the widest this CPU has)");
  const int level = name.empty() ? AMX : int(it - ISA_NAMES);
  TORCH_CHECK(name.empty() || has_level(level), "peagle::set_isa: this CPU has no ", name);  // empty: the widest it has
  isa_cap.store(level);
}

static std::atomic<int64_t> stream_limit[2] = {int64_t(16) << 20, int64_t(16) << 20};  // taller, one row
int64_t stream_bytes(bool one_row) { return stream_limit[one_row].load(std::memory_order_relaxed); }

static void set_stream_bytes(int64_t one_row, int64_t taller) {
  TORCH_CHECK(one_row >= 0 && taller >= 0, "peagle::set_stream_bytes: sizes must be >= 0");
  stream_limit[1].store(one_row);
  stream_limit[0].store(taller);
}

SiluRows silu_rows() {
  static const SiluRows rows[3] = {silu_mul_ref, silu_mul_avx2, silu_mul_avx512};
  return rows[float_level()];
}

ArgmaxRow argmax_row() {
  static const ArgmaxRow rows[3] = {argmax_row_ref, argmax_row_avx2, argmax_row_avx512};
  return rows[float_level()];
}

NormRow norm_row() {
  static const NormRow rows[3] = {norm_row_ref, norm_row_avx2, norm_row_avx2};
  return rows[float_level()];
}

HalfRow half_row() {
  static const HalfRow rows[3] = {half_row_ref, half_row_avx2, half_row_avx2};
  return rows[float_level()];
}

static Kernel kernel_for(const std::string& isa) {
  if (isa == "avx512") {
    TORCH_CHECK(has_avx512(), "peagle::linear: this CPU has no AVX-512");
    return linear_avx512;
  }
  if (isa == "avx2") {
    TORCH_CHECK(has_avx2(), "peagle::linear: this CPU has no AVX2 + FMA + F16C");
    return linear_avx2;
  }
  TORCH_CHECK(isa == "scalar", "peagle::linear: unknown instruction set '", isa, "' (avx512, avx2, scalar)");
  return linear_scalar;
}

static AttnKernel attn_kernel_for(const std::string& isa) {
  kernel_for(isa);  // the same checks
  if (isa == "avx512") return attention_avx512;
  if (isa == "avx2") return attention_avx2;
  return attention_scalar;
}

static at::Tensor run_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& table,
                                const at::Tensor& seq, const at::Tensor& pos, const at::Tensor& rows,
                                int64_t block_size, int64_t window, double scale,
                                const c10::optional<at::Tensor>& sinks, const c10::optional<at::Tensor>& tree_base,
                                const c10::optional<at::Tensor>& tree_map, const AttnKernel& kernel,
                                const at::Tensor* into = nullptr) {
  TORCH_CHECK(q.scalar_type() == at::kFloat, "peagle::attention: q must be float32");
  TORCH_CHECK((k.scalar_type() == at::kFloat || k.scalar_type() == at::kHalf) && v.scalar_type() == k.scalar_type(),
              "peagle::attention: the KV pools must be both float32 or both float16");
  TORCH_CHECK(q.dim() == 3 && q.stride(2) == 1 && q.stride(1) == q.size(2), "peagle::attention: q must be [T, H, d], rows strided");
  TORCH_CHECK(k.dim() == 3 && k.is_contiguous() && v.is_contiguous() && k.sizes() == v.sizes(),
              "peagle::attention: the KV pools must be contiguous [slots, Hkv, d]");
  const int64_t H = q.size(1), d = q.size(2), Hkv = k.size(1);
  TORCH_CHECK(Hkv >= 1 && d >= 1, "peagle::attention: the KV pools need heads of width >= 1, got ", k.sizes());
  TORCH_CHECK(k.size(2) == d && H % Hkv == 0 && H / Hkv <= MAX_GROUP && d <= MAX_HEAD_DIM,
              "peagle::attention: unsupported heads (H ", H, ", Hkv ", Hkv, ", d ", d, ")");
  for (const at::Tensor* t : {&table, &seq, &pos, &rows})
    TORCH_CHECK(t->scalar_type() == at::kLong && t->is_contiguous(), "peagle::attention: indices must be contiguous int64");
  TORCH_CHECK(seq.numel() == q.size(0) && pos.numel() == q.size(0), "peagle::attention: seq and pos need one entry per row");
  TORCH_CHECK(block_size > 0, "peagle::attention: block_size must be > 0, got ", block_size);
  TORCH_CHECK(window >= 0, "peagle::attention: window must be >= 0 (0: none), got ", window);
  TORCH_CHECK(table.dim() == 2, "peagle::attention: table must be [sequences, blocks], got ", table.sizes());
  at::Tensor sk;
  if (sinks.has_value() && sinks->defined()) {
    sk = sinks->to(at::kFloat).contiguous();
    TORCH_CHECK(sk.numel() == H, "peagle::attention: one sink per query head");
  }
  const int64_t* rp = rows.data_ptr<int64_t>();
  const int64_t* sp = seq.data_ptr<int64_t>();
  // every index the kernel reads, checked once here (it reads them unchecked): a scheduler's bad layout is an
  // error, not a read outside the tensors. keys[s]: the keys sequence s's rows read, 0 .. keys[s] - 1.
  const int64_t T = q.size(0), B = table.size(0), nb = table.size(1), capacity = nb * block_size;
  const int64_t* pp = pos.data_ptr<int64_t>();
  std::vector<int64_t> keys(size_t(B), 0);
  for (int64_t i = 0; i < rows.numel(); ++i) {
    const int64_t r = rp[i];
    TORCH_CHECK(0 <= r && r < T, "peagle::attention: rows[", i, "] = ", r, " is no row of q (", T, " rows)");
    TORCH_CHECK(0 <= sp[r] && sp[r] < B, "peagle::attention: seq[", r, "] = ", sp[r], " is no row of table (", B,
                " sequences)");
    TORCH_CHECK(0 <= pp[r] && pp[r] < capacity, "peagle::attention: pos[", r, "] = ", pp[r],
                " lies outside its table's capacity (", nb, " blocks of block_size ", block_size, ")");
    keys[size_t(sp[r])] = std::max(keys[size_t(sp[r])], pp[r] + 1);
  }
  const bool tree = tree_base.has_value() && tree_base->defined();
  TORCH_CHECK(tree == (tree_map.has_value() && tree_map->defined()), "peagle::attention: tree_base and tree_map go together");
  const int64_t W = tree ? tree_map->size(-1) : 0;
  if (tree) {
    for (const at::Tensor* t : {&*tree_base, &*tree_map})
      TORCH_CHECK(t->scalar_type() == at::kLong && t->is_contiguous(), "peagle::attention: the tree must be contiguous int64");
    TORCH_CHECK(tree_base->numel() == q.size(0) && tree_map->dim() == 2 && tree_map->size(0) == q.size(0) && W >= 1,
                "peagle::attention: tree_base [T] and tree_map [T, W >= 1], one entry per row");
    // every KV index a row reads through its map lies in its block table (the kernel reads it unchecked)
    const int64_t *bp = tree_base->data_ptr<int64_t>(), *mp = tree_map->data_ptr<int64_t>();
    for (int64_t i = 0; i < rows.numel(); ++i) {
      const int64_t r = rp[i], n = pp[r] + 1 - bp[r];
      TORCH_CHECK(bp[r] >= 0 && n <= W, "peagle::attention: row ", r, " reads ", n, " mapped keys, its map has ", W);
      for (int64_t c = 0; c < n; ++c) {
        const int64_t key = mp[r * W + c];
        TORCH_CHECK(key >= 0 && key < capacity, "peagle::attention: tree_map: row ", r, " maps a key to KV index ", key,
                    ", outside its block table");
        keys[size_t(sp[r])] = std::max(keys[size_t(sp[r])], key + 1);
      }
    }
  }
  // the block ids of every block a sequence's rows read lie in the pools
  const int64_t* tp = table.data_ptr<int64_t>();
  const int64_t pool_blocks = k.size(0) / block_size;
  for (int64_t s = 0; s < B; ++s)
    for (int64_t b = 0; b * block_size < keys[size_t(s)]; ++b)
      TORCH_CHECK(0 <= tp[s * nb + b] && tp[s * nb + b] < pool_blocks, "peagle::attention: table[", s, ", ", b, "] = ",
                  tp[s * nb + b], " is no block of the KV pools (", pool_blocks, " blocks of block_size ", block_size, ")");
  at::Tensor out = into ? *into : at::empty({q.size(0), H * d}, q.options());  // (attention_into: one that fits)
  // tiles: runs of rows of one sequence (a sequence's verification rows share every key load), each run cut
  // into as few tiles of at most tile_rows as it takes, of equal heights (8 rows: 4 + 4, not 5 + 3: the
  // threads' shares of one sequence's items are equal), tile_rows halved while there are fewer than two work
  // items a thread (one sequence's verify rows: both threads busy), down to SPLIT_ROWS: tiles of three rows
  // or fewer wait on memory, and cut in two they read their keys twice for nothing (2 threads, 2 rows of a
  // sequence: 0.49-0.54 ms split against 0.44-0.50 whole, 30 layers at 220 positions)
  constexpr int64_t SPLIT_ROWS = 3;
  std::vector<int64_t> tiles;
  for (int64_t tile_rows = std::max<int64_t>(1, MAX_QUERIES / (H / Hkv));; tile_rows = (tile_rows + 1) / 2) {
    tiles.assign(1, 0);
    for (int64_t i = 1; i <= rows.numel(); ++i) {
      if (i < rows.numel() && sp[rp[i]] == sp[rp[i - 1]]) continue;
      const int64_t start = tiles.back(), run = i - start, parts = (run + tile_rows - 1) / tile_rows;
      for (int64_t p = 1; p <= parts; ++p) tiles.push_back(start + run * p / parts);
    }
    if (tile_rows <= SPLIT_ROWS || int64_t(tiles.size() - 1) * Hkv >= 2 * split_threads()) break;
  }
  if (rows.numel() == 0) return out;
  // still fewer than two items a thread (one sequence's one to three rows: 3 KV heads on 2 threads, one thread
  // doing two): each KV head's query heads cut in two items, which read the head's keys each (a query's
  // arithmetic is its own whichever item computes it: the same bits)
  const int64_t head_items = int64_t(tiles.size() - 1) * Hkv;  // (tile, KV head) pairs
  const int64_t parts = head_items < 2 * split_threads() && H / Hkv > 1 ? 2 : 1;
  AttnArgs a{q.data_ptr<float>(), q.stride(0), k.data_ptr(), v.data_ptr(), k.scalar_type() == at::kHalf, table.data_ptr<int64_t>(),
             table.size(1), rp, tiles.data(), sp, pos.data_ptr<int64_t>(),
             tree ? tree_base->data_ptr<int64_t>() : nullptr, tree ? tree_map->data_ptr<int64_t>() : nullptr, W,
             sk.defined() ? sk.data_ptr<float>() : nullptr, out.data_ptr<float>(), H, Hkv, d, block_size, window,
             parts, float(scale)};
  const int64_t items = head_items * parts;
  parallel_for(0, items, 1, [&](int64_t i0, int64_t i1) { kernel(a, i0, i1); });
  return out;
}

void attention_into(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& table,
                    const at::Tensor& seq, const at::Tensor& pos, const at::Tensor& rows, int64_t block_size,
                    int64_t window, double scale, const c10::optional<at::Tensor>& tree_base,
                    const c10::optional<at::Tensor>& tree_map, at::Tensor& out) {
  const bool reuse = fits(out, q.size(0) * q.size(1) * q.size(2));
  out = run_attention(q, k, v, table, seq, pos, rows, block_size, window, scale, c10::nullopt, tree_base, tree_map,
                      attn_kernel_for(best_isa()), reuse ? &out : nullptr);
}

at::Tensor attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& table,
                            const at::Tensor& seq, const at::Tensor& pos, const at::Tensor& rows, int64_t block_size,
                            int64_t window, double scale, const c10::optional<at::Tensor>& sinks, c10::string_view isa,
                            const c10::optional<at::Tensor>& tree_base, const c10::optional<at::Tensor>& tree_map) {
  return run_attention(q, k, v, table, seq, pos, rows, block_size, window, scale, sinks, tree_base, tree_map,
                       attn_kernel_for(isa.empty() ? best_isa() : std::string(isa)));
}

static at::Tensor attention_reference(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                      const at::Tensor& table, const at::Tensor& seq, const at::Tensor& pos,
                                      const at::Tensor& rows, int64_t block_size, int64_t window, double scale,
                                      const c10::optional<at::Tensor>& sinks, int64_t lanes,
                                      const c10::optional<at::Tensor>& tree_base, const c10::optional<at::Tensor>& tree_map) {
  TORCH_CHECK(lanes == 8 || lanes == 16, "peagle::attention_ref: lanes must be 8 or 16");
  return run_attention(q, k, v, table, seq, pos, rows, block_size, window, scale, sinks, tree_base, tree_map,
                       [lanes](const AttnArgs& a, int64_t i0, int64_t i1) { attention_ref(a, i0, i1, int(lanes)); });
}

WeightView weight_view(const at::Tensor& w) {
  TORCH_CHECK(w.device().is_cpu(), "peagle::linear runs on the CPU");
  TORCH_CHECK(w.is_contiguous(), "peagle::linear: the weight must be contiguous");
  if (w.scalar_type() == at::kByte) {
    TORCH_CHECK(w.dim() == 3, "peagle::linear: GGUF blocks are uint8 [N, K / block weights, block bytes], got ", w.sizes());
    for (const auto& [name, t] : GGUF_TYPES) {
      if (w.size(2) == block_bytes(t)) return {w.data_ptr(), t, w.size(0), w.size(1) * block_weights(t), false};
      if (w.size(2) == packed_bytes(t)) return {w.data_ptr(), t, w.size(0) * QGROUP, w.size(1) * block_weights(t), true};
    }
    if (w.size(2) == BF16_PAIR_BYTES) return {w.data_ptr(), WType::bf16, w.size(0) * QGROUP, w.size(1) * 2, true};
    std::string known;
    for (const auto& [name, t] : GGUF_TYPES)
      known += std::string(name) + " " + std::to_string(block_bytes(t)) + " (packed " + std::to_string(packed_bytes(t)) + "), ";
    TORCH_CHECK(false, "peagle::linear: ", w.size(2), "-byte blocks are no format the kernels know (", known,
                "bf16 pairs packed ", BF16_PAIR_BYTES, ")");
  }
  TORCH_CHECK(w.dim() == 2, "peagle::linear: the weight must be an [N, K] matrix");
  switch (w.scalar_type()) {
    case at::kFloat: return {w.data_ptr(), WType::f32, w.size(0), w.size(1), false};
    case at::kHalf: return {w.data_ptr(), WType::f16, w.size(0), w.size(1), false};
    case at::kBFloat16: return {w.data_ptr(), WType::bf16, w.size(0), w.size(1), false};
    default: TORCH_CHECK(false, "peagle::linear: weights must be float32, float16, bfloat16 or GGUF blocks (uint8), got ",
                         w.scalar_type());
  }
}

// A call's rows: x [..., K] as contiguous [M, K], the bias as float32 (or nullptr), y [M, N] to fill, its rows
// ldy apart (a fused weight's part fills its columns of a wider y: linear_parts_into).
struct Call {
  at::Tensor x, y, bias;
  std::vector<int64_t> shape;  // y's, as x's with N last
  int64_t M, ldy;
  const float* b() const { return bias.defined() ? bias.data_ptr<float>() : nullptr; }
  at::Tensor result() const { return y.is_contiguous() ? y.view(shape) : y; }
};

static Call prepare(const at::Tensor& x, const WeightView& w, const c10::optional<at::Tensor>& bias, const at::Tensor* out) {
  TORCH_CHECK(x.device().is_cpu(), "peagle::linear runs on the CPU");
  TORCH_CHECK(x.scalar_type() == at::kFloat, "peagle::linear: x must be float32, got ", x.scalar_type());
  TORCH_CHECK(x.size(-1) == w.K, "peagle::linear: x has ", x.size(-1), " features, the weight ", w.K);
  Call c;
  if (bias.has_value() && bias->defined()) {
    c.bias = bias->to(at::kFloat).contiguous();
    TORCH_CHECK(c.bias.numel() == w.N, "peagle::linear: bias has ", c.bias.numel(), " entries, the weight ", w.N, " rows");
  }
  c.x = x.reshape({-1, w.K}).contiguous();
  c.M = c.x.size(0);
  c.shape.assign(x.sizes().begin(), x.sizes().end());
  c.shape.back() = w.N;
  if (out && out->dim() == 2 && !out->is_contiguous()) {  // columns of a wider y (linear_parts_into)
    TORCH_CHECK(out->size(0) == c.M && out->size(1) == w.N && out->stride(1) == 1 && out->scalar_type() == at::kFloat,
                "peagle::linear: out must be float32 [", c.M, ", ", w.N, "] with unit column stride");
    c.y = *out;
  } else {
    c.y = out ? out->view({c.M, w.N}) : at::empty({c.M, w.N}, x.options());  // (linear_into: one that fits)
  }
  c.ldy = c.y.stride(0);
  return c;
}

// Where weight k (0..31) of column c sits in a chunk's packed record (kernels.h's layout): its quant's byte and
// shift, and its high bits' byte and bit (high_at).
struct PackedAt {
  int64_t q, high;
  int shift, at;
};
static PackedAt packed_at(const PackedFormat& f, WType t, int64_t c, int k) {
  const int64_t Q = packed_quants(t), v = (k % 16) / 4, i = k % 4;
  if (!f.nibbles) return {Q + 64 * (k / 4) + 4 * c + i, 0, 0, 0};
  const HighAt h = high_at(t, int(v), k / 16);
  return {Q + 64 * v + 4 * c + i, Q - 64 * (f.planes - h.vec) + 4 * c + i, k < 16 ? 0 : 4, h.at};
}

// A packed chunk of column c as float32: the file's values, sub_block's arithmetic on the packed quants less the
// offset and the packed scales (the packing reproduces gguf's values bit for bit).
static void packed_values(const PackedChunk<const uint8_t>& pc, WType t, int64_t c, float* out) {
  const PackedFormat f = packed_format(t);
  const float s[2] = {packed_scale(pc, t, c, 0), packed_scale(pc, t, c, f.scales - 1)};
  const float m = f.min ? packed_min(pc, t, c) : 0.f;
  for (int k = 0; k < QBLOCK; ++k) {
    const PackedAt at = packed_at(f, t, c, k);
    int q = f.nibbles ? (pc.rec[at.q] >> at.shift) & 15 : pc.rec[at.q];
    if (f.planes) q |= ((pc.rec[at.high] >> at.at) & ((1 << f.planes) - 1)) << 4;
    out[k] = f.min ? std::fma(float(q), s[0], m) : float(q - f.offset) * s[k / 16];
  }
}

// Packing a chunk's quants, a column at a time, on bytes: the 16 bytes of its nibble vectors' column slots (byte 4v +
// i: weight 4v + i low, 16 + 4v + i high) and its high-bit vectors' 4 bytes each, from the file's bytes as they lie.
static inline uint64_t load64(const uint8_t* p) { uint64_t v; std::memcpy(&v, p, 8); return v; }
static inline uint32_t load32(const uint8_t* p) { uint32_t v; std::memcpy(&v, p, 4); return v; }
// Nibble bytes: weights 0..15 the nibble at ``shift`` of lo[0..15], weights 16..31 that of hi[0..15].
static inline void nibble_bytes(const uint8_t* lo, const uint8_t* hi, int shift, uint8_t* out) {
  constexpr uint64_t LOW = 0x0F0F0F0F0F0F0F0FULL;
  for (int h = 0; h < 2; ++h) {
    const uint64_t v = ((load64(lo + 8 * h) >> shift) & LOW) | ((load64(hi + 8 * h) >> shift) & LOW) << 4;
    std::memcpy(out + 8 * h, &v, 8);
  }
}

// Each of 32 bytes' bits from ``shift`` (``mask``: 0x01 or 0x03 in every byte), a byte each: a K-quant's qh as
// 32 weights' high bits. Eight bytes a step: a byte's kept bits come from its own byte (shift + bits <= 8).
static inline void high_of_bytes(const uint8_t* src, int shift, uint64_t mask, uint8_t* out) {
  for (int w = 0; w < 4; ++w) {
    const uint64_t v = (load64(src + 8 * w) >> shift) & mask;
    std::memcpy(out + 8 * w, &v, 8);
  }
}

// Column c of chunk b of a row (its file block at blk) into a packed record: quants and high bits. The same bytes
// as placing every weight's q + offset by packed_at (kernels.h's layout; tests: the file's values read back).
static void pack_column(const uint8_t* blk, WType t, int64_t b, int64_t c, uint8_t* rec) {
  const PackedFormat f = packed_format(t);
  uint8_t* q = rec + packed_quants(t);
  if (t == WType::q8_0) {  // byte q + 128 a weight, four weights a vector's column slot
    for (int v = 0; v < 8; ++v) {
      const uint32_t w = load32(blk + 2 + 4 * v) ^ 0x80808080u;
      std::memcpy(q + 64 * v + 4 * c, &w, 4);
    }
    return;
  }
  alignas(8) uint8_t nib[16];
  alignas(8) uint8_t high[32] = {};  // weight l's bits above its nibble
  const int j = int(b % 8);
  switch (t) {
    case WType::q4_0: std::memcpy(nib, blk + 2, 16); break;  // the file's bytes are the packed ones
    case WType::q4_1: std::memcpy(nib, blk + 4, 16); break;
    case WType::q5_0:
    case WType::q5_1: {
      const int at = t == WType::q5_0 ? 2 : 4;  // qh, weight l's bit at bit l, then the nibbles
      std::memcpy(nib, blk + at + 4, 16);
      const uint32_t qh = load32(blk + at);
      for (int l = 0; l < 32; ++l) high[l] = (qh >> l) & 1;
      break;
    }
    case WType::q4_k: nibble_bytes(blk + 16 + 32 * (j / 2), blk + 32 + 32 * (j / 2), 4 * (j % 2), nib); break;
    case WType::q5_k:  // qh: weight l's bit at bit j of byte l
      nibble_bytes(blk + 48 + 32 * (j / 2), blk + 64 + 32 * (j / 2), 4 * (j % 2), nib);
      high_of_bytes(blk + 16, j, 0x0101010101010101ULL, high);
      break;
    case WType::q6_k: {  // chunk j: ql's nibbles at 64 (j / 4) + 32 (j % 2), shift 4 (j % 4 / 2); qh's 2 bits at 2 (j % 4)
      const uint8_t* ql = blk + 64 * (j / 4) + 32 * (j % 2);
      const uint8_t* qh = blk + 128 + 32 * (j / 4);
      nibble_bytes(ql, ql + 16, 4 * (j % 4 / 2), nib);
      high_of_bytes(qh, 2 * (j % 4), 0x0303030303030303ULL, high);
      break;
    }
    default: TORCH_CHECK(false, "peagle::pack: no packed layout for this format");
  }
  for (int v = 0; v < 4; ++v) std::memcpy(q + 64 * v + 4 * c, nib + 4 * v, 4);
  if (!f.planes) return;
  uint32_t hv[2] = {0, 0};  // byte i of each: column c's slot in a high-bit vector
  const auto place = [&](auto planes) {  // the places known when compiled (a Q6_K matrix packed in half the time)
    for (int half = 0; half < 2; ++half)
      for (int v = 0; v < 4; ++v) {  // weights 16 half + 4v + i, i = 0..3, their bits into byte i (values < 4 << 6)
        const HighAt h = high_at(planes(), v, half);
        hv[h.vec] |= load32(high + 16 * half + 4 * v) << h.at;
      }
  };
  if (f.planes == 1) place(std::integral_constant<int, 1>());
  else place(std::integral_constant<int, 2>());
  for (int h = 0; h < f.planes; ++h) std::memcpy(q - 64 * (f.planes - h) + 4 * c, &hv[h], 4);
}

// The file's blocks uint8 [N, K / block weights, block bytes] (N a multiple of 16) packed for the integer
// path, uint8 [N / 16, K / block weights, packed_bytes] (kernels.h's layout), into ``out`` where given (a slice of
// the model's one mapping: loading writes each matrix once, where it stays): the quants a permutation of the
// bytes (q8_0, q4_0, q4_1) or of the bits, the scales the file's own (a K-quant's 6-bit ones as bytes).
static at::Tensor pack(const at::Tensor& blocks, const c10::optional<at::Tensor>& into) {
  const WeightView w = weight_view(blocks);
  TORCH_CHECK(quantized(w.wtype) && !w.packed && w.N % QGROUP == 0,
              "peagle::pack: takes a GGUF file's blocks, uint8 [N, K / block weights, block bytes], N a multiple of 16");
  const WType t = w.wtype;
  const PackedFormat f = packed_format(t);
  const int64_t nb = w.K / QBLOCK, RB = row_bytes(t, w.K), BB = block_bytes(t);
  const std::vector<int64_t> shape = {w.N / QGROUP, blocks.size(1), packed_bytes(t)};
  at::Tensor out;
  if (into.has_value() && into->defined()) {
    TORCH_CHECK(into->scalar_type() == at::kByte && into->is_contiguous() && into->sizes().vec() == shape,
                "peagle::pack: out must be contiguous uint8 ", c10::IntArrayRef(shape), ", got ", into->sizes());
    out = *into;
  } else {
    out = at::empty(shape, blocks.options());
  }
  const uint8_t* in = static_cast<const uint8_t*>(w.w);
  uint8_t* o = out.data_ptr<uint8_t>();
  parallel_for(0, w.N / QGROUP, 1, [&](int64_t g0, int64_t g1) {
    for (int64_t g = g0; g < g1; ++g)
      for (int64_t b = 0; b < nb; ++b) {
        const PackedChunk<uint8_t> pc = packed_chunk_at(o, t, g, b, w.K);
        if (t == WType::q6_k && pc.j == 0) std::memset(pc.head + 288, 0, KHEAD - 288);  // its header's unused bytes
        for (int64_t c = 0; c < QGROUP; ++c) {
          const uint8_t* blk = in + (g * QGROUP + c) * RB + b * QBLOCK / block_weights(t) * BB;  // the chunk's block
          if (t == WType::q6_k) {  // d, and the chunk's two int8 scales
            std::memcpy(pc.head + 2 * c, blk + 208, 2);
            for (int h = 0; h < 2; ++h) pc.head[32 + QGROUP * (2 * pc.j + h) + c] = blk[192 + 2 * pc.j + h];
          } else if (super_packed(t)) {  // d, dmin, and the chunk's 6-bit scale and min
            int sc, mn;
            kquant_scale_min(blk, pc.j, sc, mn);
            std::memcpy(pc.head + 2 * c, blk, 2);
            std::memcpy(pc.head + 32 + 2 * c, blk + 2, 2);
            pc.head[64 + QGROUP * pc.j + c] = uint8_t(sc);
            pc.head[192 + QGROUP * pc.j + c] = uint8_t(mn);
          } else {  // the file's fp16 d (and m): the block's first bytes
            std::memcpy(pc.rec + 2 * c, blk, 2);
            if (f.min) std::memcpy(pc.rec + 2 * (QGROUP + c), blk + 2, 2);
          }
          pack_column(blk, t, b, c, pc.rec);
        }
      }
  });
  return out;
}

// Rows ``ids`` of a GGUF matrix (the file's blocks or packed), de-quantized to float32 [n, K]: gguf's values
// (q * d exact, + m rounded once), as the embedding looks tokens up; of a packed bf16 matrix, its values.
at::Tensor dequantize_rows(const at::Tensor& blocks, const at::Tensor& ids) {
  const WeightView w = weight_view(blocks);
  TORCH_CHECK(quantized(w.wtype) || w.packed, "peagle::dequantize_rows: takes GGUF blocks or a packed bf16 matrix");
  TORCH_CHECK(ids.scalar_type() == at::kLong && ids.dim() == 1 && ids.is_contiguous(),
              "peagle::dequantize_rows: ids must be contiguous int64 [n]");
  const int64_t n = ids.numel(), nb = w.K / QBLOCK, RB = row_bytes(w.wtype, w.K);
  const int64_t* ip = ids.data_ptr<int64_t>();
  for (int64_t i = 0; i < n; ++i)
    TORCH_CHECK(0 <= ip[i] && ip[i] < w.N, "peagle::dequantize_rows: row ", ip[i], " out of ", w.N);
  at::Tensor out = at::empty({n, w.K}, blocks.options().dtype(at::kFloat));
  const uint8_t* base = static_cast<const uint8_t*>(w.w);
  float* o = out.data_ptr<float>();
  if (w.wtype == WType::bf16) {  // kernels.h's layout: column c of group g, pair p at (g * K / 2 + p) * 64 + 4c
    parallel_for(0, n, 16, [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i)
        for (int64_t k = 0; k < w.K; ++k)
          o[i * w.K + k] = weight_at(base + ((ip[i] / QGROUP * w.K + k) / 2 * BF16_PAIR_BYTES + 4 * (ip[i] % QGROUP)),
                                     WType::bf16, k % 2);
    });
    return out;
  }
  parallel_for(0, n, 16, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i)
      for (int64_t b = 0; b < nb; ++b) {
        float* dst = o + i * w.K + b * QBLOCK;
        if (w.packed) packed_values(packed_chunk_at(base, w.wtype, ip[i] / QGROUP, b, w.K), w.wtype, ip[i] % QGROUP, dst);
        else chunk_values(base + ip[i] * RB, w.wtype, b, dst);
      }
  });
  return out;
}

static at::Tensor run(const at::Tensor& x, const WeightView& w, const c10::optional<at::Tensor>& bias,
                      const Kernel& kernel, const at::Tensor* out = nullptr) {
  TORCH_CHECK(!w.packed, "peagle::linear: packed weights run on the integer or bf16 dot-product path only");
  const Call c = prepare(x, w, bias, out);
  const int64_t N = w.N, K = w.K;
  for (int64_t m0 = 0; m0 < c.M; m0 += ROW_CHUNK) {
    LinearArgs a{c.x.data_ptr<float>() + m0 * K, w.w, c.b(), c.y.data_ptr<float>() + m0 * c.ldy,
                 std::min(ROW_CHUNK, c.M - m0), N, K, K, c.ldy, w.wtype};
    parallel_for(0, N, COL_GRAIN, [&](int64_t n0, int64_t n1) { kernel(a, n0, n1); });
  }
  return c.result();
}

// The integer path (kernels.h): x quantized once, then the weight's columns.
using Quantize = void (*)(const float*, int64_t, int64_t, int64_t, int32_t, const QRows&, int64_t, int64_t);
struct QKernel {
  Quantize quantize;
  int32_t (*offset)(WType);
  std::function<void(const QLinearArgs&, int64_t, int64_t)> linear;  // column groups (packed) or columns (ref)
  int64_t grain;
};

static QKernel qkernel_for(const std::string& isa) {
  if (isa == "amx") {
    TORCH_CHECK(has_level(AMX), "peagle::linear: this CPU has no AMX-INT8 (or the OS did not grant its tiles)");
    return {quantize_rows_avx512, vnni_offset, qlinear_amx, COL_GRAIN / QGROUP};
  }
  if (isa == "amx-model") {  // the AMX kernel over the tile instructions' C++ model (tests)
    TORCH_CHECK(has_avx512vnni(), "peagle::linear: the AMX model's kernel needs AVX512-VNNI");
    return {quantize_rows_avx512, vnni_offset, qlinear_amx_model, COL_GRAIN / QGROUP};
  }
  if (isa == "avx512vnni") {
    TORCH_CHECK(has_avx512vnni(), "peagle::linear: this CPU has no AVX512-VNNI");
    return {quantize_rows_avx512, vnni_offset, qlinear_avx512vnni, COL_GRAIN / QGROUP};
  }
  if (isa == "avxvnni") {
    TORCH_CHECK(has_avxvnni(), "peagle::linear: this CPU has no AVX-VNNI");
    return {quantize_rows_avx2, vnni_offset, qlinear_avxvnni, COL_GRAIN / QGROUP};
  }
  if (isa == "avx2") {
    TORCH_CHECK(has_avx2(), "peagle::linear: this CPU has no AVX2 + FMA + F16C");
    return {quantize_rows_avx2, avx2_offset, qlinear_avx2, COL_GRAIN / QGROUP};
  }
  TORCH_CHECK(false, "peagle::linear: packed GGUF blocks run on amx, avx512vnni, avxvnni or avx2, not '", isa,
              "' (the file's blocks run on every instruction set)");
}

// x's quants for M rows of K, then each block's d, d * s, c, c16 and s (4 bytes each: aligned, K being a
// multiple of 32), in the calling thread's scratch (kept between calls: a decoding step makes ~120 of these).
static QRows quant_scratch(int64_t M, int64_t K) {
  static thread_local std::vector<int32_t> scratch;
  const int64_t nb = K / QBLOCK;
  scratch.resize(size_t((M * (K + 20 * nb) + 3) / 4));
  uint8_t* base = reinterpret_cast<uint8_t*>(scratch.data());
  return {reinterpret_cast<int8_t*>(base), reinterpret_cast<float*>(base + M * K),
          reinterpret_cast<float*>(base + M * K + 4 * M * nb), reinterpret_cast<int32_t*>(base + M * K + 8 * M * nb),
          reinterpret_cast<int32_t*>(base + M * K + 12 * M * nb), reinterpret_cast<float*>(base + M * K + 16 * M * nb)};
}

// Passes of up to this many rows inside a team (decoding, verification, drafting) quantize x in every thread,
// each into its own scratch, inside the columns' range: one range a call instead of two, and no thread reads
// quants another wrote. The same function on the same rows: the same bits. (Zen 4, engine steps, paired
// bursts: K=1 rounds 0.97x, K=3 0.88-0.94x, plain steps and K=7 level; on the bf16 path the same change measured
// level, not taken.)
static constexpr int64_t OWN_QUANT_ROWS = 8;

static at::Tensor qrun(const at::Tensor& x, const WeightView& w, const c10::optional<at::Tensor>& bias,
                       const QKernel& k, const at::Tensor* out = nullptr) {
  const Call c = prepare(x, w, bias, out);
  const int64_t N = w.N, K = w.K, M = c.M, nb = K / QBLOCK;
  const float* xp = c.x.data_ptr<float>();
  const int32_t offset = k.offset(w.wtype);
  const int64_t span = quant_span(w.wtype);
  const int64_t units = w.packed ? N / QGROUP : N;
  if (team_size() && M <= OWN_QUANT_ROWS) {
    parallel_for(0, units, k.grain, [&](int64_t u0, int64_t u1) {
      const QRows q = quant_scratch(M, K);
      k.quantize(xp, K, K, span, offset, q, 0, M);
      k.linear({q, static_cast<const uint8_t*>(w.w), c.b(), c.y.data_ptr<float>(), M, N, K, c.ldy, w.wtype}, u0, u1);
    });
    return c.result();
  }
  const QRows q = quant_scratch(M, K);
  parallel_for(0, M, row_grain(), [&](int64_t m0, int64_t m1) { k.quantize(xp, K, K, span, offset, q, m0, m1); });
  for (int64_t m0 = 0; m0 < M; m0 += ROW_CHUNK) {
    const QRows qc{q.q + m0 * K, q.d + m0 * nb, q.sd + m0 * nb, q.c + m0 * nb, q.c16 + m0 * nb, q.s + m0 * nb};
    QLinearArgs a{qc, static_cast<const uint8_t*>(w.w), c.b(), c.y.data_ptr<float>() + m0 * c.ldy,
                  std::min(ROW_CHUNK, M - m0), N, K, c.ldy, w.wtype};
    parallel_for(0, units, k.grain, [&](int64_t u0, int64_t u1) { k.linear(a, u0, u1); });
  }
  return c.result();
}

// The bf16 dot-product path (kernels.h): x rounded to bf16 once, then the weight's columns.
struct BKernel {
  void (*rows)(const float*, int64_t, int64_t, uint16_t*, int64_t, int64_t);
  std::function<void(const BLinearArgs&, int64_t, int64_t)> linear;  // column groups (packed) or columns (ref)
  int64_t grain;
};

static BKernel bkernel_for(const std::string& isa) {
  TORCH_CHECK(isa == "amx" || isa == "amx-model" || isa == "avx512bf16" || isa == "avx2", "peagle::linear: packed "
              "bf16 weights run on amx, avx512bf16 or avx2, not '", isa, "' (the plain bf16 matrix runs on every "
              "instruction set)");
  if (isa == "avx2") {
    TORCH_CHECK(has_level(AVX2), "peagle::linear: this CPU has no AVX2");
    return {bf16_rows_ref, bf16linear_avx2, COL_GRAIN / QGROUP};
  }
  TORCH_CHECK(has_avx512bf16(), "peagle::linear: this CPU has no AVX512_BF16");
  if (isa == "amx") {
    TORCH_CHECK(has_amx_bf16(), "peagle::linear: this CPU (or its OS) has no AMX-BF16 tiles");
    return {bf16_rows_avx512bf16, bf16linear_amx, COL_GRAIN / QGROUP};
  }
  if (isa == "amx-model") return {bf16_rows_avx512bf16, bf16linear_amx_model, COL_GRAIN / QGROUP};  // tests
  return {bf16_rows_avx512bf16, bf16linear_avx512bf16, COL_GRAIN / QGROUP};
}

static at::Tensor brun(const at::Tensor& x, const WeightView& w, const c10::optional<at::Tensor>& bias,
                       const BKernel& k, const at::Tensor* out = nullptr) {
  const Call c = prepare(x, w, bias, out);
  const int64_t N = w.N, K = w.K, M = c.M;
  static thread_local std::vector<uint16_t> scratch;  // x in bf16, kept between calls as qrun's
  scratch.resize(size_t(M * K));
  uint16_t* xp = scratch.data();
  parallel_for(0, M, row_grain(), [&](int64_t m0, int64_t m1) { k.rows(c.x.data_ptr<float>(), K, K, xp, m0, m1); });
  const int64_t units = w.packed ? N / QGROUP : N;
  for (int64_t m0 = 0; m0 < M; m0 += ROW_CHUNK) {
    BLinearArgs a{xp + m0 * K, static_cast<const uint8_t*>(w.w), c.b(), c.y.data_ptr<float>() + m0 * c.ldy,
                  std::min(ROW_CHUNK, M - m0), N, K, c.ldy};
    parallel_for(0, units, k.grain, [&](int64_t u0, int64_t u1) { k.linear(a, u0, u1); });
  }
  return c.result();
}

static at::Tensor linear_to(const at::Tensor& x, const WeightView& v, const c10::optional<at::Tensor>& bias,
                            c10::string_view isa, const at::Tensor* out) {
  if (v.packed && v.wtype == WType::bf16)
    return brun(x, v, bias, bkernel_for(isa.empty() ? best_bf16_isa() : std::string(isa)), out);
  if (v.packed) return qrun(x, v, bias, qkernel_for(isa.empty() ? best_int_isa() : std::string(isa)), out);
  return run(x, v, bias, kernel_for(isa.empty() ? best_isa() : std::string(isa)), out);
}

at::Tensor linear(const at::Tensor& x, const at::Tensor& w, const c10::optional<at::Tensor>& bias,
                         c10::string_view isa) {
  return linear_to(x, weight_view(w), bias, isa, nullptr);
}

void linear_into(const at::Tensor& x, const at::Tensor& w, const c10::optional<at::Tensor>& bias, at::Tensor& y) {
  const WeightView v = weight_view(w);
  const int64_t m = x.numel() / std::max<int64_t>(x.size(-1), 1);
  if (fits(y, m * v.N)) linear_to(x, v, bias, "", &y);
  else y = linear_to(x, v, bias, "", nullptr).view({m, v.N});
}

// A fused weight (q/k/v, gate/up) given as its parts, each in its own format (a Q4_K_M file's Q6_K attn_v beside
// Q4_K q and k): each part's linear fills its columns of y [M, sum of the parts' rows], its bias slice with it.
// Column n's output is the part's own, as the fused matrix's would be: the same bits.
void linear_parts_into(const at::Tensor& x, at::TensorList parts, const c10::optional<at::Tensor>& bias, at::Tensor& y) {
  TORCH_CHECK(!parts.empty(), "peagle::linear_parts: no parts");
  if (parts.size() == 1) return linear_into(x, parts[0], bias, y);
  std::vector<WeightView> views;
  int64_t N = 0;
  for (const at::Tensor& p : parts) {
    views.push_back(weight_view(p));
    TORCH_CHECK(views.back().K == views.front().K, "peagle::linear_parts: the parts have ", views.front().K, " and ",
                views.back().K, " input features");
    N += views.back().N;
  }
  const bool b = bias.has_value() && bias->defined();
  TORCH_CHECK(!b || bias->numel() == N, "peagle::linear_parts: bias has ", b ? bias->numel() : 0, " entries, the parts ", N, " rows");
  const int64_t m = x.numel() / std::max<int64_t>(x.size(-1), 1);
  if (!fits(y, m * N)) y = at::empty({m, N}, x.options());
  const at::Tensor y2 = y.view({m, N});
  int64_t at = 0;
  for (const WeightView& v : views) {
    const at::Tensor cols = y2.narrow(1, at, v.N);
    const c10::optional<at::Tensor> part_bias = b ? c10::optional<at::Tensor>(bias->narrow(0, at, v.N)) : c10::nullopt;
    linear_to(x, v, part_bias, "", &cols);
    at += v.N;
  }
}

static at::Tensor linear_parts(const at::Tensor& x, at::TensorList parts, const c10::optional<at::Tensor>& bias) {
  at::Tensor y;
  linear_parts_into(x, parts, bias, y);
  std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end());
  shape.back() = y.size(-1);
  return y.view(shape);
}

static at::Tensor linear_reference(const at::Tensor& x, const at::Tensor& w, const c10::optional<at::Tensor>& bias,
                                   int64_t lanes) {
  TORCH_CHECK(lanes == 8 || lanes == 16, "peagle::linear_ref: lanes must be 8 or 16");
  return run(x, weight_view(w), bias,
             [lanes](const LinearArgs& a, int64_t n0, int64_t n1) { linear_ref(a, n0, n1, int(lanes)); });
}

// The integer path's scalar reference, on the file's blocks.
static at::Tensor qlinear_reference(const at::Tensor& x, const at::Tensor& w, const c10::optional<at::Tensor>& bias) {
  const WeightView v = weight_view(w);
  TORCH_CHECK(quantized(v.wtype) && !v.packed, "peagle::qlinear_ref: takes a GGUF file's blocks, uint8 [N, K / block weights, block bytes]");
  return qrun(x, v, bias, {quantize_rows_ref, [](WType) { return 0; }, qlinear_ref, COL_GRAIN});
}

// The bf16 dot-product path's scalar reference, on the plain bf16 matrix [N, K] (K even).
static at::Tensor bf16linear_reference(const at::Tensor& x, const at::Tensor& w, const c10::optional<at::Tensor>& bias) {
  const WeightView v = weight_view(w);
  TORCH_CHECK(v.wtype == WType::bf16 && !v.packed && v.K % 2 == 0,
              "peagle::bf16linear_ref: takes a plain bfloat16 [N, K] matrix, K even");
  return brun(x, v, bias, {bf16_rows_ref, bf16linear_ref, COL_GRAIN});
}

TORCH_LIBRARY(peagle, m) {
  // w: a float [N, K] matrix, GGUF blocks, uint8 [N, K / 32, block bytes], or packed (kernels.h)
  m.def("linear(Tensor x, Tensor w, Tensor? bias=None, str isa='') -> Tensor");
  m.def("linear_parts(Tensor x, Tensor[] parts, Tensor? bias=None) -> Tensor");
  m.def("linear_ref(Tensor x, Tensor w, Tensor? bias=None, int lanes=8) -> Tensor");
  m.def("attention(Tensor q, Tensor k, Tensor v, Tensor table, Tensor seq, Tensor pos, Tensor rows, int block_size, "
        "int window, float scale, Tensor? sinks=None, str isa='', Tensor? tree_base=None, Tensor? tree_map=None) -> Tensor");
  m.def("attention_ref(Tensor q, Tensor k, Tensor v, Tensor table, Tensor seq, Tensor pos, Tensor rows, "
        "int block_size, int window, float scale, Tensor? sinks=None, int lanes=8, Tensor? tree_base=None, "
        "Tensor? tree_map=None) -> Tensor");
  m.def("qlinear_ref(Tensor x, Tensor w, Tensor? bias=None) -> Tensor");
  m.def("bf16linear_ref(Tensor x, Tensor w, Tensor? bias=None) -> Tensor");
  m.def("dequantize_rows(Tensor blocks, Tensor ids) -> Tensor");
  m.def("pack(Tensor blocks, Tensor(a!)? out=None) -> Tensor");
  m.impl("pack", c10::DispatchKey::CPU, TORCH_FN(pack));
  m.impl("dequantize_rows", c10::DispatchKey::CPU, TORCH_FN(dequantize_rows));
  m.def("isa() -> str", [] { return best_isa(); });
  m.def("int_isa() -> str", [] { return best_int_isa(); });
  m.def("int_isas() -> str[]", [] { return int_isas(); });
  m.def("bf16_isa() -> str", [] { return best_bf16_isa(); });
  m.def("set_isa(str isa) -> ()", set_isa);
  m.def("bf16_isas() -> str[]", [] { return bf16_isas(); });
  m.def("set_amx(bool int8, bool bf16) -> ()", [](bool int8, bool bf16) {
    amx_int8_on.store(int8);
    amx_bf16_on.store(bf16);
  });
  m.def("set_stream_bytes(int one_row, int taller) -> ()", set_stream_bytes);
  m.def("stream_bytes() -> int[]", [] { return std::vector<int64_t>{stream_bytes(true), stream_bytes(false)}; });
  m.def("limits() -> Dict(str, int)", limits);
  m.def("formats() -> Dict(str, int[])", formats);
  m.impl("attention", c10::DispatchKey::CPU, TORCH_FN(attention));
  m.impl("attention_ref", c10::DispatchKey::CPU, TORCH_FN(attention_reference));
  m.impl("linear", c10::DispatchKey::CPU, TORCH_FN(linear));
  m.impl("linear_parts", c10::DispatchKey::CPU, TORCH_FN(linear_parts));
  m.impl("linear_ref", c10::DispatchKey::CPU, TORCH_FN(linear_reference));
  m.impl("qlinear_ref", c10::DispatchKey::CPU, TORCH_FN(qlinear_reference));
  m.impl("bf16linear_ref", c10::DispatchKey::CPU, TORCH_FN(bf16linear_reference));
}

}  // namespace peagle
