// Prepared structured kernels for graph replays (ReplayKernels.h).

// The wheel's x86-64 build has AVX2 and AVX512 kernels: declaring them makes
// the DispatchStub calls here (sum_stub, copy_stub, ...) pick the kernel ATen picks
// (as in DirectKernels.cpp).
#if defined(__x86_64__)
#define HAVE_AVX512_CPU_DEFINITION
#define HAVE_AVX2_CPU_DEFINITION
#endif

#include "ReplayKernels.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/ScalarOps.h>
#include <ATen/TensorIterator.h>
#include <ATen/native/Copy.h>
#include <ATen/native/Fill.h>
#include <ATen/native/IndexKernel.h>
#include <ATen/native/RangeFactories.h>
#include <ATen/native/ReduceOps.h>
#include <ATen/native/ReduceOpsUtils.h>
#include <ATen/native/TensorCompare.h>
#include <ATen/ops/add_native.h>
#include <ATen/ops/cat_native.h>
#include <ATen/ops/div_native.h>
#include <ATen/ops/exp_native.h>
#include <ATen/ops/gelu_native.h>
#include <ATen/ops/index_copy_native.h>
#include <ATen/ops/mean_native.h>
#include <ATen/ops/mul_native.h>
#include <ATen/ops/neg_native.h>
#include <ATen/ops/pow_native.h>
#include <ATen/ops/rsqrt_native.h>
#include <ATen/ops/sigmoid_native.h>
#include <ATen/ops/silu_native.h>
#include <ATen/ops/sqrt_native.h>
#include <ATen/ops/sub_native.h>
#include <ATen/ops/sum_native.h>
#include <ATen/ops/tanh_native.h>

#include <functional>
#include <optional>
#include <string>
#include <type_traits>
#include <unordered_map>

namespace at::neuron {
namespace {

using Args = std::vector<c10::IValue>;

// The CPU kernel object `Native` (a structured TensorIterator kernel) with a
// fixed output, as the out= and in-place overloads' kernels have: the output
// exists with the meta function's sizes and dtype, so nothing is resized or
// proxied (anything else is refused, and the op keeps its dispatcher call).
template <class Native>
class Fixed final : public Native {
  static_assert(std::is_base_of_v<at::TensorIteratorBase, Native>);

 public:
  explicit Fixed(at::Tensor out) : out_(std::move(out)) {}

  const at::Tensor& maybe_get_output(int64_t) override { return out_; }
  void set_output_raw_strided(int64_t i, at::IntArrayRef sizes, at::IntArrayRef strides,
                              at::TensorOptions options) override {
    TORCH_CHECK(out_.sizes() == sizes && out_.scalar_type() == options.dtype(), "the output would be resized");
    Native::set_output_raw_strided(i, sizes, strides, options);
  }
  void set_output_strided(int64_t i, at::IntArrayRef sizes, at::IntArrayRef strides,
                          at::TensorOptions options) override {
    TORCH_CHECK(out_.strides() == strides, "the kernel needs other output strides");
    set_output_raw_strided(i, sizes, strides, options);
  }

  // Whether building the iterator replaced an input by a converted copy
  // (another dtype): a replay would read the copy, not the input's memory.
  // CPU scalars (snapshots taken at capture) may be converted: they do not
  // change.
  bool converted_an_input() const {
    for (int i = this->noutputs(); i < this->ntensors(); ++i) {
      const at::TensorBase& original = this->operands_[i].original_tensor_base();
      if (original.defined() && !(original.dim() == 0 && original.unsafeGetTensorImpl()->is_wrapped_number())) {
        return true;
      }
    }
    return false;
  }

  const at::Tensor& out() const { return out_; }

 private:
  at::Tensor out_;
};

// meta(kernel, args) once; impl(kernel, args) per run. The kernel object
// borrows the tensors of `args_` (the iterator keeps references): both live
// here, at fixed addresses.
template <class Native, class Meta, class Impl>
class StructuredCall final : public ReplayCall {
 public:
  StructuredCall(const Args& args, const at::Tensor& out, Meta meta, Impl impl)
      : args_(args), kernel_(out), impl_(impl) {
    meta(kernel_, args_);
    TORCH_CHECK(!kernel_.converted_an_input(), "an input is converted at build time");
    operands_ = kernel_.ntensors();
  }
  void run() override {
    impl_(kernel_, args_);
    // Some kernels drop a scalar operand from the iterator (reduced-precision
    // binary ops): that object cannot run again.
    if (kernel_.ntensors() != operands_) rerunnable_ = false;
  }
  bool rerunnable() const override { return rerunnable_; }
  size_t footprint() const override { return sizeof(*this); }

 private:
  Args args_;
  Fixed<Native> kernel_;
  Impl impl_;
  int operands_ = 0;
  bool rerunnable_ = true;
};

template <class Native, class Meta, class Impl>
std::unique_ptr<ReplayCall> structured(const Args& args, const at::Tensor& out, Meta meta, Impl impl) {
  return std::make_unique<StructuredCall<Native, Meta, Impl>>(args, out, meta, impl);
}

// The same for structured kernels that are not TensorIterators (reductions
// over dims, cat, index_copy): their meta functions only size the output,
// which must be `out` as it is.
template <class Native>
class FixedMeta final : public Native {
  static_assert(std::is_base_of_v<at::impl::MetaBase, Native>);

 public:
  explicit FixedMeta(at::Tensor out) : out_(std::move(out)) {}

  const at::Tensor& maybe_get_output(int64_t) override { return out_; }
  void set_output_raw_strided(int64_t, at::IntArrayRef sizes, at::IntArrayRef, at::TensorOptions options) override {
    TORCH_CHECK(out_.sizes() == sizes && out_.scalar_type() == options.dtype(), "the output would be resized");
  }
  void set_output_strided(int64_t i, at::IntArrayRef sizes, at::IntArrayRef strides,
                          at::TensorOptions options) override {
    TORCH_CHECK(out_.strides() == strides, "the kernel needs other output strides");
    set_output_raw_strided(i, sizes, strides, options);
  }

  const at::Tensor& out() const { return out_; }

 private:
  at::Tensor out_;
};

// meta once, keeping what it precomputes (and any operands built from the
// arguments, e.g. cat's tensor vector) as `State`; impl per run.
template <class Native, class State, class Meta, class Impl>
class MetaCall final : public ReplayCall {
 public:
  MetaCall(const Args& args, const at::Tensor& out, Meta meta, Impl impl) : args_(args), kernel_(out), impl_(impl) {
    state_.emplace(meta(kernel_, args_));
  }
  void run() override { impl_(kernel_, args_, *state_); }
  bool rerunnable() const override { return true; }
  size_t footprint() const override { return sizeof(*this); }

 private:
  Args args_;
  FixedMeta<Native> kernel_;
  std::optional<State> state_;
  Impl impl_;
};

template <class Native, class State, class Meta, class Impl>
std::unique_ptr<ReplayCall> meta_call(const Args& args, const at::Tensor& out, Meta meta, Impl impl) {
  return std::make_unique<MetaCall<Native, State, Meta, Impl>>(args, out, meta, impl);
}

using Factory = std::function<std::unique_ptr<ReplayCall>(const Args&, const at::Tensor&)>;

template <class Native>
Factory unary() {
  return [](const Args& a, const at::Tensor& out) -> std::unique_ptr<ReplayCall> {
    if (a.size() != 1 || !a[0].isTensor()) return nullptr;
    return structured<Native>(
        a, out, [](auto& k, const Args& x) { k.meta(x[0].toTensor()); },
        [](auto& k, const Args& x) { k.impl(x[0].toTensor(), k.out()); });
  };
}

template <class Native>
Factory binary() {
  return [](const Args& a, const at::Tensor& out) -> std::unique_ptr<ReplayCall> {
    if (a.size() != 2 || !a[0].isTensor() || !a[1].isTensor()) return nullptr;
    return structured<Native>(
        a, out, [](auto& k, const Args& x) { k.meta(x[0].toTensor(), x[1].toTensor()); },
        [](auto& k, const Args& x) { k.impl(x[0].toTensor(), x[1].toTensor(), k.out()); });
  };
}

template <class Native>
Factory binary_alpha() {
  return [](const Args& a, const at::Tensor& out) -> std::unique_ptr<ReplayCall> {
    if (a.size() != 3 || !a[0].isTensor() || !a[1].isTensor() || !a[2].isScalar()) return nullptr;
    return structured<Native>(
        a, out, [](auto& k, const Args& x) { k.meta(x[0].toTensor(), x[1].toTensor(), x[2].toScalar()); },
        [](auto& k, const Args& x) { k.impl(x[0].toTensor(), x[1].toTensor(), x[2].toScalar(), k.out()); });
  };
}

Factory gelu() {
  return [](const Args& a, const at::Tensor& out) -> std::unique_ptr<ReplayCall> {
    if (a.size() != 2 || !a[0].isTensor() || !a[1].isString()) return nullptr;
    return structured<at::native::structured_gelu_out_cpu>(
        a, out, [](auto& k, const Args& x) { k.meta(x[0].toTensor(), x[1].toStringView()); },
        [](auto& k, const Args& x) { k.impl(x[0].toTensor(), x[1].toStringView(), k.out()); });
  };
}

template <class Native>
Factory tensor_scalar() {
  return [](const Args& a, const at::Tensor& out) -> std::unique_ptr<ReplayCall> {
    if (a.size() != 2 || !a[0].isTensor() || !a[1].isScalar()) return nullptr;
    return structured<Native>(
        a, out, [](auto& k, const Args& x) { k.meta(x[0].toTensor(), x[1].toScalar()); },
        [](auto& k, const Args& x) { k.impl(x[0].toTensor(), x[1].toScalar(), k.out()); });
  };
}

// sum/mean over dims: (self, dim int[1]?, keepdim, dtype?).
struct DimReduction {
  std::optional<std::vector<int64_t>> dims;
  at::OptionalIntArrayRef ref() const { return dims ? at::OptionalIntArrayRef(*dims) : std::nullopt; }
};

// A sum over dims with its reduction iterator built once: ATen's CPU sum_out
// impl builds it per call (make_reduction_from_out_ty, a few µs for a
// 576-float row) and runs sum_stub over it; its CPU mean_out is that sum
// followed by div_(the number of reduced elements), prepared here too.
class ReductionCall final : public ReplayCall {
 public:
  ReductionCall(Args args, at::TensorIterator iter, std::unique_ptr<ReplayCall> divide)
      : args_(std::move(args)), iter_(std::move(iter)), divide_(std::move(divide)) {}
  void run() override {
    at::native::sum_stub(at::kCPU, iter_);
    if (divide_) divide_->run();
  }
  bool rerunnable() const override { return !divide_ || divide_->rerunnable(); }
  size_t footprint() const override { return sizeof(*this); }

 private:
  Args args_;  // keeps the operands alive (the iterator holds its own views)
  at::TensorIterator iter_;
  std::unique_ptr<ReplayCall> divide_;
};

template <class Native, bool kMean>
Factory dim_reduction() {
  return [](const Args& a, const at::Tensor& out) -> std::unique_ptr<ReplayCall> {
    if (a.size() != 4 || !a[0].isTensor() || !(a[1].isNone() || a[1].isIntList()) || !a[2].isBool()) return nullptr;
    DimReduction r;
    if (!a[1].isNone()) r.dims = a[1].toIntVector();
    const at::Tensor& self = a[0].toTensor();
    const bool keepdim = a[2].toBool();
    FixedMeta<Native> checked(out);  // the op's checks and output size, once
    checked.meta(self, r.ref(), keepdim, a[3].toOptional<at::ScalarType>());
    // The iterator must read `self` itself (no converted copy: same dtype as
    // the output) and sum in the output's dtype (reduced-precision outputs
    // go through an fp32 buffer in ATen); an empty input zeroes instead.
    if (!self.device().is_cpu() || self.scalar_type() != out.scalar_type() ||
        at::isReducedFloatingType(out.scalar_type()) || self.numel() == 0) {
      return nullptr;
    }
    at::TensorIterator iter = at::meta::make_reduction_from_out_ty(self, out, r.ref(), keepdim, out.scalar_type());
    if (iter.numel() == 0) return nullptr;
    std::unique_ptr<ReplayCall> divide;
    if constexpr (kMean) {
      // mean_out's divisor, as ATen computes it.
      int64_t count = 1;
      if (!r.dims || r.dims->empty() || self.dim() == 0) {
        count = self.numel();
      } else {
        for (int64_t d : *r.dims) count *= self.size(d);
      }
      at::Tensor divisor = c10::scalar_to_tensor(at::Scalar(count));
      divisor.unsafeGetTensorImpl()->set_wrapped_number(true);
      divide = binary<at::native::structured_div_out>()(Args{out, divisor}, out);
      if (!divide) return nullptr;
    }
    return std::make_unique<ReductionCall>(a, std::move(iter), std::move(divide));
  };
}

// Other sum/mean calls: meta once, ATen's impl per run.
template <class Native>
Factory dim_reduction_impl() {
  return [](const Args& a, const at::Tensor& out) -> std::unique_ptr<ReplayCall> {
    if (a.size() != 4 || !a[0].isTensor() || !(a[1].isNone() || a[1].isIntList()) || !a[2].isBool()) return nullptr;
    return meta_call<Native, DimReduction>(
        a, out,
        [](auto& k, const Args& x) {
          DimReduction r;
          if (!x[1].isNone()) r.dims = x[1].toIntVector();
          k.meta(x[0].toTensor(), r.ref(), x[2].toBool(), x[3].toOptional<at::ScalarType>());
          return r;
        },
        [](auto& k, const Args& x, const DimReduction& r) {
          k.impl(x[0].toTensor(), r.ref(), x[2].toBool(), x[3].toOptional<at::ScalarType>(), k.out());
        });
  };
}

// The first factory that prepares the call.
Factory first_of(Factory a, Factory b) {
  return [a, b](const Args& args, const at::Tensor& out) {
    std::unique_ptr<ReplayCall> call = a(args, out);
    return call ? std::move(call) : b(args, out);
  };
}

// cat: meta once. ATen's CPU impl copies each input through a TensorIterator
// it builds per call (after narrowing the output), unless a serial kernel
// takes all-contiguous inputs: those copies are built once here and each run
// only copies (the same bytes: a copy is exact whatever the iterator's
// layout). The serial case keeps calling impl (it builds nothing).
class CatCopies final : public ReplayCall {
 public:
  CatCopies(Args args, std::vector<at::TensorIterator> copies)
      : args_(std::move(args)), copies_(std::move(copies)) {}
  void run() override {
    for (at::TensorIterator& copy : copies_) at::native::copy_stub(at::kCPU, copy, /*non_blocking=*/false);
  }
  bool rerunnable() const override { return true; }
  size_t footprint() const override { return sizeof(*this); }

 private:
  Args args_;
  std::vector<at::TensorIterator> copies_;
};

Factory cat() {
  struct State {
    std::vector<at::Tensor> tensors;
    int64_t dim, valid;
    bool all_contiguous, all_same_dtype, all_same_sizes_and_stride;
    at::MemoryFormat memory_format;
  };
  return [](const Args& a, const at::Tensor& out) -> std::unique_ptr<ReplayCall> {
    if (a.size() != 2 || !a[0].isTensorList() || !a[1].isInt()) return nullptr;
    auto meta = [](auto& k, const Args& x) {
      std::vector<at::Tensor> tensors = x[0].toTensorVector();
      auto p = k.meta(at::ITensorListRef(tensors), x[1].toInt());
      return State{std::move(tensors), p.dim, p.valid, p.all_contiguous, p.all_same_dtype,
                   p.all_same_sizes_and_stride, p.memory_format};
    };
    FixedMeta<at::native::structured_cat_out_cpu> checked(out);
    const State s = meta(checked, a);
    const bool serial = out.numel() < at::internal::GRAIN_SIZE || at::get_num_threads() == 1;
    if (out.numel() > 0 && !(serial && s.all_contiguous && s.all_same_dtype)) {
      std::vector<at::TensorIterator> copies;
      int64_t offset = 0;
      for (const at::Tensor& t : s.tensors) {
        if (t.numel() == 0 && t.dim() == 1) continue;  // legacy empty inputs, skipped as ATen does
        const int64_t n = t.size(s.dim);
        copies.push_back(at::TensorIteratorConfig()
                             .set_check_mem_overlap(false)
                             .resize_outputs(false)
                             .add_owned_output(out.narrow(s.dim, offset, n))
                             .add_owned_const_input(t)
                             .promote_inputs_to_common_dtype(true)
                             .cast_common_dtype_to_outputs(true)
                             .enforce_safe_casting_to_output(true)
                             .build());
        offset += n;
      }
      return std::make_unique<CatCopies>(a, std::move(copies));
    }
    return meta_call<at::native::structured_cat_out_cpu, State>(
        a, out, meta, [](auto& k, const Args&, const State& st) {
          k.impl(at::ITensorListRef(st.tensors), st.dim, st.valid, st.all_contiguous, st.all_same_dtype,
                 st.all_same_sizes_and_stride, st.memory_format, k.out());
        });
  };
}

// An op whose CPU kernel builds a TensorIterator per call and runs one
// DispatchStub over it: the iterator is built once here, as ATen builds it,
// and each run is `stub(iterator)`.
template <class Stub>
class IteratorCall final : public ReplayCall {
 public:
  IteratorCall(Args args, at::TensorIterator iter, Stub stub)
      : args_(std::move(args)), iter_(std::move(iter)), stub_(std::move(stub)) {}
  void run() override { stub_(iter_); }
  bool rerunnable() const override { return true; }
  size_t footprint() const override { return sizeof(*this); }

 private:
  Args args_;  // keeps the operands alive (the iterator owns its views)
  at::TensorIterator iter_;
  Stub stub_;
};

template <class Stub>
std::unique_ptr<ReplayCall> iterator_call(const Args& args, at::TensorIterator iter, Stub stub) {
  return std::make_unique<IteratorCall<Stub>>(args, std::move(iter), std::move(stub));
}

// index_copy_(self, dim, index, source), in place (out is self): meta once,
// and the iterator ATen's impl builds (self restrided not to advance along
// `dim`, the index broadcast over it); each run is the kernel, which still
// checks every index value (a bad index fails that replay, named).
Factory index_copy() {
  return [](const Args& a, const at::Tensor& out) -> std::unique_ptr<ReplayCall> {
    if (a.size() != 4 || !a[0].isTensor() || !a[1].isInt() || !a[2].isTensor() || !a[3].isTensor()) return nullptr;
    const at::Tensor& self = a[0].toTensor();
    const at::Tensor& index = a[2].toTensor();
    const at::Tensor& source = a[3].toTensor();
    if (!out.is_same(self) || !self.device().is_cpu()) return nullptr;
    FixedMeta<at::native::structured_index_copy_out> checked(out);
    const int64_t dim = checked.meta(self, a[1].toInt(), index, source).dim;
    const at::Tensor result = self.dim() == 0 ? self.unsqueeze(0) : self;
    const at::Tensor src = source.dim() == 0 ? source.unsqueeze(0) : source;
    std::vector<int64_t> index_sizes(result.dim(), 1), index_strides(result.dim(), 0);
    index_sizes[dim] = index.numel();
    index_strides[dim] = index.dim() > 0 ? index.stride(0) : 1;
    std::vector<int64_t> result_sizes = result.sizes().vec(), result_strides = result.strides().vec();
    result_sizes[dim] = index.numel();
    result_strides[dim] = 0;
    at::TensorIterator iter = at::TensorIteratorConfig()
                                  .set_check_mem_overlap(false)  // the zero stride along dim
                                  .check_all_same_dtype(false)
                                  .resize_outputs(false)
                                  .add_owned_output(result.as_strided(result_sizes, result_strides))
                                  .add_owned_const_input(index.as_strided(index_sizes, index_strides))
                                  .add_owned_const_input(src)
                                  .build();
    return iterator_call(a, std::move(iter),
                         [dim, size = result.size(dim), stride = result.stride(dim)](at::TensorIterator& it) {
                           at::native::index_copy_stub(at::kCPU, it, dim, size, stride);
                         });
  };
}

// where.self_out(condition, self, other): operands already of the result
// dtype and a bool condition (ATen would convert the others into copies).
Factory where() {
  return [](const Args& a, const at::Tensor& out) -> std::unique_ptr<ReplayCall> {
    if (a.size() != 3 || !a[0].isTensor() || !a[1].isTensor() || !a[2].isTensor()) return nullptr;
    const at::Tensor &condition = a[0].toTensor(), &self = a[1].toTensor(), &other = a[2].toTensor();
    if (condition.scalar_type() != at::kBool || self.scalar_type() != out.scalar_type() ||
        other.scalar_type() != out.scalar_type()) {
      return nullptr;
    }
    at::TensorIterator iter = at::TensorIteratorConfig()
                                  .check_all_same_dtype(false)
                                  .resize_outputs(false)
                                  .add_owned_output(out)
                                  .add_owned_const_input(condition)
                                  .add_owned_const_input(self)
                                  .add_owned_const_input(other)
                                  .build();
    return iterator_call(a, std::move(iter), [](at::TensorIterator& it) { at::native::where_kernel(at::kCPU, it); });
  };
}

// arange.start_out(start, end, step): the output was sized at capture (its
// numel is the range's size); a contiguous one is filled in place.
Factory arange() {
  return [](const Args& a, const at::Tensor& out) -> std::unique_ptr<ReplayCall> {
    if (a.size() != 3 || !a[0].isScalar() || !a[1].isScalar() || !a[2].isScalar()) return nullptr;
    if (!out.is_contiguous() || out.numel() == 0) return nullptr;
    at::TensorIterator iter = at::TensorIterator::nullary_op(const_cast<at::Tensor&>(out));
    return iterator_call(a, std::move(iter),
                         [start = a[0].toScalar(), size = at::Scalar(out.numel()),
                          step = a[2].toScalar()](at::TensorIterator& it) {
                           at::native::arange_stub(at::kCPU, it, start, size, step);
                         });
  };
}

// fill_.Scalar(self, value), in place.
Factory fill() {
  return [](const Args& a, const at::Tensor& out) -> std::unique_ptr<ReplayCall> {
    if (a.size() != 2 || !a[0].isTensor() || !a[1].isScalar() || !out.is_same(a[0].toTensor()) || out.numel() == 0) {
      return nullptr;
    }
    at::TensorIterator iter = at::TensorIteratorConfig()
                                  .set_check_mem_overlap(false)  // fill is idempotent
                                  .check_all_same_dtype(false)
                                  .add_owned_output(out)
                                  .resize_outputs(false)
                                  .build();
    return iterator_call(a, std::move(iter), [value = a[1].toScalar()](at::TensorIterator& it) {
      at::native::fill_stub(at::kCPU, it, value);
    });
  };
}

// "aten::op.overload" of the out= and in-place overloads -> the CPU kernel
// object their CPU registrations run (ATen/ops/*_native.h).
const std::unordered_map<std::string, Factory>& factories() {
  static const auto table = [] {
    std::unordered_map<std::string, Factory> m;
    auto both = [&](const char* op, const char* inplace_overload, Factory f) {
      m.emplace(std::string("aten::") + op + ".out", f);
      m.emplace(std::string("aten::") + op + "_" + inplace_overload, f);
    };
    both("add", ".Tensor", binary_alpha<at::native::structured_ufunc_add_CPU>());
    both("sub", ".Tensor", binary_alpha<at::native::structured_sub_out>());
    both("mul", ".Tensor", binary<at::native::structured_mul_out>());
    both("div", ".Tensor", binary<at::native::structured_div_out>());
    both("sigmoid", "", unary<at::native::structured_sigmoid_out>());
    both("tanh", "", unary<at::native::structured_tanh_out>());
    both("exp", "", unary<at::native::structured_exp_out>());
    both("neg", "", unary<at::native::structured_neg_out>());
    both("rsqrt", "", unary<at::native::structured_rsqrt_out>());
    both("sqrt", "", unary<at::native::structured_sqrt_out>());
    both("silu", "", unary<at::native::structured_silu_out>());
    both("gelu", "", gelu());
    m.emplace("aten::pow.Tensor_Scalar_out", tensor_scalar<at::native::structured_pow_Tensor_Scalar_out>());
    m.emplace("aten::pow_.Scalar", tensor_scalar<at::native::structured_pow_Tensor_Scalar_out>());
    m.emplace("aten::sum.IntList_out", first_of(dim_reduction<at::native::structured_sum_out, false>(),
                                                dim_reduction_impl<at::native::structured_sum_out>()));
    m.emplace("aten::mean.out", first_of(dim_reduction<at::native::structured_mean_out, true>(),
                                         dim_reduction_impl<at::native::structured_mean_out>()));
    m.emplace("aten::cat.out", cat());
    m.emplace("aten::index_copy_", index_copy());
    m.emplace("aten::where.self_out", where());
    m.emplace("aten::arange.start_out", arange());
    m.emplace("aten::fill_.Scalar", fill());
    return m;
  }();
  return table;
}

}  // namespace

std::unique_ptr<ReplayCall> prepare_replay_call(const c10::OperatorHandle& op, const std::vector<c10::IValue>& args,
                                                const at::Tensor& out) {
  const auto& name = op.schema().operator_name();
  std::string key = name.name;
  if (!name.overload_name.empty()) key += "." + name.overload_name;
  auto it = factories().find(key);
  if (it == factories().end() || !out.defined()) return nullptr;
  try {
    return it->second(args, out);
  } catch (const std::exception&) {
    return nullptr;  // the op keeps its dispatcher call (which reports real errors)
  }
}

}  // namespace at::neuron
