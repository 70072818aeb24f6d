// The row kernels built with AVX-512 (F, BW, VL, DQ) + F16C and 512-bit
// vectors (CMakeLists.txt sets the flags for this file only; Executor.cpp
// calls them when the CPU has them). Sums keep their explicit 8-lane order.
#include "Kernels.h"

namespace neuronrt::nki::detail::avx512 {
#include "Kernels.inc"
}  // namespace neuronrt::nki::detail::avx512
