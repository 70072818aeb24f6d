// The AOTInductor model runner for `neuron` (torch._inductor.aoti_load_package,
// torch::inductor::AOTIModelPackageLoader).
//
// A neuron AOTI package is the host-code model Inductor builds for the C++
// wrapper route (fused C++ kernels and CPU C shims over host-mappable device
// memory, buffers allocated on neuron). The loader picks the runner by the
// package's AOTI_DEVICE_KEY ("neuron"); this one runs each call of the model
// as one launch on the current stream of its device, so the model touches
// device memory only inside a launch (NEURON_RT_PROTECT=1), in order with the
// stream's queued work, as the cpp_wrapper route's `launched` does.
#include <torch/csrc/inductor/aoti_runner/model_container_runner.h>
#include <torch/csrc/inductor/aoti_torch/utils.h>

#include <regex>
#include <string>

#include "csrc/aten/NeuronFunctions.h"
#include "csrc/runtime/Runtime.h"

namespace torch_neuronx {
namespace {

using torch::inductor::AOTIModelContainerRunner;

// "neuron" or "neuron:N" -> N (the current device when no index is given).
c10::DeviceIndex parse_neuron_device(const std::string& device_str) {
  static const std::regex re("neuron(:([0-9]+))?");
  std::smatch match;
  TORCH_CHECK(std::regex_match(device_str, match, re), "AOTInductor: the neuron model runner got device '", device_str,
              "'; expected 'neuron' or 'neuron:N'");
  at::neuron::lazy_init();
  c10::DeviceIndex index = match[2].matched ? static_cast<c10::DeviceIndex>(std::stoi(match[2].str())) : -1;
  return at::neuron::resolve_device(index);
}

class AOTIModelContainerRunnerNeuron : public AOTIModelContainerRunner {
 public:
  AOTIModelContainerRunnerNeuron(const std::string& model_so_path, size_t num_models, c10::DeviceIndex device,
                                 const std::string& bin_dir, bool run_single_threaded)
      // The generated model knows only the devices AOTI builds for
      // (cpu/cuda/xpu/mps) and is host code: it is created as a cpu model.
      // Its buffers still go to neuron (the wrapper allocates them with the
      // PrivateUse1 device and the current index, set below); its weights stay
      // in the model's own host memory.
      : AOTIModelContainerRunner(model_so_path, num_models, "cpu", bin_dir, run_single_threaded),
        device_(device),
        label_("aoti_model neuron:" + std::to_string(device)) {}

 protected:
  std::vector<at::Tensor> run_impl(std::vector<AtenTensorHandle>& input_handles, void* stream_handle) override {
    for (size_t i = 0; i < input_handles.size(); ++i) {
      const at::Tensor* t = torch::aot_inductor::tensor_handle_to_tensor_pointer(input_handles[i]);
      if (!t->defined()) continue;
      TORCH_CHECK(t->device() == at::neuron::device_of_index(device_), "AOTInductor: input ", i, " is on ",
                  t->device(), " but this model was compiled for neuron and loaded for neuron:",
                  static_cast<int>(device_), "; move the inputs there, or load the package for their device "
                  "(aoti_load_package(path, device_index=N))");
    }
    // Allocations inside the model (device index -1) go to the current device.
    c10::DeviceGuard guard(at::neuron::device_of_index(device_));
    std::vector<at::Tensor> outputs;
    at::neuron::rt_call([&] {
      neuronrt::current_stream(device_).launch(
          [&] { outputs = AOTIModelContainerRunner::run_impl(input_handles, stream_handle); }, label_.c_str());
    });
    return outputs;
  }

 private:
  c10::DeviceIndex device_;
  std::string label_;
};

std::unique_ptr<AOTIModelContainerRunner> create_neuron_runner(const std::string& model_so_path, size_t num_models,
                                                               const std::string& device_str,
                                                               const std::string& bin_dir,
                                                               const bool run_single_threaded) {
  return std::make_unique<AOTIModelContainerRunnerNeuron>(model_so_path, num_models, parse_neuron_device(device_str),
                                                          bin_dir, run_single_threaded);
}

// Registered when the extension loads (import torch_neuronx), before any
// package can be loaded for neuron.
const torch::inductor::RegisterAOTIModelRunner register_neuron_runner("neuron", &create_neuron_runner);

}  // namespace
}  // namespace torch_neuronx
