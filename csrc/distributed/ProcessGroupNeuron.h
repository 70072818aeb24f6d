// ProcessGroupNeuron: the `neuron` c10d backend.
//
// Collectives on neuron tensors run over Gloo: device memory is host memory,
// so every neuron tensor is handed to a per-group ProcessGroupGloo as a
// zero-copy CPU alias (at::neuron::host_alias). This layer adds what Gloo
// lacks: PREMUL_SUM, fp8 data movement, futures that carry the neuron output
// tensors, copyable Options, cached split(), abort/shutdown/getError, and
// timeouts reported as DistBackendError naming op, sequence number and ranks.
//
// The Gloo backend is built in Python (the torch wheel ships no gloo headers)
// and passed in as a plain c10d::Backend.
//
// Intra-node fast path: when every rank of the group runs on this host, the
// group also maps a shared-memory segment (neuronrt::ShmCollectives, set up
// through the group's store at construction) and runs all_reduce, reduce,
// reduce_scatter and all_gather there, and the pre-collective argument check
// too. Gloo stays the transport for everything else and across hosts.
// TORCH_NEURONX_SHM=0 turns the fast path off.
#pragma once

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <ATen/core/ivalue.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace neuronrt {
class ShmCollectives;
struct ShmCheck;
}

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

  // Watchdog state: it fails works nobody waits on once their timeout has
  // passed, and handles timeouts the transport reported (works queue those).
  struct Watchdog {
    std::mutex mutex;
    std::condition_variable cv;
    bool stop = false;
    std::deque<std::string> timedOut;  // descriptions of works that timed out
  };

  // One collective. Completes when the Gloo work under it completes (see
  // Completion in the .cpp); its future carries the output tensors on their
  // own (neuron) device.
  class WorkNeuron : public Work {
   public:
    WorkNeuron(int rank, OpType opType, uint64_t seq, std::string describe, std::chrono::milliseconds timeout,
               std::vector<at::Tensor> outputs, std::vector<c10::Device> devices,
               std::shared_ptr<std::atomic<ErrorType>> errorSink);

    bool wait(std::chrono::milliseconds timeout = kNoTimeout) override;
    void abort() override;
    std::vector<at::Tensor> result() override { return outputs_; }
    c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }
    uint64_t getSequencenumber() const override { return seq_; }
    int sourceRank() const override;

    // Runs `after` (copy-backs on the host), then completes the work and its
    // future; with an error instead when the transport failed. Idempotent:
    // the first completion wins (abort may race with Gloo).
    void complete(std::exception_ptr error, const std::function<void()>& after);
    const std::string& describe() const { return describe_; }
    // The group's watchdog list keeps weak references to works, which keep a
    // work's memory until they go; its tensors must not wait that long.
    void release_resources() override;

   private:
    friend class ProcessGroupNeuron;
    std::exception_ptr wrap(std::exception_ptr error, const char* what) const;

    const uint64_t seq_;
    const std::string describe_;
    const std::chrono::milliseconds timeout_;
    const std::chrono::steady_clock::time_point start_;
    std::vector<at::Tensor> outputs_;
    c10::intrusive_ptr<c10::ivalue::Future> future_;
    std::atomic<bool> claimed_{false};  // set by the first completion
    c10::intrusive_ptr<Work> transport_;  // the Gloo work (abort, sourceRank)
    std::shared_ptr<std::atomic<ErrorType>> errorSink_;  // the group's getError()
    std::shared_ptr<Watchdog> watchdog_;  // told about transport timeouts
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
  // At interpreter exit (atexit, before finalization): waits up to `timeout`
  // for completions running on transport threads; later ones leave their
  // works uncompleted and their references leaked (see the .cpp).
  static void quiesceCompletions(std::chrono::milliseconds timeout);
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
  // Starts `run` on Gloo and returns the work that completes with `outputs`.
  // Synchronizes the tensors' current streams and returns the host access
  // (neuronrt::host_access) the transport works under; null for CPU tensors.
  std::shared_ptr<void> expose(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b = {});
  // Runs `run` (issues the Gloo work on host views) and tracks it; `access`
  // is held until the transport is done with the buffers.
  c10::intrusive_ptr<Work> launch(std::shared_ptr<void> access, OpType type, std::chrono::milliseconds opTimeout,
                                  std::vector<at::Tensor> outputs, const std::function<c10::intrusive_ptr<Work>()>& run,
                                  std::function<void()> after = {});
  // Before a collective, the ranks compare what they pass (op, dtype, sizes;
  // all_to_all splits pairwise) over one small allgather, and all raise the
  // same error on a mismatch: Gloo would abort the process or move garbage.
  // TORCH_NEURONX_COLLECTIVE_CHECK=0 turns it off (saves a round trip).
  // recv / recvAnysource (srcRank < 0) with the p2p argument check.
  // all_gather (list form) with outputs of different sizes, as NCCL allows.
  c10::intrusive_ptr<Work> allgatherUneven(const std::vector<at::Tensor>& outs, const at::Tensor& input,
                                           const AllgatherOptions& opts);
  c10::intrusive_ptr<Work> recvChecked(std::vector<at::Tensor>& tensors, int srcRank, int tag, OpType type);
  // `redop` (a ReduceOp::RedOpType, -1 for none) is compared too: ranks
  // reducing with different ops would take different paths or mix garbage.
  void agree(OpType type, std::chrono::milliseconds opTimeout, const std::vector<at::Tensor>& tensors,
             const std::vector<int64_t>& inSplits = {}, const std::vector<int64_t>& outSplits = {},
             int64_t redop = -1);
  // What a rank publishes for the check, and the mismatch report (empty when
  // every rank's words, `all` = size x words, agree).
  std::vector<int64_t> agreementWords(OpType type, const std::vector<at::Tensor>& tensors,
                                      const std::vector<int64_t>& inSplits = {},
                                      const std::vector<int64_t>& outSplits = {}, int64_t redop = -1) const;
  std::string disagreement(const std::vector<int64_t>& mine, const int64_t* all) const;
  // One round of the argument check with `words` (shared memory or one small
  // Gloo allgather); returns the mismatch report, throws DistBackendError
  // when the exchange itself fails.
  std::string exchangeWords(OpType type, std::chrono::milliseconds opTimeout, const std::vector<int64_t>& words);
  // Local argument errors. `check` validates this rank's arguments before
  // anything is exchanged; if it throws, this rank still takes part in the
  // collective's argument check with words that say "rejected" (so its peers
  // raise DistBackendError at once instead of waiting for a collective that
  // never comes) and then rethrows its own error (ValueError / TypeError).
  void validate(OpType type, std::chrono::milliseconds opTimeout, const std::function<void()>& check);
  void track(const c10::intrusive_ptr<WorkNeuron>& work, c10::intrusive_ptr<Work> transport,
             std::function<void()> after, std::shared_ptr<void> access);
  c10::intrusive_ptr<WorkNeuron> makeWork(OpType type, std::chrono::milliseconds opTimeout,
                                          std::vector<at::Tensor> outputs);
  void watch(const c10::intrusive_ptr<WorkNeuron>& work);

  // The shared-memory path. setupShm() agrees through the store whether all
  // ranks share this host and maps the segment (rank 0 creates it and
  // publishes its name). launchShm() runs `body` synchronously, inside a
  // launch on the current stream of the outputs' device, so the engine
  // reaches device memory the way kernels do (NEURON_RT_PROTECT=1 holds).
  void setupShm(const c10::intrusive_ptr<Store>& store);
  // `checked` are the tensors the argument check describes (as in agree()).
  using ShmBody = std::function<void(std::chrono::milliseconds, const neuronrt::ShmCheck*)>;
  c10::intrusive_ptr<Work> launchShm(OpType type, std::chrono::milliseconds opTimeout, std::vector<at::Tensor> outputs,
                                     const std::vector<at::Tensor>& checked, const char* kernelName,
                                     const ShmBody& body, int64_t redop = -1);
  std::unique_ptr<neuronrt::ShmCollectives> shm_;
  std::mutex shmMutex_;  // one shared-memory collective at a time per group
  std::chrono::milliseconds effectiveTimeout(std::chrono::milliseconds opTimeout) const;
  std::string ranksString() const;
  void checkUsable() const;

  c10::intrusive_ptr<Backend> gloo_;
  c10::intrusive_ptr<Options> options_;
  std::atomic<uint64_t> seq_{0};
  std::shared_ptr<std::atomic<ErrorType>> error_ = std::make_shared<std::atomic<ErrorType>>(ErrorType::SUCCESS);
  std::atomic<bool> aborted_{false};
  std::atomic<bool> shutdown_{false};
  bool checkAgreement_ = true;

  // TORCH_NEURONX_ASYNC_ERROR_HANDLING, as TORCH_NCCL_ASYNC_ERROR_HANDLING:
  // what a collective timeout does besides failing the work. 0 nothing,
  // 1 abort the group and exit, 2 abort the group, 3 exit (default: a
  // launcher such as torchrun can then restart the job).
  int errorHandling_ = 3;
  void handleTimeout(const std::string& what);

  std::shared_ptr<Watchdog> watchdog_ = std::make_shared<Watchdog>();
  std::thread watchdogThread_;
  void watchdogLoop();
  // Callers blocked in agree() wait here; abort() wakes them.
  struct WaitState {
    std::mutex mutex;
    std::condition_variable cv;
  };
  std::shared_ptr<WaitState> abortWaits_ = std::make_shared<WaitState>();

  // Works still in flight, so abort() can fail them at once.
  std::mutex pendingMutex_;
  std::vector<c10::weak_intrusive_ptr<WorkNeuron>> pending_;

  // Gloo works without a future (send/recv, some coalesced forms) are waited
  // on by one backend-owned thread: it is the only waiter, since waiting
  // twice on a Gloo send work hangs.
  // The queue outlives the backend when shutdown has to leave that thread
  // blocked in a wait on a dead peer (it then exits on the transport's own
  // timeout).
  struct Waiting {
    c10::intrusive_ptr<WorkNeuron> work;
    c10::intrusive_ptr<Work> transport;
    std::function<void()> after;
    std::shared_ptr<void> access;  // see expose()
  };
  struct CompletionQueue {
    std::mutex mutex;
    std::condition_variable cv;
    std::deque<Waiting> items;
    bool stop = false;
    bool busy = false;
  };
  std::shared_ptr<CompletionQueue> queue_ = std::make_shared<CompletionQueue>();
  static void completionLoop(std::shared_ptr<CompletionQueue> queue);
  // Completes item.work on a transport thread and drops the item's
  // references there, unless the process is exiting (see the .cpp).
  static void finish(Waiting item, std::exception_ptr error);
  std::thread completionThread_;

  // split() is called once per device type bound to this backend ("neuron"
  // and "cpu"); the second call must return the child made by the first.
  std::mutex splitMutex_;
  std::string lastSplitKey_;
  c10::intrusive_ptr<Backend> lastSplit_;
};

}  // namespace c10d
