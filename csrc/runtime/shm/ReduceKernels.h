// The reduction kernels, one build per ISA (ReduceKernels.inc); ShmReduce.cpp
// picks one for the CPU.
#pragma once

#include <cstddef>

#include "csrc/runtime/ShmCollectives.h"

namespace neuronrt::shm::detail {

using ReduceFn = void (*)(ShmDtype dtype, ShmReduceOp op, const void* const* srcs, int n, void* const* dsts,
                          int ndst, size_t count, bool stream);

namespace generic {
void reduce(ShmDtype, ShmReduceOp, const void* const*, int, void* const*, int, size_t, bool);
}
namespace avx2 {
void reduce(ShmDtype, ShmReduceOp, const void* const*, int, void* const*, int, size_t, bool);
}
namespace avx512 {
void reduce(ShmDtype, ShmReduceOp, const void* const*, int, void* const*, int, size_t, bool);
}

// Streaming copy (same in every build: 16-byte SSE2 non-temporal stores).
void stream_copy(void* dst, const void* src, size_t n);

}  // namespace neuronrt::shm::detail
