#include "Routes.h"

#include <ATen/ATen.h>
#include <ATen/EmptyTensor.h>
#include <ATen/MetaFunctions.h>
#include <ATen/OpMathType.h>
#include <ATen/TensorIterator.h>
#include <ATen/ops/arange_meta_dispatch.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include <algorithm>
#include <map>

#include "DirectKernels.h"
#include "HostExecution.h"

namespace at::neuron {
namespace {

using Args = QueuedRoute::Args;
using Outs = QueuedRoute::Outs;

const at::Tensor& T(const Args& a, size_t i) { return a[i].toTensor(); }

// (The returned reference points into `dims`: a temporary of the caller's
// expression.)
at::OptionalIntArrayRef dims_ref(const std::optional<std::vector<int64_t>>& dims) {
  return dims ? at::OptionalIntArrayRef(*dims) : std::nullopt;
}
std::optional<std::vector<int64_t>> opt_dims(const c10::IValue& v) {
  if (v.isNone()) return std::nullopt;
  return v.toIntVector();
}

std::optional<at::ScalarType> opt_dtype(const c10::IValue& v) {
  if (v.isNone()) return std::nullopt;
  return v.toScalarType();
}

Outs index_copy_meta(const Args& a) {
  at::Tensor self = T(a, 0);
  at::meta::index_copy_(self, a[1].toInt(), T(a, 2), T(a, 3));
  return {};
}

// ATen has no C++ meta function for index_select: its checks and output
// shape (the index values are checked by the kernel).
Outs index_select_meta(const Args& a) {
  const at::Tensor& self = T(a, 0);
  const at::Tensor& index = T(a, 2);
  int64_t dim = c10::maybe_wrap_dim(a[1].toInt(), self.dim());
  TORCH_CHECK_INDEX(index.dim() <= 1, "index_select(): Index is supposed to be a vector");
  TORCH_CHECK(index.scalar_type() == at::kLong || index.scalar_type() == at::kInt,
              "index_select(): Expected dtype int32 or int64 for index");
  auto sizes = self.sizes().vec();
  if (self.dim() > 0) sizes[dim] = index.numel();
  return {at::empty(sizes, self.options())};
}

// where(condition, self, other): ATen's is not structured (its Meta kernel
// is Python). The CPU kernel's output: the broadcast shape, the promoted
// dtype of self and other, laid out by its TensorIterator.
Outs where_meta(const Args& a) {
  const at::Tensor& condition = T(a, 0);
  TORCH_CHECK(condition.scalar_type() == at::kBool || condition.scalar_type() == at::kByte,
              "where expected condition to be a boolean tensor, but got a tensor with dtype ",
              condition.scalar_type());
  at::Tensor out;
  auto iter = at::TensorIteratorConfig()
                  .check_all_same_dtype(false)
                  .declare_static_dtype(at::result_type(T(a, 1), T(a, 2)))
                  .add_output(out)
                  .add_const_input(condition)
                  .add_const_input(T(a, 1))
                  .add_const_input(T(a, 2))
                  .build();
  return {iter.output()};
}

// arange's out= (what the functional factories call, with a fresh empty
// output): the size follows from start, end, step and the output's dtype.
Outs arange_meta(const Args& a) {
  at::Tensor out = T(a, 3);
  at::meta::arange_out(out, a[0].toScalar(), a[1].toScalar(), a[2].toScalar());
  return {out};
}

// The fused attention of torch.nn.functional.scaled_dot_product_attention
// (csrc/aten/Attention.cpp). The output layouts are the CPU kernel's, which
// are also its meta function's (Inductor asserts them on compiled graphs'
// fallbacks): the output is laid out like the query.
Outs flash_attention_meta(const Args& a) {
  const at::Tensor& q = T(a, 0);
  const at::Tensor& v = T(a, 2);
  TORCH_CHECK(q.dim() == 4 && v.dim() == 4, "scaled_dot_product_attention_flash_attention: expected "
              "4-D query, key and value");
  TORCH_CHECK(q.size(3) == v.size(3), "scaled_dot_product_attention_flash_attention: Q/K/V should have "
              "the same head size");
  const int64_t B = q.size(0), H = q.size(1), L = q.size(2);
  auto acc = at::toOpMathType(q.scalar_type());
  // (at::empty_like would run its Python meta function here.)
  auto strides = q.is_non_overlapping_and_dense() ? q.strides().vec() : at::infer_dense_strides(q.sizes(), q.strides());
  return {at::empty_strided(q.sizes(), strides, q.options()),
          at::empty({B, L, H}, q.options().dtype(acc)).transpose(1, 2)};
}

// A queued overload whose meta function returns the outputs / checks `self`
// in place (the row's op + "_").
#define OUT(overload, out, ...) \
  QueuedRoute{overload, QueueMode::Out, out, [](const Args& a) -> Outs { return {__VA_ARGS__}; }}
#define IN_PLACE(overload, ...)                                           \
  QueuedRoute{overload, QueueMode::InPlace, nullptr, [](const Args& a) -> Outs { \
                at::Tensor self = T(a, 0);                                \
                __VA_ARGS__;                                              \
                return {};                                                \
              }}
// A direct kernel (DirectKernels.h), registered in place of the host path's;
// it falls back to the host path itself.
#define DIRECT(suffix, fn) \
  DirectRoute { suffix, [] { return torch::CppFunction(TORCH_FN(direct::fn)); } }
// Rows: an op with the host path only, a family by prefix, and the queued
// shapes shared by many ops (out= and in-place overloads).
#define R(op) Route{#op}
#define FAMILY(prefix) Route{#prefix "*"}
#define UNARY(fn) Route{#fn, {OUT("", "out", at::meta::fn(T(a, 0))), IN_PLACE("", at::meta::fn##_(self))}}
#define BINARY(fn, ...)                                                                                      \
  Route{#fn,                                                                                                 \
        {OUT("Tensor", "out", at::meta::fn(T(a, 0), T(a, 1))), IN_PLACE("Tensor", at::meta::fn##_(self, T(a, 1)))}, \
        {__VA_ARGS__}}
#define BINARY_ALPHA(fn, ...)                                                              \
  Route{#fn,                                                                               \
        {OUT("Tensor", "out", at::meta::fn(T(a, 0), T(a, 1), a[2].toScalar())),            \
         IN_PLACE("Tensor", at::meta::fn##_(self, T(a, 1), a[2].toScalar()))},             \
        {__VA_ARGS__}}
#define COMPARE(fn)                                                              \
  Route{#fn, {OUT("Tensor", "Tensor_out", at::meta::fn(T(a, 0), T(a, 1))),       \
              OUT("Scalar", "Scalar_out", at::meta::fn(T(a, 0), a[1].toScalar()))}}
#define BITWISE(fn) Route{#fn, {OUT("Tensor", "Tensor_out", at::meta::fn(T(a, 0), T(a, 1)))}}

// The route table: one row per ATen op the neuron device executes with the
// host runtime's kernels (HostExecution.h), by base name (no "aten::" prefix,
// no trailing "_"). A row covers all of the op's overloads and its
// in-place/out= variants that have a CPU kernel, and names those that may be
// queued, with their meta functions (AsyncExecution.cpp), and those with a
// direct kernel (DirectKernels.cpp). Queued overloads are sized by the decode
// and training steps of Transformers models. Ops outside the table still run,
// through the counted fallback; an op moves into the table once the op-level
// differential suite covers it.
const Route kRoutes[] = {
    // pointwise math
    R(abs), UNARY(neg),
    BINARY_ALPHA(add, DIRECT(".Tensor", add), DIRECT("_.Tensor", add_)),
    BINARY_ALPHA(sub, DIRECT(".Tensor", sub), DIRECT("_.Tensor", sub_)),
    R(rsub),
    BINARY(mul, DIRECT(".Tensor", mul), DIRECT("_.Tensor", mul_)),
    BINARY(div, DIRECT(".Tensor", div), DIRECT("_.Tensor", div_)),
    R(remainder), R(fmod),
    Route{"pow", {OUT("Tensor_Scalar", "Tensor_Scalar_out", at::meta::pow(T(a, 0), a[1].toScalar())),
              OUT("Tensor_Tensor", "Tensor_Tensor_out", at::meta::pow(T(a, 0), T(a, 1)))}},
    UNARY(exp), UNARY(exp2), UNARY(expm1), UNARY(log), R(log2), R(log10), UNARY(log1p), UNARY(sqrt), UNARY(rsqrt),
    UNARY(reciprocal), UNARY(sin), UNARY(cos), R(tan), R(asin), R(acos), R(atan), BINARY(atan2), R(sinh), R(cosh),
    UNARY(tanh), R(asinh), R(acosh), R(atanh), UNARY(sigmoid), R(logit), UNARY(erf), R(erfc), R(erfinv), UNARY(floor),
    UNARY(ceil), R(round), UNARY(trunc), R(frac), UNARY(sign), R(sgn), R(signbit),
    Route{"clamp",
          {OUT("", "out", at::meta::clamp(T(a, 0), a[1].toOptional<at::Scalar>(), a[2].toOptional<at::Scalar>())),
           IN_PLACE("", at::meta::clamp_(self, a[1].toOptional<at::Scalar>(), a[2].toOptional<at::Scalar>()))}},
    R(clamp_min), R(clamp_max),
    Route{"maximum", {OUT("", "out", at::meta::maximum(T(a, 0), T(a, 1)))}},
    Route{"minimum", {OUT("", "out", at::meta::minimum(T(a, 0), T(a, 1)))}},
    R(fmax), R(fmin), R(lerp), R(addcmul), R(addcdiv), R(hypot), R(copysign), R(nan_to_num), R(xlogy), R(logaddexp),
    R(logaddexp2), R(floor_divide), BITWISE(bitwise_and), BITWISE(bitwise_or), BITWISE(bitwise_xor),
    UNARY(bitwise_not), R(bitwise_left_shift), R(bitwise_right_shift), R(__lshift__), R(__rshift__), R(__ilshift__),
    R(__irshift__), R(logical_and), R(logical_or), R(logical_xor), R(logical_not), COMPARE(eq), COMPARE(ne),
    COMPARE(lt), COMPARE(le), COMPARE(gt), COMPARE(ge), R(isnan), R(isinf), R(isfinite), R(isposinf), R(isneginf),
    Route{"where", {QueuedRoute{"self", QueueMode::Out, "self_out", where_meta}}},
    R(heaviside), R(digamma), R(lgamma), R(polygamma), R(mvlgamma), R(i0), R(sinc), R(igamma), R(igammac),
    R(nextafter), R(frexp), R(gcd), R(lcm), R(angle), R(conj_physical), R(deg2rad), R(rad2deg), R(polar), R(complex),
    R(view_as_real), R(view_as_complex),
    // activations and their backward passes
    R(relu),
    Route{"gelu", {OUT("", "out", at::meta::gelu(T(a, 0), a[1].toStringView()))}},
    R(gelu_backward), UNARY(silu), R(silu_backward), R(mish), R(mish_backward), R(elu), R(elu_backward), R(hardtanh),
    R(hardtanh_backward), R(hardsigmoid), R(hardsigmoid_backward), R(hardswish), R(hardswish_backward), R(leaky_relu),
    R(leaky_relu_backward), R(softplus), R(softplus_backward), R(softshrink), R(softshrink_backward), R(hardshrink),
    R(hardshrink_backward), R(threshold), R(threshold_backward), R(sigmoid_backward), R(tanh_backward),
    R(logit_backward), R(log_sigmoid_forward), R(log_sigmoid_backward), R(glu), R(glu_backward), R(_prelu_kernel),
    R(_prelu_kernel_backward), R(rrelu_with_noise), R(rrelu_with_noise_backward),
    // reductions, scans, sorting
    Route{"sum",
          {OUT("dim_IntList", "IntList_out",
               at::meta::sum(T(a, 0), dims_ref(opt_dims(a[1])), a[2].toBool(), opt_dtype(a[3])))},
          {DIRECT(".dim_IntList", sum_dim)}},
    R(nansum),
    Route{"mean",
          {OUT("dim", "out", at::meta::mean(T(a, 0), dims_ref(opt_dims(a[1])), a[2].toBool(), opt_dtype(a[3])))}},
    R(prod),
    Route{"amax", {OUT("", "out", at::meta::amax(T(a, 0), a[1].toIntVector(), a[2].toBool()))}},
    Route{"amin", {OUT("", "out", at::meta::amin(T(a, 0), a[1].toIntVector(), a[2].toBool()))}},
    R(max), R(min), R(aminmax), R(_aminmax),
    Route{"argmax", {OUT("", "out", at::meta::argmax(T(a, 0), a[1].toOptional<int64_t>(), a[2].toBool()))}},
    R(argmin),
    Route{"all", {OUT("", "all_out", at::meta::all(T(a, 0)))}},
    Route{"any", {OUT("", "all_out", at::meta::any(T(a, 0))),
                  OUT("dim", "out", at::meta::any(T(a, 0), a[1].toInt(), a[2].toBool()))}},
    R(std), R(var), R(std_mean), R(var_mean), R(norm), R(linalg_vector_norm), R(logsumexp),
    Route{"cumsum", {OUT("", "out", at::meta::cumsum(T(a, 0), a[1].toInt(), opt_dtype(a[2])))}},
    R(cumprod), R(_cummax_helper), R(_cummin_helper), R(_logcumsumexp), R(median), R(nanmedian), R(mode), R(kthvalue),
    R(topk), R(sort), R(count_nonzero), R(bincount), R(histc), R(histogram), R(_histogramdd_bin_edges),
    R(_histogramdd_from_bin_cts), R(_histogramdd_from_bin_tensors), R(hash_tensor), R(searchsorted), R(bucketize),
    R(_unique), R(_unique2), R(unique_consecutive), R(unique_dim), R(unique_dim_consecutive),
    Route{"isin", {OUT("Tensor_Tensor", "Tensor_Tensor_out", at::meta::isin(T(a, 0), T(a, 1), a[2].toBool(), a[3].toBool())),
                   OUT("Tensor_Scalar", "Tensor_Scalar_out",
                       at::meta::isin(T(a, 0), a[1].toScalar(), a[2].toBool(), a[3].toBool()))}},
    R(equal),
    R(dist), R(renorm),
    // linear algebra
    Route{"mm", {OUT("", "out", at::meta::mm(T(a, 0), T(a, 1)))}},
    Route{"bmm", {OUT("", "out", at::meta::bmm(T(a, 0), T(a, 1)))}},
    Route{"addmm", {OUT("", "out", at::meta::addmm(T(a, 0), T(a, 1), T(a, 2), a[3].toScalar(), a[4].toScalar()))}},
    R(_addmm_activation), R(addbmm),
    Route{"baddbmm", {OUT("", "out", at::meta::baddbmm(T(a, 0), T(a, 1), T(a, 2), a[3].toScalar(), a[4].toScalar()))}},
    R(addmv), R(mv), R(dot), R(vdot), R(addr), R(tril), R(triu), R(trace), R(linalg_cross), R(_cdist_forward),
    R(_cdist_backward), R(_pdist_forward), R(_pdist_backward), R(triangular_solve), R(cholesky), R(cholesky_inverse),
    R(_cholesky_solve_helper), R(lu_unpack), R(geqrf), R(ormqr),
    // normalization, softmax, losses, embeddings
    Route{"_softmax", {OUT("", "out", at::meta::_softmax(T(a, 0), a[1].toInt(), a[2].toBool()))}},
    Route{"_log_softmax", {OUT("", "out", at::meta::_log_softmax(T(a, 0), a[1].toInt(), a[2].toBool()))}},
    R(_softmax_backward_data), R(_log_softmax_backward_data), R(_masked_softmax), R(_masked_softmax_backward),
    R(native_layer_norm), R(native_layer_norm_backward), R(_fused_rms_norm), R(_fused_rms_norm_backward),
    R(native_group_norm), R(native_group_norm_backward), R(native_batch_norm), R(native_batch_norm_backward),
    R(_native_batch_norm_legit), R(batch_norm_update_stats), R(_batch_norm_with_update), R(batch_norm_backward),
    R(embedding_dense_backward), R(embedding_renorm), R(_embedding_bag), R(_embedding_bag_forward_only),
    R(_embedding_bag_dense_backward), R(_embedding_bag_per_sample_weights_backward), R(nll_loss_forward),
    R(nll_loss_backward), R(nll_loss2d_forward), R(nll_loss2d_backward), R(mse_loss), R(mse_loss_backward),
    R(smooth_l1_loss), R(smooth_l1_loss_backward), R(huber_loss), R(huber_loss_backward), R(binary_cross_entropy),
    R(binary_cross_entropy_backward), R(soft_margin_loss), R(soft_margin_loss_backward), R(multi_margin_loss),
    R(multi_margin_loss_backward), R(multilabel_margin_loss_forward), R(multilabel_margin_loss_backward),
    R(_ctc_loss), R(_ctc_loss_backward), R(_weight_norm_interface), R(_weight_norm_interface_backward),
    // pooling, padding, resampling, image ops
    R(max_pool2d_with_indices), R(max_pool2d_with_indices_backward), R(max_pool3d_with_indices),
    R(max_pool3d_with_indices_backward), R(avg_pool2d), R(avg_pool2d_backward), R(avg_pool3d), R(avg_pool3d_backward),
    R(_adaptive_avg_pool2d), R(_adaptive_avg_pool2d_backward), R(_adaptive_avg_pool3d),
    R(_adaptive_avg_pool3d_backward), R(adaptive_max_pool2d), R(adaptive_max_pool2d_backward), R(adaptive_max_pool3d),
    R(adaptive_max_pool3d_backward), R(fractional_max_pool2d), R(fractional_max_pool2d_backward),
    R(fractional_max_pool3d), R(fractional_max_pool3d_backward), R(max_unpool2d), R(max_unpool3d),
    R(reflection_pad1d), R(reflection_pad1d_backward), R(reflection_pad2d), R(reflection_pad2d_backward),
    R(reflection_pad3d), R(reflection_pad3d_backward), R(replication_pad1d), R(replication_pad1d_backward),
    R(replication_pad2d), R(replication_pad2d_backward), R(replication_pad3d), R(replication_pad3d_backward),
    R(upsample_nearest1d), R(upsample_nearest1d_backward), R(upsample_nearest2d), R(upsample_nearest2d_backward),
    R(upsample_nearest3d), R(upsample_nearest3d_backward), R(_upsample_nearest_exact1d),
    R(_upsample_nearest_exact1d_backward), R(_upsample_nearest_exact2d), R(_upsample_nearest_exact2d_backward),
    R(_upsample_nearest_exact3d), R(_upsample_nearest_exact3d_backward), R(upsample_linear1d),
    R(upsample_linear1d_backward), R(upsample_bilinear2d), R(upsample_bilinear2d_backward),
    R(_upsample_bilinear2d_aa), R(_upsample_bilinear2d_aa_backward), R(upsample_bicubic2d),
    R(upsample_bicubic2d_backward), R(upsample_trilinear3d), R(upsample_trilinear3d_backward), R(im2col), R(col2im),
    R(pixel_shuffle), R(pixel_unshuffle), R(grid_sampler_2d), R(grid_sampler_2d_backward), R(grid_sampler_3d),
    R(grid_sampler_3d_backward),
    // indexing, shapes, factories
    Route{"index", {}, {DIRECT(".Tensor", index)}},
    R(_index_put_impl), R(index_put),
    Route{"index_select", {QueuedRoute{"", QueueMode::Out, "out", index_select_meta, /*checks_data=*/true}}},
    R(index_add),
    Route{"index_copy", {QueuedRoute{"", QueueMode::InPlace, nullptr, index_copy_meta, /*checks_data=*/true}}},
    R(index_fill), R(index_reduce), R(gather), R(scatter), R(scatter_add), R(scatter_reduce), R(take), R(put),
    R(masked_fill), R(masked_scatter), R(masked_select), R(nonzero), R(nonzero_static),
    Route{"cat", {OUT("", "out", at::meta::cat(a[0].toTensorVector(), a[1].toInt()))}},
    R(flip), R(roll), R(repeat_interleave), R(unfold), R(unfold_backward),
    Route{"fill", {IN_PLACE("Scalar")}, {DIRECT("_.Scalar", fill_)}},
    Route{"zero", {IN_PLACE("")}, {DIRECT("_", zero_)}},
    Route{"arange", {QueuedRoute{"start_step", QueueMode::Out, "start_out", arange_meta}}}, R(linspace), R(logspace), R(eye), R(tril_indices), R(triu_indices), R(_assert_async),
    R(segment_reduce), R(_segment_reduce_backward),
    // random: drawn from the device generator (NeuronGenerator.h)
    R(normal), R(uniform), R(bernoulli), R(random), R(exponential), R(geometric), R(log_normal), R(cauchy),
    R(multinomial), R(randperm), R(native_dropout), R(native_dropout_backward), R(_standard_gamma),
    R(_standard_gamma_grad), R(poisson), R(binomial), R(_sample_dirichlet), R(_dirichlet_grad),
    // optimizers and AMP
    R(_amp_foreach_non_finite_check_and_unscale), R(_amp_update_scale),
    // families, by prefix
    FAMILY(_foreach_), FAMILY(_fused_adam), FAMILY(_fused_sgd), FAMILY(_fused_adagrad), FAMILY(special_),
    FAMILY(linalg_), FAMILY(_linalg_),
    // queued when a dedicated kernel (Attention.cpp) runs it through host_call
    Route{"_scaled_dot_product_flash_attention_for_cpu",
          {QueuedRoute{"", QueueMode::Copy, nullptr, flash_attention_meta}}, {}, /*table=*/false},
};

#undef OUT
#undef IN_PLACE
#undef DIRECT
#undef R
#undef FAMILY
#undef UNARY
#undef BINARY
#undef BINARY_ALPHA
#undef COMPARE
#undef BITWISE

// The row of an op by base name: its own, or its family's; null if none.
const Route* route_of(std::string_view base) {
  static const auto rows = [] {
    std::map<std::string_view, const Route*> m;
    for (const Route& r : kRoutes) {
      if (r.table) m.emplace(r.op, &r);
    }
    return m;
  }();
  if (auto it = rows.find(base); it != rows.end()) return it->second;
  for (const Route& r : kRoutes) {
    if (r.op.back() == '*' && base.substr(0, r.op.size() - 1) == r.op.substr(0, r.op.size() - 1)) return &r;
  }
  return nullptr;
}

}  // namespace

c10::ArrayRef<Route> routes() { return kRoutes; }

namespace {

// The table's overloads, as registered: with the table's kernel (host or
// direct), or left to a dedicated neuron kernel (e.g. histc's).
struct Registered {
  RouteRow row;
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
      const Route* route = route_of(base);
      if (!route) continue;
      auto op = dispatcher.findOp(name);
      // Only real backend kernels: composite ops already work on neuron
      // through their decompositions.
      if (!op || !op->hasKernelForDispatchKey(c10::DispatchKey::CPU)) continue;
      std::string qualified =
          std::string(full.substr(6)) + (name.overload_name.empty() ? "" : "." + name.overload_name);
      const DirectRoute* direct = nullptr;
      for (const DirectRoute& d : route->direct) {
        if (d.suffix && qualified == std::string(route->op) + d.suffix) direct = &d;
      }
      bool queued = false, checks_data = false;
      for (const QueuedRoute& q : route->queued) {
        if (!q.meta || route->queued_name(q) != full) continue;
        if (name.overload_name == q.overload ||
            (q.mode == QueueMode::Out && name.overload_name == q.out_overload)) {
          queued = true;
          checks_data = q.checks_data;
        }
      }
      const bool dedicated = !direct && op->hasKernelForDispatchKey(c10::DispatchKey::PrivateUse1);
      if (direct) {
        lib.impl(qualified.c_str(), direct->kernel());
      } else if (!dedicated) {
        lib.impl(qualified.c_str(), torch::CppFunction::makeFromBoxedFunction<&host_kernel>());
      }
      const bool random = op->hasTag(at::Tag::nondeterministic_seeded);
      out.push_back({{std::move(qualified), direct != nullptr, queued, checks_data, random}, !dedicated});
    }
    direct::install_cpu_stubs();
    return out;
  }();
  return registered;
}

}  // namespace

std::vector<std::string> register_host_kernels() {
  std::vector<std::string> names;
  for (const Registered& r : registrations()) names.push_back(r.row.op);
  return names;
}

std::vector<RouteRow> route_table() {
  std::vector<RouteRow> rows;
  for (const Registered& r : registrations()) {
    if (r.table_kernel) rows.push_back(r.row);
  }
  std::sort(rows.begin(), rows.end(), [](const RouteRow& a, const RouteRow& b) { return a.op < b.op; });
  return rows;
}

}  // namespace at::neuron
