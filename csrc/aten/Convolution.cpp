// Convolutions: ATen routes a PrivateUse1 convolution to the "overrideable"
// pair, which the host runtime serves with ATen's own convolution kernels.
//
// Layout contract: for the Overrideable backend, ATen's
// _conv_determine_backend_memory_format (which FakeTensor uses to predict the
// strides compiled code asserts) says contiguous, while the CPU kernels return
// channels-last whenever the input or the weight is. Results are returned
// contiguous, as the contract says.
#include <ATen/ATen.h>
#include <torch/library.h>

#include "HostExecution.h"
#include "OpTracking.h"

namespace at::neuron {
namespace {

at::Tensor convolution(const at::Tensor& input, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                       c10::IntArrayRef stride, c10::IntArrayRef padding, c10::IntArrayRef dilation, bool transposed,
                       c10::IntArrayRef output_padding, int64_t groups) {
  return host_call("aten::convolution", "",
                   {input, weight, bias ? c10::IValue(*bias) : c10::IValue(), stride.vec(), padding.vec(),
                    dilation.vec(), transposed, output_padding.vec(), groups})[0]
      .toTensor()
      .contiguous();
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> convolution_backward(
    const at::Tensor& grad_output, const at::Tensor& input, const at::Tensor& weight, c10::IntArrayRef stride,
    c10::IntArrayRef padding, c10::IntArrayRef dilation, bool transposed, c10::IntArrayRef output_padding,
    int64_t groups, std::array<bool, 3> output_mask) {
  // Bias gradient has one entry per output channel.
  int64_t out_channels = transposed ? weight.size(1) * groups : weight.size(0);
  auto r = host_call("aten::convolution_backward", "",
                     {grad_output, input, weight, std::vector<int64_t>{out_channels}, stride.vec(), padding.vec(),
                      dilation.vec(), transposed, output_padding.vec(), groups,
                      c10::List<bool>({output_mask[0], output_mask[1], output_mask[2]})});
  auto get = [&](size_t i) { return r[i].isTensor() && r[i].toTensor().defined() ? r[i].toTensor().contiguous() : at::Tensor(); };
  return {get(0), get(1), get(2)};
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("convolution_overrideable", &Noted<at::_ops::convolution_overrideable, convolution>::call);
  m.impl("convolution_backward_overrideable",
         &Noted<at::_ops::convolution_backward_overrideable, convolution_backward>::call);
}

}  // namespace at::neuron
