// Launching Inductor's C++ kernels of neuron graphs on the current stream.
//
// A compiled neuron graph's Python wrapper calls each C++ kernel through a
// small Python binding compiled with it (torch_neuronx/_inductor_kernels.py).
// The binding parses the arguments into a closure and hands it here; we queue
// it on the current stream of the tensors' device, as an eager op is queued,
// and return before it runs. The wrapper keeps only raw pointers, so the
// kernel holds the storages of its tensor arguments until it has run (queued
// kernels own their operands: docs/runtime.md, "Memory").
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/utils/pybind.h>

#include <mutex>
#include <string>
#include <unordered_set>
#include <vector>

#include "csrc/aten/NeuronFunctions.h"
#include "csrc/runtime/Runtime.h"

namespace py = pybind11;

namespace torch_neuronx {
namespace {

using RunFn = void (*)(void*);
using DropFn = void (*)(void*);
// The binding's closure (the kernel's parsed arguments), freed by the binding.
using Closure = std::unique_ptr<void, DropFn>;

class CompiledKernel final : public neuronrt::Kernel {
 public:
  CompiledKernel(const char* name, RunFn run, Closure closure, std::vector<c10::Storage> storages)
      : name_(name), run_(run), closure_(std::move(closure)), storages_(std::move(storages)) {
    for (const c10::Storage& s : storages_) bytes_ += s.nbytes();
  }

  const char* name() const noexcept override { return name_; }
  // At most what its tensors' storages hold.
  size_t bytes() const noexcept override { return bytes_; }
  void run() override { run_(closure_.get()); }

 private:
  const char* name_;
  RunFn run_;
  Closure closure_;
  std::vector<c10::Storage> storages_;
  size_t bytes_ = 0;
};

// Launch names outlive the launch (the profiler reports them after it ran).
const char* intern(const char* name) {
  static std::mutex mutex;
  static std::unordered_set<std::string> names;
  std::lock_guard<std::mutex> lock(mutex);
  return names.emplace(name).first->c_str();
}

// Called by the binding with the GIL held; returns 0, or -1 with a Python
// error set. Takes ownership of `closure` in every case.
extern "C" int launch_compiled_kernel(PyObject* args, const char* name, RunFn run, DropFn drop, void* closure) {
  Closure owned(closure, drop);
  HANDLE_TH_ERRORS
  std::vector<c10::Storage> storages;
  c10::DeviceIndex device = -1;
  const Py_ssize_t n = PyTuple_GET_SIZE(args);
  for (Py_ssize_t i = 0; i < n; ++i) {
    PyObject* item = PyTuple_GET_ITEM(args, i);
    if (!THPVariable_Check(item)) continue;
    const at::Tensor& t = THPVariable_Unpack(item);
    if (t.device().type() != c10::DeviceType::PrivateUse1) continue;
    TORCH_CHECK(device < 0 || device == t.device().index(), "compiled kernel ", name,
                " got tensors on neuron:", device, " and neuron:", t.device().index());
    device = t.device().index();
    storages.push_back(t.storage());
  }
  if (device < 0) {
    // No device tensor (a host kernel of a mixed graph): it runs here, now.
    run(owned.get());
    return 0;
  }
  auto kernel = std::make_unique<CompiledKernel>(intern(name), run, std::move(owned), std::move(storages));
  at::neuron::rt_call(
      [&] { neuronrt::launch_async(neuronrt::current_stream(device), std::move(kernel)); });
  return 0;
  END_HANDLE_TH_ERRORS_RET(-1)
}

}  // namespace

void register_compiled_kernels(py::module& m) {
  // The address the bindings call (passed to them through the environment,
  // as Inductor passes its own helpers to kernel bindings).
  m.def("_compiled_kernel_launcher", [] { return reinterpret_cast<uintptr_t>(&launch_compiled_kernel); });
}

}  // namespace torch_neuronx
