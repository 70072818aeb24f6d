// Host kernel execution: how the host NeuronCore runtime runs ATen ops.
//
// Device memory is host memory, so a kernel runs in place: every neuron
// tensor argument is aliased (zero copy) as a CPU tensor over the same bytes,
// ATen's reference CPU kernel runs on the aliases inside a launch on the
// current neuron stream, and results are mapped back to neuron tensors.
// Fresh outputs are allocated in HBM while the kernel runs (StagingScope), so
// they too come back without a copy. Mutations of out=/in-place arguments,
// resizes and views keep their aliasing because the aliases share storage.
#pragma once

#include <ATen/core/boxing/BoxedKernel.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "csrc/runtime/Runtime.h"

namespace at::neuron {

// Runs `op` on the host runtime, in steps: check the devices, queue it if it
// can be (launch_async), else alias, launch and adopt the results. Used for
// every op of the route table (Routes.h) and by the fallback.
void host_execute(const c10::OperatorHandle& op, torch::jit::Stack* stack);
// The kernel registered for the table's ops: notes the op as executed
// (OpTracking.h), then host_execute.
void host_kernel(const c10::OperatorHandle& op, torch::jit::Stack* stack);

// Runs `op`'s kernel on the host aliases in `stack`, inside a launch: one of
// the runtime's own kernels where one covers the call (DeviceKernels.cpp),
// else the op's CPU kernel.
void run_host_kernel(const c10::OperatorHandle& op, torch::jit::Stack* stack);
// Matmuls the GEMV and the small-M GEMM kernel have run so far (tests check
// which kernel ran).
int64_t gemv_calls();
int64_t gemm_calls();

// Queues `op` on `device`'s current stream when its outputs can be allocated
// without running it (AsyncExecution.cpp); returns false, leaving `stack`
// untouched, for ops that run synchronously.
bool launch_async(const c10::OperatorHandle& op, torch::jit::Stack* stack, c10::DeviceIndex device);

// Queues dst.copy_(src) (either may be a CPU tensor) on `stream`; the kernel
// keeps both alive until it has run.
void copy_async(const at::Tensor& src, const at::Tensor& dst, neuronrt::Stream& stream, const char* name);

// Queues `body` on `stream` as a kernel named `name` (a string that outlives
// it), run with the caller's thread state (AsyncExecution.cpp).
void queue_host_work(neuronrt::Stream& stream, const char* name, size_t bytes, std::function<void()> body);

// Registers `kernel` as the neuron kernel (PrivateUse1 and its autograd
// key) of another library's op `qualified` ("ns::op" or "ns::op.overload"),
// once per op; `check` sees the op first and raises for an op the kernel
// cannot take (QueuedCustomOps.cpp).
void register_neuron_kernel(const std::string& qualified, c10::BoxedKernel kernel,
                            const std::function<void(const std::string&, const c10::OperatorHandle&)>& check);

// Registers a queued PrivateUse1 kernel for custom op `qualified`
// ("ns::op.overload"), which must return nothing (QueuedCustomOps.cpp).
void register_queued_custom_op(const std::string& qualified);

// The queued kernel of such an op, as a boxed kernel: for kernels that take
// some calls themselves and queue the others as the op's own host kernel.
void queue_custom_op(const c10::OperatorHandle& op, torch::jit::Stack* stack);

// Registers our kernel for vLLM's paged attention op (`qualified`, vLLM's
// `_C::cpu_attention_with_kv_cache` signature): the calls it covers run it
// on device memory, the others vLLM's kernel as a queued custom op
// (PagedAttention.cpp).
void register_paged_attention(const std::string& qualified);

// While `device`'s current stream captures a graph: records `op` as a kernel,
// its outputs described by the op's Meta kernel (CaptureExecution.cpp), and
// returns true; raises a capture error for ops that cannot be recorded.
// Returns false when the stream is not capturing.
bool record_in_capture(const c10::OperatorHandle& op, torch::jit::Stack* stack, c10::DeviceIndex device);

// Boxed PrivateUse1 fallback for ops with no neuron kernel: counts the op
// (OpTracking.h), warns once per op, and raises instead when
// TORCH_NEURONX_DISABLE_FALLBACK=1.
void fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack);

// Op name ("add.Tensor") -> number of calls that reached the fallback: the
// fallback part of the op record with the "aten::" prefix dropped.
std::map<std::string, int64_t> fallback_counts();
void reset_fallback_counts();

// A CPU tensor over the same bytes as neuron tensor `t` (zero copy); it keeps
// t's storage alive. Non-neuron tensors are returned unchanged.
at::Tensor host_alias(const at::Tensor& t);

// Calls aten::`name`.`overload` through host_execute with `args` and returns
// the results (neuron tensors where the op produced tensors).
std::vector<c10::IValue> host_call(const char* name, const char* overload, std::vector<c10::IValue> args);

// Calls fn(tensor, in_index_list) for every tensor in IValue `iv` (a tensor
// or a list of tensors or of optional tensors, as index's indices).
template <class F>
void for_each_tensor(const c10::IValue& iv, F&& fn) {
  if (iv.isTensor()) {
    fn(iv.toTensor(), false);
  } else if (iv.isTensorList()) {
    for (const at::Tensor& t : iv.toTensorList()) fn(t, false);
  } else if (iv.isOptionalTensorList()) {
    for (const std::optional<at::Tensor>& t : iv.toOptionalTensorList()) {
      if (t && t->defined()) fn(*t, true);
    }
  }
}

// `iv` with each tensor (also in tensor lists and optional tensor lists)
// replaced by fn(tensor), in new lists: the caller's lists stay as they are.
template <class F>
c10::IValue map_tensors(const c10::IValue& iv, F&& fn) {
  if (iv.isTensor()) return fn(iv.toTensor());
  if (iv.isTensorList()) {
    std::vector<at::Tensor> list;
    for (const at::Tensor& t : iv.toTensorList()) list.push_back(fn(t));
    return list;
  }
  if (iv.isOptionalTensorList()) {
    c10::List<std::optional<at::Tensor>> list;
    for (const std::optional<at::Tensor>& t : iv.toOptionalTensorList()) {
      list.push_back(t && t->defined() ? std::optional<at::Tensor>(fn(*t)) : t);
    }
    return list;
  }
  return iv;
}

// Whether a schema type is Generator or Generator?.
inline bool is_generator_type(c10::TypePtr t) {
  if (auto opt = t->cast<c10::OptionalType>()) t = opt->getElementType();
  return t->kind() == c10::TypeKind::GeneratorType;
}

// Whether `op`, called with the arguments at `args` (its first argument),
// draws from the default generator inside its CPU kernel although it has no
// Generator argument (the nondeterministic_seeded tag: native_dropout). An
// attention op with dropout_p == 0 draws nothing: it moves no generator,
// however it runs (queued, inline or in a graph).
bool draws_implicitly(const c10::OperatorHandle& op, const c10::IValue* args);

// Unsupported dtypes (complex, quantized) raise TypeError.
void check_supported_dtype(c10::ScalarType dtype);

}  // namespace at::neuron
