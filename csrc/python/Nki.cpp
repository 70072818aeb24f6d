// torch_neuronx._C._NkiProgram: the Python lowering of a traced NKI kernel
// (nki/_native.py) hands its record table to the runtime's executor
// (csrc/runtime/nki), which checks it once; run() queues it on the current
// stream of the tensors' neuron device (a program with a device loop runs
// synchronously), or runs it in place on CPU memory (NumPy arrays and the CPU
// kernels of nki_op).
#include <torch/csrc/utils/pybind.h>

#include "csrc/aten/HostExecution.h"
#include "csrc/aten/NeuronFunctions.h"
#include "csrc/runtime/Runtime.h"

namespace py = pybind11;
namespace nk = neuronrt::nki;

namespace torch_neuronx {
namespace {

at::ScalarType scalar_type(int64_t dtype) {
  // In nk::DType order (csrc/runtime/nki/Program.h).
  constexpr at::ScalarType types[nk::kNumDTypes] = {at::kFloat, at::kBFloat16, at::kHalf, at::kFloat8_e4m3fn,
                                                    at::kFloat8_e5m2, at::kInt, at::kShort, at::kChar,
                                                    at::kByte, at::kUInt16, at::kUInt32, at::kBool};
  return types[dtype];
}

template <typename T>
std::vector<T> to_vector(const at::Tensor& t, at::ScalarType type, const char* what) {
  TORCH_CHECK(t.device().is_cpu() && t.scalar_type() == type && t.dim() == 1 && t.is_contiguous(),
              "_NkiProgram: ", what, " must be a contiguous 1-D CPU tensor of ", type);
  const T* p = t.data_ptr<T>();
  return std::vector<T>(p, p + t.numel());
}

std::shared_ptr<nk::Program> make_program(const at::Tensor& words, const at::Tensor& imms,
                                          const std::vector<std::tuple<int64_t, int64_t, int64_t>>& buffers,
                                          int64_t arena_bytes, std::string name) {
  std::vector<nk::Buffer> bufs;
  for (const auto& [dtype, numel, offset] : buffers) bufs.push_back({dtype, numel, offset});
  return at::neuron::rt_call([&] {
    return std::make_shared<nk::Program>(to_vector<int64_t>(words, at::kLong, "words"),
                                         to_vector<double>(imms, at::kDouble, "imms"), std::move(bufs),
                                         arena_bytes, std::move(name));
  });
}

void run(const std::shared_ptr<nk::Program>& program, const std::vector<at::Tensor>& bound, int threads) {
  const auto& ids = program->bound();
  TORCH_CHECK(bound.size() == ids.size(), "nki kernel '", program->name(), "': expected ", ids.size(),
              " bound tensors, got ", bound.size());
  std::vector<void*> ptrs;
  std::optional<c10::Device> device;
  for (size_t k = 0; k < bound.size(); ++k) {
    const at::Tensor& t = bound[k];
    const nk::Buffer& buf = program->buffers()[ids[k]];
    TORCH_CHECK(t.defined() && t.is_contiguous() && t.scalar_type() == scalar_type(buf.dtype) &&
                    t.numel() == buf.numel,
                "nki kernel '", program->name(), "': bound buffer ", ids[k], " must be a contiguous ",
                scalar_type(buf.dtype), " tensor of ", buf.numel, " elements, got ",
                t.defined() ? t.toString() : "an undefined tensor", " of ", t.defined() ? t.numel() : 0);
    TORCH_CHECK(!device || *device == t.device(), "nki kernel '", program->name(),
                "': bound tensors are on different devices (", *device, ", ", t.device(), ")");
    TORCH_CHECK(t.device().is_cpu() || t.device().is_privateuseone(), "nki kernel '", program->name(),
                "': tensors must be on neuron or cpu, got ", t.device());
    device = t.device();
    ptrs.push_back(t.data_ptr());
  }
  py::gil_scoped_release no_gil;
  at::neuron::rt_call([&] {
    if (device && device->is_privateuseone()) {
      const int index = device->has_index() ? device->index() : neuronrt::current_device();
      neuronrt::Stream& stream = neuronrt::current_stream(index);
      if (program->has_loops()) {
        // A device loop can fail at run time (its iteration cap): launched
        // synchronously, its error is raised at the call, as the interpreter
        // raises it (nki/_native.py turns it into NKIError).
        nk::ProgramKernel kernel(program, std::move(ptrs), threads);
        stream.launch([&] { kernel.run(); }, kernel.name());
      } else {
        // Queued like an ATen op: the caller goes on while the stream runs the
        // work before it (a decode step's kernels overlap the Python that
        // launches them), a graph capture records it, errors surface at the
        // next sync point, and the bound tensors stay alive until it has run
        // (an argument the caller drops at once is still read). A small
        // program on an idle stream runs on the caller (Stream.h).
        auto kernel = std::make_shared<nk::ProgramKernel>(program, std::move(ptrs), threads);
        size_t bytes = 0;
        for (const at::Tensor& t : bound) bytes += t.nbytes();
        at::neuron::queue_host_work(stream, kernel->name(), bytes, [kernel, bound] { kernel->run(); });
      }
    } else {
      nk::execute(*program, ptrs, threads);
    }
  });
}

}  // namespace

void register_nki(py::module& m) {
  py::class_<nk::Program, std::shared_ptr<nk::Program>>(m, "_NkiProgram")
      .def(py::init(&make_program), py::arg("words"), py::arg("imms"), py::arg("buffers"), py::arg("arena_bytes"),
           py::arg("name"))
      .def("run", &run, py::arg("bound"), py::arg("threads"))
      .def_property_readonly("name", &nk::Program::name)
      .def_property_readonly("size", &nk::Program::size)
      .def_property_readonly("max_free", &nk::Program::max_free)
      .def_property_readonly("bound", &nk::Program::bound);
  m.attr("_nki_layout") = py::make_tuple(nk::kMaxDims, nk::kMaxViews, nk::kHeader, nk::kRecord);
  m.def("_nki_kernel_isa", &nk::kernel_isa);
}

}  // namespace torch_neuronx
