// ATen ops that PyTorch implements for accelerators (CUDA, XPU, MPS) but not
// for the CPU: the host fallback has no CPU kernel to run for them, so they
// get neuron kernels here, written as ATen ops on device tensors (which run on
// neuron through the device kernel table). tools/sweep_accelerator_only_ops.py
// lists every such op and which file covers it. Their autograd formulas are
// PyTorch's: these kernels sit below the Autograd key.
#include <ATen/ATen.h>
#include <ATen/native/Resize.h>
#include <torch/library.h>

#include "OpTracking.h"

namespace at::neuron {
namespace {

// ---- linear_backward (MPS) --------------------------------------------------

// The leading dimensions of `t` as rows: [..., n] -> [rows, n].
at::Tensor as_rows(const at::Tensor& t) {
  return t.dim() == 1 ? t.unsqueeze(0) : t.flatten(0, -2);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> linear_backward(const at::Tensor& input, const at::Tensor& grad_output,
                                                               const at::Tensor& weight,
                                                               std::array<bool, 3> output_mask) {
  TORCH_CHECK(input.dim() >= 1 && grad_output.dim() == input.dim(),
              "linear_backward: input and grad_output must have the same number (>= 1) of dimensions, got ",
              input.sizes(), " and ", grad_output.sizes());
  TORCH_CHECK(weight.dim() == 2 && weight.size(0) == grad_output.size(-1) && weight.size(1) == input.size(-1),
              "linear_backward: weight of shape ", weight.sizes(), " does not map input ", input.sizes(),
              " to grad_output ", grad_output.sizes());
  at::Tensor grad_input, grad_weight, grad_bias;
  if (output_mask[0]) grad_input = at::matmul(grad_output, weight);
  if (output_mask[1]) grad_weight = as_rows(grad_output).t().mm(as_rows(input));
  if (output_mask[2]) grad_bias = as_rows(grad_output).sum(0);
  return {grad_input, grad_weight, grad_bias};
}

// ---- out= forms -------------------------------------------------------------

// The out= form of functional kernel `fn`, noted as op `Op`: fn's result
// copied into `out`, which is resized as out= ops resize. kExactDtype: `out`
// must have the result's dtype, where the copy would otherwise convert.
template <class Op, auto fn, bool kExactDtype = false>
struct OutOf;
template <class Op, class... Args, at::Tensor (*fn)(Args...), bool kExactDtype>
struct OutOf<Op, fn, kExactDtype> {
  static at::Tensor& call(Args... args, at::Tensor& out) {
    note_executed(Op::name);
    at::Tensor result = fn(args...);
    TORCH_CHECK(!kExactDtype || out.scalar_type() == result.scalar_type(), Op::name + 6 /* past "aten::" */,
                ": expected out of dtype ", result.scalar_type(), ", got ", out.scalar_type());
    at::native::resize_output(out, result.sizes());
    return out.copy_(result);
  }
};

// ---- matmuls with an output dtype (CUDA, XPU) -------------------------------

// CUDA's rule: the inputs' dtype, or float32 from float16/bfloat16. The
// product of upcast inputs is what those kernels compute (fp32 accumulation).
void check_out_dtype(const char* op, const at::Tensor& a, const at::Tensor& b, at::ScalarType out_dtype) {
  TORCH_CHECK(a.scalar_type() == b.scalar_type(), op, ": expected both matrices to have the same dtype, got ",
              a.scalar_type(), " and ", b.scalar_type());
  TORCH_CHECK(out_dtype == a.scalar_type() ||
                  (out_dtype == at::kFloat && (a.scalar_type() == at::kHalf || a.scalar_type() == at::kBFloat16)),
              op, ": out_dtype must be the same as input dtype or fp32 for fp16/bf16 inputs, got ", out_dtype,
              " for ", a.scalar_type(), " inputs");
}

// mm.dtype, bmm.dtype: Op (at::_ops::mm, bmm) on the upcast inputs.
template <class Op>
at::Tensor mm_dtype(const at::Tensor& self, const at::Tensor& mat2, at::ScalarType out_dtype) {
  check_out_dtype(Op::name + 6, self, mat2, out_dtype);
  return Op::call(self.to(out_dtype), mat2.to(out_dtype));
}

// addmm.dtype, baddbmm.dtype: Op (at::_ops::addmm, baddbmm) on the upcast inputs.
template <class Op>
at::Tensor addmm_dtype(const at::Tensor& self, const at::Tensor& mat1, const at::Tensor& mat2,
                       at::ScalarType out_dtype, const at::Scalar& beta, const at::Scalar& alpha) {
  check_out_dtype(Op::name + 6, mat1, mat2, out_dtype);
  return Op::call(self.to(out_dtype), mat1.to(out_dtype), mat2.to(out_dtype), beta, alpha);
}

// ---- _fused_rms_norm_backward (CUDA, XPU) ------------------------------------

// The gradients of y = x * rstd * weight over the trailing normalized
// dimensions, in float32 for reduced-precision inputs, returned in the input's
// dtype (torch._decomp's reference).
std::tuple<at::Tensor, at::Tensor> fused_rms_norm_backward(const at::Tensor& grad_out, const at::Tensor& input,
                                                           at::IntArrayRef normalized_shape, const at::Tensor& rstd,
                                                           const std::optional<at::Tensor>& weight,
                                                           std::array<bool, 2> output_mask) {
  const int64_t axis = input.dim() - static_cast<int64_t>(normalized_shape.size());
  TORCH_CHECK(axis >= 0 && input.sizes().slice(axis) == normalized_shape,
              "_fused_rms_norm_backward: normalized_shape ", normalized_shape,
              " is not the trailing shape of the input ", input.sizes());
  TORCH_CHECK(grad_out.sizes() == input.sizes(), "_fused_rms_norm_backward: grad_out of shape ", grad_out.sizes(),
              " for input of shape ", input.sizes());
  const bool has_weight = weight && weight->defined();
  const auto dtype = at::isReducedFloatingType(input.scalar_type()) ? at::kFloat : input.scalar_type();
  std::vector<int64_t> inner, outer;
  for (int64_t d = 0; d < input.dim(); ++d) (d >= axis ? inner : outer).push_back(d);

  at::Tensor x = input.to(dtype);
  at::Tensor g = grad_out.to(dtype);
  at::Tensor r = rstd.to(dtype);
  while (r.dim() < x.dim()) r = r.unsqueeze(-1);
  at::Tensor x_hat = x * r;
  at::Tensor grad_x_hat = has_weight ? g * weight->to(dtype) : g;
  at::Tensor d_input, d_weight;
  if (output_mask[0]) {
    const int64_t n = c10::multiply_integers(normalized_shape);
    if (input.numel() == 0) {
      d_input = at::zeros_like(input);
    } else {
      at::Tensor dot = (x_hat * grad_x_hat).sum(inner, /*keepdim=*/true);
      d_input = ((grad_x_hat - x_hat * dot / n) * r).to(input.scalar_type());
    }
  }
  if (output_mask[1] && has_weight) {
    at::Tensor full = g * x_hat;
    d_weight = (outer.empty() ? full : full.sum(outer)).to(input.scalar_type());
  }
  return {d_input, d_weight};
}

// ---- dropout helpers (CUDA) ---------------------------------------------------

// self * mask * scale: the dropout scaling with a given mask.
at::Tensor masked_scale(const at::Tensor& self, const at::Tensor& mask, double scale) {
  TORCH_CHECK(mask.scalar_type() == at::kByte || mask.scalar_type() == at::kBool,
              "_masked_scale: mask should be torch.uint8 or torch.bool, got ", mask.scalar_type());
  return self * mask * scale;
}

// Dropout keeping each element with probability p: (self * mask / p, mask) with
// a uint8 mask drawn from the device generator.
std::tuple<at::Tensor, at::Tensor> fused_dropout(const at::Tensor& self, double p,
                                                 std::optional<at::Generator> generator) {
  TORCH_CHECK(p >= 0 && p <= 1, "_fused_dropout: p (the probability of keeping an element) must be in [0, 1], got ",
              p);
  at::Tensor mask = at::empty_like(self, self.options().dtype(at::kByte)).bernoulli_(p, generator);
  at::Tensor out = p == 0 ? at::zeros_like(self) : masked_scale(self, mask, 1.0 / p);
  return {out, mask};
}

// ---- max_pool2d_backward (MPS) ----------------------------------------------

at::Tensor max_pool2d_backward(const at::Tensor& grad_output, const at::Tensor& self, at::IntArrayRef kernel_size,
                               at::IntArrayRef stride, at::IntArrayRef padding, at::IntArrayRef dilation,
                               bool ceil_mode) {
  auto indices = std::get<1>(at::max_pool2d_with_indices(self, kernel_size, stride, padding, dilation, ceil_mode));
  return at::max_pool2d_with_indices_backward(grad_output, self, kernel_size, stride, padding, dilation, ceil_mode,
                                              indices);
}

// ---- depthwise convolutions (CUDA) -------------------------------------------

// One group per input channel: the ordinary convolution (the neuron
// convolution override) computes them.
at::Tensor conv_depthwise(const at::Tensor& self, const at::Tensor& weight, c10::SymIntArrayRef kernel_size,
                          const std::optional<at::Tensor>& bias, c10::SymIntArrayRef stride,
                          c10::SymIntArrayRef padding, c10::SymIntArrayRef dilation) {
  const int64_t spatial = static_cast<int64_t>(kernel_size.size());
  TORCH_CHECK(self.dim() == spatial + 2 && weight.dim() == spatial + 2,
              "depthwise convolution: expected ", spatial + 2, "-D input and weight, got ", self.sizes(), " and ",
              weight.sizes());
  TORCH_CHECK(weight.sym_sizes().slice(2) == kernel_size, "depthwise convolution: kernel_size ", kernel_size,
              " does not match the weight's ", weight.sizes());
  std::vector<c10::SymInt> output_padding(spatial, 0);
  return at::convolution_symint(self, weight, bias, stride, padding, dilation, /*transposed=*/false, output_padding,
                                self.sym_size(1));
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("linear_backward", &Noted<at::_ops::linear_backward, linear_backward>::call);
  m.impl("mm.dtype", &Noted<at::_ops::mm_dtype, mm_dtype<at::_ops::mm>>::call);
  m.impl("mm.dtype_out", &OutOf<at::_ops::mm_dtype_out, mm_dtype<at::_ops::mm>, true>::call);
  m.impl("bmm.dtype", &Noted<at::_ops::bmm_dtype, mm_dtype<at::_ops::bmm>>::call);
  m.impl("bmm.dtype_out", &OutOf<at::_ops::bmm_dtype_out, mm_dtype<at::_ops::bmm>, true>::call);
  m.impl("addmm.dtype", &Noted<at::_ops::addmm_dtype, addmm_dtype<at::_ops::addmm>>::call);
  m.impl("addmm.dtype_out", &OutOf<at::_ops::addmm_dtype_out, addmm_dtype<at::_ops::addmm>, true>::call);
  m.impl("baddbmm.dtype", &Noted<at::_ops::baddbmm_dtype, addmm_dtype<at::_ops::baddbmm>>::call);
  m.impl("baddbmm.dtype_out", &OutOf<at::_ops::baddbmm_dtype_out, addmm_dtype<at::_ops::baddbmm>, true>::call);
  m.impl("_fused_rms_norm_backward", &Noted<at::_ops::_fused_rms_norm_backward, fused_rms_norm_backward>::call);
  m.impl("_masked_scale", &Noted<at::_ops::_masked_scale, masked_scale>::call);
  m.impl("_fused_dropout", &Noted<at::_ops::_fused_dropout, fused_dropout>::call);
  m.impl("max_pool2d_backward", &Noted<at::_ops::max_pool2d_backward, max_pool2d_backward>::call);
  m.impl("_conv_depthwise2d", &Noted<at::_ops::_conv_depthwise2d, conv_depthwise>::call);
  m.impl("_conv_depthwise2d.out", &OutOf<at::_ops::_conv_depthwise2d_out, conv_depthwise>::call);
  m.impl("conv_depthwise3d", &Noted<at::_ops::conv_depthwise3d, conv_depthwise>::call);
  m.impl("batch_norm_elemt.out", &OutOf<at::_ops::batch_norm_elemt_out, at::batch_norm_elemt>::call);
}

}  // namespace at::neuron
