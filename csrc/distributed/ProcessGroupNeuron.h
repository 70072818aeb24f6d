// ProcessGroupNeuron: the `neuron` c10d backend. This file only dispatches:
// each collective checks this rank's arguments (Arguments.h), then runs on
// the intra-node shared-memory path (ShmPath.h) where it has one, else on the
// wrapped Gloo backend (GlooPath.h); the ranks agree on the arguments first
// (Agreement.h) and works complete through Completion.h. The layer adds what
// Gloo lacks: PREMUL_SUM, fp8 data movement, futures that carry the neuron
// output tensors, copyable Options, cached split(), abort/shutdown/getError,
// and timeouts reported as DistBackendError naming op, sequence number and
// ranks (docs/distributed.md).
//
// The Gloo backend is built in Python (the torch wheel ships no gloo headers)
// and passed in as a plain c10d::Backend.
#pragma once

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "csrc/distributed/Completion.h"
#include "csrc/distributed/GlooPath.h"
#include "csrc/distributed/ShmPath.h"

namespace c10d {

class TORCH_API ProcessGroupNeuron : public Backend {
 public:
  struct Options : Backend::Options {
    explicit Options(std::chrono::milliseconds timeout = kBackendDefaultTimeout)
        : Backend::Options("neuron", timeout) {}
    Options(const Options&) = default;

    static c10::intrusive_ptr<Options> create(std::chrono::milliseconds timeout = kBackendDefaultTimeout) {
      return c10::make_intrusive<Options>(timeout);
    }
    // split_group deep-copies the parent backend's options.
    c10::intrusive_ptr<Options> clone() const { return c10::make_intrusive<Options>(*this); }
  };

  // `store` (the group's store; optional) is where the ranks agree on the
  // shared-memory segment; without it every collective runs on Gloo.
  ProcessGroupNeuron(c10::intrusive_ptr<Backend> gloo, int rank, int size, c10::intrusive_ptr<Options> options,
                     c10::intrusive_ptr<Store> store = nullptr);
  ~ProcessGroupNeuron() override;

  const std::string getBackendName() const override { return "neuron"; }
  c10::intrusive_ptr<Backend::Options> getBackendOptions() override { return options_->clone(); }
  c10::intrusive_ptr<Options> options() const { return options_; }
  c10::intrusive_ptr<Backend> transport() const { return gloo_; }
  // Whether the intra-node shared-memory path is active for this group.
  bool usesShm() const { return shm_ != nullptr; }

  bool supportsSplitting() const override { return true; }
  c10::intrusive_ptr<Backend> split(const c10::intrusive_ptr<Store>& store, const std::vector<int>& ranks,
                                    const c10::intrusive_ptr<Backend::Options>& opts) override;

  void setTimeout(std::chrono::milliseconds timeout) override;
  void abort() override;
  void shutdown() override;
  ErrorType getError() override { return error_->load(); }
  // At interpreter exit: see neuron_pg::WorkTracker::quiesce.
  static void quiesceCompletions(std::chrono::milliseconds timeout) { neuron_pg::WorkTracker::quiesce(timeout); }
  void setSequenceNumberForGroup() override;
  uint64_t getSequenceNumberForGroup() override { return seq_.load(); }
  void setGroupUid(const std::string& pg_uid) override;

  c10::intrusive_ptr<Work> broadcast(std::vector<at::Tensor>& tensors, const BroadcastOptions& opts) override;
  c10::intrusive_ptr<Work> allreduce(std::vector<at::Tensor>& tensors, const AllreduceOptions& opts) override;
  c10::intrusive_ptr<Work> allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                               const AllreduceCoalescedOptions& opts) override;
  c10::intrusive_ptr<Work> reduce(std::vector<at::Tensor>& tensors, const ReduceOptions& opts) override;
  c10::intrusive_ptr<Work> allgather(std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
                                     const AllgatherOptions& opts) override;
  c10::intrusive_ptr<Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                           const AllgatherOptions& opts) override;
  c10::intrusive_ptr<Work> allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs,
                                               std::vector<at::Tensor>& inputs, const AllgatherOptions& opts) override;
  c10::intrusive_ptr<Work> allgather_into_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                           std::vector<at::Tensor>& inputs,
                                                           const AllgatherOptions& opts) override;
  c10::intrusive_ptr<Work> gather(std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
                                  const GatherOptions& opts) override;
  c10::intrusive_ptr<Work> scatter(std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
                                   const ScatterOptions& opts) override;
  c10::intrusive_ptr<Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                          std::vector<std::vector<at::Tensor>>& inputs,
                                          const ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<Work> _reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                const ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<Work> reduce_scatter_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                           std::vector<at::Tensor>& inputs,
                                                           const ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<Work> alltoall_base(at::Tensor& output, at::Tensor& input, std::vector<int64_t>& outputSplits,
                                         std::vector<int64_t>& inputSplits, const AllToAllOptions& opts) override;
  c10::intrusive_ptr<Work> alltoall(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
                                    const AllToAllOptions& opts) override;
  c10::intrusive_ptr<Work> send(std::vector<at::Tensor>& tensors, int dstRank, int tag) override;
  c10::intrusive_ptr<Work> recv(std::vector<at::Tensor>& tensors, int srcRank, int tag) override;
  c10::intrusive_ptr<Work> recvAnysource(std::vector<at::Tensor>& tensors, int tag) override;
  c10::intrusive_ptr<Work> barrier(const BarrierOptions& opts) override;

 private:
  // ---- the Gloo path (GlooPath.cpp) ----
  // Synchronizes the tensors' current streams and returns the host access
  // (neuronrt::host_access) the transport works under; null for CPU tensors.
  std::shared_ptr<void> expose(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b = {});
  // Issues `issued` and tracks its work; `access` is held until the
  // transport is done with the buffers.
  c10::intrusive_ptr<Work> launch(std::shared_ptr<void> access, OpType type, std::chrono::milliseconds opTimeout,
                                  std::vector<at::Tensor> outputs, const neuron_pg::Issued& issued);
  // Every collective: on shared memory (launchShm) when it has a body
  // there, else on Gloo: agree, expose, prepare, launch.
  c10::intrusive_ptr<Work> run(const neuron_pg::Collective& call);
  // all_reduce, all_reduce_coalesced and reduce, `gloo` their Gloo form.
  template <class Opts>
  c10::intrusive_ptr<Work> reduction(OpType type, const char* op, const char* kernel, std::vector<at::Tensor>& tensors,
                                     const Opts& opts, int root,
                                     c10::intrusive_ptr<Work> (Backend::*gloo)(std::vector<at::Tensor>&, const Opts&));
  // The tensor forms of all_gather (AllgatherOptions) and reduce_scatter:
  // one pair of tensors, or lists of pairs (`coalesced`).
  template <class Opts>
  c10::intrusive_ptr<Work> tensorForm(OpType type, const char* op, std::vector<at::Tensor> outputs,
                                      std::vector<at::Tensor> inputs, const Opts& opts, bool coalesced);
  // recv / recvAnysource (srcRank < 0), with the p2p argument check.
  c10::intrusive_ptr<Work> receive(std::vector<at::Tensor>& tensors, int srcRank, int tag, OpType type);

  // ---- the argument agreement (Agreement.cpp) ----
  // Before a collective, the ranks compare what they pass (`words`, see
  // Agreement.h) through shared memory or one small Gloo allgather, and all
  // raise the same DistBackendError on a mismatch or when the exchange fails.
  void agree(OpType type, std::chrono::milliseconds opTimeout, const std::vector<int64_t>& words);
  // Local argument errors. `check` validates this rank's arguments before
  // anything is exchanged; if it throws, this rank still takes part in the
  // collective's agreement with words that say "rejected" (so its peers
  // raise DistBackendError at once instead of waiting for a collective that
  // never comes) and then rethrows its own error (ValueError / TypeError).
  void validate(OpType type, std::chrono::milliseconds opTimeout, const std::function<void()>& check);

  // ---- the shared-memory path (ShmPath.cpp) ----
  // Runs `call.shm` synchronously inside a launch on the current stream of
  // the outputs' device, so the engine reaches device memory the way kernels
  // do (NEURON_RT_PROTECT=1 holds).
  c10::intrusive_ptr<Work> launchShm(const neuron_pg::Collective& call);
  std::unique_ptr<neuron_pg::ShmPath> shm_;

  // ---- the group ----
  c10::intrusive_ptr<WorkNeuron> makeWork(OpType type, std::chrono::milliseconds opTimeout,
                                          std::vector<at::Tensor> outputs);
  // "[neuron] <op> (sequence number, group, rank, ranks, timeout)".
  std::string describeOp(OpType type, uint64_t seq, std::chrono::milliseconds opTimeout) const;
  std::chrono::milliseconds effectiveTimeout(std::chrono::milliseconds opTimeout) const;
  void checkUsable() const;

  c10::intrusive_ptr<Backend> gloo_;
  c10::intrusive_ptr<Options> options_;
  std::atomic<uint64_t> seq_{0};
  std::shared_ptr<std::atomic<ErrorType>> error_ = std::make_shared<std::atomic<ErrorType>>(ErrorType::SUCCESS);
  std::atomic<bool> aborted_{false};
  std::atomic<bool> shutdown_{false};
  bool checkAgreement_ = true;  // TORCH_NEURONX_COLLECTIVE_CHECK

  // TORCH_NEURONX_ASYNC_ERROR_HANDLING, as TORCH_NCCL_ASYNC_ERROR_HANDLING:
  // what a collective timeout does besides failing the work. 0 nothing,
  // 1 abort the group and exit, 2 abort the group, 3 exit (default: a
  // launcher such as torchrun can then restart the job).
  int errorHandling_ = 3;
  void handleTimeout(const std::string& what);

  neuron_pg::WorkTracker tracker_{[this](const std::string& what) { handleTimeout(what); }};
  // Callers blocked in agree() wait here; abort() wakes them.
  struct WaitState {
    std::mutex mutex;
    std::condition_variable cv;
  };
  std::shared_ptr<WaitState> abortWaits_ = std::make_shared<WaitState>();

  // split() is called once per device type bound to this backend ("neuron"
  // and "cpu"); the second call must return the child made by the first.
  std::mutex splitMutex_;
  std::string lastSplitKey_;
  c10::intrusive_ptr<Backend> lastSplit_;
};

}  // namespace c10d
