// Direct kernels: frequent small ops, unboxed and without host aliases.
//
// Every op can run through the host path (HostExecution.cpp): boxed, over
// host aliases of its device tensors, its results mapped back. For a
// 16-element add that bookkeeping costs as much as the kernel. The ops here
// run ATen's structured CPU kernel on the device tensors themselves: its meta
// function checks the arguments and sizes the outputs, which are allocated on
// the device, and its impl runs in a runtime launch, where device memory is
// host-accessible. The DispatchStubs those impls call resolve, for
// PrivateUse1, to the CPU kernels (use_cpu_kernel below).
//
// A call takes this path only when it computes what the host path computes:
// - the host path would run it on the caller too: the stream is idle and the
//   operands are small, launches are blocking, the op is never queued
//   (index), or the call comes from inside a running kernel (sum's fill_);
//   runtime.md, "What is queued". Otherwise the host path queues it;
// - no device operand needs a dtype conversion: TensorIterator converts
//   operands (into temporaries) only when its common device is the CPU, as
//   other devices' kernels convert while loading, and CPU kernels do not;
// - its CPU operands are scalars: a wrapped number (a Python scalar) is
//   converted to the op's dtype here, as TensorIterator would on the CPU
//   (see binary_operand for the exceptions);
// - no negative or conjugate bit, no zero tensor, and not in strict mode
//   (Fidelity.h, which checks each result).
// Anything else takes the host path, which raises the same errors.

// The wheel's x86-64 build has AVX2 and AVX512 kernels: declaring them lets
// use_cpu_kernel pick the kernel DispatchStub picks for the CPU.
#if defined(__x86_64__)
#define HAVE_AVX512_CPU_DEFINITION
#define HAVE_AVX2_CPU_DEFINITION
#endif

#include <ATen/ATen.h>
#include <ATen/EmptyTensor.h>
#include <ATen/Version.h>
#include <ATen/native/BinaryOps.h>
#include <ATen/native/DispatchStub.h>
#include <ATen/native/Fill.h>
#include <ATen/native/IndexKernel.h>
#include <ATen/native/ReduceOps.h>
#include <ATen/ops/add_native.h>
#include <ATen/ops/div_native.h>
#include <ATen/ops/fill_native.h>
#include <ATen/ops/index_native.h>
#include <ATen/ops/mul_native.h>
#include <ATen/ops/sub_native.h>
#include <ATen/ops/sum_native.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/DeviceGuard.h>

#include <array>
#include <cstring>
#include <functional>
#include <mutex>
#include <type_traits>

#include "DirectKernels.h"
#include "Fidelity.h"
#include "HostExecution.h"
#include "NeuronAllocator.h"
#include "NeuronFunctions.h"
#include "OpTracking.h"
#include "Routes.h"
#include "csrc/runtime/Runtime.h"

namespace at::neuron {
namespace {

constexpr auto kNeuron = c10::DeviceType::PrivateUse1;

// ---- outputs of the structured kernels ---------------------------------------

at::Tensor empty_on_device(c10::IntArrayRef sizes, c10::IntArrayRef strides, const c10::TensorOptions& options) {
  const auto keys = c10::DispatchKeySet(c10::DispatchKey::PrivateUse1);
  const auto dtype = c10::typeMetaToScalarType(options.dtype());
  if (strides.empty()) return at::detail::empty_generic(sizes, device_allocator(), keys, dtype, std::nullopt);
  return at::detail::empty_strided_generic(sizes, strides, device_allocator(), keys, dtype);
}

// A structured kernel's output: functional, allocated on the device (the
// caller's Guard selects which); in place, `self`, which the op may not
// resize or cast.
template <class Structured>
struct Outputs final : Structured {
  explicit Outputs(const at::Tensor* self = nullptr) : self_(self) {}
  void set_output_strided(int64_t i, c10::IntArrayRef sizes, c10::IntArrayRef strides,
                          c10::TensorOptions options) override {
    set_output_raw_strided(i, sizes, strides, options);
  }
  void set_output_raw_strided(int64_t i, c10::IntArrayRef sizes, c10::IntArrayRef strides,
                              c10::TensorOptions options) override {
    if (!self_) {
      outputs[i] = empty_on_device(sizes, strides, options);
    } else {
      TORCH_CHECK(options.dtype() == self_->dtype(), "Bad in-place call: input tensor dtype ", self_->dtype(),
                  " and output tensor dtype ", options.dtype(), " should match");
      TORCH_CHECK(options.device() == self_->device(), "Bad in-place call: input tensor device ", self_->device(),
                  " and output tensor device ", options.device(), " should match");
      TORCH_CHECK(sizes == self_->sizes(), "Bad in-place call: input tensor size ", self_->sizes(),
                  " and output tensor size ", sizes, " should match");
    }
    // After the output exists: TensorIterator reads it back through maybe_get_output.
    if constexpr (std::is_base_of_v<at::TensorIteratorBase, Structured>) {
      Structured::set_output_raw_strided(i, sizes, strides, options);
    }
  }
  const at::Tensor& maybe_get_output(int64_t i) override { return self_ ? *self_ : outputs[i]; }
  std::array<at::Tensor, 1> outputs;
  const at::Tensor* self_;
};

// ---- when the direct path applies --------------------------------------------

// A device tensor the CPU kernels can read as it is.
bool plain(const at::Tensor& t) {
  return t.defined() && t.device().type() == kNeuron && !t.is_neg() && !t.is_conj() && !t._is_zerotensor();
}

size_t bytes_of(const at::Tensor& t) { return static_cast<size_t>(t.numel()) * t.element_size(); }

neuronrt::Stream& stream_of(const at::Tensor& self) { return neuronrt::current_stream(self.device().index()); }

// The stream of an op on `self` whose operands total `bytes`, if the host
// path would run it on the caller as well (see the top), else null. Inside a
// kernel (an op's kernel calling another op), work runs inline.
neuronrt::Stream* caller_stream(const at::Tensor& self, size_t bytes) {
  if (strict_mode()) return nullptr;
  neuronrt::Stream& stream = stream_of(self);
  return neuronrt::in_kernel() || runs_inline(stream, bytes) ? &stream : nullptr;
}

// Runs `body` (a kernel over device memory) on the stream, on the caller; as
// part of the running kernel when called from one. (The launch takes a
// std::function: wrapping a reference to `body` keeps it from allocating.)
template <class F>
void launch(neuronrt::Stream& stream, const char* name, F&& body) {
  note_executed(name);
  if (neuronrt::in_kernel()) return body();
  rt_call([&] { stream.launch(std::ref(body), name); });
}

// Makes `self`'s device current for the call (outputs are allocated there).
class Guard {
 public:
  explicit Guard(const at::Tensor& self) {
    if (self.device().index() != current_device()) guard_.emplace(self.device());
  }

 private:
  std::optional<c10::DeviceGuard> guard_;
};

int category(c10::ScalarType t) {
  if (t == at::kBool) return 0;
  if (c10::isIntegralType(t, /*includeBool=*/false)) return 1;
  if (c10::isFloatingType(t)) return 2;
  return 3;  // complex
}

c10::Scalar value_of(const at::Tensor& number) {
  const void* p = number.const_data_ptr();
  switch (number.scalar_type()) {
    case at::kDouble: return *static_cast<const double*>(p);
    case at::kLong: return *static_cast<const int64_t*>(p);
    case at::kBool: return *static_cast<const bool*>(p);
    case at::kComplexDouble: return *static_cast<const c10::complex<double>*>(p);
    default: TORCH_INTERNAL_ASSERT(false, "unexpected wrapped number dtype ", number.scalar_type());
  }
}

// `other` as an operand of a binary op with `self` on the direct path, or an
// undefined tensor when the call needs the host path. `to_float`: the op
// computes integer inputs in floating point (true division).
at::Tensor binary_operand(const at::Tensor& self, const at::Tensor& other, bool to_float = false) {
  if (!plain(self) || !other.defined() || other.is_neg() || other.is_conj() || other._is_zerotensor()) return {};
  const auto dtype = self.scalar_type();
  if (to_float && category(dtype) < 2) return {};
  if (other.device() == self.device()) return other.scalar_type() == dtype ? other : at::Tensor();
  // A CPU operand: only a scalar (TensorIterator allows one on other devices).
  if (!other.device().is_cpu() || other.dim() != 0 || other.layout() != c10::kStrided) return {};
  if (other.scalar_type() == dtype) return other;
  // A wrapped number converts to the tensor's dtype unless its category is
  // higher (2.5 + an int tensor is a float tensor): then the host path
  // promotes. Not for float16/bfloat16 tensors, whose CPU kernels read the
  // scalar's unconverted value; not a bool, which meta functions check for
  // (sub refuses one).
  if (!other.unsafeGetTensorImpl()->is_wrapped_number() || c10::isReducedFloatingType(dtype) ||
      other.scalar_type() == at::kBool || category(other.scalar_type()) > category(dtype)) {
    return {};
  }
  at::Tensor converted = at::detail::scalar_tensor_static(value_of(other), dtype, c10::Device(c10::kCPU));
  converted.unsafeGetTensorImpl()->set_wrapped_number(true);
  return converted;
}

// ---- the host path -------------------------------------------------------------

// Calls the host kernel of the op named by `Op` (an at::_ops struct) boxed.
template <class Op, class... Args>
decltype(auto) host_path(Args&&... args) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow(Op::name, Op::overload_name)
                             .template typed<typename Op::schema>();
  return c10::impl::BoxedKernelWrapper<typename Op::schema>::call(
      c10::BoxedKernel::makeFromFunction<&host_kernel>(), op, c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
      std::forward<Args>(args)...);
}

// ---- the kernels ---------------------------------------------------------------

// Binary TensorIterator ops: add, sub (`extra` is their alpha), mul, div
// (kToFloat: integer inputs compute in floating point); in place when `self`
// is not const (add_, ...).
template <class Structured, class Op, bool kToFloat, class Self, class... Extra>
std::conditional_t<std::is_const_v<Self>, at::Tensor, at::Tensor&> binary(Self& self, const at::Tensor& other,
                                                                          const Extra&... extra) {
  const at::Tensor b = binary_operand(self, other, kToFloat);
  auto* stream = b.defined() ? caller_stream(self, bytes_of(self) + bytes_of(b)) : nullptr;
  if (!stream) return host_path<Op>(self, other, extra...);
  AllocationContext context;
  Guard guard(self);
  Outputs<Structured> op(std::is_const_v<Self> ? nullptr : &self);
  op.meta(self, b, extra...);
  launch(*stream, Op::name, [&] { op.impl(self, b, extra..., op.maybe_get_output(0)); });
  if constexpr (std::is_const_v<Self>) {
    return std::move(op.outputs[0]);
  } else {
    return self;
  }
}

// ---- the CPU kernels of the stubs, for PrivateUse1 ---------------------------------

// The CPU kernel a stub selects, by the CPU capability (as DispatchStub does;
// ATEN_CPU_CAPABILITY can lower it).
template <class Stub>
void use_cpu_kernel(Stub& stub) {
  using Base = typename Stub::DispatchStub;
  typename Base::FnPtr fn = Base::DEFAULT;
#if defined(__x86_64__)
  static const std::string capability = at::get_cpu_capability();
  if (capability == "AVX512" && Base::AVX512) {
    fn = Base::AVX512;
  } else if ((capability == "AVX512" || capability == "AVX2") && Base::AVX2) {
    fn = Base::AVX2;
  }
#endif
  TORCH_INTERNAL_ASSERT(fn, "no CPU kernel for a DispatchStub");
  stub.set_privateuse1_dispatch_ptr(fn);
}

}  // namespace

namespace direct {

using namespace at::native;

at::Tensor add(const at::Tensor& self, const at::Tensor& other, const at::Scalar& alpha) {
  return binary<structured_ufunc_add_CPU, at::_ops::add_Tensor, false>(self, other, alpha);
}
at::Tensor& add_(at::Tensor& self, const at::Tensor& other, const at::Scalar& alpha) {
  return binary<structured_ufunc_add_CPU, at::_ops::add__Tensor, false>(self, other, alpha);
}
at::Tensor sub(const at::Tensor& self, const at::Tensor& other, const at::Scalar& alpha) {
  return binary<structured_sub_out, at::_ops::sub_Tensor, false>(self, other, alpha);
}
at::Tensor& sub_(at::Tensor& self, const at::Tensor& other, const at::Scalar& alpha) {
  return binary<structured_sub_out, at::_ops::sub__Tensor, false>(self, other, alpha);
}
at::Tensor mul(const at::Tensor& self, const at::Tensor& other) {
  return binary<structured_mul_out, at::_ops::mul_Tensor, false>(self, other);
}
at::Tensor& mul_(at::Tensor& self, const at::Tensor& other) {
  return binary<structured_mul_out, at::_ops::mul__Tensor, false>(self, other);
}
at::Tensor div(const at::Tensor& self, const at::Tensor& other) {
  return binary<structured_div_out, at::_ops::div_Tensor, true>(self, other);
}
at::Tensor& div_(at::Tensor& self, const at::Tensor& other) {
  return binary<structured_div_out, at::_ops::div__Tensor, true>(self, other);
}

// sum over dims, in the input's own dtype. (Integer sums accumulate in int64
// and reduced-precision sums through a float buffer: conversions, so those
// take the host path, as do empty inputs, whose kernel calls zero_.)
at::Tensor sum_dim(const at::Tensor& self, at::OptionalIntArrayRef dim, bool keepdim,
                   std::optional<at::ScalarType> dtype) {
  const bool direct = plain(self) && category(self.scalar_type()) >= 2 &&
                      !c10::isReducedFloatingType(self.scalar_type()) && (!dtype || *dtype == self.scalar_type()) &&
                      self.numel() > 0;
  auto* stream = direct ? caller_stream(self, bytes_of(self)) : nullptr;
  if (!stream) {
    return host_path<at::_ops::sum_dim_IntList>(self, dim, keepdim, dtype);
  }
  AllocationContext context;
  Guard guard(self);
  Outputs<at::native::structured_sum_out> op;
  op.meta(self, dim, keepdim, dtype);
  launch(*stream, "aten::sum", [&] { op.impl(self, dim, keepdim, dtype, op.outputs[0]); });
  return std::move(op.outputs[0]);
}

at::Tensor& fill_(at::Tensor& self, const at::Scalar& value) {
  auto* stream = plain(self) ? caller_stream(self, bytes_of(self)) : nullptr;
  if (!stream) return host_path<at::_ops::fill__Scalar>(self, value);
  Guard guard(self);
  launch(*stream, "aten::fill_", [&] { at::native::fill_(self, value); });
  return self;
}

// As on the CPU, a small dense tensor is cleared with memset (all-zero bytes
// are zero in every dtype), anything else filled by the fill kernel.
at::Tensor& zero_(at::Tensor& self) {
  auto* stream = plain(self) ? caller_stream(self, bytes_of(self)) : nullptr;
  if (!stream) return host_path<at::_ops::zero_>(self);
  Guard guard(self);
  if (self.is_non_overlapping_and_dense() && self.numel() < at::internal::GRAIN_SIZE) {
    launch(*stream, "aten::zero_", [&] { std::memset(self.mutable_data_ptr(), 0, self.nbytes()); });
  } else {
    launch(*stream, "aten::zero_", [&] { at::native::fill_(self, 0); });
  }
  return self;
}

// Advanced indexing with int64 device indices. (Boolean masks need nonzero,
// int32 and CPU indices a conversion: the host path.) The host path never
// queues it either: it always runs on the caller, except while capturing,
// where the host path records it.
at::Tensor index(const at::Tensor& self, const c10::List<std::optional<at::Tensor>>& indices) {
  bool direct = plain(self) && !strict_mode();
  for (size_t i = 0; direct && i < indices.size(); ++i) {
    const std::optional<at::Tensor> t = indices[i];
    if (t && t->defined()) direct = plain(*t) && t->device() == self.device() && t->scalar_type() == at::kLong;
  }
  if (!direct) return host_path<at::_ops::index_Tensor>(self, indices);
  auto& stream = stream_of(self);
  if (stream.is_capturing()) return host_path<at::_ops::index_Tensor>(self, indices);
  AllocationContext context;
  Guard guard(self);
  Outputs<at::native::structured_index_out> op;
  auto precompute = op.meta(self, at::IOptTensorListRef(indices));
  launch(stream, "aten::index", [&] { op.impl(self, precompute.sizes, precompute.strides, op.outputs[0]); });
  return std::move(op.outputs[0]);
}

void install_cpu_stubs() {
  static std::once_flag once;
  std::call_once(once, [] {
    use_cpu_kernel(add_stub);
    use_cpu_kernel(mul_stub);
    use_cpu_kernel(div_true_stub);
    use_cpu_kernel(sum_stub);
    use_cpu_kernel(fill_stub);
    use_cpu_kernel(index_stub);
  });
}

}  // namespace direct

}  // namespace at::neuron
