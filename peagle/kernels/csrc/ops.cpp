// The torch operators. peagle::linear and peagle::attention run the widest path this CPU has (or the one
// named: tests run each); the *_ref operators are the scalar references of a path's lane order. Work is
// split across torch's threads (the same OpenMP team as every other op).
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <algorithm>
#include <functional>
#include <string>
#include <vector>

#include "kernels.h"
#include "ops.h"

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

static std::string best_isa() { return has_avx512() ? "avx512" : has_avx2() ? "avx2" : "scalar"; }

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
  return [](const LinearArgs& a, int64_t n0, int64_t n1) { linear_ref(a, n0, n1, 8); };
}

static AttnKernel attn_kernel_for(const std::string& isa) {
  kernel_for(isa);  // the same checks
  if (isa == "avx512") return attention_avx512;
  if (isa == "avx2") return attention_avx2;
  return [](const AttnArgs& a, int64_t i0, int64_t i1) { attention_ref(a, i0, i1, 8); };
}

static at::Tensor run_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& table,
                                const at::Tensor& seq, const at::Tensor& pos, const at::Tensor& rows,
                                int64_t block_size, int64_t window, double scale,
                                const c10::optional<at::Tensor>& sinks, const c10::optional<at::Tensor>& tree_base,
                                const c10::optional<at::Tensor>& tree_map, const AttnKernel& kernel) {
  TORCH_CHECK(q.scalar_type() == at::kFloat && k.scalar_type() == at::kFloat && v.scalar_type() == at::kFloat,
              "peagle::attention: q and the KV pools must be float32");
  TORCH_CHECK(q.dim() == 3 && q.stride(2) == 1 && q.stride(1) == q.size(2), "peagle::attention: q must be [T, H, d], rows strided");
  TORCH_CHECK(k.dim() == 3 && k.is_contiguous() && v.is_contiguous() && k.sizes() == v.sizes(),
              "peagle::attention: the KV pools must be contiguous [slots, Hkv, d]");
  const int64_t H = q.size(1), d = q.size(2), Hkv = k.size(1);
  TORCH_CHECK(k.size(2) == d && H % Hkv == 0 && H / Hkv <= MAX_GROUP && d <= MAX_HEAD_DIM,
              "peagle::attention: unsupported heads (H ", H, ", Hkv ", Hkv, ", d ", d, ")");
  for (const at::Tensor* t : {&table, &seq, &pos, &rows})
    TORCH_CHECK(t->scalar_type() == at::kLong && t->is_contiguous(), "peagle::attention: indices must be contiguous int64");
  TORCH_CHECK(seq.numel() == q.size(0) && pos.numel() == q.size(0), "peagle::attention: seq and pos need one entry per row");
  at::Tensor sk;
  if (sinks.has_value() && sinks->defined()) {
    sk = sinks->to(at::kFloat).contiguous();
    TORCH_CHECK(sk.numel() == H, "peagle::attention: one sink per query head");
  }
  const int64_t* rp = rows.data_ptr<int64_t>();
  const int64_t* sp = seq.data_ptr<int64_t>();
  const bool tree = tree_base.has_value() && tree_base->defined();
  TORCH_CHECK(tree == (tree_map.has_value() && tree_map->defined()), "peagle::attention: tree_base and tree_map go together");
  const int64_t W = tree ? tree_map->size(-1) : 0;
  if (tree) {
    for (const at::Tensor* t : {&*tree_base, &*tree_map})
      TORCH_CHECK(t->scalar_type() == at::kLong && t->is_contiguous(), "peagle::attention: the tree must be contiguous int64");
    TORCH_CHECK(tree_base->numel() == q.size(0) && tree_map->dim() == 2 && tree_map->size(0) == q.size(0) && W >= 1,
                "peagle::attention: tree_base [T] and tree_map [T, W >= 1], one entry per row");
    // every KV index a row reads through its map lies in its block table (the kernel reads it unchecked)
    const int64_t *bp = tree_base->data_ptr<int64_t>(), *mp = tree_map->data_ptr<int64_t>(), *pp = pos.data_ptr<int64_t>();
    const int64_t keys = table.size(1) * block_size;
    for (int64_t i = 0; i < rows.numel(); ++i) {
      const int64_t r = rp[i], n = pp[r] + 1 - bp[r];
      TORCH_CHECK(bp[r] >= 0 && n <= W, "peagle::attention: row ", r, " reads ", n, " mapped keys, its map has ", W);
      for (int64_t c = 0; c < n; ++c)
        TORCH_CHECK(mp[r * W + c] >= 0 && mp[r * W + c] < keys, "peagle::attention: row ", r, " maps a key to KV index ",
                    mp[r * W + c], ", outside its block table");
    }
  }
  at::Tensor out = at::empty({q.size(0), H * d}, q.options());
  // tiles: runs of rows of one sequence (a sequence's verification rows share every key load)
  const int64_t tile_rows = std::max<int64_t>(1, MAX_QUERIES / (H / Hkv));
  std::vector<int64_t> tiles{0};
  for (int64_t i = 1; i <= rows.numel(); ++i)
    if (i == rows.numel() || sp[rp[i]] != sp[rp[i - 1]] || i - tiles.back() == tile_rows) tiles.push_back(i);
  if (rows.numel() == 0) return out;
  AttnArgs a{q.data_ptr<float>(), q.stride(0), k.data_ptr<float>(), v.data_ptr<float>(), table.data_ptr<int64_t>(),
             table.size(1), rp, tiles.data(), sp, pos.data_ptr<int64_t>(),
             tree ? tree_base->data_ptr<int64_t>() : nullptr, tree ? tree_map->data_ptr<int64_t>() : nullptr, W,
             sk.defined() ? sk.data_ptr<float>() : nullptr, out.data_ptr<float>(), H, Hkv, d, block_size, window,
             float(scale)};
  const int64_t items = int64_t(tiles.size() - 1) * Hkv;
  at::parallel_for(0, items, 1, [&](int64_t i0, int64_t i1) { kernel(a, i0, i1); });
  return out;
}

at::Tensor attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& table,
                            const at::Tensor& seq, const at::Tensor& pos, const at::Tensor& rows, int64_t block_size,
                            int64_t window, double scale, const c10::optional<at::Tensor>& sinks, c10::string_view isa,
                            const c10::optional<at::Tensor>& tree_base, const c10::optional<at::Tensor>& tree_map) {
  static const AttnKernel best = attn_kernel_for(best_isa());
  return run_attention(q, k, v, table, seq, pos, rows, block_size, window, scale, sinks, tree_base, tree_map,
                       isa.empty() ? best : attn_kernel_for(std::string(isa)));
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
    TORCH_CHECK(w.dim() == 3, "peagle::linear: GGUF blocks are uint8 [N, K / 32, block bytes], got ", w.sizes());
    WType t;
    switch (w.size(2)) {
      case 34: t = WType::q8_0; break;
      case 18: t = WType::q4_0; break;
      case 20: t = WType::q4_1; break;
      default: TORCH_CHECK(false, "peagle::linear: ", w.size(2), "-byte blocks are no format the kernels know "
                           "(34: q8_0, 18: q4_0, 20: q4_1)");
    }
    return {w.data_ptr(), t, w.size(0), w.size(1) * QBLOCK};
  }
  TORCH_CHECK(w.dim() == 2, "peagle::linear: the weight must be an [N, K] matrix");
  switch (w.scalar_type()) {
    case at::kFloat: return {w.data_ptr(), WType::f32, w.size(0), w.size(1)};
    case at::kHalf: return {w.data_ptr(), WType::f16, w.size(0), w.size(1)};
    case at::kBFloat16: return {w.data_ptr(), WType::bf16, w.size(0), w.size(1)};
    default: TORCH_CHECK(false, "peagle::linear: weights must be float32, float16, bfloat16 or GGUF blocks (uint8), got ",
                         w.scalar_type());
  }
}

static at::Tensor run(const at::Tensor& x, const at::Tensor& weight, const c10::optional<at::Tensor>& bias,
                      const Kernel& kernel) {
  TORCH_CHECK(x.device().is_cpu(), "peagle::linear runs on the CPU");
  TORCH_CHECK(x.scalar_type() == at::kFloat, "peagle::linear: x must be float32, got ", x.scalar_type());
  const WeightView w = weight_view(weight);
  const int64_t N = w.N, K = w.K;
  TORCH_CHECK(x.size(-1) == K, "peagle::linear: x has ", x.size(-1), " features, the weight ", K);
  const float* b = nullptr;
  at::Tensor bc;
  if (bias.has_value() && bias->defined()) {
    bc = bias->to(at::kFloat).contiguous();
    TORCH_CHECK(bc.numel() == N, "peagle::linear: bias has ", bc.numel(), " entries, the weight ", N, " rows");
    b = bc.data_ptr<float>();
  }
  at::Tensor x2 = x.reshape({-1, K}).contiguous();
  const int64_t M = x2.size(0);
  std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end());
  shape.back() = N;
  at::Tensor y = at::empty({M, N}, x.options());
  for (int64_t m0 = 0; m0 < M; m0 += ROW_CHUNK) {
    LinearArgs a{x2.data_ptr<float>() + m0 * K, w.w, b, y.data_ptr<float>() + m0 * N,
                 std::min(ROW_CHUNK, M - m0), N, K, K, N, w.wtype};
    at::parallel_for(0, N, COL_GRAIN, [&](int64_t n0, int64_t n1) { kernel(a, n0, n1); });
  }
  return y.view(shape);
}

at::Tensor linear(const at::Tensor& x, const at::Tensor& w, const c10::optional<at::Tensor>& bias,
                         c10::string_view isa) {
  static const Kernel best = kernel_for(best_isa());
  return isa.empty() ? run(x, w, bias, best) : run(x, w, bias, kernel_for(std::string(isa)));
}

static at::Tensor linear_reference(const at::Tensor& x, const at::Tensor& w, const c10::optional<at::Tensor>& bias,
                                   int64_t lanes) {
  TORCH_CHECK(lanes == 8 || lanes == 16, "peagle::linear_ref: lanes must be 8 or 16");
  return run(x, w, bias, [lanes](const LinearArgs& a, int64_t n0, int64_t n1) { linear_ref(a, n0, n1, int(lanes)); });
}

TORCH_LIBRARY(peagle, m) {
  // w: a float [N, K] matrix or GGUF blocks, uint8 [N, K / 32, block bytes] (kernels.h)
  m.def("linear(Tensor x, Tensor w, Tensor? bias=None, str isa='') -> Tensor");
  m.def("linear_ref(Tensor x, Tensor w, Tensor? bias=None, int lanes=8) -> Tensor");
  m.def("attention(Tensor q, Tensor k, Tensor v, Tensor table, Tensor seq, Tensor pos, Tensor rows, int block_size, "
        "int window, float scale, Tensor? sinks=None, str isa='', Tensor? tree_base=None, Tensor? tree_map=None) -> Tensor");
  m.def("attention_ref(Tensor q, Tensor k, Tensor v, Tensor table, Tensor seq, Tensor pos, Tensor rows, "
        "int block_size, int window, float scale, Tensor? sinks=None, int lanes=8, Tensor? tree_base=None, "
        "Tensor? tree_map=None) -> Tensor");
  m.def("isa() -> str", [] { return best_isa(); });
  m.impl("attention", c10::DispatchKey::CPU, TORCH_FN(attention));
  m.impl("attention_ref", c10::DispatchKey::CPU, TORCH_FN(attention_reference));
  m.impl("linear", c10::DispatchKey::CPU, TORCH_FN(linear));
  m.impl("linear_ref", c10::DispatchKey::CPU, TORCH_FN(linear_reference));
}

}  // namespace peagle
