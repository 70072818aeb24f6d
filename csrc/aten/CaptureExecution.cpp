// Recording ops without a queued route while a stream captures a graph
// (docs/graphs.md, "Capture rules").
//
// Eagerly, an op without a queued route runs synchronously on the caller
// (host_execute), which a capture cannot repeat. While capturing, such an op
// is described instead by running it on meta tensors (its Meta kernel: the
// structured meta functions, or the Python meta registrations torch installs
// for the Meta key; too slow for every eager call, fine once per capture),
// which checks its arguments and gives its outputs' sizes, strides and dtypes.
// The outputs are allocated on the device (from the graph's pool), and the
// recorded kernel runs the op's CPU kernel over host aliases of device memory
// and copies the fresh results into them; in-place and out= arguments are
// written through their aliases. An op whose outputs cannot be described
// without its input values (nonzero, boolean-mask indexing, unique, ...) has
// no Meta kernel that works, and one that returns a non-tensor (equal) hands
// a device value to the host: both raise the capture error.
#include <ATen/ATen.h>
#include <ATen/EmptyTensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/DeviceGuard.h>

#include <optional>
#include <string>
#include <vector>

#include "HostExecution.h"
#include "NeuronFunctions.h"
#include "NeuronGenerator.h"
#include "csrc/runtime/Runtime.h"

namespace at::neuron {
namespace {

constexpr auto kNeuron = c10::DeviceType::PrivateUse1;

// Whether a return type can be described by meta tensors (Tensor, Tensor?,
// Tensor[]); any other return is a value the host would read.
bool is_tensor_type(c10::TypePtr t) {
  if (auto opt = t->cast<c10::OptionalType>()) t = opt->getElementType();
  if (auto list = t->cast<c10::ListType>()) t = list->getElementType();
  return t->kind() == c10::TypeKind::TensorType;
}

// CPU scalars stay: meta kernels take them with meta tensors, as they do
// CPU scalars with device tensors.
at::Tensor to_meta(const at::Tensor& t) {
  if (!t.defined() || (t.device().is_cpu() && t.dim() == 0)) return t;
  at::Tensor m = at::detail::empty_strided_meta(t.sizes(), t.strides(), t.scalar_type());
  if (t.unsafeGetTensorImpl()->is_wrapped_number()) m.unsafeGetTensorImpl()->set_wrapped_number(true);
  return m;
}

// The kernel's operand for `t`: a host alias of device memory, or a copy of a
// CPU tensor (a scalar, CPU indices) as it is at capture.
at::Tensor operand(const at::Tensor& t) {
  if (!t.defined() || t.device().type() == kNeuron) return host_alias(t);
  at::Tensor c = t.clone();
  if (t.unsafeGetTensorImpl()->is_wrapped_number()) c.unsafeGetTensorImpl()->set_wrapped_number(true);
  return c;
}

size_t bytes_of(const c10::IValue& v) {
  size_t n = 0;
  for_each_tensor(v, [&](const at::Tensor& t, bool) { n += t.defined() ? t.nbytes() : 0; });
  return n;
}

uint64_t numel_of(const c10::IValue& v) {
  uint64_t n = 1;
  for_each_tensor(v, [&](const at::Tensor& t, bool) { n = std::max<uint64_t>(n, t.defined() ? t.numel() : 0); });
  return n;
}

// The argument a return aliases (the same alias set), or -1.
int aliased_argument(const c10::FunctionSchema& schema, size_t ret) {
  const c10::AliasInfo* r = schema.returns()[ret].alias_info();
  if (!r) return -1;
  for (size_t i = 0; i < schema.arguments().size(); ++i) {
    const c10::AliasInfo* a = schema.arguments()[i].alias_info();
    if (a && a->beforeSets() == r->beforeSets()) return static_cast<int>(i);
  }
  return -1;
}

// Where ATen's meta kernels size outputs unlike the CPU kernels (found by the
// OpInfo sweep of tests/test_graphs_capture.py): the static output would not
// have the shape an eager call returns.
// - batch norm in eval mode: the CPU kernel returns empty save_mean and
//   save_invstd, the meta kernel channel-sized ones;
// - embedding_bag: the CPU kernel sizes offset2bag / bag_size by its mode.
// Returns false for an op a capture cannot describe.
bool match_cpu_outputs(const c10::FunctionSchema& schema, const torch::jit::Stack& args, torch::jit::Stack& meta) {
  const std::string& name = schema.name();
  if (name == "aten::native_batch_norm" || name == "aten::_native_batch_norm_legit") {
    auto training = schema.argumentIndexWithName("training");
    if (training && !args[*training].toBool() && meta.size() == 3) {
      for (size_t j = 1; j < 3; ++j) meta[j] = at::empty({0}, meta[j].toTensor().options());
    }
    return true;
  }
  return name.rfind("aten::_embedding_bag", 0) != 0;
}

// A view of device tensor `t` with the geometry and dtype of meta view `m`
// of t's meta twin (view_as_real's reinterpretation included).
at::Tensor view_over(const at::Tensor& t, const at::Tensor& m) {
  if (!m.defined()) return m;
  const int64_t offset_bytes = t.storage_offset() * static_cast<int64_t>(t.itemsize());
  TORCH_INTERNAL_ASSERT(offset_bytes % static_cast<int64_t>(m.itemsize()) == 0);
  at::Tensor v = at::detail::make_tensor<c10::TensorImpl>(c10::TensorImpl::VIEW, c10::Storage(t.storage()),
                                                          t.key_set(), m.dtype());
  v.unsafeGetTensorImpl()->set_sizes_and_strides(m.sizes(), m.strides(),
                                                 offset_bytes / static_cast<int64_t>(m.itemsize()) + m.storage_offset());
  return v;
}

// How a recorded random op draws at replay (NeuronGenerator.h, GraphRng).
struct RecordedDraw {
  std::shared_ptr<GraphRng> rng;
  uint64_t offset = 0;  // relative to the replay's base
  bool implicit = false;
  std::vector<size_t> generator_args;
};

}  // namespace

bool record_in_capture(const c10::OperatorHandle& op, torch::jit::Stack* stack, c10::DeviceIndex device) {
  neuronrt::Stream& stream = rt_call([&]() -> neuronrt::Stream& { return neuronrt::current_stream(device); });
  if (!stream.is_capturing()) return false;
  const c10::FunctionSchema& schema = op.schema();
  const std::string& name = schema.name();
  auto violation = [&](const std::string& what) { rt_call([&] { stream.capture_violation(name + " " + what); }); };

  for (const c10::Argument& r : schema.returns()) {
    if (!is_tensor_type(r.type())) {
      violation("returns a value (" + r.type()->str() + ") the host would read now, and cannot be captured");
    }
  }
  const size_t num_args = schema.arguments().size();
  const size_t begin = stack->size() - num_args;

  // Random ops: registered with the capture (philox mode only).
  std::optional<RecordedDraw> draw;
  at::Generator gen;
  for (size_t i = 0; i < num_args; ++i) {
    if (!is_generator_type(schema.arguments()[i].type())) continue;
    if (!draw) draw.emplace();
    draw->generator_args.push_back(i);
    const c10::IValue& g = (*stack)[begin + i];
    gen = g.isNone() ? default_generator(device) : g.toGenerator();
  }
  if (!draw && draws_implicitly(op, &(*stack)[begin])) {
    draw.emplace();
    draw->implicit = true;
    gen = default_generator(device);
  }
  if (draw) {
    TORCH_CHECK(gen.device().type() == kNeuron, "Expected a 'neuron' device type for generator but found '",
                gen.device().type(), "'");
    if (rng_mode() != RngMode::Philox) {
      violation("draws random numbers: random ops can be captured in the \"philox\" rng mode only, whose "
                "(seed, offset) a replay can restart from; call torch.neuron.set_rng_mode(\"philox\") before "
                "the capture (docs/graphs.md)");
    }
  }

  // Describe the outputs: the op on meta tensors.
  torch::jit::Stack meta;
  meta.reserve(num_args);
  for (size_t i = 0; i < num_args; ++i) {
    const c10::IValue& v = (*stack)[begin + i];
    if (is_generator_type(schema.arguments()[i].type())) {
      meta.emplace_back();
    } else if (v.isDevice() && v.toDevice().type() == kNeuron) {
      meta.emplace_back(c10::Device(c10::kMeta));
    } else {
      meta.push_back(map_tensors(v, to_meta));
    }
  }
  // Sizes of the arguments the op writes, to see the meta kernel's resizes.
  std::vector<std::optional<std::vector<int64_t>>> written_sizes(num_args);
  for (size_t i = 0; i < num_args; ++i) {
    const c10::AliasInfo* a = schema.arguments()[i].alias_info();
    if (a && a->isWrite() && meta[i].isTensor()) written_sizes[i] = meta[i].toTensor().sizes().vec();
  }
  const torch::jit::Stack meta_args(meta);  // the same tensors: they show the meta kernel's resizes
  try {
    op.callBoxed(&meta);
  } catch (const std::exception& e) {
    std::string why = e.what();
    if (auto* err = dynamic_cast<const c10::Error*>(&e)) why = err->what_without_backtrace();
    violation("cannot be captured: its outputs cannot be described without running it (its meta kernel: " +
              why.substr(0, why.find('\n')) + ")");
  }
  if (!match_cpu_outputs(schema, meta_args, meta)) {
    violation("cannot be captured: its meta kernel sizes its outputs unlike its kernel");
  }

  // An out= argument the kernel would resize (arange's fresh empty output)
  // is resized now, from the graph's pool, so that the kernel only writes.
  for (size_t i = 0; i < num_args; ++i) {
    if (!written_sizes[i]) continue;
    const at::Tensor& m = meta_args[i].toTensor();
    if (m.sizes().vec() == *written_sizes[i]) continue;
    const at::Tensor& out = (*stack)[begin + i].toTensor();
    if (out.device().type() != kNeuron) violation("would resize a CPU output, and cannot be captured");
    out.resize_(m.sizes());
    if (out.strides() != m.strides()) out.as_strided_(m.sizes(), m.strides());
  }

  // The results: written arguments themselves, or fresh device tensors.
  const size_t num_rets = schema.returns().size();
  std::vector<c10::IValue> results(num_rets);
  std::vector<c10::IValue> host_outputs(num_rets);  // aliases of the fresh outputs
  size_t bytes = 0;
  size_t views = 0;
  uint64_t drawn = 1;
  {
    c10::DeviceGuard guard(device_of_index(device));
    for (size_t j = 0; j < num_rets; ++j) {
      const int arg = aliased_argument(schema, j);
      if (arg >= 0) {
        const c10::AliasInfo* a = schema.arguments()[arg].alias_info();
        if (a->isWrite()) {
          results[j] = (*stack)[begin + arg];
          continue;
        }
        // A view computes nothing: made now, over the input's memory, with
        // the meta view's geometry (its offset is relative to the input's).
        const c10::IValue& in = (*stack)[begin + arg];
        if (!in.isTensor()) violation("returns a view of a tensor list, which a capture cannot record yet");
        const at::Tensor& t = in.toTensor();
        results[j] = map_tensors(meta[j], [&](const at::Tensor& m) { return view_over(t, m); });
        ++views;
      } else {
        results[j] = map_tensors(meta[j], [&](const at::Tensor& m) {
          if (!m.defined()) return m;
          check_supported_dtype(m.scalar_type());
          return at::empty_strided(m.sizes(), m.strides(), m.options().device(device_of_index(device)));
        });
        host_outputs[j] = map_tensors(results[j], [](const at::Tensor& t) { return host_alias(t); });
        bytes += bytes_of(results[j]);
      }
    }
  }
  for (const c10::IValue& r : results) drawn = std::max(drawn, numel_of(r));

  // The kernel's arguments, made once: host aliases and snapshots.
  torch::jit::Stack args;
  args.reserve(num_args);
  for (size_t i = 0; i < num_args; ++i) {
    const c10::IValue& v = (*stack)[begin + i];
    if (v.isDevice() && v.toDevice().type() == kNeuron) {
      args.emplace_back(c10::Device(c10::kCPU));
    } else {
      args.push_back(map_tensors(v, operand));
    }
    bytes += bytes_of(v);
  }
  if (draw) {
    draw->rng = graph_rng(&stream, gen);
    draw->offset = draw->rng->total;
    draw->rng->total += draw_increment(drawn);
  }

  if (views == num_rets && num_rets > 0 && !draw) {  // a view op: nothing to run at replay
    torch::jit::drop(*stack, num_args);
    for (c10::IValue& r : results) stack->push_back(std::move(r));
    return true;
  }
  queue_host_work(stream, name.c_str(), bytes,
                  [op, args = std::move(args), outs = std::move(host_outputs), draw = std::move(draw)] {
                    torch::jit::Stack s(args);
                    std::optional<PhiloxDraw> philox;
                    if (draw) {
                      std::vector<c10::IValue*> gens;
                      for (size_t i : draw->generator_args) gens.push_back(&s[i]);
                      philox.emplace(draw->rng->seed.load(), draw->rng->base.load() + draw->offset, draw->implicit,
                                     gens);
                    }
                    run_host_kernel(op, &s);
                    philox.reset();
                    for (size_t j = 0; j < outs.size(); ++j) {
                      if (outs[j].isTensor()) {
                        if (outs[j].toTensor().defined()) outs[j].toTensor().copy_(s[j].toTensor());
                      } else if (outs[j].isTensorList()) {
                        auto dst = outs[j].toTensorList();
                        auto src = s[j].toTensorList();
                        for (size_t k = 0; k < dst.size(); ++k) dst.get(k).copy_(src.get(k));
                      }
                    }
                  });

  torch::jit::drop(*stack, num_args);
  for (c10::IValue& r : results) stack->push_back(std::move(r));
  return true;
}

}  // namespace at::neuron
