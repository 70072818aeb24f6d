// Kernels where PyTorch's accelerator semantics (what CUDA/XPU accept, and
// what libraries written for accelerators therefore rely on) are wider than
// ATen's CPU kernels: the host kernel runs on a widened input.
#include <ATen/ATen.h>
#include <torch/library.h>

#include "HostExecution.h"

namespace at::neuron {
namespace {

// histc on integer tensors (Transformers' MoE routing counts expert ids with
// it off CPU); ATen's CPU kernel only takes floating types. Counts are exact
// in double and come back in the input's dtype, as on CUDA.
at::Tensor histc(const at::Tensor& self, int64_t bins, const at::Scalar& min, const at::Scalar& max) {
  if (c10::isFloatingType(self.scalar_type())) {
    return host_call("aten::histc", "", {self, bins, min, max})[0].toTensor();
  }
  auto counts = host_call("aten::histc", "", {self.to(at::kDouble), bins, min, max})[0].toTensor();
  return counts.to(self.scalar_type());
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("histc", histc);
}

}  // namespace at::neuron
