// The device kernel table: ATen ops the neuron device executes with the host
// runtime's kernels (see HostExecution.h). An op is named by its base name
// and covers all of its overloads and its in-place/out= variants that have a
// CPU kernel. Ops outside this table still run, through the counted fallback;
// an op moves into the table once the op-level differential suite covers it.
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include <memory>
#include <set>
#include <string_view>

#include "HostExecution.h"

namespace at::neuron {
namespace {

// Base names (no "aten::" prefix, no trailing "_").
constexpr std::string_view kOps[] = {
    // pointwise math
    "abs", "neg", "add", "sub", "rsub", "mul", "div", "remainder", "fmod", "pow", "exp", "exp2", "expm1", "log",
    "log2", "log10", "log1p", "sqrt", "rsqrt", "reciprocal", "sin", "cos", "tan", "asin", "acos", "atan", "atan2",
    "sinh", "cosh", "tanh", "asinh", "acosh", "atanh", "sigmoid", "logit", "erf", "erfc", "erfinv", "floor", "ceil",
    "round", "trunc", "frac", "sign", "sgn", "signbit", "clamp", "clamp_min", "clamp_max", "maximum", "minimum",
    "fmax", "fmin", "lerp", "addcmul", "addcdiv", "hypot", "copysign", "nan_to_num", "xlogy", "logaddexp",
    "logaddexp2", "floor_divide", "bitwise_and", "bitwise_or", "bitwise_xor", "bitwise_not", "bitwise_left_shift",
    "bitwise_right_shift", "__lshift__", "__rshift__", "__ilshift__", "__irshift__", "logical_and", "logical_or",
    "logical_xor", "logical_not", "eq", "ne", "lt", "le", "gt", "ge", "isnan", "isinf", "isfinite", "isposinf",
    "isneginf", "where", "heaviside", "digamma", "lgamma", "polygamma", "mvlgamma", "i0", "sinc", "igamma",
    "igammac", "nextafter", "frexp", "gcd", "lcm", "angle", "conj_physical", "deg2rad", "rad2deg", "polar",
    "complex", "view_as_real", "view_as_complex",
    // activations and their backward passes
    "relu", "gelu", "gelu_backward", "silu", "silu_backward", "mish", "mish_backward", "elu", "elu_backward",
    "hardtanh", "hardtanh_backward", "hardsigmoid", "hardsigmoid_backward", "hardswish", "hardswish_backward",
    "leaky_relu", "leaky_relu_backward", "softplus", "softplus_backward", "softshrink", "softshrink_backward",
    "hardshrink", "hardshrink_backward", "threshold", "threshold_backward", "sigmoid_backward", "tanh_backward",
    "logit_backward", "log_sigmoid_forward", "log_sigmoid_backward", "glu", "glu_backward", "_prelu_kernel",
    "_prelu_kernel_backward", "rrelu_with_noise", "rrelu_with_noise_backward",
    // reductions, scans, sorting
    "sum", "nansum", "mean", "prod", "amax", "amin", "max", "min", "aminmax", "_aminmax", "argmax", "argmin", "all",
    "any", "std", "var", "std_mean", "var_mean", "norm", "linalg_vector_norm", "logsumexp", "cumsum", "cumprod",
    "_cummax_helper", "_cummin_helper", "_logcumsumexp", "median", "nanmedian", "mode", "kthvalue", "topk", "sort",
    "count_nonzero", "bincount", "histc", "histogram", "_histogramdd_bin_edges", "_histogramdd_from_bin_cts",
    "_histogramdd_from_bin_tensors", "hash_tensor", "searchsorted", "bucketize", "_unique", "_unique2",
    "unique_consecutive", "unique_dim", "unique_dim_consecutive", "isin", "equal", "dist", "renorm",
    // linear algebra
    "mm", "bmm", "addmm", "_addmm_activation", "addbmm", "baddbmm", "addmv", "mv", "dot", "vdot", "addr", "tril", "triu",
    "trace", "linalg_cross", "_cdist_forward", "_cdist_backward", "_pdist_forward", "_pdist_backward",
    "triangular_solve", "cholesky", "cholesky_inverse", "_cholesky_solve_helper", "lu_unpack", "geqrf", "ormqr",
    // normalization, softmax, losses, embeddings
    "_softmax", "_log_softmax", "_softmax_backward_data", "_log_softmax_backward_data", "_masked_softmax",
    "_masked_softmax_backward", "native_layer_norm", "native_layer_norm_backward", "_fused_rms_norm",
    "_fused_rms_norm_backward", "native_group_norm", "native_group_norm_backward", "native_batch_norm",
    "native_batch_norm_backward", "_native_batch_norm_legit", "batch_norm_update_stats", "_batch_norm_with_update",
    "batch_norm_backward", "embedding_dense_backward", "embedding_renorm", "_embedding_bag",
    "_embedding_bag_forward_only", "_embedding_bag_dense_backward", "_embedding_bag_per_sample_weights_backward",
    "nll_loss_forward", "nll_loss_backward", "nll_loss2d_forward", "nll_loss2d_backward", "mse_loss",
    "mse_loss_backward", "smooth_l1_loss", "smooth_l1_loss_backward", "huber_loss", "huber_loss_backward",
    "binary_cross_entropy", "binary_cross_entropy_backward", "soft_margin_loss", "soft_margin_loss_backward",
    "multi_margin_loss", "multi_margin_loss_backward", "multilabel_margin_loss_forward",
    "multilabel_margin_loss_backward", "_ctc_loss", "_ctc_loss_backward", "_weight_norm_interface",
    "_weight_norm_interface_backward",
    // pooling, padding, resampling, image ops
    "max_pool2d_with_indices", "max_pool2d_with_indices_backward", "max_pool3d_with_indices",
    "max_pool3d_with_indices_backward", "avg_pool2d", "avg_pool2d_backward", "avg_pool3d", "avg_pool3d_backward",
    "_adaptive_avg_pool2d", "_adaptive_avg_pool2d_backward", "_adaptive_avg_pool3d", "_adaptive_avg_pool3d_backward",
    "adaptive_max_pool2d", "adaptive_max_pool2d_backward", "adaptive_max_pool3d", "adaptive_max_pool3d_backward",
    "fractional_max_pool2d", "fractional_max_pool2d_backward", "fractional_max_pool3d",
    "fractional_max_pool3d_backward", "max_unpool2d", "max_unpool3d",
    "reflection_pad1d", "reflection_pad1d_backward", "reflection_pad2d", "reflection_pad2d_backward",
    "reflection_pad3d", "reflection_pad3d_backward", "replication_pad1d", "replication_pad1d_backward",
    "replication_pad2d", "replication_pad2d_backward", "replication_pad3d", "replication_pad3d_backward",
    "upsample_nearest1d", "upsample_nearest1d_backward", "upsample_nearest2d", "upsample_nearest2d_backward",
    "upsample_nearest3d", "upsample_nearest3d_backward", "_upsample_nearest_exact1d",
    "_upsample_nearest_exact1d_backward", "_upsample_nearest_exact2d", "_upsample_nearest_exact2d_backward",
    "_upsample_nearest_exact3d", "_upsample_nearest_exact3d_backward", "upsample_linear1d",
    "upsample_linear1d_backward", "upsample_bilinear2d", "upsample_bilinear2d_backward", "_upsample_bilinear2d_aa",
    "_upsample_bilinear2d_aa_backward", "upsample_bicubic2d", "upsample_bicubic2d_backward", "upsample_trilinear3d",
    "upsample_trilinear3d_backward", "im2col", "col2im", "pixel_shuffle", "pixel_unshuffle", "grid_sampler_2d",
    "grid_sampler_2d_backward", "grid_sampler_3d", "grid_sampler_3d_backward",
    // indexing, shapes, factories
    "index", "_index_put_impl", "index_put", "index_select", "index_add", "index_copy", "index_fill", "index_reduce",
    "gather", "scatter", "scatter_add", "scatter_reduce", "take", "put", "masked_fill", "masked_scatter",
    "masked_select", "nonzero", "nonzero_static", "cat", "flip", "roll", "repeat_interleave", "unfold",
    "unfold_backward", "fill", "zero", "arange", "linspace", "logspace", "eye", "tril_indices", "triu_indices",
    "_assert_async", "segment_reduce", "_segment_reduce_backward",
    // random: drawn from the device generator (NeuronGenerator.h)
    "normal", "uniform", "bernoulli", "random", "exponential", "geometric", "log_normal", "cauchy", "multinomial",
    "randperm", "native_dropout", "native_dropout_backward", "_standard_gamma", "_standard_gamma_grad", "poisson",
    "binomial", "_sample_dirichlet", "_dirichlet_grad",
    // optimizers and AMP
    "_amp_foreach_non_finite_check_and_unscale", "_amp_update_scale",
};

// Whole families, by prefix.
constexpr std::string_view kPrefixes[] = {"_foreach_", "_fused_adam", "_fused_sgd", "_fused_adagrad", "special_",
                                          "linalg_", "_linalg_"};

bool in_table(std::string_view base) {
  static const std::set<std::string_view> ops(std::begin(kOps), std::end(kOps));
  if (ops.count(base)) return true;
  for (auto p : kPrefixes) {
    if (base.substr(0, p.size()) == p) return true;
  }
  return false;
}

}  // namespace

std::vector<std::string> register_host_kernels() {
  static std::unique_ptr<torch::Library> lib;
  static std::vector<std::string> registered;
  if (lib) return registered;
  lib = std::make_unique<torch::Library>(torch::Library::IMPL, "aten", c10::DispatchKey::PrivateUse1, __FILE__,
                                         __LINE__);
  auto& dispatcher = c10::Dispatcher::singleton();
  for (const c10::OperatorName& name : dispatcher.getAllOpNames()) {
    std::string_view full = name.name;
    if (full.substr(0, 6) != "aten::") continue;
    std::string_view base = full.substr(6);
    if (base.size() > 1 && base.back() == '_' && base.substr(0, 2) != "__") base.remove_suffix(1);
    if (!in_table(base)) continue;
    auto op = dispatcher.findOp(name);
    // Only real backend kernels: composite ops already work on neuron through
    // their decompositions.
    if (!op || !op->hasKernelForDispatchKey(c10::DispatchKey::CPU)) continue;
    std::string qualified = std::string(full.substr(6)) + (name.overload_name.empty() ? "" : "." + name.overload_name);
    // A native neuron kernel (DirectKernels.cpp) takes precedence.
    if (!op->hasKernelForDispatchKey(c10::DispatchKey::PrivateUse1)) {
      lib->impl(qualified.c_str(), torch::CppFunction::makeFromBoxedFunction<&host_kernel>());
    }
    registered.push_back(qualified);
  }
  return registered;
}

}  // namespace at::neuron
