// The NKI executor: runs a lowered program (Program.h) over raw buffer
// pointers, partition rows spread over threads, and the runtime kernel that
// launches it on a stream over device memory.
#pragma once

#include <memory>
#include <vector>

#include "Program.h"
#include "csrc/runtime/Runtime.h"

namespace neuronrt::nki {

// Runs `program` with `bound[k]` the memory of buffer program.bound()[k]
// (each at least numel elements of its dtype). Device memory must be
// accessible: call it inside a kernel launch (ProgramKernel). `threads`
// (>= 1) threads each own a fixed range of the 128 partitions; bound buffers
// that overlap in memory run on one thread (the schedule assumes distinct
// HBM tensors). Throws Error when `bound` does not match the program.
void execute(const Program& program, const std::vector<void*>& bound, int threads);

// Which build of the row kernels runs on this CPU: "avx512", "avx2" or
// "generic" (all give the same results).
const char* kernel_isa() noexcept;

// One launch of a program: a runtime Kernel, so it runs in stream order
// with device memory mapped (protect mode) like any other kernel. It owns
// what it needs, so it may outlive its caller's frame.
class ProgramKernel final : public Kernel {
 public:
  ProgramKernel(std::shared_ptr<const Program> program, std::vector<void*> bound, int threads);
  const char* name() const noexcept override { return name_; }
  void run() override { execute(*program_, bound_, threads_); }

 private:
  std::shared_ptr<const Program> program_;
  std::vector<void*> bound_;
  int threads_;
  const char* name_;  // interned: launch observers keep the pointer
};

}  // namespace neuronrt::nki
