// The element-wise work of the intra-node collectives (ShmCollectives): the
// reduction over the ranks' buffers and the copies, with streaming
// (non-temporal) stores for results that would not stay in the cache.
//
// The reduction is one pass over the sources per block: each element is read
// from every source once and written to every destination, in registers,
// vectorised by the compiler for the widest ISA the CPU has (the kernels are
// built three times, shm/ReduceKernels.inc; dispatch once per process), as
// the NKI row kernels are. Results equal an element-wise reduction in ATen
// bit for bit on every ISA: the per-element operations and their order do not
// depend on the vector width.
#pragma once

#include <cstddef>

#include "ShmCollectives.h"

namespace neuronrt::shm {

// dsts[0..ndst) = reduction over srcs[0..n) in that order (AVG divides by n).
// A destination may be one of the sources (the same elements), not a
// partial overlap. `stream`: non-temporal stores (call store_fence() before
// announcing the results).
void reduce(ShmDtype dtype, ShmReduceOp op, const void* const* srcs, int n, void* const* dsts, int ndst,
            size_t count, bool stream);

void copy_bytes(void* dst, const void* src, size_t n, bool stream);
// Copies src to every destination, a block at a time so src is read once.
void copy_to_all(void* const* dsts, int ndst, const void* src, size_t n, bool stream);
// Streaming stores are weakly ordered: fence them before announcing them.
void store_fence();

// Which kernel build reduce() uses: "avx512", "avx2" or "generic".
const char* reduce_isa();

}  // namespace neuronrt::shm
