// The GEMV kernels of the generic build (CMakeLists.txt sets this file's flags;
// Gemv.cpp picks the build).
#include <algorithm>
#include <cstdint>
#include <cstring>

#include "GemvKernels.h"

namespace neuronrt::gemv::generic {
constexpr int64_t kRegLanes = 4;
#include "GemvKernels.inc"
}  // namespace neuronrt::gemv::generic
