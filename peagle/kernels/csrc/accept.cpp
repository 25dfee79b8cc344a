// Tree verification (peagle/engine/tree.py's accept_paths_torch states it in plain torch, the form CUDA runs)
// as one pass over the batch on the CPU: a verify step's ~20 small torch ops cost 25 us of host work warm,
// about twice that inside a step whose weights have evicted it.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <tuple>
#include <vector>

namespace peagle {

// y, tokens, parents, depths [B, N+1]; lineage [B, N+1, D+1] (int64). Node i is accepted when every node of its
// lineage matched (node 0, the root, always; node j>0 when its token is y at its parent) and it is a real node
// (depth >= 0); the path ends at the first of the deepest accepted nodes. Returns (accepted drafts [B], y at the
// path's end [B], the path's nodes [B, D+1]).
static std::tuple<at::Tensor, at::Tensor, at::Tensor> accept_paths(const at::Tensor& y, const at::Tensor& tokens,
                                                                   const at::Tensor& parents, const at::Tensor& depths,
                                                                   const at::Tensor& lineage) {
  for (const at::Tensor* t : {&y, &tokens, &parents, &depths, &lineage})
    TORCH_CHECK(t->device().is_cpu() && t->scalar_type() == at::kLong && t->is_contiguous(),
                "peagle::accept_paths: takes contiguous int64 tensors on the CPU");
  TORCH_CHECK(y.dim() == 2 && y.size(1) >= 1 && lineage.dim() == 3 && lineage.size(2) >= 1,
              "peagle::accept_paths: y [B, N+1], lineage [B, N+1, D+1]");
  const int64_t B = y.size(0), N1 = y.size(1), D1 = lineage.size(2);
  for (const at::Tensor* t : {&tokens, &parents, &depths})
    TORCH_CHECK(t->dim() == 2 && t->size(0) == B && t->size(1) == N1, "peagle::accept_paths: tokens, parents and "
                "depths are [B, N+1] as y");
  TORCH_CHECK(lineage.size(0) == B && lineage.size(1) == N1, "peagle::accept_paths: lineage is [B, N+1, D+1]");
  const int64_t *yp = y.data_ptr<int64_t>(), *tp = tokens.data_ptr<int64_t>(), *pp = parents.data_ptr<int64_t>(),
                *dp = depths.data_ptr<int64_t>(), *lp = lineage.data_ptr<int64_t>();
  at::Tensor accepted = at::empty({B}, y.options()), token = at::empty({B}, y.options()),
             path = at::empty({B, D1}, y.options());
  int64_t *ap = accepted.data_ptr<int64_t>(), *op = token.data_ptr<int64_t>(), *pa = path.data_ptr<int64_t>();
  std::vector<char> match(N1);
  for (int64_t b = 0; b < B; ++b) {
    const int64_t *yb = yp + b * N1, *tb = tp + b * N1, *pb = pp + b * N1, *db = dp + b * N1, *lb = lp + b * N1 * D1;
    for (int64_t i = 0; i < N1; ++i) {
      TORCH_CHECK(0 <= pb[i] && pb[i] < N1, "peagle::accept_paths: node ", i, "'s parent ", pb[i], " is not a node");
      match[i] = i == 0 || tb[i] == yb[pb[i]];
    }
    int64_t end = 0, best = 0;
    for (int64_t i = 0; i < N1; ++i) {
      bool ok = db[i] >= 0;
      for (int64_t j = 0; j < D1 && ok; ++j) {
        const int64_t a = lb[i * D1 + j];
        TORCH_CHECK(0 <= a && a < N1, "peagle::accept_paths: node ", i, "'s lineage names ", a, ", not a node");
        ok = match[a];
      }
      const int64_t d = ok ? db[i] : -1;
      if (i == 0 || d > best) end = i, best = d;
    }
    ap[b] = best;
    op[b] = yb[end];
    for (int64_t j = 0; j < D1; ++j) pa[b * D1 + j] = lb[end * D1 + j];
  }
  return {accepted, token, path};
}

TORCH_LIBRARY_FRAGMENT(peagle, m) {
  m.def("accept_paths(Tensor y, Tensor tokens, Tensor parents, Tensor depths, Tensor lineage) -> (Tensor, Tensor, Tensor)");
  m.impl("accept_paths", c10::DispatchKey::CPU, TORCH_FN(accept_paths));
}

}  // namespace peagle
