// The route table: how each ATen op the device kernel table covers reaches
// the device (docs/architecture.md, "Ops"; docs/ops.md is generated from it).
//
// Every op in the table runs through the host path (HostExecution.h): its CPU
// kernel over host aliases of device memory, inside a launch. On top of that
// an overload may be
// - queued (AsyncExecution.cpp): its C++ meta function checks the arguments
//   and describes the outputs, so the caller returns before the kernel runs;
// - direct (DirectKernels.cpp): an unboxed kernel run on the device tensors
//   themselves, taken when the call runs on the caller anyway.
// Random ops (the nondeterministic_seeded tag) draw through the device
// generator, and in strict mode (Fidelity.h) every call takes the host path,
// which checks its results.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>
#include <torch/library.h>

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "csrc/runtime/Runtime.h"

namespace at::neuron {

// Whether a launch touching `bytes` on `stream` runs on the calling thread:
// launches are blocking, or the stream is idle and the work small, where the
// runtime runs it inline rather than hand it to the executor (runtime.md,
// "Small kernels on an idle stream"). The queued and direct paths both ask.
inline bool runs_inline(const neuronrt::Stream& stream, size_t bytes) {
  return neuronrt::launch_blocking() ||
         (bytes <= neuronrt::Stream::kInlineBytes / 2 && stream.query() && !stream.failed());
}

// ---- the table's entries (Routes.cpp) ---------------------------------------

// A queued overload: how its outputs are described and what the kernel runs.
enum class QueueMode {
  Out,      // run the out= overload into the allocated outputs
  InPlace,  // run the op itself; its result is its first argument
  Copy,     // no out= overload: run the op, copy its results into the outputs
};
struct QueuedRoute {
  using Args = std::vector<c10::IValue>;  // the op's arguments, tensors as meta tensors
  using Outs = std::vector<at::Tensor>;   // meta outputs
  const char* name;
  const char* overload;
  QueueMode mode;
  const char* out_overload;  // QueueMode::Out
  Outs (*meta)(const Args&);
  // The kernel checks values (index ranges): its errors must wait for a
  // synchronization point however it runs.
  bool checks_data = false;
};
c10::ArrayRef<QueuedRoute> queued_routes();

// An overload with a direct kernel (DirectKernels.h).
struct DirectRoute {
  const char* overload;
  torch::CppFunction (*kernel)();
};

// Registers the table's PrivateUse1 kernels: the direct kernel where there is
// one, else the host path, for every overload of the table's ops that has a
// CPU kernel and no dedicated neuron kernel. Returns the table's overloads.
std::vector<std::string> register_host_kernels();

// The table per overload that runs the table's kernels ("add.Tensor"; not
// those left to a dedicated kernel): what docs/ops.md lists
// (torch_neuronx._C._route_table()).
struct RouteRow {
  std::string op;
  bool direct;       // has a direct kernel
  bool queued;       // may be queued (a meta function describes its outputs)
  bool checks_data;  // its kernel checks values: errors wait for a sync point
  bool random;       // draws from the device generator (nondeterministic_seeded)
};
std::vector<RouteRow> route_table();

}  // namespace at::neuron
