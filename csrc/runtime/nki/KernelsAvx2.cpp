// The row kernels built with AVX2 + F16C (CMakeLists.txt sets the flags for
// this file only; Executor.cpp calls them when the CPU has both).
#include "Kernels.h"

namespace neuronrt::nki::detail::avx2 {
#include "Kernels.inc"
}  // namespace neuronrt::nki::detail::avx2
