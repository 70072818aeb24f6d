// The intra-node shared-memory path of the `neuron` c10d backend: when every
// rank of a group runs on this host, the group maps a shared-memory segment
// (neuronrt::ShmCollectives, set up through the group's store) and runs
// all_reduce, reduce, reduce_scatter and all_gather there, and the argument
// agreement too. Gloo stays the transport for everything else and across
// hosts. TORCH_NEURONX_SHM=0 turns the path off, TORCH_NEURONX_SHM_DIRECT=0
// its single-copy mode (peers map each other's device memory).
#pragma once

#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/Types.hpp>

#include <ATen/core/Tensor.h>

#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

#include "csrc/runtime/Runtime.h"

namespace c10d::neuron_pg {

class ShmPath {
 public:
  // Agrees through `store` whether all ranks share this host and maps the
  // segment (rank 0 creates it and publishes its name); null when the group
  // stays on Gloo. Every rank reads every rank's keys, so all decide alike.
  static std::unique_ptr<ShmPath> connect(const c10::intrusive_ptr<Store>& store, int rank, int size,
                                          std::chrono::milliseconds timeout);
  explicit ShmPath(std::unique_ptr<neuronrt::ShmCollectives> shm, int size) : shm_(std::move(shm)), size_(size) {}

  // A collective's work on host views; `check` (may be null) is the
  // argument agreement, which travels with its first step.
  using Body = std::function<void(std::chrono::milliseconds timeout, const neuronrt::ShmCheck* check)>;
  // Runs `step` (the launch of a body) as the group's only shared-memory
  // collective at the time.
  void serialized(const std::function<void()>& step);
  // One round of the argument agreement alone.
  void exchange(const neuronrt::ShmCheck& check, std::chrono::milliseconds timeout) {
    serialized([&] { shm_->exchange(check, timeout); });
  }
  // Releases callers inside a shared-memory collective.
  void abort() { shm_->abort(); }

  // all_reduce of `t`; reduce when `keepResult` is false on a non-root rank
  // (the engine reduces a scratch, `t` stays as it was).
  Body allReduce(at::Tensor t, ReduceOp op, bool keepResult) const;
  // all_gather: rank r's input lands in outs[r] (the list form, one output
  // per rank; outputs of different sizes get the leading bytes of blocks of
  // the largest one's bytes) or in block r of outs[0] (the tensor form; a
  // group on this path has two ranks or more).
  Body allGather(std::vector<at::Tensor> outs, at::Tensor input) const;
  // reduce_scatter into `output` of the `inputs` (one per rank, or one of
  // all ranks' blocks: reduce_scatter_tensor) as one flat input.
  Body reduceScatter(at::Tensor output, std::vector<at::Tensor> inputs, ReduceOp op) const;

 private:
  std::unique_ptr<neuronrt::ShmCollectives> shm_;
  const int size_;
  std::mutex mutex_;  // one shared-memory collective at a time per group
};

}  // namespace c10d::neuron_pg
