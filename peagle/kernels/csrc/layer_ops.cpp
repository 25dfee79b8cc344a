// The small operations of a decoder layer, one pass over the data each instead of torch's five to ten
// eager ops: rms_norm (optionally fused with the residual add), silu_mul (SwiGLU), rope_write (RoPE on q
// and k in place, k and v into the paged cache), move_rows (KV rows between slots of every layer). Elementwise arithmetic is the same IEEE operations on
// every CPU; rms_norm's sum of squares goes in eight fixed lanes (norm_row, kernels.h). Each row on its own: batch-invariant.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <tuple>
#include <utility>
#include <vector>

#include "kernels.h"
#include "ops.h"
#include "team.h"

namespace peagle {


static void check_rows(const at::Tensor& x, const char* op) {
  TORCH_CHECK(x.device().is_cpu() && x.scalar_type() == at::kFloat && x.dim() == 2 && x.is_contiguous(),
              "peagle::", op, ": expects a contiguous float32 [rows, n] tensor on the CPU");
}

static void check_weight(const at::Tensor& w, int64_t n) {
  TORCH_CHECK(w.scalar_type() == at::kFloat && w.is_contiguous() && w.numel() == n, "peagle::rms_norm: weight must be float32 [n]");
}

// An output the caller holds, (re)made where it does not fit ``shape``.
static void fit(at::Tensor& out, at::IntArrayRef shape, const at::Tensor& like) {
  if (!fits(out, c10::multiply_integers(shape)) || out.sizes() != shape) out = at::empty(shape, like.options());
}

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& w, double eps) {
  at::Tensor y;
  rms_norm_into(x, w, eps, y);
  return y;
}

void rms_norm_into(const at::Tensor& x, const at::Tensor& w, double eps, at::Tensor& y) {
  check_rows(x, "rms_norm");
  const int64_t T = x.size(0), n = x.size(1);
  check_weight(w, n);
  fit(y, x.sizes(), x);
  const float *xp = x.data_ptr<float>(), *wp = w.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  const NormRow norm_row = peagle::norm_row();
  parallel_for(0, T, row_grain(), [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) norm_row(xp + t * n, wp, float(eps), n, yp + t * n);
  });
}

// h = x + residual, and rms_norm(h): the residual add before a layer's second norm, fused.
std::tuple<at::Tensor, at::Tensor> add_rms_norm(const at::Tensor& x, const at::Tensor& residual,
                                                       const at::Tensor& w, double eps) {
  at::Tensor y, h;
  add_rms_norm_into(x, residual, w, eps, y, h);
  return {y, h};
}

// (h may be residual itself: each element is read before it is written)
void add_rms_norm_into(const at::Tensor& x, const at::Tensor& residual, const at::Tensor& w, double eps,
                       at::Tensor& y, at::Tensor& h) {
  check_rows(x, "add_rms_norm");
  check_rows(residual, "add_rms_norm");
  const int64_t T = x.size(0), n = x.size(1);
  TORCH_CHECK(residual.sizes() == x.sizes(), "peagle::add_rms_norm: x and residual differ in shape");
  check_weight(w, n);
  fit(y, x.sizes(), x);
  fit(h, x.sizes(), x);
  const float *xp = x.data_ptr<float>(), *rp = residual.data_ptr<float>(), *wp = w.data_ptr<float>();
  float *yp = y.data_ptr<float>(), *hp = h.data_ptr<float>();
  const NormRow norm_row = peagle::norm_row();
  parallel_for(0, T, row_grain(), [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      for (int64_t i = 0; i < n; ++i) hp[t * n + i] = rp[t * n + i] + xp[t * n + i];
      norm_row(hp + t * n, wp, float(eps), n, yp + t * n);
    }
  });
}

// [rows, 2n] (gate | up) -> [rows, n]: silu(gate) * up.
at::Tensor silu_mul(const at::Tensor& gu) {
  at::Tensor out;
  silu_mul_into(gu, out);
  return out;
}

void silu_mul_into(const at::Tensor& gu, at::Tensor& out) {
  check_rows(gu, "silu_mul");
  TORCH_CHECK(gu.size(1) % 2 == 0, "peagle::silu_mul: gate_up's width ", gu.size(1), " is odd (gate | up)");
  const int64_t T = gu.size(0), n = gu.size(1) / 2;
  fit(out, {T, n}, gu);
  const float* g = gu.data_ptr<float>();
  float* o = out.data_ptr<float>();
  const SiluRows rows = silu_rows();
  // a row a task: a verify pass's few rows share out
  parallel_for(0, T, 1, [&](int64_t t0, int64_t t1) { rows(g, o, n, t0, t1); });
}

static constexpr int64_t MAX_ROPE_DIM = 512;  // rope_write's row buffer

// qkv [rows, H + 2 Hkv, d]: RoPE (HF's rotate-half: x * cos + rotate_half(x) * sin, as three rounded
// operations like torch's eager ops) on the H query and Hkv key heads in place, then keys and values
// into the pools [slots, Hkv, d] at ``slots[row]`` (float32, or float16 rounded to nearest even). Rows naming one
// slot (the engine sends every row that keeps nothing to the pools' scratch slot) leave the last one's keys
// there, as index_copy_ in row order would, and no two threads write it: concurrent writes of one slot were a
// data race (ThreadSanitizer, docs/exactness.md), harmless only because nothing reads the scratch slot.
void rope_write(const at::Tensor& qkv, const at::Tensor& cos, const at::Tensor& sin, int64_t H,
                       const at::Tensor& k_pool, const at::Tensor& v_pool, const at::Tensor& slots) {
  TORCH_CHECK(qkv.scalar_type() == at::kFloat && qkv.dim() == 3 && qkv.is_contiguous(), "peagle::rope_write: qkv must be contiguous float32 [rows, heads, d]");
  const int64_t T = qkv.size(0), heads = qkv.size(1), d = qkv.size(2), Hkv = (heads - H) / 2, half = d / 2;
  TORCH_CHECK(H >= 1 && Hkv >= 1 && H + 2 * Hkv == heads && d % 2 == 0,
              "peagle::rope_write: heads (", heads, ") do not split into H (", H, ") + 2 Hkv, Hkv >= 1");
  TORCH_CHECK(d <= MAX_ROPE_DIM, "peagle::rope_write: head_dim ", d, " is over ", MAX_ROPE_DIM);
  TORCH_CHECK(cos.is_contiguous() && sin.is_contiguous() && cos.numel() == T * d && sin.numel() == T * d &&
              cos.scalar_type() == at::kFloat && sin.scalar_type() == at::kFloat, "peagle::rope_write: cos/sin must be float32 [rows, d]");
  TORCH_CHECK(k_pool.is_contiguous() && v_pool.is_contiguous() && (k_pool.scalar_type() == at::kFloat || k_pool.scalar_type() == at::kHalf) &&
              v_pool.scalar_type() == k_pool.scalar_type() && k_pool.dim() == 3 && v_pool.sizes() == k_pool.sizes() &&
              k_pool.size(1) == Hkv && k_pool.size(2) == d,
              "peagle::rope_write: pools must be contiguous [slots, Hkv, d], both float32 or both float16");
  TORCH_CHECK(slots.scalar_type() == at::kLong && slots.is_contiguous() && slots.numel() == T, "peagle::rope_write: one int64 slot per row");
  float* x = qkv.data_ptr<float>();
  const float *c = cos.data_ptr<float>(), *s = sin.data_ptr<float>();
  const bool half_pools = k_pool.scalar_type() == at::kHalf;
  const int64_t* sl = slots.data_ptr<int64_t>();
  const int64_t nslots = k_pool.size(0);
  for (int64_t t = 0; t < T; ++t)  // before anything is written: a bad slot leaves qkv and the pools as they were
    TORCH_CHECK(sl[t] >= 0 && sl[t] < nslots, "peagle::rope_write: slots[", t, "] = ", sl[t], " is no slot of the pools (",
                nslots, " slots)");
  // writes: whether a row's keys go to the pools; named: a slot a later row takes (all clear between calls)
  static thread_local std::vector<uint8_t> named, writes;
  named.resize(size_t(std::max<int64_t>(int64_t(named.size()), nslots)));
  writes.resize(size_t(T));
  for (int64_t t = T - 1; t >= 0; --t) writes[t] = !std::exchange(named[sl[t]], 1);
  for (int64_t t = 0; t < T; ++t) named[sl[t]] = 0;
  const uint8_t* keeps = writes.data();  // the caller's: a thread_local named in the lambda is each thread's own
  const HalfRow to_half = half_row();
  parallel_for(0, T, row_grain(), [&](int64_t t0, int64_t t1) {
    float tmp[MAX_ROPE_DIM];
    for (int64_t t = t0; t < t1; ++t) {
      const float *ct = c + t * d, *st = s + t * d;
      for (int64_t hh = 0; hh < H + Hkv; ++hh) {
        float* v = x + (t * heads + hh) * d;
        for (int64_t i = 0; i < half; ++i) {
          tmp[i] = v[i] * ct[i] + (-v[i + half]) * st[i];
          tmp[i + half] = v[i + half] * ct[i + half] + v[i] * st[i + half];
        }
        std::copy(tmp, tmp + d, v);
      }
      if (!keeps[t]) continue;
      const int64_t slot = sl[t];
      const float *kx = x + (t * heads + H) * d, *vx = kx + Hkv * d;
      if (half_pools) {  // rounded to nearest even, as torch's .to(float16)
        to_half(kx, reinterpret_cast<uint16_t*>(k_pool.data_ptr<c10::Half>()) + slot * Hkv * d, Hkv * d);
        to_half(vx, reinterpret_cast<uint16_t*>(v_pool.data_ptr<c10::Half>()) + slot * Hkv * d, Hkv * d);
      } else {
        std::copy(kx, kx + Hkv * d, k_pool.data_ptr<float>() + slot * Hkv * d);
        std::copy(vx, vx + Hkv * d, v_pool.data_ptr<float>() + slot * Hkv * d);
      }
    }
  });
}

// Each row's largest value and the first index holding it (torch's max over the last dimension), NaN as
// the value of a row holding a NaN or an infinity: the greedy token and the engine's finiteness check in one
// pass a row (torch's argmax and isfinite take ~20x as long on a verify pass's logits).
std::tuple<at::Tensor, at::Tensor> argmax_rows(const at::Tensor& x) {
  check_rows(x, "argmax");
  const int64_t T = x.size(0), n = x.size(1);
  TORCH_CHECK(n > 0, "peagle::argmax: empty rows");
  at::Tensor values = at::empty({T}, x.options()), indices = at::empty({T}, x.options().dtype(at::kLong));
  const float* p = x.data_ptr<float>();
  float* vp = values.data_ptr<float>();
  int64_t* ip = indices.data_ptr<int64_t>();
  const ArgmaxRow row = argmax_row();
  parallel_for(0, T, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) row(p + t * n, n, vp + t, ip + t);
  });
  return {values, indices};
}

// Rows src[i] -> dst[i] of every pool (a tree's accepted path moved to where a chain's KV sits, in all the
// layers' K and V pools in one call): each pool's rows are all read before any is written, so a
// destination that is also a source is read first.
static void move_rows(at::TensorList pools, const at::Tensor& src, const at::Tensor& dst) {
  TORCH_CHECK(src.scalar_type() == at::kLong && dst.scalar_type() == at::kLong && src.is_contiguous() &&
                  dst.is_contiguous() && src.numel() == dst.numel(),
              "peagle::move_rows: src and dst must be contiguous int64 of one length");
  const int64_t n = src.numel();
  const int64_t* s = src.data_ptr<int64_t>();
  const int64_t* d = dst.data_ptr<int64_t>();
  for (const at::Tensor& p : pools) {  // every pool checked before any is written: a bad call moves nothing
    TORCH_CHECK(p.device().is_cpu() && p.is_contiguous() && p.dim() >= 1, "peagle::move_rows: pools must be contiguous CPU tensors");
    for (int64_t i = 0; i < n; ++i)
      TORCH_CHECK(0 <= s[i] && s[i] < p.size(0) && 0 <= d[i] && d[i] < p.size(0), "peagle::move_rows: src[", i, "] = ",
                  s[i], " or dst[", i, "] = ", d[i], " is no row of the pools (", p.size(0), " rows)");
  }
  std::vector<char> tmp;
  for (const at::Tensor& p : pools) {
    const int64_t rows = p.size(0), row_bytes = p.numel() / std::max<int64_t>(rows, 1) * int64_t(p.element_size());
    char* base = static_cast<char*>(p.data_ptr());
    tmp.resize(size_t(n * row_bytes));
    for (int64_t i = 0; i < n; ++i) std::memcpy(tmp.data() + i * row_bytes, base + s[i] * row_bytes, size_t(row_bytes));
    for (int64_t i = 0; i < n; ++i) std::memcpy(base + d[i] * row_bytes, tmp.data() + i * row_bytes, size_t(row_bytes));
  }
}

TORCH_LIBRARY_FRAGMENT(peagle, m) {
  m.def("move_rows(Tensor(a!)[] pools, Tensor src, Tensor dst) -> ()");
  m.def("argmax(Tensor x) -> (Tensor, Tensor)");
  m.impl("argmax", c10::DispatchKey::CPU, TORCH_FN(argmax_rows));
  m.impl("move_rows", c10::DispatchKey::CPU, TORCH_FN(move_rows));
  m.def("rms_norm(Tensor x, Tensor w, float eps) -> Tensor");
  m.def("add_rms_norm(Tensor x, Tensor residual, Tensor w, float eps) -> (Tensor, Tensor)");
  m.def("silu_mul(Tensor gate_up) -> Tensor");
  m.def("rope_write(Tensor(a!) qkv, Tensor cos, Tensor sin, int heads, Tensor(b!) k, Tensor(c!) v, Tensor slots) -> ()");
  m.impl("rms_norm", c10::DispatchKey::CPU, TORCH_FN(rms_norm));
  m.impl("add_rms_norm", c10::DispatchKey::CPU, TORCH_FN(add_rms_norm));
  m.impl("silu_mul", c10::DispatchKey::CPU, TORCH_FN(silu_mul));
  m.impl("rope_write", c10::DispatchKey::CPU, TORCH_FN(rope_write));
}

}  // namespace peagle
