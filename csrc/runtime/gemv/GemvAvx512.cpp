// The GEMV kernels of the avx512 build (CMakeLists.txt sets this file's flags;
// Gemv.cpp picks the build).
#include <cstdint>
#include <cstring>

#include "GemvKernels.h"

namespace neuronrt::gemv::avx512 {
#include "GemvKernels.inc"
}  // namespace neuronrt::gemv::avx512
