#include "Routes.h"

#include <ATen/ATen.h>
#include <ATen/EmptyTensor.h>
#include <ATen/MetaFunctions.h>
#include <ATen/OpMathType.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include <algorithm>
#include <set>

#include "DirectKernels.h"
#include "HostExecution.h"

namespace at::neuron {
namespace {

// The device kernel table: ATen ops the neuron device executes with the host
// runtime's kernels (HostExecution.h), by base name (no "aten::" prefix, no
// trailing "_"). An op covers all of its overloads and its in-place/out=
// variants that have a CPU kernel. Ops outside the table still run, through
// the counted fallback; an op moves into the table once the op-level
// differential suite covers it.
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

// Overloads with a direct kernel (DirectKernels.h), registered in place of
// the host path's kernel; each falls back to the host path itself.
#define DIRECT(overload, fn) \
  DirectRoute { overload, [] { return torch::CppFunction(TORCH_FN(direct::fn)); } }
const DirectRoute kDirect[] = {
    DIRECT("add.Tensor", add), DIRECT("add_.Tensor", add_), DIRECT("sub.Tensor", sub), DIRECT("sub_.Tensor", sub_),
    DIRECT("mul.Tensor", mul), DIRECT("mul_.Tensor", mul_), DIRECT("div.Tensor", div), DIRECT("div_.Tensor", div_),
    DIRECT("sum.dim_IntList", sum_dim), DIRECT("fill_.Scalar", fill_), DIRECT("zero_", zero_),
    DIRECT("index.Tensor", index),
};
#undef DIRECT

using Args = QueuedRoute::Args;
using Outs = QueuedRoute::Outs;

const at::Tensor& T(const Args& a, size_t i) { return a[i].toTensor(); }

std::optional<std::vector<int64_t>> opt_dims(const c10::IValue& v) {
  if (v.isNone()) return std::nullopt;
  return v.toIntVector();
}

std::optional<at::ScalarType> opt_dtype(const c10::IValue& v) {
  if (v.isNone()) return std::nullopt;
  return v.toScalarType();
}

#define UNARY(fn)                                                                                   \
  QueuedRoute{"aten::" #fn, "", QueueMode::Out, "out", [](const Args& a) -> Outs { return {at::meta::fn(T(a, 0))}; }}, \
      QueuedRoute {                                                                                     \
    "aten::" #fn "_", "", QueueMode::InPlace, nullptr, [](const Args& a) -> Outs {                       \
      at::Tensor self = T(a, 0);                                                                    \
      at::meta::fn##_(self);                                                                        \
      return {};                                                                                    \
    }                                                                                               \
  }

#define BINARY(fn)                                                                                           \
  QueuedRoute{"aten::" #fn, "Tensor", QueueMode::Out, "out",                                                        \
          [](const Args& a) -> Outs { return {at::meta::fn(T(a, 0), T(a, 1))}; }},                            \
      QueuedRoute {                                                                                              \
    "aten::" #fn "_", "Tensor", QueueMode::InPlace, nullptr, [](const Args& a) -> Outs {                          \
      at::Tensor self = T(a, 0);                                                                             \
      at::meta::fn##_(self, T(a, 1));                                                                        \
      return {};                                                                                             \
    }                                                                                                        \
  }

#define BINARY_ALPHA(fn)                                                                                     \
  QueuedRoute{"aten::" #fn, "Tensor", QueueMode::Out, "out",                                                        \
          [](const Args& a) -> Outs { return {at::meta::fn(T(a, 0), T(a, 1), a[2].toScalar())}; }},           \
      QueuedRoute {                                                                                              \
    "aten::" #fn "_", "Tensor", QueueMode::InPlace, nullptr, [](const Args& a) -> Outs {                          \
      at::Tensor self = T(a, 0);                                                                             \
      at::meta::fn##_(self, T(a, 1), a[2].toScalar());                                                       \
      return {};                                                                                             \
    }                                                                                                        \
  }

#define COMPARE(fn)                                                                                          \
  QueuedRoute{"aten::" #fn, "Tensor", QueueMode::Out, "Tensor_out",                                                 \
          [](const Args& a) -> Outs { return {at::meta::fn(T(a, 0), T(a, 1))}; }},                            \
      QueuedRoute {                                                                                              \
    "aten::" #fn, "Scalar", QueueMode::Out, "Scalar_out",                                                         \
        [](const Args& a) -> Outs { return {at::meta::fn(T(a, 0), a[1].toScalar())}; }                       \
  }

#define BITWISE(fn)                                                                                          \
  QueuedRoute {                                                                                                  \
    "aten::" #fn, "Tensor", QueueMode::Out, "Tensor_out",                                                         \
        [](const Args& a) -> Outs { return {at::meta::fn(T(a, 0), T(a, 1))}; }                               \
  }

// The queued overloads with their meta functions (AsyncExecution.cpp).
// Sized by the decode and training steps of Transformers models: pointwise
// math, matmuls, normalization pieces, softmax, reductions, cat, indexing.
const QueuedRoute kQueued[] = {
    UNARY(neg), UNARY(exp), UNARY(log), UNARY(rsqrt), UNARY(sqrt), UNARY(sigmoid), UNARY(tanh), UNARY(silu),
    UNARY(cos), UNARY(sin), UNARY(reciprocal), UNARY(erf), UNARY(exp2), UNARY(expm1), UNARY(log1p), UNARY(floor),
    UNARY(ceil), UNARY(trunc), UNARY(sign), UNARY(bitwise_not),
    BINARY_ALPHA(add), BINARY_ALPHA(sub), BINARY(mul), BINARY(div), BINARY(atan2),
    QueuedRoute{"aten::maximum", "", QueueMode::Out, "out",
            [](const Args& a) -> Outs { return {at::meta::maximum(T(a, 0), T(a, 1))}; }},
    QueuedRoute{"aten::minimum", "", QueueMode::Out, "out",
            [](const Args& a) -> Outs { return {at::meta::minimum(T(a, 0), T(a, 1))}; }},
    QueuedRoute{"aten::pow", "Tensor_Scalar", QueueMode::Out, "Tensor_Scalar_out",
            [](const Args& a) -> Outs { return {at::meta::pow(T(a, 0), a[1].toScalar())}; }},
    QueuedRoute{"aten::pow", "Tensor_Tensor", QueueMode::Out, "Tensor_Tensor_out",
            [](const Args& a) -> Outs { return {at::meta::pow(T(a, 0), T(a, 1))}; }},
    COMPARE(eq), COMPARE(ne), COMPARE(lt), COMPARE(le), COMPARE(gt), COMPARE(ge),
    BITWISE(bitwise_and), BITWISE(bitwise_or), BITWISE(bitwise_xor),
    QueuedRoute{"aten::gelu", "", QueueMode::Out, "out",
            [](const Args& a) -> Outs { return {at::meta::gelu(T(a, 0), a[1].toStringView())}; }},
    QueuedRoute{"aten::clamp", "", QueueMode::Out, "out",
            [](const Args& a) -> Outs {
              return {at::meta::clamp(T(a, 0), a[1].toOptional<at::Scalar>(), a[2].toOptional<at::Scalar>())};
            }},
    QueuedRoute{"aten::clamp_", "", QueueMode::InPlace, nullptr,
            [](const Args& a) -> Outs {
              at::Tensor self = T(a, 0);
              at::meta::clamp_(self, a[1].toOptional<at::Scalar>(), a[2].toOptional<at::Scalar>());
              return {};
            }},
    // matmuls
    QueuedRoute{"aten::mm", "", QueueMode::Out, "out", [](const Args& a) -> Outs { return {at::meta::mm(T(a, 0), T(a, 1))}; }},
    QueuedRoute{"aten::bmm", "", QueueMode::Out, "out",
            [](const Args& a) -> Outs { return {at::meta::bmm(T(a, 0), T(a, 1))}; }},
    QueuedRoute{"aten::addmm", "", QueueMode::Out, "out",
            [](const Args& a) -> Outs {
              return {at::meta::addmm(T(a, 0), T(a, 1), T(a, 2), a[3].toScalar(), a[4].toScalar())};
            }},
    QueuedRoute{"aten::baddbmm", "", QueueMode::Out, "out",
            [](const Args& a) -> Outs {
              return {at::meta::baddbmm(T(a, 0), T(a, 1), T(a, 2), a[3].toScalar(), a[4].toScalar())};
            }},
    // softmax and reductions
    QueuedRoute{"aten::_softmax", "", QueueMode::Out, "out",
            [](const Args& a) -> Outs { return {at::meta::_softmax(T(a, 0), a[1].toInt(), a[2].toBool())}; }},
    QueuedRoute{"aten::_log_softmax", "", QueueMode::Out, "out",
            [](const Args& a) -> Outs { return {at::meta::_log_softmax(T(a, 0), a[1].toInt(), a[2].toBool())}; }},
    QueuedRoute{"aten::sum", "dim_IntList", QueueMode::Out, "IntList_out",
            [](const Args& a) -> Outs {
              auto dims = opt_dims(a[1]);
              return {at::meta::sum(T(a, 0), dims ? at::OptionalIntArrayRef(*dims) : std::nullopt, a[2].toBool(),
                                    opt_dtype(a[3]))};
            }},
    QueuedRoute{"aten::mean", "dim", QueueMode::Out, "out",
            [](const Args& a) -> Outs {
              auto dims = opt_dims(a[1]);
              return {at::meta::mean(T(a, 0), dims ? at::OptionalIntArrayRef(*dims) : std::nullopt, a[2].toBool(),
                                     opt_dtype(a[3]))};
            }},
    QueuedRoute{"aten::amax", "", QueueMode::Out, "out",
            [](const Args& a) -> Outs { return {at::meta::amax(T(a, 0), a[1].toIntVector(), a[2].toBool())}; }},
    QueuedRoute{"aten::amin", "", QueueMode::Out, "out",
            [](const Args& a) -> Outs { return {at::meta::amin(T(a, 0), a[1].toIntVector(), a[2].toBool())}; }},
    QueuedRoute{"aten::argmax", "", QueueMode::Out, "out",
            [](const Args& a) -> Outs {
              return {at::meta::argmax(T(a, 0), a[1].toOptional<int64_t>(), a[2].toBool())};
            }},
    QueuedRoute{"aten::cumsum", "", QueueMode::Out, "out",
            [](const Args& a) -> Outs { return {at::meta::cumsum(T(a, 0), a[1].toInt(), opt_dtype(a[2]))}; }},
    QueuedRoute{"aten::any", "", QueueMode::Out, "all_out", [](const Args& a) -> Outs { return {at::meta::any(T(a, 0))}; }},
    QueuedRoute{"aten::all", "", QueueMode::Out, "all_out", [](const Args& a) -> Outs { return {at::meta::all(T(a, 0))}; }},
    // shape and indexing
    QueuedRoute{"aten::cat", "", QueueMode::Out, "out",
            [](const Args& a) -> Outs {
              auto list = a[0].toTensorVector();
              return {at::meta::cat(list, a[1].toInt())};
            }},
    QueuedRoute{"aten::index_copy_", "", QueueMode::InPlace, nullptr,
            [](const Args& a) -> Outs {
              at::Tensor self = T(a, 0);
              at::meta::index_copy_(self, a[1].toInt(), T(a, 2), T(a, 3));
              return {};
            },
            /*checks_data=*/true},
    QueuedRoute{"aten::index_select", "", QueueMode::Out, "out",
            [](const Args& a) -> Outs {
              // ATen has no C++ meta function for index_select: its checks
              // and output shape (the index values are checked by the kernel).
              const at::Tensor& self = T(a, 0);
              const at::Tensor& index = T(a, 2);
              int64_t dim = c10::maybe_wrap_dim(a[1].toInt(), self.dim());
              TORCH_CHECK_INDEX(index.dim() <= 1, "index_select(): Index is supposed to be a vector");
              TORCH_CHECK(index.scalar_type() == at::kLong || index.scalar_type() == at::kInt,
                          "index_select(): Expected dtype int32 or int64 for index");
              auto sizes = self.sizes().vec();
              if (self.dim() > 0) sizes[dim] = index.numel();
              return {at::empty(sizes, self.options())};
            },
            /*checks_data=*/true},
    QueuedRoute{"aten::fill_", "Scalar", QueueMode::InPlace, nullptr, [](const Args&) -> Outs { return {}; }},
    QueuedRoute{"aten::zero_", "", QueueMode::InPlace, nullptr, [](const Args&) -> Outs { return {}; }},
    // the fused attention of torch.nn.functional.scaled_dot_product_attention
    // (csrc/aten/Attention.cpp). The output layouts are the CPU kernel's, which
    // are also its meta function's (Inductor asserts them on compiled graphs'
    // fallbacks): the output is laid out like the query.
    QueuedRoute{"aten::_scaled_dot_product_flash_attention_for_cpu", "", QueueMode::Copy, nullptr,
            [](const Args& a) -> Outs {
              const at::Tensor& q = T(a, 0);
              const at::Tensor& v = T(a, 2);
              TORCH_CHECK(q.dim() == 4 && v.dim() == 4, "scaled_dot_product_attention_flash_attention: expected "
                          "4-D query, key and value");
              TORCH_CHECK(q.size(3) == v.size(3), "scaled_dot_product_attention_flash_attention: Q/K/V should have "
                          "the same head size");
              const int64_t B = q.size(0), H = q.size(1), L = q.size(2);
              auto acc = at::toOpMathType(q.scalar_type());
              // (at::empty_like would run its Python meta function here.)
              auto strides = q.is_non_overlapping_and_dense() ? q.strides().vec()
                                                               : at::infer_dense_strides(q.sizes(), q.strides());
              return {at::empty_strided(q.sizes(), strides, q.options()),
                      at::empty({B, L, H}, q.options().dtype(acc)).transpose(1, 2)};
            }},
};

#undef UNARY
#undef BINARY
#undef BINARY_ALPHA
#undef COMPARE
#undef BITWISE

}  // namespace

c10::ArrayRef<QueuedRoute> queued_routes() { return kQueued; }

namespace {

// The table's overloads, as registered: with the table's kernel (host or
// direct), or left to a dedicated neuron kernel (e.g. histc's).
struct Registered {
  std::string op;
  bool table_kernel;
};

const std::vector<Registered>& registrations() {
  static const auto registered = [] {
    std::vector<Registered> out;
    static torch::Library lib(torch::Library::IMPL, "aten", c10::DispatchKey::PrivateUse1, __FILE__, __LINE__);
    auto& dispatcher = c10::Dispatcher::singleton();
    for (const c10::OperatorName& name : dispatcher.getAllOpNames()) {
      std::string_view full = name.name;
      if (full.substr(0, 6) != "aten::") continue;
      std::string_view base = full.substr(6);
      if (base.size() > 1 && base.back() == '_' && base.substr(0, 2) != "__") base.remove_suffix(1);
      if (!in_table(base)) continue;
      auto op = dispatcher.findOp(name);
      // Only real backend kernels: composite ops already work on neuron
      // through their decompositions.
      if (!op || !op->hasKernelForDispatchKey(c10::DispatchKey::CPU)) continue;
      std::string qualified =
          std::string(full.substr(6)) + (name.overload_name.empty() ? "" : "." + name.overload_name);
      const DirectRoute* direct = nullptr;
      for (const DirectRoute& r : kDirect) {
        if (qualified == r.overload) direct = &r;
      }
      const bool dedicated = !direct && op->hasKernelForDispatchKey(c10::DispatchKey::PrivateUse1);
      if (direct) {
        lib.impl(qualified.c_str(), direct->kernel());
      } else if (!dedicated) {
        lib.impl(qualified.c_str(), torch::CppFunction::makeFromBoxedFunction<&host_kernel>());
      }
      out.push_back({std::move(qualified), !dedicated});
    }
    direct::install_cpu_stubs();
    return out;
  }();
  return registered;
}

}  // namespace

std::vector<std::string> register_host_kernels() {
  std::vector<std::string> names;
  for (const Registered& r : registrations()) names.push_back(r.op);
  return names;
}

std::vector<RouteRow> route_table() {
  std::set<std::string> queued, checks_data, direct;
  auto& dispatcher = c10::Dispatcher::singleton();
  for (const QueuedRoute& q : kQueued) {
    const std::string name = std::string(q.name).substr(6);
    for (const char* overload : {q.overload, q.mode == QueueMode::Out ? q.out_overload : nullptr}) {
      if (!overload || !dispatcher.findSchema({q.name, overload})) continue;
      const std::string qualified = *overload ? name + "." + overload : name;
      queued.insert(qualified);
      if (q.checks_data) checks_data.insert(qualified);
    }
  }
  for (const DirectRoute& d : kDirect) direct.insert(d.overload);
  std::vector<RouteRow> rows;
  for (const Registered& r : registrations()) {
    if (!r.table_kernel) continue;
    const auto dot = r.op.find('.');
    auto op = dispatcher.findSchema(
        {"aten::" + r.op.substr(0, dot), dot == std::string::npos ? "" : r.op.substr(dot + 1)});
    rows.push_back({r.op, direct.count(r.op) > 0, queued.count(r.op) > 0, checks_data.count(r.op) > 0,
                    op && op->hasTag(at::Tag::nondeterministic_seeded)});
  }
  std::sort(rows.begin(), rows.end(), [](const RouteRow& a, const RouteRow& b) { return a.op < b.op; });
  return rows;
}

}  // namespace at::neuron
