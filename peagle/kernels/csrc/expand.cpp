// The drafter-batch expansion (peagle/engine/expansion.py states it; expand_torch is its plain-torch form and
// the Triton kernel its CUDA one) as one pass over the requests on the CPU: a decode step's expansion is a
// few rows, and expand_torch's ~30 small torch ops cost more than the drafter's own layer arithmetic there
// (0.13 ms of a K=1 round's 1.07 ms over a plain step).
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <tuple>

#include "ops.h"

namespace peagle {

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> expand(
    const at::Tensor& ids, const at::Tensor& positions, const at::Tensor& cu, const at::Tensor& num_valid,
    const at::Tensor& bonus, int64_t num_masks, int64_t mask_id) {
  const int64_t B = num_valid.numel(), T = ids.numel();
  for (const at::Tensor* t : {&ids, &positions, &cu, &num_valid, &bonus})
    TORCH_CHECK(t->device().is_cpu() && t->scalar_type() == at::kLong && t->dim() == 1 && t->is_contiguous(),
                "peagle::expand: takes contiguous int64 vectors on the CPU");
  TORCH_CHECK(positions.numel() == T && cu.numel() == B + 1 && bonus.numel() == B && num_masks >= 0,
              "peagle::expand: ids/positions [T], cu_num_tokens [B+1], num_valid and bonus [B]");
  const int64_t *id = ids.data_ptr<int64_t>(), *pos = positions.data_ptr<int64_t>(), *c = cu.data_ptr<int64_t>(),
                *nv = num_valid.data_ptr<int64_t>(), *bo = bonus.data_ptr<int64_t>();
  TORCH_CHECK(c[0] == 0 && c[B] == T, "peagle::expand: cu_num_tokens must run from 0 to the row count");
  for (int64_t i = 0; i < B; ++i)  // before any row is written: each request's rows lie in ids
    TORCH_CHECK(c[i] < c[i + 1], "peagle::expand: cu_num_tokens must rise (each request one row or more), got ", c[i],
                " then ", c[i + 1]);
  const int64_t R = T + B * num_masks;
  const auto i64 = ids.options(), flag = ids.options().dtype(at::kBool);
  at::Tensor out_ids = at::empty({R}, i64), out_pos = at::empty({R}, i64), rej = at::empty({R}, flag),
             masked = at::empty({R}, flag), map = at::empty({R}, i64), sample = at::empty({B, num_masks + 1}, i64);
  int64_t *oi = out_ids.data_ptr<int64_t>(), *op = out_pos.data_ptr<int64_t>(), *om = map.data_ptr<int64_t>(),
          *os = sample.data_ptr<int64_t>();
  bool *orj = rej.data_ptr<bool>(), *oms = masked.data_ptr<bool>();
  for (int64_t i = 0; i < B; ++i) {
    const int64_t start = c[i], n = c[i + 1] - start, valid = nv[i], out0 = start + i * num_masks;
    TORCH_CHECK(n >= 1 && 1 <= valid && valid <= n, "peagle::expand: request ", i, " keeps ", valid, " of ", n, " rows");
    for (int64_t j = 0; j < n; ++j) {  // the rows shifted by one token, the bonus at the last kept row
      const int64_t o = out0 + j;
      oi[o] = j == valid - 1 ? bo[i] : j < valid - 1 ? id[start + j + 1] : 0;
      op[o] = pos[start + j];
      orj[o] = j >= valid;
      oms[o] = false;
      om[o] = start + j;
    }
    for (int64_t j = 0; j < num_masks; ++j) {  // mask rows, positions after the bonus
      const int64_t o = out0 + n + j;
      oi[o] = mask_id;
      op[o] = pos[start + valid - 1] + 1 + j;
      orj[o] = false;
      oms[o] = true;
      om[o] = -1;
    }
    os[i * (num_masks + 1)] = out0 + valid - 1;
    for (int64_t j = 0; j < num_masks; ++j) os[i * (num_masks + 1) + 1 + j] = out0 + n + j;
  }
  return {out_ids, out_pos, rej, masked, map, sample};
}

TORCH_LIBRARY_FRAGMENT(peagle, m) {
  m.def("expand(Tensor ids, Tensor positions, Tensor cu, Tensor num_valid, Tensor bonus, int num_masks, int mask_id) "
        "-> (Tensor, Tensor, Tensor, Tensor, Tensor, Tensor)");
  m.impl("expand", c10::DispatchKey::CPU, TORCH_FN(expand));
}

}  // namespace peagle
