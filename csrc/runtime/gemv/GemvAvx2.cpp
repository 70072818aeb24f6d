// The GEMV kernels of the avx2 build (CMakeLists.txt sets this file's flags;
// Gemv.cpp picks the build).
#include <algorithm>
#include <cstdint>
#include <cstring>

#include "GemvKernels.h"

namespace neuronrt::gemv::avx2 {
constexpr int64_t kRegLanes = 8;
#include "GemvKernels.inc"
}  // namespace neuronrt::gemv::avx2
