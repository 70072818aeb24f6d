// neuron_tools._rtinfo: the runtime's resolved configuration and its registry
// layout for neuron-ls and neuron-top, without torch. The tools start at once
// and show exactly what a process started in the same environment would have
// (NEURON_RT_TARGET, visible cores, HBM budget), because the answers come from
// the runtime's own code, not from a second parser of the variables.
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <cstddef>

#include "csrc/runtime/Device.h"
#include "csrc/runtime/Registry.h"
#include "csrc/runtime/Target.h"

namespace {

using neuronrt::RegistryDevice;
using neuronrt::RegistryRecord;

// {"error": str, "target": str, "devices": [{"index", "physical_core", "name", "capacity"}]}
PyObject* configuration(PyObject*, PyObject*) {
  const std::string& error = neuronrt::configuration_error();
  PyObject* devices = PyList_New(0);
  if (!devices) return nullptr;
  const int n = error.empty() ? neuronrt::device_count() : 0;
  for (int d = 0; d < n; ++d) {
    const neuronrt::DeviceProperties& p = neuronrt::device_properties(d);
    PyObject* item = Py_BuildValue("{s:i,s:i,s:s,s:K}", "index", d, "physical_core", p.physical_core, "name",
                                   p.name.c_str(), "capacity", static_cast<unsigned long long>(p.total_memory));
    if (!item || PyList_Append(devices, item) < 0) {
      Py_XDECREF(item);
      Py_DECREF(devices);
      return nullptr;
    }
    Py_DECREF(item);
  }
  return Py_BuildValue("{s:s,s:s,s:N}", "error", error.c_str(), "target", neuronrt::target().name.c_str(),
                       "devices", devices);
}

// Field name -> (offset, size) of RegistryRecord's header and of one
// RegistryDevice, with the record's constants: the reader's whole contract.
PyObject* registry_layout(PyObject*, PyObject*) {
#define NRT_FIELD(T, f) #f, static_cast<Py_ssize_t>(offsetof(T, f)), static_cast<Py_ssize_t>(sizeof(T::f))
  return Py_BuildValue(
      "{s:y#,s:I,s:s,s:n,s:n,s:n,s:i,"
      "s:{s:(nn),s:(nn),s:(nn),s:(nn),s:(nn),s:(nn),s:(nn),s:(nn)},"
      "s:{s:(nn),s:(nn),s:(nn),s:(nn),s:(nn),s:(nn),s:(nn)}}",
      "magic", neuronrt::kRegistryMagic, static_cast<Py_ssize_t>(sizeof neuronrt::kRegistryMagic), "version",
      neuronrt::kRegistryVersion, "path_prefix", neuronrt::kRegistryPathPrefix, "record_size",
      static_cast<Py_ssize_t>(sizeof(RegistryRecord)), "devices_offset",
      static_cast<Py_ssize_t>(offsetof(RegistryRecord, devices)), "device_size",
      static_cast<Py_ssize_t>(sizeof(RegistryDevice)), "max_devices", neuronrt::kRegistryMaxDevices,
      "header", NRT_FIELD(RegistryRecord, magic), NRT_FIELD(RegistryRecord, version), NRT_FIELD(RegistryRecord, pid),
      NRT_FIELD(RegistryRecord, start_unix_ns), NRT_FIELD(RegistryRecord, device_count),
      NRT_FIELD(RegistryRecord, command), NRT_FIELD(RegistryRecord, target), NRT_FIELD(RegistryRecord, device_name),
      "device", NRT_FIELD(RegistryDevice, allocated_bytes), NRT_FIELD(RegistryDevice, reserved_bytes),
      NRT_FIELD(RegistryDevice, busy_ns), NRT_FIELD(RegistryDevice, launches), NRT_FIELD(RegistryDevice, capacity),
      NRT_FIELD(RegistryDevice, physical_core), NRT_FIELD(RegistryDevice, graph_replays));
#undef NRT_FIELD
}

PyMethodDef methods[] = {
    {"configuration", configuration, METH_NOARGS, "The devices the runtime resolves from this environment."},
    {"registry_layout", registry_layout, METH_NOARGS, "Offsets and sizes of the per-process registry record."},
    {nullptr, nullptr, 0, nullptr}};

PyModuleDef module = {PyModuleDef_HEAD_INIT, "_rtinfo", nullptr, -1, methods};

}  // namespace

PyMODINIT_FUNC PyInit__rtinfo() { return PyModule_Create(&module); }
