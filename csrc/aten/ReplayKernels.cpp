// Prepared structured kernels for graph replays (ReplayKernels.h).
#include "ReplayKernels.h"

#include <ATen/ATen.h>
#include <ATen/TensorIterator.h>
#include <ATen/ops/add_native.h>
#include <ATen/ops/div_native.h>
#include <ATen/ops/exp_native.h>
#include <ATen/ops/gelu_native.h>
#include <ATen/ops/mul_native.h>
#include <ATen/ops/neg_native.h>
#include <ATen/ops/rsqrt_native.h>
#include <ATen/ops/sigmoid_native.h>
#include <ATen/ops/silu_native.h>
#include <ATen/ops/sqrt_native.h>
#include <ATen/ops/sub_native.h>
#include <ATen/ops/tanh_native.h>

#include <functional>
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
