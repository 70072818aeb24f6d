// Queued kernels for other libraries' custom ops that return nothing.
//
// Some libraries register host kernels for their ops under
// CompositeImplicitAutograd only (vLLM's CPU attention and KV-cache ops,
// torch_neuronx/vllm/kernels.py): on a neuron tensor such a kernel would run
// at once on the raw device pointers, unordered with the queued work. An op
// that only writes into its arguments (schema `-> ()`) needs nothing from its
// run to return, so it is queued like a routed ATen op: its neuron tensors are
// aliased on the host (zero copy), the op runs on the aliases in a kernel on
// the current stream, and the caller goes on at once. CPU tensor operands are
// held, not copied: the kernel reads them when it runs (vLLM's are made per
// step and not written after the call).
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "HostExecution.h"
#include "NeuronFunctions.h"
#include "csrc/runtime/Runtime.h"

namespace at::neuron {

void queue_custom_op(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const auto& schema = op.schema();
  const size_t n = schema.arguments().size();
  std::optional<c10::Device> device;
  size_t bytes = 0;
  auto args = std::make_shared<std::vector<c10::IValue>>();
  args->reserve(n);
  for (size_t i = stack->size() - n; i < stack->size(); ++i) {
    args->push_back(map_tensors((*stack)[i], [&](const at::Tensor& t) {
      if (t.device().type() != c10::DeviceType::PrivateUse1) return t;
      if (!device) device = t.device();
      TORCH_CHECK(t.device() == *device, schema.name(), ": expected all neuron tensors on ", *device,
                  ", got one on ", t.device());
      bytes += t.nbytes();
      return host_alias(t);
    }));
  }
  torch::jit::drop(*stack, n);
  TORCH_CHECK(device, schema.name(), ": no neuron tensor argument");
  queue_host_work(neuronrt::current_stream(device->index()), schema.name().c_str(), bytes, [op, args] {
    torch::jit::Stack run(args->begin(), args->end());
    op.callBoxed(run);  // the aliases are CPU tensors: the op's own host kernel
  });
}

void register_neuron_kernel(const std::string& qualified, c10::BoxedKernel kernel,
                            const std::function<void(const std::string&, const c10::OperatorHandle&)>& check) {
  static std::mutex mutex;
  static std::map<std::string, std::unique_ptr<torch::Library>> libraries;  // namespace -> fragment
  static std::set<std::string> registered;
  std::lock_guard<std::mutex> lock(mutex);
  if (registered.count(qualified)) return;
  const size_t sep = qualified.find("::");
  TORCH_CHECK(sep != std::string::npos, "expected a qualified op name like 'ns::op.overload', got '", qualified, "'");
  const std::string ns = qualified.substr(0, sep);
  const std::string rest = qualified.substr(sep + 2);
  const size_t dot = rest.find('.');
  const std::string name = ns + "::" + rest.substr(0, dot);
  const std::string overload = dot == std::string::npos ? "" : rest.substr(dot + 1);
  auto handle = c10::Dispatcher::singleton().findSchema({name, overload});
  TORCH_CHECK(handle, "no operator ", qualified);
  check(qualified, *handle);
  auto& lib = libraries[ns];
  if (!lib) lib = std::make_unique<torch::Library>(torch::Library::IMPL, ns, std::nullopt, __FILE__, __LINE__);
  // Autograd's key too: under no_grad a composite kernel would still be
  // picked there, before PrivateUse1 is reached.
  for (auto key : {c10::DispatchKey::PrivateUse1, c10::DispatchKey::AutogradPrivateUse1}) {
    lib->impl(rest.c_str(), torch::dispatch(key, torch::CppFunction::makeFromBoxedKernel(kernel)));
  }
  registered.insert(qualified);
}

void register_queued_custom_op(const std::string& qualified) {
  register_neuron_kernel(qualified, c10::BoxedKernel::makeFromFunction<&queue_custom_op>(),
                         [](const std::string& qualified, const c10::OperatorHandle& op) {
                           TORCH_CHECK(op.schema().returns().empty(), qualified,
                                       " returns values: only ops that write into their arguments can be queued");
                         });
}

}  // namespace at::neuron
