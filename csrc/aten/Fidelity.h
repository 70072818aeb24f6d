// Trainium fidelity checks of the PyTorch layer (NEURON_RT_STRICT=1; see
// csrc/runtime/Target.h and docs/fidelity.md): the device refuses data types
// the target hardware does not have, and integer results that the real
// backend's narrowing of 64-bit integers to 32 bits would corrupt.
#pragma once

#include <ATen/core/Tensor.h>

#include <string_view>

namespace at::neuron {

bool strict_mode();

// TypeError unless `dtype` exists on the target (float64, complex, uint64
// do not); `what` names the op or the conversion.
void check_strict_dtype(c10::ScalarType dtype, std::string_view what);

// RuntimeError when an int64 result holds values outside the int32 range
// (`host` is the host view of the result; `op` names the op).
void check_strict_int_range(const at::Tensor& host, std::string_view op);

}  // namespace at::neuron
