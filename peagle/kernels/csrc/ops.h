// The operators' C++ entry points (the widest path this CPU has), for the operators built from them
// (decoder_layers): each checks its arguments and splits its work over torch's threads, as when
// called from Python.
#pragma once
#include <ATen/core/Tensor.h>
#include <c10/util/Optional.h>
#include <c10/util/string_view.h>

#include <ATen/core/List.h>

#include <tuple>
#include <vector>

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
// A fused weight given as parts of their own formats, each filling its columns of y (ops.cpp).
void linear_parts_into(const at::Tensor& x, at::TensorList parts, const c10::optional<at::Tensor>& bias, at::Tensor& y);
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
// rows ``ids`` of GGUF blocks or a packed bf16 matrix, in float32 (ops.cpp)
at::Tensor dequantize_rows(const at::Tensor& blocks, const at::Tensor& ids);
// (values, indices) of each row's maximum, the first of equal ones (layer_ops.cpp)
std::tuple<at::Tensor, at::Tensor> argmax_rows(const at::Tensor& x);
// the drafter's batch from the verified one (expand.cpp): ids, positions, rejected, masked, hidden map, sample rows
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> expand(
    const at::Tensor& ids, const at::Tensor& positions, const at::Tensor& cu, const at::Tensor& num_valid,
    const at::Tensor& bonus, int64_t num_masks, int64_t mask_id);
// a stack of Llama-style layers in one call (stack.cpp)
std::tuple<at::Tensor, std::vector<at::Tensor>> decoder_layers(
    const at::Tensor& x0, const c10::List<c10::optional<at::Tensor>>& weights, const at::Tensor& cos,
    const at::Tensor& sin, at::TensorList k_pools, at::TensorList v_pools, const at::Tensor& slots,
    const at::Tensor& table, const at::Tensor& seq, const at::Tensor& pos, const at::Tensor& rows,
    int64_t block_size, at::IntArrayRef windows, int64_t heads, int64_t head_dim, double scale, double eps,
    at::IntArrayRef taps, const c10::optional<at::Tensor>& tree_base, const c10::optional<at::Tensor>& tree_map,
    const c10::optional<at::Tensor>& first_normed, const c10::optional<at::Tensor>& out_rows);

}  // namespace peagle
