#include "csrc/distributed/Completion.h"

#include <c10/util/Exception.h>
#include <c10/util/ScopeExit.h>
#include <c10/util/thread_name.h>

#include <algorithm>

namespace c10d {
namespace neuron_pg {

std::string error_message(std::exception_ptr error) {
  try {
    std::rethrow_exception(error);
  } catch (const c10::Error& e) {
    return e.what_without_backtrace();
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "unknown error";
  }
}

ErrorType classify(const std::string& msg) {
  std::string lower(msg);
  std::transform(lower.begin(), lower.end(), lower.begin(), ::tolower);
  if (lower.find("timed out") != std::string::npos || lower.find("timeout") != std::string::npos) {
    return ErrorType::TIMEOUT;
  }
  if (lower.find("closed") != std::string::npos || lower.find("reset") != std::string::npos ||
      lower.find("peer") != std::string::npos) {
    return ErrorType::REMOTE_ERROR;
  }
  return ErrorType::COMM_ERROR;
}

void note_error(std::atomic<ErrorType>& sink, ErrorType type) {
  auto expected = ErrorType::SUCCESS;
  sink.compare_exchange_strong(expected, type);
}

namespace {

std::exception_ptr dist_error(const std::string& msg) {
  return std::make_exception_ptr(c10::DistBackendError({__func__, __FILE__, static_cast<uint32_t>(__LINE__)}, msg));
}

// Joins `thread`, or detaches it where a join would block (`detach`).
void end_thread(std::thread& thread, bool detach) {
  if (!thread.joinable()) return;
  if (detach) {
    thread.detach();
  } else {
    thread.join();
  }
}

// Works complete on transport threads (Gloo's, the completion queue's, the
// watchdog). Dropping a work's last reference there can drop a tensor's last
// C++ reference, which releases its PyObject under the GIL; a thread that
// asks for the GIL while the interpreter finalizes ends with pthread_exit
// through a noexcept frame: std::terminate. So those threads complete and
// release works inside an open completion (finish()), and at exit (atexit,
// before finalization) quiesceCompletions() waits for the open ones and makes
// later ones leak what they hold: the process is going away.
struct CompletionState {
  std::mutex mutex;
  std::condition_variable cv;
  int open = 0;
  bool exiting = false;
};

CompletionState& completion_state() {
  static auto* state = new CompletionState();  // outlives static destruction
  return *state;
}

}  // namespace
}  // namespace neuron_pg

using neuron_pg::classify;
using neuron_pg::error_message;
using neuron_pg::kMaxTimeout;
using neuron_pg::note_error;

WorkNeuron::WorkNeuron(int rank, OpType opType, uint64_t seq, std::string describe,
                                           std::chrono::milliseconds timeout, std::vector<at::Tensor> outputs,
                                           std::vector<c10::Device> devices,
                                           std::shared_ptr<std::atomic<ErrorType>> errorSink,
                       std::shared_ptr<neuron_pg::Watchdog> watchdog)
    : Work(rank, opType),
      seq_(seq),
      describe_(std::move(describe)),
      timeout_(std::min(timeout, kMaxTimeout)),
      start_(std::chrono::steady_clock::now()),
      outputs_(std::move(outputs)),
      future_(c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()),
                                                       std::move(devices))),
      errorSink_(std::move(errorSink)),
      watchdog_(std::move(watchdog)) {}

void WorkNeuron::release_resources() {
  outputs_.clear();
  future_.reset();
  transport_.reset();
}

void WorkNeuron::complete(std::exception_ptr error, const std::function<void()>& after) {
  if (claimed_.exchange(true)) return;
  if (!error && after) {
    try {
      after();
    } catch (...) {
      error = std::current_exception();
    }
  }
  if (error) {
    const auto kind = classify(error_message(error));
    note_error(*errorSink_, kind);
    if (kind == ErrorType::TIMEOUT && watchdog_) {
      std::lock_guard<std::mutex> lock(watchdog_->mutex);
      watchdog_->timedOut.push_back(describe_);
      watchdog_->cv.notify_all();
    }
    error = neuron_pg::dist_error(describe_ + " failed: " + error_message(error));
  }
  // The future first: whoever wait() releases may read it at once.
  if (error) {
    future_->setErrorIfNeeded(error);
  } else {
    future_->markCompleted(c10::IValue(outputs_));
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    completed_ = true;
    exception_ = error;
  }
  cv_.notify_all();
}

bool WorkNeuron::wait(std::chrono::milliseconds timeout) {
  // Without an explicit timeout the group's timeout counts from the launch,
  // so a hung peer surfaces here even when the transport never returns.
  const auto deadline = timeout == kNoTimeout ? start_ + timeout_
                                              : std::chrono::steady_clock::now() + std::min(timeout, kMaxTimeout);
  std::unique_lock<std::mutex> lock(mutex_);
  if (!cv_.wait_until(lock, deadline, [&] { return completed_; })) {
    lock.unlock();
    note_error(*errorSink_, ErrorType::TIMEOUT);
    const auto limit = timeout == kNoTimeout ? timeout_ : timeout;
    C10_THROW_ERROR(DistBackendError, c10::str(describe_, " timed out: not completed after ", limit.count(),
                                               " ms (the peer may have hung or exited)"));
  }
  if (exception_) std::rethrow_exception(exception_);
  // Streams: the transport wrote the outputs on the host before completing,
  // and kernels launched after this returns are queued behind it.
  return true;
}

void WorkNeuron::abort() {
  if (transport_) {
    try {
      transport_->abort();
    } catch (...) {  // Gloo's collective works cannot be aborted; abort() fails this work anyway
    }
  }
  complete(neuron_pg::dist_error("the work was aborted"), {});
}

int WorkNeuron::sourceRank() const {
  TORCH_CHECK(transport_, "sourceRank() is only defined for recv from any source");
  return transport_->sourceRank();
}

namespace neuron_pg {

void WorkTracker::track(const c10::intrusive_ptr<WorkNeuron>& work, c10::intrusive_ptr<Work> transport,
                               std::function<void()> after, std::shared_ptr<void> access) {
  work->transport_ = transport;
  watch(work);
  // Collective works carry a future; complete ours from its callback (no
  // extra thread, no second waiter on the Gloo work).
  c10::intrusive_ptr<c10::ivalue::Future> fut;
  try {
    fut = transport->getFuture();
  } catch (const c10::Error&) {
  }
  if (fut) {
    // The callback (and with it the host access) lives until the transport's
    // future completes, also when our work completed early (a timeout).
    // (`work = work`: a plain capture of the const reference would be a const
    // copy, which std::move copies; its reference would then drop outside the
    // open completion, when Gloo destroys the callback.)
    fut->addCallback([work = work, after = std::move(after), access = std::move(access)](
                         c10::ivalue::Future& f) mutable {
      Waiting item{std::move(work), nullptr, std::move(after), std::move(access)};
      finish(std::move(item), f.hasError() ? f.exception_ptr() : nullptr);
    });
    return;
  }
  {
    std::lock_guard<std::mutex> lock(queue_->mutex);
    queue_->items.push_back({work, std::move(transport), std::move(after), std::move(access)});
    if (!completionThread_.joinable()) completionThread_ = std::thread(&WorkTracker::completionLoop, queue_);
  }
  queue_->cv.notify_one();
}

void WorkTracker::finish(Waiting item, std::exception_ptr error) {
  auto& s = completion_state();
  {
    std::lock_guard<std::mutex> lock(s.mutex);
    if (s.exiting) return (void)new Waiting(std::move(item));  // leaked: the process is exiting
    ++s.open;
  }
  auto close = c10::make_scope_exit([&s] {
    std::lock_guard<std::mutex> lock(s.mutex);
    if (--s.open == 0) s.cv.notify_all();
  });
  item.work->complete(error, item.after);
  item = Waiting{};  // the references drop while the completion is open
}

void WorkTracker::quiesce(std::chrono::milliseconds timeout) {
  auto& s = completion_state();
  std::unique_lock<std::mutex> lock(s.mutex);
  s.exiting = true;
  s.cv.wait_for(lock, timeout, [&] { return s.open == 0; });
}

void WorkTracker::watch(const c10::intrusive_ptr<WorkNeuron>& work) {
  std::lock_guard<std::mutex> lock(pendingMutex_);
  if (!watchdogThread_.joinable()) watchdogThread_ = std::thread(&WorkTracker::watchdogLoop, this);
  if (pending_.size() >= 64) {
    std::erase_if(pending_, [](const auto& w) {
      auto p = w.lock();
      return !p || p->isCompleted();
    });
  }
  pending_.emplace_back(work);
}

void WorkTracker::completionLoop(std::shared_ptr<CompletionQueue> queue) {
  c10::setThreadName("pt_neuron_comm");
  // Works that timed out: the transport may still touch their buffers, so
  // their host access lives until it is done.
  std::vector<Waiting> lingering;
  while (true) {
    Waiting item;
    std::erase_if(lingering, [](const Waiting& w) { return w.transport->isCompleted(); });
    {
      std::unique_lock<std::mutex> lock(queue->mutex);
      queue->cv.wait(lock, [&] { return queue->stop || !queue->items.empty(); });
      if (queue->items.empty()) return;
      item = std::move(queue->items.front());
      queue->items.pop_front();
      queue->busy = true;
    }
    std::exception_ptr error;
    try {
      item.transport->wait(item.work->timeout_);
    } catch (...) {
      error = std::current_exception();
    }
    // A failed transport may still touch the buffers: keep the host access.
    if (error && item.access) lingering.push_back({nullptr, item.transport, nullptr, item.access});
    finish(std::move(item), error);
    std::lock_guard<std::mutex> lock(queue->mutex);
    queue->busy = false;
  }
}

void WorkTracker::watchdogLoop() {
  c10::setThreadName("pt_neuron_watch");
  auto dog = watchdog_;
  while (true) {
    std::deque<std::string> reported;
    {
      std::unique_lock<std::mutex> lock(dog->mutex);
      dog->cv.wait_for(lock, std::chrono::milliseconds(200), [&] { return dog->stop || !dog->timedOut.empty(); });
      if (dog->stop) return;
      reported.swap(dog->timedOut);
    }
    for (const auto& what : reported) onTimeout_(what);
    std::vector<c10::intrusive_ptr<WorkNeuron>> late;
    const auto now = std::chrono::steady_clock::now();
    {
      std::lock_guard<std::mutex> lock(pendingMutex_);
      for (auto& w : pending_) {
        auto p = w.lock();
        if (p && !p->isCompleted() && now > p->start_ + p->timeout_) late.push_back(std::move(p));
      }
    }
    for (auto& w : late) {
      const auto error = dist_error(c10::str("timed out: not completed after ", w->timeout_.count(), " ms"));
      finish({std::move(w), nullptr, nullptr, nullptr}, error);  // queues the timeout for the next round
    }
  }
}

void WorkTracker::abortAll() {
  std::vector<c10::intrusive_ptr<WorkNeuron>> pending;
  {
    std::lock_guard<std::mutex> lock(pendingMutex_);
    for (auto& w : pending_) {
      if (auto p = w.lock()) pending.push_back(std::move(p));
    }
    pending_.clear();
  }
  for (auto& w : pending) w->abort();
}

void WorkTracker::stop(bool aborted) {
  {
    std::lock_guard<std::mutex> lock(watchdog_->mutex);
    watchdog_->stop = true;
  }
  watchdog_->cv.notify_all();
  // abort() may run on the watchdog itself (error handling 1 and 2).
  end_thread(watchdogThread_, watchdogThread_.get_id() == std::this_thread::get_id());
  bool blocked = false;
  {
    std::lock_guard<std::mutex> lock(queue_->mutex);
    queue_->stop = true;
    // After an abort the thread may sit in a wait on a dead peer: leave it
    // (it owns the queue) rather than block shutdown until the timeout.
    blocked = aborted && (queue_->busy || !queue_->items.empty());
  }
  queue_->cv.notify_all();
  end_thread(completionThread_, blocked);
}

}  // namespace neuron_pg
}  // namespace c10d
