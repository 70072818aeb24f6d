// In-order work queues (streams) and markers in them (events).
//
// A stream executes its work in issue order. Work comes in two forms:
// - enqueue(kernel): the caller hands over an owning Kernel and returns at
//   once; the stream's executor thread runs it (CUDA's kernel launch).
//   NEURON_RT_LAUNCH_BLOCKING=1 runs it before enqueue() returns instead, as
//   does a kernel enqueued from inside a synchronous launch (nested work).
// - launch(fn): runs `fn` on the calling thread once the queued work is done
//   (a synchronous launch, for work whose results the caller needs now).
// A small kernel (Kernel::bytes() <= kInlineBytes) enqueued on an idle stream
// runs on the calling thread instead, before enqueue() returns: the handoff to
// the executor would cost more than the kernel (on an idle stream the caller
// has nothing to overlap it with). Its errors are reported as a queued
// kernel's are, and work enqueued meanwhile by other threads waits for it.
// A kernel that fails on the executor does not raise at its launch: the error
// is kept, the stream skips its remaining queued kernels, and the next
// synchronization point of the stream (synchronize, a synchronous launch, an
// event synchronize) raises KernelError naming the kernel, as CUDA reports
// device-side asserts.
// A stream in capture mode (Graph.h) records enqueued kernels instead of
// running them, and refuses synchronous launches and synchronization.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace neuronrt {

class Kernel;         // Runtime.h
struct CaptureRecord;  // Graph.h

// Whether launches run synchronously (NEURON_RT_LAUNCH_BLOCKING=1, or the
// vendor product's NEURON_LAUNCH_BLOCKING=1 when ours is unset; read once).
bool launch_blocking() noexcept;
// Empty when both variables are valid (see check_configuration()).
const std::string& launch_blocking_error() noexcept;

// Whether the calling thread is running a kernel (a synchronous launch, a
// small kernel run inline, or a stream's executor): device memory is
// accessible to it, and work it issues runs inline, as part of that kernel.
bool in_kernel() noexcept;
// Whether the calling thread is a stream's executor running a queued kernel
// (not a synchronous launch inside one): thread state a kernel sets there
// need not be restored for anyone.
bool on_executor() noexcept;

class Stream {
 public:
  static constexpr int kPoolSize = 32;
  // Kernels up to this size may run on the launching thread (see above).
  static constexpr size_t kInlineBytes = 64 * 1024;
  // At most this many kernels wait in a stream's queue: enqueue() blocks
  // until the executor makes room, as a CUDA launch does when the device's
  // launch queue is full.
  static constexpr size_t kMaxQueued = 1024;
  // At most this many bytes (Kernel::bytes(), summed) are touched by the
  // kernels queued or running on a stream; enqueue() blocks until the
  // executor makes room (a larger kernel waits for an empty queue). Queued
  // kernels hold their operands' memory, also what the host has dropped:
  // this bounds it. 1 GiB is tens of milliseconds of work at the host's
  // memory bandwidth, ahead enough to hide any launch overhead.
  static constexpr size_t kMaxQueuedBytes = size_t{1} << 30;
  // Stream ids: 0 is the default stream, 1..kPoolSize the normal-priority
  // pool, kPoolSize+1..2*kPoolSize the high-priority pool.
  Stream(int device, int64_t id);

  int device() const { return device_; }
  int64_t id() const { return id_; }
  // CUDA convention: lower numbers are higher priority (0 normal, -1 high).
  int priority() const { return id_ > kPoolSize ? -1 : 0; }

  ~Stream();

  // Runs `fn` on the calling thread after the work queued before it. `name`
  // (a string that outlives the call, such as an op's schema name) labels the
  // kernel for observers (the profiler).
  void launch(const std::function<void()>& fn, const char* name = "kernel");
  // Queues `kernel` and returns (see the top of this file). The stream owns
  // the kernel until it has run; it is destroyed on a thread that calls into
  // the stream (enqueue, synchronize), never on the executor.
  void enqueue(std::unique_ptr<Kernel> kernel);
  // Number of launches issued / completed so far.
  uint64_t issued() const { return issued_.load(std::memory_order_acquire); }
  uint64_t completed() const { return completed_.load(std::memory_order_acquire); }
  // How many synchronous launches (launch()) found queued work to wait for:
  // points where the caller stalled and Python overhead stopped overlapping
  // with the kernels.
  uint64_t stalls() const { return stalls_.load(std::memory_order_relaxed); }
  bool query() const { return completed() >= issued(); }
  // Whether a queued kernel's failure waits to be reported (check_error).
  bool failed() const { return failed_.load(std::memory_order_acquire); }
  // Waits for all issued work; raises KernelError if a queued kernel failed.
  void synchronize() const;
  // Blocks until the launch with sequence number `seq` has completed.
  void wait_for(uint64_t seq) const;
  // Raises KernelError for a failed queued kernel (clearing it); also frees
  // the kernels that have run.
  void check_error() const;
  // Waits for the kernels queued so far (not for a synchronous launch in
  // progress, which may be the caller itself).
  void wait_queued() const { wait_for(last_queued_.load(std::memory_order_acquire)); }
  // Frees the kernels that have run (they hold their tensors until then),
  // without waiting or reporting errors.
  void release_finished() const;

  // Capture mode (Graph.h). While capturing, enqueue() appends to `record`.
  bool is_capturing() const { return capture_.load(std::memory_order_acquire) != nullptr; }
  void begin_capture(CaptureRecord* record);
  void end_capture() { capture_.store(nullptr, std::memory_order_release); }
  // The capture this stream records into (nullptr when not capturing).
  CaptureRecord* capture() const { return capture_.load(std::memory_order_acquire); }
  // Invalidates the capture in progress and throws CaptureError saying that
  // `what` cannot happen while the stream is capturing.
  [[noreturn]] void capture_violation(const std::string& what) const;

 private:
  struct Executor;
  Executor& executor() const;
  void run(Kernel& kernel, uint64_t correlation);
  // launch() of `kernel` (observers see the kernel itself: its name, and a
  // replay's kernel count).
  void launch_kernel(Kernel& kernel);
  // Runs a small kernel on the caller if the stream is idle; false otherwise.
  bool run_inline_if_idle(std::unique_ptr<Kernel>& kernel);

  int device_;
  int64_t id_;
  std::atomic<uint64_t> issued_{0};
  std::atomic<uint64_t> completed_{0};
  std::atomic<uint64_t> last_queued_{0};  // sequence number of the last enqueue()
  std::atomic<uint64_t> stalls_{0};
  mutable std::atomic<bool> failed_{false};
  mutable std::atomic<Executor*> executor_{nullptr};
  std::atomic<CaptureRecord*> capture_{nullptr};
};

// What the profiler sees of each launch, reported after it ran, on the thread
// that ran it (the stream's executor for a queued kernel).
struct LaunchRecord {
  int device;
  int64_t stream;
  const char* name;
  uint64_t duration_ns;
  uint64_t correlation;  // the correlation source's value at launch time
  int64_t graph_kernels;  // a graph replay: the recorded kernels it ran (else -1)
};
// Installs (or, with nullptr, removes) the launch observer.
using LaunchObserver = void (*)(const LaunchRecord&);
void set_launch_observer(LaunchObserver observer);
// Called on the launching thread at each launch while an observer is
// installed: ties a kernel to the host operation that launched it.
using CorrelationSource = uint64_t (*)();
void set_correlation_source(CorrelationSource source);

Stream& default_stream(int device);
// Throws Error for an id that names no stream.
Stream& get_stream(int device, int64_t id);
// Round-robin pick from the device's pool (priority < 0 means high).
Stream& pool_stream(int device, int priority);
// The calling thread's current stream for `device` (default stream at first).
Stream& current_stream(int device);
void set_current_stream(Stream& stream);
// Streams of `device` that have been handed out so far.
std::vector<Stream*> all_streams(int device);

class Event {
 public:
  explicit Event(bool enable_timing = false) : timing_(enable_timing) {}

  // Marks the current end of `stream`'s queue.
  void record(const Stream& stream);
  bool recorded() const { return stream_ != nullptr; }
  // True once every launch before the record point has completed.
  bool query() const;
  void synchronize() const;
  // Makes `stream` wait for this event (a no-op once the event completed).
  // An event recorded in a capture joins `stream` to that capture (fork/join
  // capture, Graph.h); waiting for it after the capture ended, or for an
  // event recorded outside a capture while `stream` captures, raises
  // CaptureError.
  void block(const Stream& stream) const;
  // Milliseconds between this event and `end`; both need enable_timing.
  double elapsed_ms(const Event& end) const;
  int device() const;

 private:
  bool timing_;
  // Recorded on a capturing stream: the capture's id (0: not) and the
  // recording stream's clock then (Graph.h), which a join merges.
  uint64_t capture_id_ = 0;
  std::map<const Stream*, uint64_t> clock_;
  const Stream* stream_ = nullptr;
  uint64_t seq_ = 0;
  // Set when the stream reaches the record point (timing events only).
  std::shared_ptr<std::atomic<int64_t>> time_ns_;
};

}  // namespace neuronrt
