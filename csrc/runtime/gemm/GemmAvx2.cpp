// The small-M GEMM kernels of the avx2 build (CMakeLists.txt sets this file's
// flags; Gemm.cpp picks the build).
#include <cstdint>
#include <cstring>
#include <algorithm>
#include <utility>

#include "GemmKernels.h"

namespace neuronrt::gemm::avx2 {
constexpr int64_t kLanes = 8;
#include "GemmKernels.inc"
}  // namespace neuronrt::gemm::avx2
