// Asynchronous kernel launches.
//
// An op is queued on the current neuron stream, and the caller returns at
// once, when everything the caller must see can be known without running it:
// argument checks and the outputs' sizes, strides and dtype. Those come from
// ATen's C++ meta functions (at::meta::*, the structured kernels' shape and
// dtype logic; the Python meta registrations torch installs for the Meta key
// would cost far more than the kernels), so user errors are still raised at
// the call site. The outputs are allocated here; the queued kernel runs the
// op's CPU out= overload (or the in-place op itself) over host aliases of
// device memory and keeps every tensor it uses alive until it has run.
//
// The queued overloads and their meta functions are entries of the route
// table (Routes.cpp). Other ops, random ops, and ops with CPU tensor operands
// other than scalars run synchronously (host_execute), after the work queued
// before them. While the stream is capturing a graph, queued routes are taken
// always (small ops too) and the kernels are recorded; other ops are
// described by their Meta kernels and recorded too (CaptureExecution.cpp,
// docs/graphs.md).
#include <ATen/ATen.h>
#include <ATen/EmptyTensor.h>
#include <ATen/MemoryOverlap.h>
#include <ATen/Parallel.h>
#include <ATen/TensorUtils.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/AutogradState.h>
#include <c10/core/impl/LocalDispatchKeySet.h>

#include <mutex>
#include <unordered_map>

#include "Fidelity.h"
#include "HostExecution.h"
#include "NeuronFunctions.h"
#include "ReplayKernels.h"
#include "Routes.h"
#include "csrc/runtime/Runtime.h"

namespace at::neuron {
namespace {

constexpr auto kNeuron = c10::DeviceType::PrivateUse1;

using Args = QueuedRoute::Args;
using Outs = QueuedRoute::Outs;
using Mode = QueueMode;

struct Entry {
  const QueuedRoute* op;
  std::optional<c10::OperatorHandle> run;  // what the kernel runs
  // The out= overload itself was called (compiled graphs' extern kernels,
  // `torch.mm(a, b, out=c)`): its trailing `out` arguments are the outputs.
  bool called_out = false;
};

// schema -> entry, resolved once against the dispatcher.
const std::unordered_map<const c10::FunctionSchema*, Entry>& entries() {
  static const auto table = [] {
    std::unordered_map<const c10::FunctionSchema*, Entry> m;
    auto& d = c10::Dispatcher::singleton();
    for (const Route& route : routes()) {
      for (const QueuedRoute& op : route.queued) {
        if (!op.meta) continue;
        const std::string name = route.queued_name(op);
        auto handle = d.findSchema({name, op.overload});
        if (!handle) continue;
        std::optional<c10::OperatorHandle> run = handle;
        if (op.mode == Mode::Out) {
          run = d.findSchema({name, op.out_overload});
          TORCH_INTERNAL_ASSERT(run, "no out= overload ", op.out_overload, " of ", name);
          m.emplace(&run->schema(), Entry{&op, run, /*called_out=*/true});
        }
        m.emplace(&handle->schema(), Entry{&op, run});
      }
    }
    return m;
  }();
  return table;
}

at::Tensor to_meta(const at::Tensor& t) {
  if (!t.defined()) return t;
  at::Tensor m = at::detail::empty_strided_meta(t.sizes(), t.strides(), t.scalar_type());
  if (t.unsafeGetTensorImpl()->is_wrapped_number()) m.unsafeGetTensorImpl()->set_wrapped_number(true);
  return m;
}

// Whether tensor `t` can be an operand of a queued kernel: device tensors,
// and CPU scalars (0-dim), which are snapshotted at launch.
bool queueable(const at::Tensor& t) {
  if (!t.defined()) return true;
  if (t.is_neg() || t.is_conj() || t._is_zerotensor()) return false;
  if (t.device().type() == kNeuron) return true;
  return t.device().is_cpu() && t.dim() == 0 && t.layout() == c10::kStrided;
}

// Whether `out` shares memory with a tensor among the arguments [begin, end)
// (tensor lists included: cat's inputs).
bool overlaps_an_input(const at::Tensor& out, const torch::jit::Stack& stack, size_t begin, size_t end) {
  bool overlaps = false;
  for (size_t i = begin; i < end; ++i) {
    for_each_tensor(stack[i], [&](const at::Tensor& t, bool) {
      overlaps = overlaps || (t.defined() && at::get_overlap_status(out, t) != at::MemOverlapStatus::No);
    });
  }
  return overlaps;
}

// The bytes of the tensors among `values` (tensor lists included).
size_t tensor_bytes(c10::ArrayRef<c10::IValue> values) {
  size_t bytes = 0;
  for (const c10::IValue& v : values) for_each_tensor(v, [&](const at::Tensor& t, bool) { bytes += t.nbytes(); });
  return bytes;
}

// The kernel's operand for `t`: a host alias of device memory, or a copy of a
// CPU scalar (the caller may change it after the launch).
at::Tensor operand(const at::Tensor& t) {
  if (!t.defined()) return t;
  if (t.device().type() == kNeuron) return host_alias(t);
  at::Tensor c = t.clone();
  if (t.unsafeGetTensorImpl()->is_wrapped_number()) c.unsafeGetTensorImpl()->set_wrapped_number(true);
  return c;
}

// What a kernel takes over from the thread that launched it: the intra-op
// thread count (OpenMP keeps it per thread, and torch.set_num_threads sets only
// the caller's), the dispatch keys the caller had excluded (it runs below
// autograd) and its autograd state (inference mode: ATen refuses in-place
// writes to the inference tensors an out= kernel fills outside of it).
struct CallerState {
  int threads = at::get_num_threads();
  c10::impl::LocalDispatchKeySet keys = excluded_keys();
  c10::AutogradState autograd = c10::AutogradState::get_tls_state();

  // Only the exclusions: keys the caller includes beyond the defaults (e.g.
  // PythonDispatcher while tracing) need Python-side state the executor does
  // not have, and a kernel calls CPU ops on host aliases only.
  static c10::impl::LocalDispatchKeySet excluded_keys() {
    c10::impl::LocalDispatchKeySet keys = c10::impl::tls_local_dispatch_key_set();
    keys.included_ = c10::default_included_set;
    return keys;
  }

  void apply_threads() const {
    thread_local int current = -1;
    if (current != threads) {
      at::set_num_threads(threads);
      current = threads;
    }
  }

  // Whether the calling thread has this state already (the kernels of a
  // graph replay, one after another on one thread, usually do).
  bool is_current() const {
    const c10::impl::LocalDispatchKeySet now = c10::impl::tls_local_dispatch_key_set();
    const c10::AutogradState a = c10::AutogradState::get_tls_state();
    return now.included_ == keys.included_ && now.excluded_ == keys.excluded_ &&
           a.get_grad_mode() == autograd.get_grad_mode() && a.get_fw_grad_mode() == autograd.get_fw_grad_mode() &&
           a.get_inference_mode() == autograd.get_inference_mode() &&
           a.get_multithreading_enabled() == autograd.get_multithreading_enabled() &&
           a.get_view_replay_enabled() == autograd.get_view_replay_enabled() &&
           a.get_grad_layout_enforcement_enabled() == autograd.get_grad_layout_enforcement_enabled();
  }

  void apply() const {
    c10::impl::_force_tls_local_dispatch_key_set(keys);
    c10::AutogradState::set_tls_state(autograd);
  }
};

// A queued kernel: `body(replay)` run with the caller's state (`replay`:
// the kernel was recorded in a graph and runs at each replay). What the body
// captures (host aliases of the operands and outputs, made at launch) keeps
// the device storages alive until it has run, with the sizes and strides of
// launch time (later metadata changes of the caller's tensors, e.g. an
// in-place transpose_, do not reach a queued kernel).
template <class F>
class QueuedKernel final : public neuronrt::Kernel {
 public:
  QueuedKernel(const char* name, size_t bytes, F body) : name_(name), bytes_(bytes), body_(std::move(body)) {}
  const char* name() const noexcept override { return name_; }
  size_t bytes() const noexcept override { return bytes_; }
  void recorded() noexcept override { recorded_ = true; }
  void prefetch() const noexcept override {
    neuronrt::prefetch_range(this, sizeof(*this));
    if constexpr (requires(const F& f) { f.prefetch(); }) body_.prefetch();
  }
  // A c10::Error is reported at a later synchronization point, so it keeps
  // the message, not the executor thread's C++ backtrace.
  void run() override {
    caller_.apply_threads();
    // On an executor nothing needs the previous state back: the state stays,
    // and the next kernel (a graph's, usually the same state) finds it set.
    if (!caller_.is_current() && neuronrt::on_executor()) caller_.apply();
    if (caller_.is_current()) {
      try {
        body_(recorded_);
      } catch (const c10::Error& e) {
        throw std::runtime_error(e.what_without_backtrace());
      }
      return;
    }
    // On the launching thread (an inline run, or a graph replayed with
    // blocking launches from Python), the thread's own state comes back after.
    struct Restore {
      c10::impl::LocalDispatchKeySet keys = c10::impl::tls_local_dispatch_key_set();
      c10::AutogradState autograd = c10::AutogradState::get_tls_state();
      ~Restore() {
        c10::impl::_force_tls_local_dispatch_key_set(keys);
        c10::AutogradState::set_tls_state(autograd);
      }
    } restore;
    try {
      caller_.apply();
      body_(recorded_);
    } catch (const c10::Error& e) {
      throw std::runtime_error(e.what_without_backtrace());
    }
  }

 private:
  const char* name_;
  size_t bytes_;
  CallerState caller_;
  F body_;
  bool recorded_ = false;
};

// The kernel of a queued op: its CPU kernel called through the dispatcher
// over the operands. Recorded in a graph, it prepares the op's kernel object
// once (ReplayKernels.h) at its first replay, where the op has one, and runs
// only that from then on.
class OpCall {
 public:
  OpCall(const c10::OperatorHandle& op, Mode mode, Args args, Outs outputs)
      : op_(op), mode_(mode), args_(std::move(args)), outputs_(std::move(outputs)) {}

  // Before a replay runs it (Kernel::prefetch): the state its run reads
  // through this object, found at its first replay.
  void prefetch() const noexcept { neuronrt::prefetch_range(state_, state_bytes_); }

  void operator()(bool replay) {
    if (replay) {
      if (!prepared_tried_) {
        prepared_tried_ = true;
        if (mode_ == Mode::InPlace && !args_.empty() && args_[0].isTensor()) {
          prepared_ = prepare_replay_call(op_, args_, args_[0].toTensor());
        } else if (mode_ == Mode::Out && outputs_.size() == 1) {
          prepared_ = prepare_replay_call(op_, args_, outputs_[0]);
        }
        find_state();
      }
      if (prepared_) {
        prepared_->run();
        if (!prepared_->rerunnable()) {
          prepared_.reset();
          find_state();
        }
        return;
      }
    }
    torch::jit::Stack stack(args_);
    if (mode_ == Mode::Out) stack.insert(stack.end(), outputs_.begin(), outputs_.end());
    run_host_kernel(op_, &stack);
    if (mode_ == Mode::Copy) {
      for (size_t i = 0; i < outputs_.size(); ++i) outputs_[i].copy_(stack[i].toTensor());
    }
  }

 private:
  // What a replayed run reads besides this object: the prepared kernel
  // object (its iterator), or the argument stack of the dispatcher call.
  void find_state() {
    if (prepared_) {
      state_ = prepared_.get();
      state_bytes_ = prepared_->footprint();
    } else {
      state_ = args_.data();
      state_bytes_ = args_.size() * sizeof(c10::IValue);
    }
  }

  c10::OperatorHandle op_;
  Mode mode_;
  Args args_;
  Outs outputs_;
  std::unique_ptr<ReplayCall> prepared_;
  bool prepared_tried_ = false;
  const void* state_ = nullptr;
  size_t state_bytes_ = 0;
};

template <class F>
void queue(neuronrt::Stream& stream, const char* name, size_t bytes, F body) {
  rt_call([&] { neuronrt::launch_async(stream, std::make_unique<QueuedKernel<F>>(name, bytes, std::move(body))); });
}

}  // namespace

void copy_async(const at::Tensor& src, const at::Tensor& dst, neuronrt::Stream& stream, const char* name) {
  queue(stream, name, src.nbytes() + dst.nbytes(), [src = host_alias(src), dst = host_alias(dst)](bool) { dst.copy_(src); });
}

void queue_host_work(neuronrt::Stream& stream, const char* name, size_t bytes, std::function<void()> body) {
  queue(stream, name, bytes, [body = std::move(body)](bool) { body(); });
}

bool launch_async(const c10::OperatorHandle& op, torch::jit::Stack* stack, c10::DeviceIndex device) {
  static const bool enabled = !neuronrt::launch_blocking();
  // A capturing stream records queued kernels, also with blocking launches;
  // the synchronous path cannot be captured (docs/graphs.md).
  if ((!enabled && !neuronrt::current_stream(device).is_capturing()) || strict_mode()) return false;
  const auto& table = entries();
  auto it = table.find(&op.schema());
  if (it == table.end()) return false;
  const QueuedRoute& info = *it->second.op;

  const auto& schema = op.schema();
  const size_t num_args = schema.arguments().size();
  const size_t begin = stack->size() - num_args;
  // A small op on an idle stream would run on the caller anyway
  // (runs_inline): the synchronous path does that without describing the
  // outputs with meta tensors first. Ops whose kernels check values keep the
  // queued path, so their errors wait for a sync point.
  if (!info.checks_data &&
      runs_inline(neuronrt::current_stream(device), tensor_bytes(c10::ArrayRef<c10::IValue>(*stack).slice(begin)))) {
    return false;
  }
  // An out= call: the functional overload's arguments, then the outputs.
  const size_t num_outs = it->second.called_out ? schema.returns().size() : 0;
  const size_t outs_begin = stack->size() - num_outs;
  Args meta_args;
  meta_args.reserve(num_args);
  bool all_queueable = true;
  for (size_t i = begin; i < outs_begin; ++i) {
    const c10::IValue& v = (*stack)[i];
    if (v.isOptionalTensorList() || v.isGenerator()) return false;
    meta_args.push_back(map_tensors(v, [&](const at::Tensor& t) {
      all_queueable = all_queueable && queueable(t);
      return to_meta(t);
    }));
  }
  if (!all_queueable) return false;
  // An out= call's meta function also sees its outputs (after the other
  // arguments), for ops whose result depends on them (arange's dtype).
  for (size_t i = outs_begin; i < stack->size(); ++i) {
    const c10::IValue& v = (*stack)[i];
    meta_args.push_back(v.isTensor() ? c10::IValue(to_meta(v.toTensor())) : v);
  }

  // Checks and output metadata, on the caller: errors raise here.
  Outs meta = info.meta(meta_args);
  Outs outputs;
  outputs.reserve(meta.size());
  if (num_outs > 0) {
    // Given outputs are used as they are. Anything the out= kernel would do
    // to them besides writing (a resize, a cast to another dtype), and any
    // overlap with an input (which some kernels refuse, e.g. cat's), takes
    // the synchronous path, where it happens or raises on the caller.
    if (meta.size() != num_outs) return false;
    for (size_t k = 0; k < num_outs; ++k) {
      const c10::IValue& v = (*stack)[outs_begin + k];
      if (!v.isTensor()) return false;
      const at::Tensor& out = v.toTensor();
      // An empty out= is resized here, as the kernel would (resize_output
      // does so silently): a functional factory's fresh `empty({0})` result
      // (arange) is queued instead of waiting for the stream.
      if (out.defined() && out.device().type() == kNeuron && out.numel() == 0 && out.sizes() != meta[k].sizes() &&
          out.scalar_type() == meta[k].scalar_type() && meta[k].is_contiguous()) {
        out.resize_(meta[k].sizes());
      }
      if (!out.defined() || out.device().type() != kNeuron || out.is_neg() || out.is_conj() ||
          out.sizes() != meta[k].sizes() || out.scalar_type() != meta[k].scalar_type() ||
          at::has_internal_overlap(out) != at::MemOverlap::No) {
        return false;
      }
      if (overlaps_an_input(out, *stack, begin, outs_begin)) return false;
      outputs.push_back(out);
    }
  } else {
    c10::DeviceGuard guard(device_of_index(device));
    for (const at::Tensor& m : meta) {
      check_supported_dtype(m.scalar_type());
      outputs.push_back(at::empty_strided(m.sizes(), m.strides(), m.options().device(device_of_index(device))));
    }
  }

  Args args;
  args.reserve(num_args);
  for (size_t i = begin; i < outs_begin; ++i) args.push_back(map_tensors((*stack)[i], operand));
  at::Tensor self = info.mode == Mode::InPlace ? (*stack)[begin].toTensor() : at::Tensor();
  Outs host_outputs;
  size_t bytes = tensor_bytes(args);
  if (info.mode != Mode::InPlace) {
    for (const at::Tensor& o : outputs) {
      host_outputs.push_back(host_alias(o));
      bytes += o.nbytes();
    }
  }
  queue(neuronrt::current_stream(device), schema.name().c_str(), bytes,
        OpCall(*it->second.run, info.mode, std::move(args), std::move(host_outputs)));

  torch::jit::drop(*stack, num_args);
  if (info.mode == Mode::InPlace) {
    stack->emplace_back(std::move(self));
  } else {
    for (at::Tensor& o : outputs) stack->emplace_back(std::move(o));
  }
  return true;
}

}  // namespace at::neuron
