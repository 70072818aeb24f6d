// Cheaper re-runnable forms of recorded op kernels (graph replays).
//
// A queued op kernel (AsyncExecution.cpp) calls its CPU kernel through the
// dispatcher with a stack rebuilt each run: right for a kernel that runs
// once, but a graph replays the same call over the same host aliases every
// time. For structured pointwise ops (TensorIterator kernels) the CPU kernel
// object is built once over the fixed operands, running the op's own meta
// function (checks, broadcasting, dtype promotion, the iterator's layout),
// and each replay runs only its impl(): the iterator's loops over the same
// memory. Ops whose impl() builds a TensorIterator per call and runs one
// DispatchStub over it (sum/mean over dims, cat's copies, index_copy_,
// where, arange, fill_) get that iterator built once, as ATen builds it, and
// run only the stub. The results are those of the eager call, bit for bit:
// the same kernels run the same loops over the same layout.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>

#include <memory>
#include <vector>

namespace at::neuron {

// One prepared call; run() may be called any number of times, not
// concurrently.
class ReplayCall {
 public:
  virtual ~ReplayCall() = default;
  virtual void run() = 0;
  // False when the first run() showed that the kernel changes its own state
  // (e.g. drops a scalar operand) and cannot run again.
  virtual bool rerunnable() const = 0;
  // The bytes of this object (its inline state, e.g. a TensorIterator), for
  // prefetching before a replay runs it.
  virtual size_t footprint() const = 0;
};

// The prepared form of `op` (an out= or in-place overload) over `args` (its
// arguments, host aliases and CPU scalar snapshots, without the outputs)
// writing `out`; null when `op` has no such form or the operands need what a
// fixed kernel object cannot redo (an input converted to another dtype at
// build time). Runs the op's meta function: call it where device memory is
// accessible (a kernel's run()).
std::unique_ptr<ReplayCall> prepare_replay_call(const c10::OperatorHandle& op, const std::vector<c10::IValue>& args,
                                                const at::Tensor& out);

}  // namespace at::neuron
