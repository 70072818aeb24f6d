// The GEMV kernels of the avx512 build (CMakeLists.txt sets this file's flags;
// Gemv.cpp picks the build).
#include <algorithm>
#include <cstdint>
#include <cstring>

#include "GemvKernels.h"

namespace neuronrt::gemv::avx512 {
// Halves of the 16 lanes in ymm registers, not one zmm: two accumulator chains
// per output, 28 against 20 GB/s at one thread on a Zen 4 (same sums).
constexpr int64_t kRegLanes = 8;
#include "GemvKernels.inc"
}  // namespace neuronrt::gemv::avx512
