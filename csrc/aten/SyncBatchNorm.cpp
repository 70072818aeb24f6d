// The per-channel statistics ops behind nn.SyncBatchNorm. PyTorch has only
// CUDA kernels for them (torch/nn/modules/_functions.py calls them between
// its collectives), so SyncBatchNorm needs these on neuron. They are written
// as ATen ops on device tensors, each of which runs on the host through the
// host execution path, and follow the CUDA kernels' contracts: statistics in
// the accumulate type (float for half/bfloat16 inputs), channels on dim 1,
// element-wise results in the input's dtype.
#include <ATen/ATen.h>
#include <ATen/AccumulateType.h>
#include <torch/library.h>

#include "OpTracking.h"

namespace at::neuron {
namespace {

at::ScalarType acc_type(const at::Tensor& t) {
  // is_cuda=true: the CUDA kernels' accumulate types (float for half, bf16).
  return at::toAccumulateType(t.scalar_type(), /*is_cuda=*/true);
}

void check_input(const at::Tensor& input, const char* op) {
  TORCH_CHECK(input.dim() >= 2, op, ": expected an input with at least 2 dimensions (N, C, ...), got ",
              input.sizes());
  TORCH_CHECK(at::isFloatingType(input.scalar_type()), op, ": expected a floating point input, got ",
              input.scalar_type());
}

void check_per_channel(const at::Tensor& t, int64_t channels, const char* op, const char* name) {
  TORCH_CHECK(t.dim() == 1 && t.size(0) == channels, op, ": ", name, " must have shape [", channels, "], got ",
              t.sizes());
}

// The dims a per-channel reduction runs over: all but dim 1.
std::vector<int64_t> reduce_dims(const at::Tensor& input) {
  std::vector<int64_t> dims{0};
  for (int64_t d = 2; d < input.dim(); ++d) dims.push_back(d);
  return dims;
}

// [C] -> [1, C, 1, ...] in the input's accumulate type: a per-channel vector
// (checked to be one) broadcast against the input.
at::Tensor per_channel(const at::Tensor& v, const at::Tensor& input, const char* op, const char* name) {
  check_per_channel(v, input.size(1), op, name);
  std::vector<int64_t> shape(input.dim(), 1);
  shape[1] = v.size(0);
  return v.to(acc_type(input)).reshape(shape);
}

// 1 / sqrt(var + eps), and 0 where both are 0 (as the CUDA kernels).
at::Tensor inv_std(const at::Tensor& var, double eps) {
  at::Tensor invstd = (var + eps).rsqrt();
  return eps == 0 ? at::where(var == 0, at::zeros_like(invstd), invstd) : invstd;
}

std::tuple<at::Tensor, at::Tensor> batch_norm_stats(const at::Tensor& input, double eps) {
  check_input(input, "batch_norm_stats");
  TORCH_CHECK(input.numel() > 0, "batch_norm_stats: expected a non-empty input, got ", input.sizes());
  at::Tensor x = input.to(acc_type(input));
  auto [var, mean] = at::var_mean(x, reduce_dims(input), /*correction=*/0, /*keepdim=*/false);
  return {mean, inv_std(var, eps)};
}

// The outputs follow mean's dtype, as in CUDA; the input is not read.
std::tuple<at::Tensor, at::Tensor> gather_stats(const at::Tensor& mean,
                                                const at::Tensor& invstd,
                                                const std::optional<at::Tensor>& running_mean,
                                                const std::optional<at::Tensor>& running_var, double momentum,
                                                double eps, const at::Tensor& counts, const char* op) {
  TORCH_CHECK(mean.dim() == 2 && invstd.sizes() == mean.sizes(), op,
              ": mean and invstd must be [world, C] of the same shape, got ", mean.sizes(), " and ",
              invstd.sizes());
  const int64_t channels = mean.size(1);
  TORCH_CHECK(counts.numel() == mean.size(0), op, ": counts must have one entry per row of mean (", mean.size(0),
              "), got ", counts.sizes());
  at::Tensor m = mean.to(acc_type(mean));
  at::Tensor c = counts.reshape({-1, 1}).to(m.scalar_type());
  at::Tensor n = c.sum(0);  // [1]
  at::Tensor global_mean = (m * c).sum(0) / n;
  // Each row's biased variance back from its invstd, then the parallel
  // combination: sum of the rows' M2 plus the spread of their means.
  at::Tensor var_rows = invstd.to(m.scalar_type()).reciprocal().square() - eps;
  at::Tensor m2 = (c * var_rows).sum(0) + (c * (m - global_mean).square()).sum(0);
  at::Tensor global_var = m2 / n;
  bool has_rm = running_mean && running_mean->defined();
  bool has_rv = running_var && running_var->defined();
  if (has_rm) {
    check_per_channel(*running_mean, channels, op, "running_mean");
    running_mean->mul_(1 - momentum).add_((global_mean * momentum).to(running_mean->scalar_type()));
  }
  if (has_rv) {
    check_per_channel(*running_var, channels, op, "running_var");
    at::Tensor unbiased = m2 / (n - 1);
    running_var->mul_(1 - momentum).add_((unbiased * momentum).to(running_var->scalar_type()));
  }
  return {global_mean.to(mean.scalar_type()), inv_std(global_var, eps).to(mean.scalar_type())};
}

std::tuple<at::Tensor, at::Tensor> batch_norm_gather_stats_with_counts(
    const at::Tensor& /*input*/, const at::Tensor& mean, const at::Tensor& invstd,
    const std::optional<at::Tensor>& running_mean, const std::optional<at::Tensor>& running_var, double momentum,
    double eps, const at::Tensor& counts) {
  return gather_stats(mean, invstd, running_mean, running_var, momentum, eps, counts,
                      "batch_norm_gather_stats_with_counts");
}

std::tuple<at::Tensor, at::Tensor> batch_norm_gather_stats(const at::Tensor& /*input*/, const at::Tensor& mean,
                                                           const at::Tensor& invstd,
                                                           const std::optional<at::Tensor>& running_mean,
                                                           const std::optional<at::Tensor>& running_var,
                                                           double momentum, double eps, int64_t count) {
  at::Tensor counts = at::full({mean.size(0)}, static_cast<double>(count), mean.options());
  return gather_stats(mean, invstd, running_mean, running_var, momentum, eps, counts,
                      "batch_norm_gather_stats");
}

at::Tensor batch_norm_elemt(const at::Tensor& input, const std::optional<at::Tensor>& weight,
                            const std::optional<at::Tensor>& bias, const at::Tensor& mean, const at::Tensor& invstd,
                            double eps) {
  constexpr const char* op = "batch_norm_elemt";
  check_input(input, op);
  (void)eps;  // invstd already holds it
  at::Tensor centered = input.to(acc_type(input)) - per_channel(mean, input, op, "mean");
  at::Tensor out = centered * per_channel(invstd, input, op, "invstd");
  if (weight && weight->defined()) out = out * per_channel(*weight, input, op, "weight");
  if (bias && bias->defined()) out = out + per_channel(*bias, input, op, "bias");
  return out.to(input.scalar_type()).contiguous(input.suggest_memory_format());
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> batch_norm_backward_reduce(
    const at::Tensor& grad_out, const at::Tensor& input, const at::Tensor& mean, const at::Tensor& invstd,
    const std::optional<at::Tensor>& weight, bool input_g, bool weight_g, bool bias_g) {
  constexpr const char* op = "batch_norm_backward_reduce";
  check_input(input, op);
  TORCH_CHECK(grad_out.sizes() == input.sizes(), op, ": grad_out ", grad_out.sizes(), " and input ", input.sizes(),
              " differ in shape");
  at::Tensor mu = per_channel(mean, input, op, "mean");
  check_per_channel(invstd, input.size(1), op, "invstd");
  const auto acc = acc_type(input);
  const auto dims = reduce_dims(input);
  at::Tensor dy = grad_out.to(acc);
  at::Tensor sum_dy = dy.sum(dims);
  at::Tensor sum_dy_xmu = (dy * (input.to(acc) - mu)).sum(dims);
  // grad_weight/grad_bias in the weight's dtype (the input's without one).
  const auto param_type = weight && weight->defined() ? weight->scalar_type() : input.scalar_type();
  at::Tensor grad_weight = weight_g ? (sum_dy_xmu * invstd.to(acc)).to(param_type) : at::Tensor();
  at::Tensor grad_bias = bias_g ? sum_dy.to(param_type) : at::Tensor();
  if (!input_g) return {at::Tensor(), at::Tensor(), grad_weight, grad_bias};
  return {sum_dy.to(mean.scalar_type()), sum_dy_xmu.to(mean.scalar_type()), grad_weight, grad_bias};
}

at::Tensor batch_norm_backward_elemt(const at::Tensor& grad_out, const at::Tensor& input, const at::Tensor& mean,
                                     const at::Tensor& invstd, const std::optional<at::Tensor>& weight,
                                     const at::Tensor& sum_dy, const at::Tensor& sum_dy_xmu,
                                     const at::Tensor& count) {
  constexpr const char* op = "batch_norm_backward_elemt";
  check_input(input, op);
  TORCH_CHECK(grad_out.sizes() == input.sizes(), op, ": grad_out ", grad_out.sizes(), " and input ", input.sizes(),
              " differ in shape");
  at::Tensor mu = per_channel(mean, input, op, "mean");
  at::Tensor istd = per_channel(invstd, input, op, "invstd");
  at::Tensor dy = per_channel(sum_dy, input, op, "sum_dy");
  at::Tensor dy_xmu = per_channel(sum_dy_xmu, input, op, "sum_dy_xmu");
  TORCH_CHECK(count.numel() > 0, op, ": count must hold every rank's element count, got ", count.sizes());
  const auto acc = acc_type(input);
  // The global element count per channel: the sum of every rank's count.
  at::Tensor norm = count.to(acc).sum().reciprocal();
  at::Tensor mean_dy = dy * norm;
  at::Tensor mean_dy_xmu = dy_xmu * norm;
  at::Tensor xmu = input.to(acc) - mu;
  at::Tensor grad = (grad_out.to(acc) - mean_dy - xmu * istd.square() * mean_dy_xmu) * istd;
  if (weight && weight->defined()) grad = grad * per_channel(*weight, input, op, "weight");
  return grad.to(input.scalar_type()).contiguous(input.suggest_memory_format());
}

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("batch_norm_stats", &Noted<at::_ops::batch_norm_stats, batch_norm_stats>::call);
  m.impl("batch_norm_gather_stats_with_counts",
         &Noted<at::_ops::batch_norm_gather_stats_with_counts, batch_norm_gather_stats_with_counts>::call);
  m.impl("batch_norm_gather_stats", &Noted<at::_ops::batch_norm_gather_stats, batch_norm_gather_stats>::call);
  m.impl("batch_norm_elemt", &Noted<at::_ops::batch_norm_elemt, batch_norm_elemt>::call);
  m.impl("batch_norm_backward_reduce", &Noted<at::_ops::batch_norm_backward_reduce, batch_norm_backward_reduce>::call);
  m.impl("batch_norm_backward_elemt", &Noted<at::_ops::batch_norm_backward_elemt, batch_norm_backward_elemt>::call);
}

}  // namespace
}  // namespace at::neuron
