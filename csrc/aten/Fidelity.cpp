#include "Fidelity.h"

#include <ATen/ATen.h>

#include <limits>
#include <string>

#include "csrc/runtime/Runtime.h"

namespace at::neuron {

bool strict_mode() { return neuronrt::strict(); }

void check_strict_dtype(c10::ScalarType dtype, std::string_view what) {
  if (!strict_mode()) return;
  const bool missing = dtype == c10::kDouble || c10::isComplexType(dtype) || dtype == c10::kUInt64;
  TORCH_CHECK_TYPE(!missing, "neuron (NEURON_RT_STRICT=1, target ", neuronrt::target().name, "): ", what,
                   " uses ", dtype, ", which Trainium does not have (no FP64, no complex, no unsigned 64-bit "
                   "types). Use float32 (or bfloat16), or unset NEURON_RT_STRICT to run it on the host runtime "
                   "anyway.");
}

void check_strict_int_range(const at::Tensor& host, std::string_view op) {
  if (!strict_mode() || host.scalar_type() != c10::kLong || host.numel() == 0) return;
  auto [lo, hi] = at::aminmax(host);
  const int64_t mn = lo.item<int64_t>(), mx = hi.item<int64_t>();
  constexpr int64_t kMin = std::numeric_limits<int32_t>::min(), kMax = std::numeric_limits<int32_t>::max();
  TORCH_CHECK(mn >= kMin && mx <= kMax, "neuron (NEURON_RT_STRICT=1, target ", neuronrt::target().name, "): ", op,
              " produced int64 values in [", mn, ", ", mx, "], outside the int32 range the Neuron backend "
              "narrows 64-bit integers to: on Trainium they would wrap. Keep integer values below 2^31.");
}

}  // namespace at::neuron
