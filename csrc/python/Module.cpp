// torch_neuronx._C: the Python entry to the runtime and the integration.
#include <torch/csrc/Generator.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/utils/device_lazy_init.h>
#include <torch/csrc/utils/pybind.h>
#include <ATen/Context.h>

#include "csrc/aten/HostExecution.h"
#include "csrc/aten/NeuronAllocator.h"
#include "csrc/aten/NeuronFunctions.h"
#include "csrc/aten/NeuronGenerator.h"
#include "csrc/aten/OpTracking.h"
#include "csrc/aten/Routes.h"
#include "csrc/runtime/Runtime.h"

#include <mutex>
#include <set>

namespace py = pybind11;

namespace torch_neuronx {
void register_memory_snapshot(py::module& m);  // MemorySnapshot.cpp
void register_nki(py::module& m);              // Nki.cpp
void register_compiled_kernels(py::module& m);  // CompiledKernels.cpp
}

namespace {

// A compiled graph's replay checks that its static inputs (a decode step's
// few hundred parameters and cache tensors) are still where the capture saw
// them. Per call in Python that was ~120 us of cache-cold attribute calls; the
// CUDA graph trees do the same check in C++ (_tensors_data_ptrs_at_indices_equal).
bool tensors_data_ptrs_at_indices_equal(const py::list& tensors, const py::list& ptrs, const py::list& indices) {
  const Py_ssize_t n = PyList_GET_SIZE(indices.ptr());
  TORCH_CHECK(PyList_GET_SIZE(ptrs.ptr()) == n, "expected as many data pointers as indices, got ",
              PyList_GET_SIZE(ptrs.ptr()), " and ", n);
  const Py_ssize_t size = PyList_GET_SIZE(tensors.ptr());
  for (Py_ssize_t k = 0; k < n; ++k) {
    const Py_ssize_t i = PyLong_AsSsize_t(PyList_GET_ITEM(indices.ptr(), k));
    if (i == -1 && PyErr_Occurred()) throw py::error_already_set();
    TORCH_CHECK(i >= 0 && i < size, "index ", i, " out of range for ", size, " inputs");
    PyObject* item = PyList_GET_ITEM(tensors.ptr(), i);
    TORCH_CHECK(THPVariable_Check(item), "input ", i, " is not a tensor");
    const auto ptr = reinterpret_cast<uintptr_t>(THPVariable_Unpack(item).data_ptr());
    const auto expected = PyLong_AsUnsignedLongLong(PyList_GET_ITEM(ptrs.ptr(), k));
    if (expected == static_cast<unsigned long long>(-1) && PyErr_Occurred()) throw py::error_already_set();
    if (ptr != expected) return false;
  }
  return true;
}

// Called at interpreter exit (atexit, before finalization). The autograd
// engine's neuron device threads finish a backward after waking its caller
// and drop their GraphTask only then; if that last reference frees a tensor
// whose PyObject it owns during finalization, taking the GIL there ends the
// thread with pthread_exit through a noexcept frame: std::terminate, rc 134.
// A device thread takes its next task only after releasing the previous one,
// so one tiny backward per device, built without Python objects and run
// without the GIL, waits until every device thread is idle.
void drain_autograd_device_threads() {
  if (!neuronrt::is_initialized() || neuronrt::in_bad_fork()) return;
  py::gil_scoped_release no_gil;
  for (int d = 0; d < neuronrt::device_count(); ++d) {
    // Only devices that ran kernels can have had backward work.
    bool used = false;
    for (neuronrt::Stream* s : neuronrt::all_streams(d)) used = used || s->issued() > 0;
    if (!used) continue;
    at::Tensor leaf = at::zeros({1}, at::TensorOptions().device(at::neuron::device_of_index(d)))
                          .requires_grad_(true);
    torch::autograd::backward({leaf.sum()});
  }
  // Queued kernels finish before the interpreter tears down what they use;
  // their errors are no longer anyone's to report.
  for (int d = 0; d < neuronrt::device_count(); ++d) {
    for (neuronrt::Stream* s : neuronrt::all_streams(d)) s->wait_for(s->issued());
    neuronrt::release_finished_kernels(d);
  }
}

}  // namespace

namespace torch_neuronx {
void init_distributed_bindings(py::module& m);  // csrc/distributed/init.cpp
}

namespace at::neuron {  // csrc/aten/NeuronGraph.cpp
std::pair<uint64_t, uint64_t> graph_pool_handle();
bool is_current_stream_capturing();
}  // namespace at::neuron

PYBIND11_MODULE(_C, m) {
  m.doc() = "torch-neuronx native core";
  at::neuron::install_staging_allocator();
  torch_neuronx::register_memory_snapshot(m);
  torch_neuronx::register_nki(m);
  torch_neuronx::register_compiled_kernels(m);

  m.def("_register_host_kernels", &at::neuron::register_host_kernels,
        "Registers the route table's kernels; returns the registered op names.");
  m.def("_register_queued_custom_op", &at::neuron::register_queued_custom_op, py::arg("qualified_name"),
        "Queues custom op 'ns::op.overload' (no results) on the current stream for neuron tensors.");
  m.def("_register_paged_attention", &at::neuron::register_paged_attention, py::arg("qualified_name"),
        "Our kernel for vLLM's paged attention op 'ns::op' where it applies, vLLM's queued kernel elsewhere.");
  m.def(
      "_route_table",
      [] {
        std::vector<py::tuple> rows;
        for (const auto& r : at::neuron::route_table()) {
          rows.push_back(py::make_tuple(r.op, r.direct, r.queued, r.checks_data, r.random));
        }
        return rows;
      },
      "The route table per overload: (op, direct, queued, checks_data, random) (csrc/aten/Routes.h).");
  m.def("_fallback_counts", &at::neuron::fallback_counts);
  m.def("_gemm_calls", &at::neuron::gemm_calls, "matmuls run by the runtime's small-M GEMM kernel (DeviceKernels.cpp)");
  m.def("_gemv_calls", &at::neuron::gemv_calls, "matmuls run by the runtime's GEMV kernel (DeviceKernels.cpp)");
  m.def("_parallel_splits", &neuronrt::parallel_splits, "kernels split across the runtime's workers (Workers.h)");
  m.def("_reset_fallback_counts", &at::neuron::reset_fallback_counts);
  m.def("_executed_ops", &at::neuron::executed_ops, "ops that ran a neuron kernel (OpTracking.h)");
  m.def("_fallback_ops", &at::neuron::fallback_ops, "ops that reached the host fallback, with their calls");
  m.def("_note_executed_op", &at::neuron::note_executed_name);
  m.def("_note_fallback_op", &at::neuron::note_fallback_name);
  m.def("_clear_op_tracking", [] {
    at::neuron::clear_executed_ops();
    at::neuron::clear_fallback_ops();
  });

  // Unchecked (0 for a malformed configuration): safe during import.
  m.def("_device_count", [] { return neuronrt::device_count(); });
  m.def("_lazy_init", [] {
    at::neuron::lazy_init();
    // torch's own fork flag: factories in a forked child then raise in
    // torch::utils::device_lazy_init, as for CUDA.
    torch::utils::register_fork_handler_for_device_init(at::kPrivateUse1);
  });
  m.def("_in_bad_fork", [] { return neuronrt::in_bad_fork(); });
  m.def("_drain_autograd_device_threads", &drain_autograd_device_threads);
  m.def("_launch_blocking", [] { return neuronrt::launch_blocking(); });
  m.def("_graph_pool_handle", &at::neuron::graph_pool_handle, "a new memory pool id for graphs to share");
  m.def("_tensors_data_ptrs_at_indices_equal", &tensors_data_ptrs_at_indices_equal, py::arg("tensors"),
        py::arg("ptrs"), py::arg("indices"), "whether tensors[i].data_ptr() == ptrs[k] for each i = indices[k]");
  m.def("_is_current_stream_capturing", &at::neuron::is_current_stream_capturing);
  m.def("_check_configuration", [] { at::neuron::rt_call([] { neuronrt::check_configuration(); }); });
  m.def("_current_device", [] { return neuronrt::current_device(); });
  m.def("_set_device", [](int index) { at::neuron::rt_call([&] { neuronrt::set_device(index); }); });
  m.def("_exchange_device", [](int index) {
    return at::neuron::rt_call([&] { return neuronrt::exchange_device(index); });
  });
  m.def("_synchronize", [](int index) {
    py::gil_scoped_release no_gil;
    at::neuron::rt_call([&] { neuronrt::synchronize_device(index); });
  });
  m.def("_get_device_properties", [](int index) {
    const auto& p = at::neuron::rt_call([&]() -> const neuronrt::DeviceProperties& {
      return neuronrt::device_properties(index);
    });
    return py::make_tuple(p.name, p.total_memory, p.major, p.minor, p.physical_core);
  });
  m.def("_mem_get_info", [](int index) {
    return at::neuron::rt_call([&] { return neuronrt::mem_get_info(index); });
  });
  m.def("_empty_cache", [] { at::neuron::rt_call([] { neuronrt::empty_cache(); }); });
  m.def("_get_rng_mode", [] { return at::neuron::rng_mode() == at::neuron::RngMode::Cpu ? "cpu" : "philox"; });
  m.def("_set_rng_mode", [](const std::string& mode) {
    TORCH_CHECK_VALUE(mode == "cpu" || mode == "philox", "rng mode must be 'cpu' or 'philox', got '", mode, "'");
    at::neuron::set_rng_mode(mode == "cpu" ? at::neuron::RngMode::Cpu : at::neuron::RngMode::Philox);
  });
  m.def("_default_generator", [](int index) {
    return py::reinterpret_steal<py::object>(
        THPGenerator_initDefaultGenerator(at::neuron::default_generator(static_cast<c10::DeviceIndex>(index))));
  });
  // Compiled host code (torch.compile backend "neuron") runs on aliases of
  // device memory and allocates its outputs in HBM.
  m.def("_host_alias", &at::neuron::host_alias);
  // Runs fn() as a kernel on `device`'s current stream: host code working on
  // aliases of device memory (compiled graphs) is device work like any other.
  m.def("_launch", [](int device, py::function fn, std::string name) {
    // Launch names outlive the call: keep one copy of each.
    static std::mutex mutex;
    static std::set<std::string> names;
    const char* label;
    {
      std::lock_guard<std::mutex> lock(mutex);
      label = names.insert(std::move(name)).first->c_str();
    }
    py::object result;
    at::neuron::rt_call([&] {
      neuronrt::current_stream(device).launch([&] { result = fn(); }, label);
    });
    return result;
  }, py::arg("device"), py::arg("fn"), py::arg("name") = "compiled_graph");
  // torch.neuron.caching_allocator_alloc/delete: raw device memory.
  m.def("_caching_allocator_alloc", [](size_t size, int device) {
    return reinterpret_cast<uintptr_t>(at::neuron::rt_call([&] { return neuronrt::malloc(device, size); }));
  });
  m.def("_caching_allocator_delete", [](uintptr_t ptr) {
    void* p = reinterpret_cast<void*>(ptr);
    TORCH_CHECK(neuronrt::pointer_device(p) >= 0, "caching_allocator_delete: ", p,
                " was not allocated by the neuron caching allocator");
    neuronrt::free(p);
  });
  // (issued launches, stalls) over the device's streams: tests check that a
  // workload's ops do not make the caller wait for queued work.
  m.def("_launch_counts", [](int device) {
    return at::neuron::rt_call([&] {
      uint64_t issued = 0, stalls = 0;
      for (neuronrt::Stream* s : neuronrt::all_streams(device)) {
        issued += s->issued();
        stalls += s->stalls();
      }
      return std::make_pair(issued, stalls);
    });
  });
  m.def("_is_neuron_ptr", [](uintptr_t ptr) {
    return neuronrt::pointer_device(reinterpret_cast<void*>(ptr));
  });

  // The `neuron` c10d backend (torch_neuronx._C._distributed).
  torch_neuronx::init_distributed_bindings(m);
}
