// decoder_layers: a stack of Llama-style layers (pre-norm attention, SwiGLU MLP) in one call, for the
// steps whose rows the attention kernel takes whole (decoding, verification, short prompts). It runs the
// same operators in the same order as the layer-by-layer path, so every row gets the same bits; what it
// saves is the ~10 Python and dispatcher round trips a layer costs (about a third of a one-row step). The
// drafter's stack (EAGLE-3's first layer reads [normed embedding, normed hidden], width 2H) hands that
// input in as ``first_normed``: layer 0 then attends it instead of rms_norm(x), x still its residual.
#include <ATen/core/Tensor.h>
#include <ATen/ops/add.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/index_select.h>
#include <ATen/ops/isfinite.h>
#include <torch/library.h>

#include <algorithm>
#include <tuple>
#include <vector>

#include "ops.h"
#include "team.h"

namespace peagle {

static constexpr int64_t PER_LAYER = 13;  // see decoder_layers

// Weights per layer (PER_LAYER): input norm, qkv weight (or q, k and v: a file's parts in formats of their own),
// k?, v?, qkv bias?, o weight, o bias?, post-attention norm, gate_up weight (or gate and up), up?, gate_up bias?,
// down weight, down bias? (k, v and up None where the weight is fused; the biases None where the model has none).
// Returns the last layer's output (before the final norm) and the input of each layer in ``taps`` (the
// layer count for the last output). ``first_normed``: layer 0's attention input, if not rms_norm(x).
// ``out_rows``: the rows whose output the caller reads (a drafting pass's drafted rows): the last layer writes every
// row's KV but attends, projects and runs its MLP for these alone, and the output has these rows, in this order. A
// row's result is its own whatever shares the pass, so they are the bits of the full pass's rows; what the others
// skip is most of their cost (a drafter's catch-up over a prompt, one layer: its attention input and KV alone).
std::tuple<at::Tensor, std::vector<at::Tensor>> decoder_layers(
    const at::Tensor& x0, const c10::List<c10::optional<at::Tensor>>& weights, const at::Tensor& cos,
    const at::Tensor& sin, at::TensorList k_pools, at::TensorList v_pools, const at::Tensor& slots,
    const at::Tensor& table, const at::Tensor& seq, const at::Tensor& pos, const at::Tensor& rows,
    int64_t block_size, at::IntArrayRef windows, int64_t heads, int64_t head_dim, double scale, double eps,
    at::IntArrayRef taps, const c10::optional<at::Tensor>& tree_base, const c10::optional<at::Tensor>& tree_map,
    const c10::optional<at::Tensor>& first_normed, const c10::optional<at::Tensor>& out_rows) {
  const int64_t L = int64_t(k_pools.size()), T = x0.size(0);
  const bool some = out_rows.has_value() && out_rows->defined();
  TORCH_CHECK(!some || (out_rows->scalar_type() == at::kLong && out_rows->dim() == 1 && out_rows->is_contiguous()),
              "peagle::decoder_layers: out_rows must be contiguous int64 [rows]");
  TORCH_CHECK(!some || std::find(taps.begin(), taps.end(), L) == taps.end(),
              "peagle::decoder_layers: the last layer's output is tapped for every row: no out_rows");
  TORCH_CHECK(int64_t(weights.size()) == L * PER_LAYER && int64_t(v_pools.size()) == L && int64_t(windows.size()) == L,
              "peagle::decoder_layers: ", PER_LAYER, " weights, one K pool, V pool and window per layer");
  TORCH_CHECK(x0.dim() == 2 && x0.is_contiguous(), "peagle::decoder_layers: x must be contiguous [rows, hidden]");
  for (int64_t l = 0; l < L; ++l)
    for (int64_t i : {0, 1, 5, 7, 8, 11})  // the norms and matrices (a fused weight's later parts and biases may be None)
      TORCH_CHECK(weights.get(l * PER_LAYER + i).has_value(), "peagle::decoder_layers: weights[", l * PER_LAYER + i,
                  "] (layer ", l, "'s ", i, "th) is None; only the biases and a fused weight's later parts may be");
  TORCH_CHECK(!first_normed || (first_normed->dim() == 2 && first_normed->size(0) == T),
              "peagle::decoder_layers: first_normed must be [rows, width]");
  const at::Tensor c = cos.reshape({T, -1}), s = sin.reshape({T, -1});
  auto w = [&](int64_t l, int64_t i) -> c10::optional<at::Tensor> { return weights.get(l * PER_LAYER + i); };
  auto parts = [&](int64_t l, int64_t i, int64_t n) {  // a fused weight's parts: the first, and those given after it
    std::vector<at::Tensor> out;
    for (int64_t j = 0; j < n; ++j)
      if (const auto t = w(l, i + j); t.has_value() && t->defined()) out.push_back(*t);
    return out;
  };
  std::vector<std::vector<at::Tensor>> qkv_w(L), gate_up_w(L);
  for (int64_t l = 0; l < L; ++l) qkv_w[l] = parts(l, 1, 3), gate_up_w[l] = parts(l, 8, 2);
  std::vector<at::Tensor> tapped(taps.size());
  auto tap = [&](int64_t l, const at::Tensor& x, bool copy) {
    for (size_t i = 0; i < taps.size(); ++i)
      if (taps[i] == l) tapped[i] = copy ? x.clone() : x;
  };
  // every layer's outputs land in the buffers the first one made (the residual stream's in place: a tapped
  // layer's input is copied out), so the layers after it allocate nothing
  at::Tensor x = x0, normed, residual, qkv, att, o, gate_up, act, mlp_out;
  run_team([&] {
    for (int64_t l = 0; l < L; ++l) {
      if (l == 0) {
        normed = first_normed ? first_normed->contiguous() : rms_norm(x, *w(l, 0), eps);
      } else {  // the last layer's residual add, fused into this layer's norm
        add_rms_norm_into(mlp_out, residual, *w(l, 0), eps, normed, residual);
        x = residual;
      }
      tap(l, x, l > 0);
      linear_parts_into(normed, qkv_w[l], w(l, 4), qkv);
      const at::Tensor heads_view = qkv.view({T, -1, head_dim});
      rope_write(heads_view, c, s, heads, k_pools[l], v_pools[l], slots);
      const bool cut = some && l == L - 1;  // from here on the kept rows alone (their attention fills att's rows)
      attention_into(heads_view.narrow(1, 0, heads), k_pools[l], v_pools[l], table, seq, pos, cut ? *out_rows : rows,
                     block_size, windows[l], scale, tree_base, tree_map, att);
      if (cut) {
        att = att.index_select(0, *out_rows);
        x = x.index_select(0, *out_rows);
      }
      linear_into(att, *w(l, 5), w(l, 6), o);
      if (l == 0 && first_normed) normed = at::Tensor();  // (the caller's: layer 0's MLP input is ours)
      add_rms_norm_into(o, x, *w(l, 7), eps, normed, residual);
      linear_parts_into(normed, gate_up_w[l], w(l, 10), gate_up);
      silu_mul_into(gate_up, act);
      linear_into(act, *w(l, 11), w(l, 12), mlp_out);
    }
  });
  x = at::add(residual, mlp_out);
  tap(L, x, false);
  return {x, tapped};
}

// target_pass: a target's whole pass over a step's rows, where decoder_layers takes its layers: the rows
// embedded (GGUF or packed bf16 rows de-quantized, or a float32 table's rows), RoPE's rows of the table,
// the layers (the last one past its KV for the verified rows alone), the taps concatenated, the final norm at the
// verified rows, the LM head and each of those rows' argmax and finiteness. The same operators in the same order
// as LlamaModel.forward and greedy() run them (the same bits: tests/test_fused_passes.py); what it saves is their ~10 Python and dispatcher round trips
// a step, each on caches the weights' stream has just flushed (0.2 ms of a 4.8 ms step on a Zen 4).
// Returns (logits of ``logit_rows``, taps [T, sum of widths], argmax tokens, finite rows).
static std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> target_pass(
    const at::Tensor& ids, const at::Tensor& embed, const c10::List<c10::optional<at::Tensor>>& weights,
    const at::Tensor& cos, const at::Tensor& sin, at::TensorList k_pools, at::TensorList v_pools,
    const at::Tensor& slots, const at::Tensor& table, const at::Tensor& seq, const at::Tensor& pos,
    const at::Tensor& rows, int64_t block_size, at::IntArrayRef windows, int64_t heads, int64_t head_dim,
    double scale, double eps, at::IntArrayRef taps, const c10::optional<at::Tensor>& tree_base,
    const c10::optional<at::Tensor>& tree_map, const at::Tensor& logit_rows, const at::Tensor& norm,
    const at::Tensor& lm_head) {
  TORCH_CHECK(ids.scalar_type() == at::kLong && ids.dim() == 1 && ids.is_contiguous(),
              "peagle::target_pass: ids must be contiguous int64 [rows]");
  TORCH_CHECK(cos.dim() == 2 && sin.dim() == 2, "peagle::target_pass: cos and sin are the RoPE table [n, head_dim]");
  TORCH_CHECK(pos.scalar_type() == at::kLong && pos.dim() == 1 && pos.numel() == ids.numel() && pos.is_contiguous(),
              "peagle::target_pass: pos must be contiguous int64, one per row of ids");
  TORCH_CHECK(logit_rows.scalar_type() == at::kLong && logit_rows.dim() == 1 && logit_rows.is_contiguous(),
              "peagle::target_pass: logit_rows must be contiguous int64 [rows]");
  const int64_t T = ids.numel();
  const int64_t *pp = pos.data_ptr<int64_t>(), *lp = logit_rows.data_ptr<int64_t>(), *ip = ids.data_ptr<int64_t>();
  for (int64_t i = 0; i < T; ++i)
    TORCH_CHECK(0 <= pp[i] && pp[i] < cos.size(0) && cos.size(0) == sin.size(0), "peagle::target_pass: pos[", i, "] = ",
                pp[i], " is past the RoPE table cos/sin (", cos.size(0), " rows)");
  for (int64_t i = 0; i < logit_rows.numel(); ++i)
    TORCH_CHECK(0 <= lp[i] && lp[i] < T, "peagle::target_pass: logit_rows[", i, "] = ", lp[i], " is no row (", T, " rows)");
  if (embed.scalar_type() == at::kFloat)  // (dequantize_rows checks the ids of blocks)
    for (int64_t i = 0; i < T; ++i)
      TORCH_CHECK(0 <= ip[i] && ip[i] < embed.size(0), "peagle::target_pass: ids[", i, "] = ", ip[i],
                  " is no row of the embedding (", embed.size(0), " rows)");
  at::Tensor logits, tapped, tokens, finite;
  run_team([&] {
    at::Tensor x;
    if (embed.scalar_type() == at::kFloat) {  // a float32 table: its rows, as an embedding lookup copies them
      TORCH_CHECK(embed.dim() == 2 && embed.is_contiguous(), "peagle::target_pass: the table must be contiguous");
      x = embed.index_select(0, ids);
    } else {
      x = dequantize_rows(embed, ids);
    }
    // a prompt chunk reads one row's logits: the last layer past its KV for it alone, where no tap wants the rest
    const bool cut = logit_rows.numel() < ids.numel() &&
                     std::find(taps.begin(), taps.end(), int64_t(k_pools.size())) == taps.end();
    auto [out, taken] = decoder_layers(x, weights, cos.index_select(0, pos), sin.index_select(0, pos), k_pools,
                                       v_pools, slots, table, seq, pos, rows, block_size, windows, heads, head_dim,
                                       scale, eps, taps, tree_base, tree_map, c10::nullopt,
                                       cut ? c10::optional<at::Tensor>(logit_rows) : c10::nullopt);
    tapped = taken.empty() ? at::empty({x.size(0), 0}, x.options()) : at::cat(taken, 1);
    logits = linear(rms_norm(cut ? out : out.index_select(0, logit_rows), norm, eps), lm_head, c10::nullopt, "");
    auto [values, best] = argmax_rows(logits);
    tokens = best;
    finite = at::isfinite(values);
  });
  return {logits, tapped, tokens, finite};
}

TORCH_LIBRARY_FRAGMENT(peagle, m) {
  m.def("target_pass(Tensor ids, Tensor embed, Tensor?[] weights, Tensor cos, Tensor sin, Tensor(a!)[] k, "
        "Tensor(b!)[] v, Tensor slots, Tensor table, Tensor seq, Tensor pos, Tensor rows, int block_size, "
        "int[] windows, int heads, int head_dim, float scale, float eps, int[] taps, Tensor? tree_base, "
        "Tensor? tree_map, Tensor logit_rows, Tensor norm, Tensor lm_head) -> (Tensor, Tensor, Tensor, Tensor)");
  m.impl("target_pass", c10::DispatchKey::CPU, TORCH_FN(target_pass));
  m.def("decoder_layers(Tensor x, Tensor?[] weights, Tensor cos, Tensor sin, Tensor(a!)[] k, Tensor(b!)[] v, "
        "Tensor slots, Tensor table, Tensor seq, Tensor pos, Tensor rows, int block_size, int[] windows, int heads, "
        "int head_dim, float scale, float eps, int[] taps, Tensor? tree_base=None, Tensor? tree_map=None, "
        "Tensor? first_normed=None, Tensor? out_rows=None) -> (Tensor, Tensor[])");
  m.impl("decoder_layers", c10::DispatchKey::CPU, TORCH_FN(decoder_layers));
}

}  // namespace peagle
