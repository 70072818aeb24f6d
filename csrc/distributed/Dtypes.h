// Dtype and reduce-op maps of the `neuron` c10d backend: which element types
// Gloo and the shared-memory engine handle, how a neuron tensor becomes the
// host view a transport reads, and how a reduction's input is prepared
// (PREMUL_SUM scaled, narrow integers widened) and its result copied back.
#pragma once

#include <torch/csrc/distributed/c10d/Types.hpp>

#include <ATen/core/Tensor.h>

#include <functional>
#include <optional>
#include <vector>

#include "csrc/runtime/Runtime.h"

namespace c10d::neuron_pg {

// `f` of each element of `items`, in order.
template <class T, class F>
auto map_each(const std::vector<T>& items, F f) {
  std::vector<std::decay_t<decltype(f(items.front()))>> out;
  out.reserve(items.size());
  for (const auto& item : items) out.push_back(f(item));
  return out;
}

// The number of elements of each of `ts`.
inline std::vector<int64_t> numels(const std::vector<at::Tensor>& ts) {
  return map_each(ts, [](const at::Tensor& t) { return t.numel(); });
}

const char* reduce_op_name(ReduceOp::RedOpType op);

// A zero-copy CPU alias of `t` (neuron memory; CPU tensors unchanged).
at::Tensor host_view(const at::Tensor& t);
std::vector<at::Tensor> host_view(const std::vector<at::Tensor>& ts);
// The CPU view a data-movement collective hands Gloo: the alias, as bytes
// when Gloo has no kernels for its dtype (dimension 0 kept).
at::Tensor to_host(const at::Tensor& t);
std::vector<at::Tensor> to_host(const std::vector<at::Tensor>& ts);
std::vector<std::vector<at::Tensor>> to_host(const std::vector<std::vector<at::Tensor>>& lists);
std::vector<at::Tensor> flatten(const std::vector<std::vector<at::Tensor>>& lists);
// The host views of `ts`, flattened and concatenated (a list-form
// collective run as its flat form; one tensor: its flat view where it can).
at::Tensor cat_flat(const std::vector<at::Tensor>& ts);
// all_gather into outputs of different sizes runs over blocks of the largest
// output's bytes: each rank's input padded to a block, and each gathered
// block's leading bytes copied to its host output (undefined: skipped).
int64_t largest_bytes(const std::vector<at::Tensor>& outs);
at::Tensor padded_bytes(const at::Tensor& input, int64_t block);
void copy_blocks(const std::vector<at::Tensor>& hostOuts, const at::Tensor& gathered, int64_t block);
// The device the work's future reports: the neuron device of the tensors,
// none for CPU-only collectives.
std::vector<c10::Device> devices_of(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b = {});

// What a transport reduces for host alias `h`: `h` itself, or a scratch
// (PREMUL_SUM scaled, narrow integers widened) copied back afterwards.
at::Tensor reduction_input(const at::Tensor& h, const ReduceOp& op);
std::vector<at::Tensor> reduction_input(const std::vector<at::Tensor>& hs, const ReduceOp& op);
// Copies scratch results back into the caller's tensors (no-op where the
// transport reduced in place).
std::function<void()> copy_back(std::vector<at::Tensor> dst, std::vector<at::Tensor> src);
// The options Gloo runs with: PREMUL_SUM is SUM over the scaled scratch.
template <class Opts>
Opts gloo_opts(Opts opts) {
  if (opts.reduceOp.op_ == ReduceOp::PREMUL_SUM) opts.reduceOp = ReduceOp(ReduceOp::SUM);
  return opts;
}

// The shared-memory engine's element type and op, if it has them.
std::optional<neuronrt::ShmDtype> shm_dtype(at::ScalarType t);
std::optional<neuronrt::ShmReduceOp> shm_op(ReduceOp::RedOpType op);
// Whether the engine reduces `t` with `op` (dtype after widening).
bool shm_reduces(const at::Tensor& t, const ReduceOp& op);
// The engine moves bytes for all_gather: any dtype whose elements have a size.
bool shm_moves(const at::Tensor& t);

}  // namespace c10d::neuron_pg
