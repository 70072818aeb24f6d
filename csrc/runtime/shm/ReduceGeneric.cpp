// The reduction kernels built for the baseline x86-64 (or other) ISA
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

namespace neuronrt::shm::detail::generic {
#include "ReduceKernels.inc"
}  // namespace neuronrt::shm::detail::generic
