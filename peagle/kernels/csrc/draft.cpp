// draft: a P-EAGLE drafting pass of a decode step in one call: the verified batch expanded (expand.cpp), the
// target's taps projected (fc), each row's input ([normed embedding, normed feature], the mask slots' feature
// where masked), the attention layout (each row's KV slot from its sequence's block table; rejected rows
// write the scratch slot), the layers (decoder_layers; the last one past its KV for the sampled rows alone), the
// final norm, the LM head and the argmax at those rows, mapped to target ids. The same operators in the same order
// as ModelRunner.propose's steps (the same bits: tests/test_fused_passes.py); what it saves is their ~25 Python and dispatcher round trips,
// each paid on caches the target's pass has just flushed (0.47 ms of a K=1 round's host work on a Zen 4,
// more than the drafter's own arithmetic).
#include <ATen/core/Tensor.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/index_select.h>
#include <torch/library.h>

#include <cstring>
#include <vector>

#include "ops.h"
#include "team.h"

namespace peagle {

static void check_f32(const at::Tensor& t, int64_t dim, const char* name) {
  TORCH_CHECK(t.device().is_cpu() && t.scalar_type() == at::kFloat && t.dim() == dim && t.is_contiguous(),
              "peagle::draft: ", name, " must be a contiguous float32 tensor of ", dim, " dimensions on the CPU");
}

// Returns the drafts [B, num_masks + 1] as target ids. ``table`` [B, nb]: each sequence's block table (padded);
// ``cos``/``sin`` [n, head_dim]: the drafter's RoPE table, past the largest position; ``num_slots``: the
// pools' scratch slot, where rejected rows write.
static at::Tensor draft(const at::Tensor& ids, const at::Tensor& positions, const at::Tensor& cu,
                        const at::Tensor& num_valid, const at::Tensor& bonus, const at::Tensor& taps, int64_t num_masks,
                        int64_t mask_id, const at::Tensor& fc, const c10::optional<at::Tensor>& fc_bias,
                        const at::Tensor& mask_feature, const at::Tensor& embed, const at::Tensor& input_norm,
                        const at::Tensor& hidden_norm, bool norm_before_residual,
                        const c10::List<c10::optional<at::Tensor>>& weights, const at::Tensor& cos,
                        const at::Tensor& sin, at::TensorList k_pools, at::TensorList v_pools, const at::Tensor& table,
                        int64_t block_size, int64_t num_slots, int64_t heads, int64_t head_dim, double scale,
                        double eps, const at::Tensor& norm, const at::Tensor& lm_head, const at::Tensor& d2t) {
  check_f32(taps, 2, "taps");
  check_f32(embed, 2, "embed");
  check_f32(cos, 2, "cos");
  check_f32(sin, 2, "sin");
  check_f32(mask_feature, 1, "mask_feature");
  const int64_t H = embed.size(1), B = num_valid.numel(), nb = table.size(1);
  TORCH_CHECK(mask_feature.numel() == H && input_norm.numel() == H && hidden_norm.numel() == H && norm.numel() == H,
              "peagle::draft: the mask feature and the norms must have the head's width ", H);
  TORCH_CHECK(table.scalar_type() == at::kLong && table.dim() == 2 && table.size(0) == B && table.is_contiguous(),
              "peagle::draft: table must be contiguous int64 [sequences, blocks]");
  TORCH_CHECK(d2t.scalar_type() == at::kLong && d2t.dim() == 1 && d2t.is_contiguous(), "peagle::draft: d2t must be int64");
  TORCH_CHECK(taps.size(0) == ids.numel(), "peagle::draft: taps has ", taps.size(0), " rows, ids ", ids.numel());
  TORCH_CHECK(!k_pools.empty() && block_size > 0, "peagle::draft: one K and V pool per layer, block_size > 0");
  const int64_t pool_blocks = k_pools[0].size(0) / block_size;
  TORCH_CHECK(0 <= num_slots && num_slots < k_pools[0].size(0), "peagle::draft: num_slots ", num_slots,
              " is no slot of the pools (", k_pools[0].size(0), " slots)");
  const auto [in_ids, pos, rejected, masked, map, sample] = expand(ids, positions, cu, num_valid, bonus, num_masks, mask_id);
  const int64_t R = in_ids.numel(), S = sample.numel();
  const int64_t *ii = in_ids.data_ptr<int64_t>(), *ip = pos.data_ptr<int64_t>();
  for (int64_t r = 0; r < R; ++r) {  // the rows the embedding and the RoPE table give (ids, bonus, mask_id, positions)
    TORCH_CHECK(0 <= ii[r] && ii[r] < embed.size(0), "peagle::draft: token ", ii[r], " (of ids, bonus or mask_id) is no row "
                "of embed (", embed.size(0), " rows)");
    TORCH_CHECK(0 <= ip[r] && ip[r] < cos.size(0) && cos.size(0) == sin.size(0), "peagle::draft: position ", ip[r],
                " (of positions, plus num_masks) is past the RoPE table cos/sin (", cos.size(0), " rows)");
  }
  const int64_t *p = pos.data_ptr<int64_t>(), *m = map.data_ptr<int64_t>(),
                *c = cu.data_ptr<int64_t>(), *tb = table.data_ptr<int64_t>();
  const bool *rj = rejected.data_ptr<bool>(), *ms = masked.data_ptr<bool>();
  const auto i64 = ids.options(), f32 = taps.options();
  at::Tensor out;
  run_team([&] {
    // the rows' features: their target rows' projection, or the mask slots' feature
    const at::Tensor feature = linear(taps, fc, fc_bias, "");
    at::Tensor hidden = at::empty({R, H}, f32);
    float* h = hidden.data_ptr<float>();
    for (int64_t r = 0; r < R; ++r)
      std::memcpy(h + r * H, ms[r] ? mask_feature.data_ptr<float>() : feature.data_ptr<float>() + m[r] * H,
                  H * sizeof(float));
    // layer 0's attention input [normed embedding, normed feature]; its residual the feature (or its norm)
    const at::Tensor f = rms_norm(hidden, hidden_norm, eps);
    const at::Tensor first = at::cat({rms_norm(embed.index_select(0, in_ids), input_norm, eps), f}, 1);
    // where each row sits: its sequence, its KV slot (the scratch slot for a rejected row)
    at::Tensor seq = at::empty({R}, i64), slots = at::empty({R}, i64);
    int64_t *sq = seq.data_ptr<int64_t>(), *sl = slots.data_ptr<int64_t>();
    for (int64_t i = 0; i < B; ++i)
      for (int64_t r = c[i] + i * num_masks; r < c[i + 1] + (i + 1) * num_masks; ++r) {
        const int64_t block = p[r] / block_size;
        TORCH_CHECK(p[r] >= 0 && block < nb, "peagle::draft: position ", p[r], " outside sequence ", i, "'s blocks");
        TORCH_CHECK(0 <= tb[i * nb + block] && tb[i * nb + block] < pool_blocks, "peagle::draft: table[", i, ", ", block,
                    "] = ", tb[i * nb + block], " is no block of the pools (", pool_blocks, " blocks)");
        sq[r] = i;
        sl[r] = rj[r] ? num_slots : tb[i * nb + block] * block_size + p[r] % block_size;
      }
    const std::vector<int64_t> windows(k_pools.size(), 0);
    auto [x, unused] = decoder_layers(norm_before_residual ? f : hidden, weights, cos.index_select(0, pos),
                                      sin.index_select(0, pos), k_pools, v_pools, slots, table, seq, pos,
                                      at::arange(R, i64), block_size, windows, heads, head_dim, scale, eps, {},
                                      c10::nullopt, c10::nullopt, first, sample.view(-1));
    // the drafts: the sampled rows' final norm, LM head and argmax, as target ids (the other rows stopped at
    // their KV: the last layer ran the sampled ones alone)
    const at::Tensor best = std::get<1>(argmax_rows(linear(rms_norm(x, norm, eps), lm_head, c10::nullopt, "")));
    out = at::empty({B, num_masks + 1}, i64);
    const int64_t *b = best.data_ptr<int64_t>(), *off = d2t.data_ptr<int64_t>();
    int64_t* o = out.data_ptr<int64_t>();
    for (int64_t s = 0; s < S; ++s) {
      TORCH_CHECK(b[s] < d2t.numel(), "peagle::draft: the LM head is wider than d2t");
      o[s] = b[s] + off[b[s]];
    }
  });
  return out;
}

TORCH_LIBRARY_FRAGMENT(peagle, m) {
  m.def("draft(Tensor ids, Tensor positions, Tensor cu, Tensor num_valid, Tensor bonus, Tensor taps, int num_masks, "
        "int mask_id, Tensor fc, Tensor? fc_bias, Tensor mask_feature, Tensor embed, Tensor input_norm, "
        "Tensor hidden_norm, bool norm_before_residual, Tensor?[] weights, Tensor cos, Tensor sin, Tensor(a!)[] k, "
        "Tensor(b!)[] v, Tensor table, int block_size, int num_slots, int heads, int head_dim, float scale, "
        "float eps, Tensor norm, Tensor lm_head, Tensor d2t) -> Tensor");
  m.impl("draft", c10::DispatchKey::CPU, TORCH_FN(draft));
}

}  // namespace peagle
