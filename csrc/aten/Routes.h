// The route table: one row per ATen op, saying how it reaches the device
// (docs/architecture.md, "The route table"; docs/ops.md is generated from it).
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

#include <array>
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
// Never on a capturing stream: work there is recorded (docs/graphs.md).
inline bool runs_inline(const neuronrt::Stream& stream, size_t bytes) {
  if (stream.is_capturing()) return false;
  return neuronrt::launch_blocking() ||
         (bytes <= neuronrt::Stream::kInlineBytes / 2 && stream.query() && !stream.failed());
}

// ---- the table (Routes.cpp): one row per op --------------------------------

// A queued overload: how its outputs are described and what the kernel runs.
enum class QueueMode {
  Out,      // run the out= overload into the allocated outputs
  InPlace,  // run the in-place op (the row's op + "_"); its result is its first argument
  Copy,     // no out= overload: run the op, copy its results into the outputs
};
struct QueuedRoute {
  using Args = std::vector<c10::IValue>;  // the op's arguments, tensors as meta tensors
  using Outs = std::vector<at::Tensor>;   // meta outputs
  const char* overload = nullptr;         // null: no entry
  QueueMode mode = QueueMode::Out;
  const char* out_overload = nullptr;  // QueueMode::Out
  Outs (*meta)(const Args&) = nullptr;
  // The kernel checks values (index ranges): its errors must wait for a
  // synchronization point however it runs.
  bool checks_data = false;
};

// An overload with a direct kernel (DirectKernels.h), by its spelling after
// the op's name ("_.Tensor": add_.Tensor).
struct DirectRoute {
  const char* suffix = nullptr;  // null: no entry
  torch::CppFunction (*kernel)() = nullptr;
};

// An op and every way it reaches the device: its name ("add", covering its
// overloads and in-place/out= variants; "_foreach_*" a family), its queued
// overloads and its direct kernels. `table`: the table registers its kernels
// (false: a dedicated kernel runs it through host_call, which may queue it).
struct Route {
  std::string_view op;
  std::array<QueuedRoute, 2> queued{};
  std::array<DirectRoute, 2> direct{};
  bool table = true;

  std::string queued_name(const QueuedRoute& q) const {
    return "aten::" + std::string(op) + (q.mode == QueueMode::InPlace ? "_" : "");
  }
};
c10::ArrayRef<Route> routes();

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
