// scaled_dot_product_attention on neuron: the PrivateUse1 "overrideable"
// fused path. The choice asks the host (CPU) flash-attention constraints and,
// where they hold, routes SDPA to the fused kernels below; otherwise it
// returns the math path, which decomposes into device ops. A single query
// position (decode) takes a direct kernel instead (DecodeAttention.h).
//
// F.scaled_dot_product_attention does not call the aten::_fused_sdp_choice
// op: it calls _fused_sdp_choice_stub for the query's device type, so the
// choice is registered both as the op (for direct callers) and as the
// PrivateUse1 stub (for SDPA itself).
#include <ATen/ATen.h>
#include <ATen/SDPBackend.h>
#include <ATen/TensorUtils.h>
#include <ATen/native/transformers/attention.h>
#include <ATen/ops/_fused_sdp_choice_native.h>
#include <torch/library.h>

#include <cmath>

#include "DecodeAttention.h"
#include "HostExecution.h"
#include "OpTracking.h"

namespace at::neuron {
namespace {

// A CPU tensor with t's metadata and no memory. The CPU choice reads only
// metadata, but some of its checks depend on the device (a mask strided in
// its last dimension suits the CPU kernel only on CPU tensors), so it is asked
// about CPU stand-ins: the same answer for eager and for traced tensors.
at::Tensor cpu_stand_in(const at::Tensor& t) {
  c10::Storage storage(c10::Storage::use_byte_size_t(), 0, c10::DataPtr(nullptr, c10::Device(c10::kCPU)), nullptr,
                       false);
  auto out = at::detail::make_tensor<c10::TensorImpl>(std::move(storage), c10::DispatchKeySet(c10::DispatchKey::CPU),
                                                      t.dtype());
  out.unsafeGetTensorImpl()->set_sizes_and_strides(t.sizes(), t.strides());
  if (t.requires_grad()) out.set_requires_grad(true);
  return out;
}

int64_t fused_sdp_choice(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                         const std::optional<at::Tensor>& attn_mask, double dropout_p, bool is_causal,
                         std::optional<double> scale, bool enable_gqa) {
  // Conjugate/negative views would need materializing first: the math path.
  for (const at::Tensor* t : {&q, &k, &v}) {
    if (t->is_neg() || t->is_conj()) return static_cast<int64_t>(at::SDPBackend::math);
  }
  int64_t choice;
  bool symbolic = false;
  for (const at::Tensor* t : {&q, &k, &v, attn_mask ? &*attn_mask : nullptr}) {
    symbolic = symbolic || (t && t->unsafeGetTensorImpl()->has_symbolic_sizes_strides());
  }
  if (symbolic) {
    // Traced with dynamic shapes: the checks read symbolic sizes as they are.
    choice = at::native::_fused_sdp_choice_cpp(q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa);
  } else {
    choice = at::native::_fused_sdp_choice_cpp(
        cpu_stand_in(q), cpu_stand_in(k), cpu_stand_in(v),
        attn_mask ? std::optional<at::Tensor>(cpu_stand_in(*attn_mask)) : std::nullopt, dropout_p, is_causal, scale,
        enable_gqa);
  }
  // The fused kernel has no dropout RNG of its own. Grouped-query attention
  // (fewer key/value heads) is fine: the CPU flash kernel maps heads itself.
  bool fused = choice == static_cast<int64_t>(at::SDPBackend::flash_attention) && dropout_p == 0.0;
  return static_cast<int64_t>(fused ? at::SDPBackend::overrideable : at::SDPBackend::math);
}

// The layout the meta kernels promise (Inductor plans buffers from them and
// checks fallback outputs): empty_like(like)'s, i.e. `like`'s dimension order,
// densely packed.
std::vector<int64_t> dense_strides_of(const at::Tensor& like) {
  return like.is_non_overlapping_and_dense() ? like.strides().vec()
                                             : at::infer_dense_strides(like.sizes(), like.strides());
}

at::Tensor with_layout_of(const at::Tensor& t, const at::Tensor& like) {
  TORCH_INTERNAL_ASSERT(t.sizes() == like.sizes());
  auto strides = dense_strides_of(like);
  if (t.strides() == c10::IntArrayRef(strides)) return t;
  auto out = at::empty_strided(t.sizes(), strides, t.options());
  out.copy_(t);
  return out;
}

// The host flash kernels under their own names: C++ wrappers (AOTI models)
// call them in place of the fused ops (torch_neuronx/_inductor_attention.py).
std::tuple<at::Tensor, at::Tensor> flash_attention_for_host(const at::Tensor& q, const at::Tensor& k,
                                                            const at::Tensor& v, double dropout_p, bool is_causal,
                                                            const std::optional<at::Tensor>& attn_mask,
                                                            std::optional<double> scale) {
  auto out = host_call("aten::_scaled_dot_product_flash_attention_for_cpu", "",
                       {q, k, v, dropout_p, is_causal, attn_mask ? c10::IValue(*attn_mask) : c10::IValue(), scale});
  return {out[0].toTensor(), out[1].toTensor()};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> flash_attention_for_host_backward(
    const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& out,
    const at::Tensor& logsumexp, double dropout_p, bool is_causal, const std::optional<at::Tensor>& attn_mask,
    std::optional<double> scale) {
  auto grads = host_call("aten::_scaled_dot_product_flash_attention_for_cpu_backward", "",
                         {grad_out, q, k, v, out, logsumexp, dropout_p, is_causal,
                          attn_mask ? c10::IValue(*attn_mask) : c10::IValue(), scale});
  return {grads[0].toTensor(), grads[1].toTensor(), grads[2].toTensor()};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, c10::SymInt, c10::SymInt, at::Tensor, at::Tensor,
           at::Tensor>
fused_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const std::optional<at::Tensor>& bias,
                double dropout_p, bool is_causal, bool return_debug_mask, std::optional<double> scale) {
  TORCH_CHECK(dropout_p == 0.0, "neuron fused attention has no dropout; use the math path");
  at::Tensor out, logsumexp;
  if (decode_attention_applies(q, k, v, bias, is_causal)) {
    out = at::empty_strided(q.sizes(), dense_strides_of(q), q.options());
    logsumexp = at::empty({q.size(0), q.size(1), 1}, q.options().dtype(at::kFloat));
    decode_attention(q, k, v, bias, scale ? *scale : 1.0 / std::sqrt(static_cast<double>(q.size(-1))), out,
                     logsumexp);
  } else {
    std::tie(out, logsumexp) = flash_attention_for_host(q, k, v, dropout_p, is_causal, bias, scale);
  }
  auto empty = at::empty({0}, q.options());
  auto empty_i64 = at::empty({0}, q.options().dtype(at::kLong));
  auto seed = at::empty({}, q.options().dtype(at::kLong));
  return {with_layout_of(out, q), logsumexp.contiguous(), empty_i64, empty_i64,
          c10::SymInt(q.size(-2)), c10::SymInt(k.size(-2)), seed, seed, empty};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> fused_attention_backward(
    const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
    const at::Tensor& bias, std::array<bool, 4> grad_input_mask, const at::Tensor& out, const at::Tensor& logsumexp,
    const at::Tensor&, const at::Tensor&, c10::SymInt, c10::SymInt, double dropout_p, bool is_causal,
    const at::Tensor&, const at::Tensor&, std::optional<double> scale) {
  TORCH_CHECK(!grad_input_mask[3], "neuron fused attention does not compute gradients of attn_mask");
  auto [dq, dk, dv] = flash_attention_for_host_backward(
      grad_out, q, k, v, out, logsumexp, dropout_p, is_causal,
      bias.defined() ? std::optional<at::Tensor>(bias) : std::nullopt, scale);
  return {with_layout_of(dq, q), with_layout_of(dk, k), with_layout_of(dv, v), at::Tensor()};
}

// The flash-attention op itself, as CUDA offers it (callers that need the
// log-sum-exp, e.g. Diffusers' ring attention, call it directly): the CPU
// flash kernel, whose logsumexp has the same [B, H, L] layout.
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, c10::SymInt, c10::SymInt, at::Tensor, at::Tensor,
           at::Tensor>
flash_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double dropout_p, bool is_causal,
                bool return_debug_mask, std::optional<double> scale) {
  return fused_attention(q, k, v, std::nullopt, dropout_p, is_causal, return_debug_mask, scale);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> flash_attention_backward(
    const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& out,
    const at::Tensor& logsumexp, const at::Tensor&, const at::Tensor&, c10::SymInt, c10::SymInt, double dropout_p,
    bool is_causal, const at::Tensor&, const at::Tensor&, std::optional<double> scale) {
  TORCH_CHECK(dropout_p == 0.0, "neuron flash attention has no dropout");
  return flash_attention_for_host_backward(grad_out, q, k, v, out, logsumexp, dropout_p, is_causal, std::nullopt,
                                           scale);
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("_scaled_dot_product_flash_attention_for_cpu_backward",
         &Noted<at::_ops::_scaled_dot_product_flash_attention_for_cpu_backward, flash_attention_for_host_backward>::call);
  m.impl("_scaled_dot_product_flash_attention_for_cpu",
         &Noted<at::_ops::_scaled_dot_product_flash_attention_for_cpu, flash_attention_for_host>::call);
  m.impl("_scaled_dot_product_flash_attention",
         &Noted<at::_ops::_scaled_dot_product_flash_attention, flash_attention>::call);
  m.impl("_scaled_dot_product_flash_attention_backward",
         &Noted<at::_ops::_scaled_dot_product_flash_attention_backward, flash_attention_backward>::call);
  m.impl("_fused_sdp_choice", &Noted<at::_ops::_fused_sdp_choice, fused_sdp_choice>::call);
  m.impl("_scaled_dot_product_fused_attention_overrideable",
         &Noted<at::_ops::_scaled_dot_product_fused_attention_overrideable, fused_attention>::call);
  m.impl("_scaled_dot_product_fused_attention_overrideable_backward",
         &Noted<at::_ops::_scaled_dot_product_fused_attention_overrideable_backward, fused_attention_backward>::call);
}

}  // namespace at::neuron

namespace at::native {
REGISTER_PRIVATEUSE1_DISPATCH(_fused_sdp_choice_stub, &at::neuron::fused_sdp_choice)
}  // namespace at::native
