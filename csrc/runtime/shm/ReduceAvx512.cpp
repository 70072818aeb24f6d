// The reduction kernels built with AVX-512 (F, BW, VL, DQ) + F16C and 512-bit vectors
// (CMakeLists.txt sets this file's flags; ShmReduce.cpp picks the build).
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "ReduceKernels.h"

namespace neuronrt::shm::detail::avx512 {
#include "ReduceKernels.inc"
}  // namespace neuronrt::shm::detail::avx512
