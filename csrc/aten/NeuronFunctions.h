// Small helpers shared by the PyTorch integration: device-index conversion
// and translation of runtime errors into the c10 exceptions Python expects.
#pragma once

#include <c10/core/Device.h>
#include <c10/util/Exception.h>

#include "csrc/runtime/Runtime.h"

namespace at::neuron {

inline c10::Device device_of_index(c10::DeviceIndex index) {
  return c10::Device(c10::DeviceType::PrivateUse1, index);
}

// Runs `fn`, turning runtime errors into c10 errors: OutOfMemoryError becomes
// torch.OutOfMemoryError, a malformed NEURON_RT_* variable a ValueError (not
// a RuntimeError, which HF's availability probes swallow into "no device"),
// an invalid index a RuntimeError that names the valid range.
template <typename F>
decltype(auto) rt_call(F&& fn) {
  try {
    return fn();
  } catch (const neuronrt::OutOfMemoryError& e) {
    TORCH_CHECK_WITH(OutOfMemoryError, false, e.what());
  } catch (const neuronrt::KernelError& e) {
    throw c10::AcceleratorError({__func__, __FILE__, static_cast<uint32_t>(__LINE__)}, 1, e.what());
  } catch (const neuronrt::ConfigurationError& e) {
    TORCH_CHECK_VALUE(false, e.what());
  } catch (const neuronrt::Error& e) {
    TORCH_CHECK(false, e.what());
  }
}

// Entry check of every device operation: raises in a child forked after the
// runtime was initialized (before any lock is taken), else marks it initialized.
inline void lazy_init() {
  rt_call([] { neuronrt::lazy_init(); });
}

inline c10::DeviceIndex current_device() {
  return static_cast<c10::DeviceIndex>(neuronrt::current_device());
}

inline void check_device(c10::DeviceIndex index) {
  rt_call([&] { neuronrt::check_device(index); });
}

// Resolves -1 / unset to the current device and validates the index.
inline c10::DeviceIndex resolve_device(c10::DeviceIndex index) {
  if (index < 0) index = current_device();
  check_device(index);
  return index;
}

}  // namespace at::neuron
