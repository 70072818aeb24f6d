// The runtime's compute threads: one kernel split across several threads.
//
// A stream's executor runs its kernels one after another; a kernel that is
// bound by memory bandwidth (a decode step's matmuls) needs more than one
// core to reach it. OpenMP teams started from the executor thread pay a
// futex wake-up per parallel region once more threads exist than cores (the
// caller's team and the executor's): at two threads, hundreds of short
// regions a decode step cost more than the split saved. These workers spin
// for a while after each job, so the back-to-back kernels of a step find them
// awake, and sleep when the stream goes idle.
#pragma once

#include <cstdint>

namespace neuronrt {

// fn(ctx, begin, end) for a range [begin, end) of a split. Must not throw.
using RangeFn = void (*)(void* ctx, int64_t begin, int64_t end) noexcept;

// Splits [0, n) into contiguous chunks of at least `grain` (a few per
// thread) and runs fn on them on up to `threads` threads (at most one per
// core): the caller and workers take chunks until none is left, so a worker
// that starts late costs little. Returns when all have run. With threads <= 1,
// too little work for two chunks, or the workers busy with another caller's
// split, the caller runs [0, n) alone.
void parallel_for(int threads, int64_t n, int64_t grain, RangeFn fn, void* ctx);

template <typename F>
void parallel_for(int threads, int64_t n, int64_t grain, const F& f) {
  parallel_for(
      threads, n, grain, [](void* ctx, int64_t begin, int64_t end) noexcept { (*static_cast<const F*>(ctx))(begin, end); },
      const_cast<F*>(&f));
}

// Splits that ran on more than one thread (tests, diagnostics).
int64_t parallel_splits() noexcept;

}  // namespace neuronrt
