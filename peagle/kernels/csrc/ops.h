// The operators' C++ entry points (the widest path this CPU has), for the operators built from them
// (decoder_layers): each checks its arguments and splits its work over torch's threads, as when
// called from Python.
#pragma once
#include <ATen/core/Tensor.h>
#include <c10/util/Optional.h>
#include <c10/util/string_view.h>

#include <tuple>

namespace peagle {

at::Tensor linear(const at::Tensor& x, const at::Tensor& w, const c10::optional<at::Tensor>& bias, c10::string_view isa);
at::Tensor attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& table,
                     const at::Tensor& seq, const at::Tensor& pos, const at::Tensor& rows, int64_t block_size,
                     int64_t window, double scale, const c10::optional<at::Tensor>& sinks, c10::string_view isa,
                     const c10::optional<at::Tensor>& tree_base, const c10::optional<at::Tensor>& tree_map);
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& w, double eps);
// The same into outputs the caller holds (decoder_layers' buffers, made by the first layer and filled again by
// the next: a step's ~400 allocations saved), each (re)made where it does not fit. The same bits.
inline bool fits(const at::Tensor& out, int64_t numel) {
  return out.defined() && out.scalar_type() == at::kFloat && out.is_contiguous() && out.numel() == numel;
}
void linear_into(const at::Tensor& x, const at::Tensor& w, const c10::optional<at::Tensor>& bias, at::Tensor& y);
void attention_into(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& table,
                    const at::Tensor& seq, const at::Tensor& pos, const at::Tensor& rows, int64_t block_size,
                    int64_t window, double scale, const c10::optional<at::Tensor>& tree_base,
                    const c10::optional<at::Tensor>& tree_map, at::Tensor& out);
void rms_norm_into(const at::Tensor& x, const at::Tensor& w, double eps, at::Tensor& y);
void add_rms_norm_into(const at::Tensor& x, const at::Tensor& residual, const at::Tensor& w, double eps,
                       at::Tensor& y, at::Tensor& h);
void silu_mul_into(const at::Tensor& gu, at::Tensor& out);
std::tuple<at::Tensor, at::Tensor> add_rms_norm(const at::Tensor& x, const at::Tensor& residual, const at::Tensor& w,
                                                double eps);
at::Tensor silu_mul(const at::Tensor& gu);
void rope_write(const at::Tensor& qkv, const at::Tensor& cos, const at::Tensor& sin, int64_t H,
                const at::Tensor& k_pool, const at::Tensor& v_pool, const at::Tensor& slots);

}  // namespace peagle
