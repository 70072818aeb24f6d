// Kernels where PyTorch's accelerator semantics (what CUDA/XPU accept, and
// what libraries written for accelerators therefore rely on) are wider than
// ATen's CPU kernels: the host kernel runs on a widened input.
#include <ATen/ATen.h>
#include <torch/library.h>

#include "HostExecution.h"
#include "NeuronFunctions.h"
#include "OpTracking.h"
#include "csrc/runtime/Runtime.h"

namespace at::neuron {
namespace {

// histc on integer tensors (Transformers' MoE routing counts expert ids with
// it off CPU); ATen's CPU kernel only takes floating types. The kernel widens
// to double in host scratch memory (exact counts; no float64 device tensor,
// which NEURON_RT_STRICT would refuse) and writes counts in the input's
// dtype, as on CUDA.
at::Tensor histc(const at::Tensor& self, int64_t bins, const at::Scalar& min, const at::Scalar& max) {
  if (c10::isFloatingType(self.scalar_type())) {
    return host_call("aten::histc", "", {self, bins, min, max})[0].toTensor();
  }
  TORCH_CHECK(bins > 0, "histc: bins must be > 0, but got ", bins);
  at::Tensor out = at::empty({bins}, self.options());
  at::Tensor src = host_alias(self), dst = host_alias(out);
  c10::DeviceIndex device = self.device().index();
  rt_call([&] {
    neuronrt::current_stream(device).launch(
        [&] { dst.copy_(at::histc(src.to(at::kDouble), bins, min, max)); }, "aten::histc");
  });
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("histc", &Noted<at::_ops::histc, histc>::call);
}

}  // namespace at::neuron
