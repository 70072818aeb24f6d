// torch.autocast("neuron"): the AutocastPrivateUse1 policies. NeuronCores
// compute natively in bf16/fp16, so the op lists are PyTorch's shared CUDA
// lists: matmul-like ops in lower precision, reductions and losses in fp32.
// binary_cross_entropy is banned, as on every PyTorch accelerator (CUDA, XPU,
// MPS): only the CPU upcasts it.
#include <ATen/autocast_mode.h>
#include <torch/library.h>

namespace at::neuron {
namespace {

using at::autocast::CastPolicy;

// BCE takes probabilities, usually from a sigmoid computed in low precision
// where it saturates; an fp32 upcast here would hide the lost precision. The
// with_logits form fuses the sigmoid and is on the fp32 list.
at::Tensor binary_cross_entropy_banned(const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&,
                                       int64_t) {
  // The first sentence is PyTorch's (CUDA's) message, which users match on.
  TORCH_CHECK(false,
              "torch.nn.functional.binary_cross_entropy and torch.nn.BCELoss are unsafe to autocast.\n"
              "Under torch.autocast(\"neuron\"), as on CUDA, the probabilities usually come from a sigmoid run in "
              "reduced precision. Use torch.nn.functional.binary_cross_entropy_with_logits or "
              "torch.nn.BCEWithLogitsLoss on the logits instead (autocast runs them in float32), or compute "
              "the loss outside the autocast region on float32 inputs.");
}

#define NEURON_LOWER_PRECISION_FP(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, lower_precision_fp)
#define NEURON_FP32(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, fp32)
#define NEURON_FP32_SET_OPT_DTYPE(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, fp32_set_opt_dtype)
#define NEURON_PROMOTE(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, promote)

TORCH_LIBRARY_IMPL(_, AutocastPrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFallthrough());
}

TORCH_LIBRARY_IMPL(aten, AutocastPrivateUse1, m) {
  AT_FORALL_LOWER_PRECISION_FP(NEURON_LOWER_PRECISION_FP)
  AT_FORALL_FP32(NEURON_FP32)
  AT_FORALL_FP32_SET_OPT_DTYPE(NEURON_FP32_SET_OPT_DTYPE)
  AT_FORALL_DIFFERENT_REDISPATCH_SIGNATURE(KERNEL_DIFFERENT_REDISPATCH_SIGNATURE_PRIVATEUSEONE)
  AT_FORALL_PROMOTE(NEURON_PROMOTE)

  m.impl(TORCH_SELECTIVE_NAME("aten::binary_cross_entropy"), TORCH_FN(binary_cross_entropy_banned));
}

}  // namespace
}  // namespace at::neuron
