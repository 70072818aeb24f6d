// The small-M GEMM kernels of the generic build (CMakeLists.txt sets this file's
// flags; Gemm.cpp picks the build).
#include <cstdint>
#include <cstring>
#include <algorithm>
#include <utility>

#include "GemmKernels.h"

namespace neuronrt::gemm::generic {
constexpr int64_t kLanes = 4;
#include "GemmKernels.inc"
}  // namespace neuronrt::gemm::generic
