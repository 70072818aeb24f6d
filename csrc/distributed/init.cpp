// Python bindings of the `neuron` c10d backend: torch_neuronx._C._distributed.
#include <pybind11/chrono.h>
#include <torch/csrc/utils/pybind.h>

#include "csrc/distributed/ProcessGroupNeuron.h"
#include "csrc/distributed/StoreKeys.h"

namespace py = pybind11;

namespace torch_neuronx {

void init_distributed_bindings(py::module& m) {
  // Backend and Backend.Options are registered by torch's c10d module; our
  // classes derive from them.
  py::module::import("torch._C._distributed_c10d");
  auto d = m.def_submodule("_distributed", "The `neuron` c10d backend");

  using c10d::ProcessGroupNeuron;
  auto pg = py::class_<ProcessGroupNeuron, c10d::Backend, c10::intrusive_ptr<ProcessGroupNeuron>>(
      d, "ProcessGroupNeuron",
      "c10d backend for neuron (and cpu) tensors; Gloo moves zero-copy host views of device memory.");

  py::class_<ProcessGroupNeuron::Options, c10d::Backend::Options, c10::intrusive_ptr<ProcessGroupNeuron::Options>>(
      pg, "Options")
      .def(py::init([](std::chrono::milliseconds timeout) { return ProcessGroupNeuron::Options::create(timeout); }),
           py::arg("timeout") = kBackendDefaultTimeout)
      .def("__copy__", [](const ProcessGroupNeuron::Options& self) { return self.clone(); })
      .def("__deepcopy__", [](const ProcessGroupNeuron::Options& self, py::dict) { return self.clone(); });

  pg.def(py::init([](const c10::intrusive_ptr<c10d::Backend>& transport, int rank, int size,
                     const c10::intrusive_ptr<ProcessGroupNeuron::Options>& options,
                     const c10::intrusive_ptr<c10d::Store>& store) {
           return c10::make_intrusive<ProcessGroupNeuron>(transport, rank, size, options, store);
         }),
         py::arg("transport"), py::arg("rank"), py::arg("size"), py::arg("options"), py::arg("store") = nullptr,
         py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("options", &ProcessGroupNeuron::options)
      .def_property_readonly("uses_shm", &ProcessGroupNeuron::usesShm,
                             "whether all_reduce/reduce_scatter/all_gather use the intra-node shared-memory path")
      .def_property_readonly("_transport", &ProcessGroupNeuron::transport)
      .def("get_error", [](ProcessGroupNeuron& self) { return static_cast<int>(self.getError()); },
           "0 success, 1 timeout, 2 communication error, 3 remote error (c10d::ErrorType)");
  d.def("_quiesce_completions", &ProcessGroupNeuron::quiesceCompletions, py::arg("timeout"),
        py::call_guard<py::gil_scoped_release>(),
        "At exit: waits for completions on transport threads; later ones leak instead of taking the GIL");
  // The store protocol (StoreKeys.h), for the root group built in Python.
  d.def("_attempt_prefix", &c10d::neuron_pg::attempt_prefix,
        "the store prefix of this attempt's keys (neuron/<TORCHELASTIC_RESTART_COUNT>/)");
  d.attr("_TRANSPORT_PREFIX") = c10d::neuron_pg::kTransportPrefix;
}

}  // namespace torch_neuronx
