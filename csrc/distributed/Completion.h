// Completion of the `neuron` c10d backend's works: the work object, the
// thread that waits on transport works without a future, the watchdog that
// fails works nobody waits on once their timeout passed, and exit-time
// quiescing of completions that run on transport threads.
#pragma once

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <ATen/core/ivalue.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace c10d {

namespace neuron_pg {

// Longest timeout honoured as a deadline (larger ones would overflow the
// clock arithmetic; a year is "forever" for a collective).
constexpr std::chrono::milliseconds kMaxTimeout{std::chrono::hours(24 * 365)};

std::string error_message(std::exception_ptr error);
// What a transport's error message says went wrong.
ErrorType classify(const std::string& msg);
// Records the group's first error (getError()).
void note_error(std::atomic<ErrorType>& sink, ErrorType type);

// Watchdog state: it fails works nobody waits on once their timeout has
// passed, and handles timeouts the transport reported (works queue those).
struct Watchdog {
  std::mutex mutex;
  std::condition_variable cv;
  bool stop = false;
  std::deque<std::string> timedOut;  // descriptions of works that timed out
};

class WorkTracker;

}  // namespace neuron_pg

// One collective. Completes when the transport work under it completes (or
// the shared-memory launch returns); its future carries the output tensors
// on their own (neuron) device.
class WorkNeuron : public Work {
 public:
  WorkNeuron(int rank, OpType opType, uint64_t seq, std::string describe, std::chrono::milliseconds timeout,
             std::vector<at::Tensor> outputs, std::vector<c10::Device> devices,
             std::shared_ptr<std::atomic<ErrorType>> errorSink, std::shared_ptr<neuron_pg::Watchdog> watchdog);

  bool wait(std::chrono::milliseconds timeout = kNoTimeout) override;
  void abort() override;
  std::vector<at::Tensor> result() override { return outputs_; }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }
  uint64_t getSequencenumber() const override { return seq_; }
  int sourceRank() const override;

  // Runs `after` (copy-backs on the host), then completes the work and its
  // future; with an error instead when the transport failed. Idempotent:
  // the first completion wins (abort may race with the transport).
  void complete(std::exception_ptr error, const std::function<void()>& after);
  const std::string& describe() const { return describe_; }
  std::chrono::milliseconds timeout() const { return timeout_; }
  // The group's watchdog list keeps weak references to works, which keep a
  // work's memory until they go; its tensors must not wait that long.
  void release_resources() override;

 private:
  friend class neuron_pg::WorkTracker;

  const uint64_t seq_;
  const std::string describe_;
  const std::chrono::milliseconds timeout_;
  const std::chrono::steady_clock::time_point start_;
  std::vector<at::Tensor> outputs_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
  std::atomic<bool> claimed_{false};  // set by the first completion
  c10::intrusive_ptr<Work> transport_;  // the Gloo work (abort, sourceRank)
  std::shared_ptr<std::atomic<ErrorType>> errorSink_;  // the group's getError()
  std::shared_ptr<neuron_pg::Watchdog> watchdog_;  // told about transport timeouts
};

namespace neuron_pg {

// The works of one group in flight: completes them when their transport
// work does, fails them when their timeout passes, and fails them all on
// abort. `onTimeout` (the group's error handling) runs on the watchdog
// thread for every timed-out work.
class WorkTracker {
 public:
  explicit WorkTracker(std::function<void(const std::string&)> onTimeout) : onTimeout_(std::move(onTimeout)) {}
  const std::shared_ptr<Watchdog>& watchdog() const { return watchdog_; }
  // Lists `work` for the watchdog and abort.
  void watch(const c10::intrusive_ptr<WorkNeuron>& work);
  // Completes `work` (after running `after`) once `transport` completes;
  // `access` is held until the transport is done with the buffers.
  void track(const c10::intrusive_ptr<WorkNeuron>& work, c10::intrusive_ptr<Work> transport,
             std::function<void()> after, std::shared_ptr<void> access);
  // Fails every listed work at once (abort()).
  void abortAll();
  // Stops the threads; after an abort a completion thread blocked on a dead
  // peer is left to end on the transport's own timeout.
  void stop(bool aborted);
  // At interpreter exit (atexit, before finalization): waits up to `timeout`
  // for completions running on transport threads; later ones leave their
  // works uncompleted and their references leaked.
  static void quiesce(std::chrono::milliseconds timeout);

 private:
  // Transport works without a future (send/recv, some coalesced forms) are
  // waited on by one tracker-owned thread: it is the only waiter, since
  // waiting twice on a Gloo send work hangs. The queue outlives the tracker
  // when stop() has to leave that thread blocked in a wait on a dead peer.
  struct Waiting {
    c10::intrusive_ptr<WorkNeuron> work;
    c10::intrusive_ptr<Work> transport;
    std::function<void()> after;
    std::shared_ptr<void> access;  // the runtime host access (see GlooPath.h)
  };
  struct CompletionQueue {
    std::mutex mutex;
    std::condition_variable cv;
    std::deque<Waiting> items;
    bool stop = false;
    bool busy = false;
  };
  static void completionLoop(std::shared_ptr<CompletionQueue> queue);
  // Completes item.work on a transport thread and drops the item's
  // references there, unless the process is exiting (see the .cpp).
  static void finish(Waiting item, std::exception_ptr error);
  void watchdogLoop();

  std::function<void(const std::string&)> onTimeout_;
  std::shared_ptr<Watchdog> watchdog_ = std::make_shared<Watchdog>();
  std::thread watchdogThread_;
  std::mutex pendingMutex_;
  std::vector<c10::weak_intrusive_ptr<WorkNeuron>> pending_;
  std::shared_ptr<CompletionQueue> queue_ = std::make_shared<CompletionQueue>();
  std::thread completionThread_;
};

}  // namespace neuron_pg
}  // namespace c10d
