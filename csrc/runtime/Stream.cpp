// Streams, their executor threads, events and capture into graphs (Stream.h).
// Slightly over 600 lines: the executor, the inline path and capture share the
// stream's private queue state, which is easier to check in one file.
#include "Stream.h"

#include <array>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <algorithm>
#include <deque>
#include <memory>
#include <mutex>
#include <pthread.h>
#include <set>
#include <string>
#include <thread>

#if defined(__x86_64__)
#include <x86intrin.h>
#endif

#include "Device.h"
#include "Error.h"
#include "Graph.h"
#include "Process.h"
#include "Protect.h"
#include "Registry.h"
#include "Runtime.h"

namespace neuronrt {
namespace {

constexpr int kStreamsPerDevice = 1 + 2 * Stream::kPoolSize;

struct DeviceStreams {
  std::array<std::atomic<Stream*>, kStreamsPerDevice> streams{};
  std::atomic<uint32_t> next_normal{0};
  std::atomic<uint32_t> next_high{0};
  std::mutex mutex;
};

// For a device already checked.
DeviceStreams& streams_of_checked(int device) {
  static std::vector<std::unique_ptr<DeviceStreams>> all = [] {
    std::vector<std::unique_ptr<DeviceStreams>> v;
    for (int i = 0; i < device_count(); ++i) {
      v.push_back(std::make_unique<DeviceStreams>());
    }
    return v;
  }();
  return *all[device];
}

DeviceStreams& streams_of(int device) {
  check_device(device);
  return streams_of_checked(device);
}

Stream& stream_slot(int device, int64_t id) {
  lazy_init();  // before any lock: a bad fork may have inherited one held
  if (id < 0 || id >= kStreamsPerDevice) {
    throw Error("neuron stream id " + std::to_string(id) +
                " does not name a stream of neuron:" + std::to_string(device));
  }
  DeviceStreams& ds = streams_of(device);
  // Streams are created once and never destroyed: read without the lock.
  if (Stream* s = ds.streams[id].load(std::memory_order_acquire)) return *s;
  std::lock_guard<std::mutex> lock(ds.mutex);
  Stream* s = ds.streams[id].load(std::memory_order_relaxed);
  if (!s) {
    s = new Stream(device, id);
    ds.streams[id].store(s, std::memory_order_release);
  }
  return *s;
}

// Current stream per device for this thread; -1 means the default stream.
thread_local std::vector<int64_t> tls_current_stream;

}  // namespace

// ---- NEURON_RT_LAUNCH_BLOCKING ------------------------------------------------

namespace {
struct BlockingSetting {
  bool blocking = false;
  std::string error;
};

// Ours, then the vendor product's name for the same switch; both are
// validated, and ours wins when both are set.
const BlockingSetting& blocking_setting() {
  static const BlockingSetting s = [] {
    BlockingSetting out;
    bool decided = false;
    for (const char* name : {"NEURON_RT_LAUNCH_BLOCKING", "NEURON_LAUNCH_BLOCKING"}) {
      const char* v = std::getenv(name);
      if (!v || !*v) continue;
      if (std::strcmp(v, "1") != 0 && std::strcmp(v, "0") != 0) {
        if (out.error.empty()) out.error = std::string(name) + "='" + v + "' is invalid. Accepted: 0 or 1.";
        continue;
      }
      if (!decided) out.blocking = std::strcmp(v, "1") == 0;
      decided = true;
    }
    return out;
  }();
  return s;
}
}  // namespace

bool launch_blocking() noexcept { return blocking_setting().blocking; }
const std::string& launch_blocking_error() noexcept { return blocking_setting().error; }

// ---- Streams -------------------------------------------------------------------

// The executor of one stream: a queue of owning kernels and the thread that
// runs them. Created at the stream's first enqueue; streams live for the
// whole process, so executors (and their threads) do too.
struct Stream::Executor {
  std::mutex mutex;
  std::condition_variable work;  // the executor waits for kernels
  std::condition_variable done;  // synchronizing threads wait for completions
  struct Queued {
    std::unique_ptr<Kernel> kernel;
    uint64_t correlation;
  };
  std::deque<Queued> queue;
  // Kernel::bytes() of the queued kernels and the one running (kMaxQueuedBytes).
  size_t queued_bytes = 0;
  std::vector<std::unique_ptr<Kernel>> finished;  // destroyed by callers
  // Whether `finished` holds kernels: a caller then takes the lock to free them.
  std::atomic<bool> has_finished{false};
  std::string error;                              // first failure not yet reported
  bool running_inline = false;                    // a caller runs a small kernel (queue waits)
  bool sleeping = false;
  // The completion counts that threads in done.wait() wait for (0: room in
  // the queue, any completion), and their minimum in `wake_at`. A completion
  // wakes them only once the count reaches it: a thread synchronizing with a
  // long queue sleeps through the completions before its own instead of
  // being woken by each. `targets` changes under the mutex; a completing
  // launch reads `wake_at` without it and locks only to wake someone. (Both
  // sides order their completion count and `wake_at` accesses sequentially
  // consistently, so a waiter either sees the completion or is woken.)
  std::multiset<uint64_t> targets;
  std::atomic<uint64_t> wake_at{kNoWaiter};
  static constexpr uint64_t kNoWaiter = UINT64_MAX;

  // Whether a completion that brought the count to `completed` must wake.
  bool must_wake(uint64_t completed) const { return completed >= wake_at.load(std::memory_order_seq_cst); }

  // done.wait(lock, pred) as a waiter for count `target` (lock held).
  template <typename Pred>
  void wait_done(std::unique_lock<std::mutex>& lock, uint64_t target, Pred pred) {
    auto it = targets.insert(target);
    wake_at.store(*targets.begin(), std::memory_order_seq_cst);
    done.wait(lock, pred);
    targets.erase(it);
    wake_at.store(targets.empty() ? kNoWaiter : *targets.begin(), std::memory_order_seq_cst);
  }
};

namespace {
// Synchronous launches the calling thread is inside of. Work such a kernel
// launches itself (a compiled graph's aten calls) runs inline: queuing it
// would let the executor run it concurrently with the kernel that waits for it.
thread_local int tls_inline_depth = 0;
// Marks the calling thread as running a kernel itself (see tls_inline_depth).
struct InlineScope {
  InlineScope() { ++tls_inline_depth; }
  ~InlineScope() { --tls_inline_depth; }
};
// The stream whose executor this thread is (it must never wait for room in
// its own queue).
thread_local const Stream* tls_executor_of = nullptr;

std::atomic<LaunchObserver> g_launch_observer{nullptr};
}  // namespace

bool in_kernel() noexcept { return tls_inline_depth > 0 || tls_executor_of != nullptr; }
bool on_executor() noexcept { return tls_executor_of != nullptr && tls_inline_depth == 0; }

namespace {
std::atomic<CorrelationSource> g_correlation_source{nullptr};

uint64_t launch_correlation() {
  if (!g_launch_observer.load(std::memory_order_relaxed)) return 0;
  CorrelationSource source = g_correlation_source.load(std::memory_order_relaxed);
  return source ? source() : 0;
}

std::string failure_message(const Stream& s, const Kernel& kernel, const std::exception& ex) {
  return std::string("a kernel launched asynchronously on neuron:") + std::to_string(s.device()) + " (stream " +
         std::to_string(s.id()) + ") failed: " + kernel.name() + ": " + ex.what() +
         "\nKernel errors are reported at the next synchronization point; set "
         "NEURON_RT_LAUNCH_BLOCKING=1 to raise them where the kernel is launched.";
}

// A kernel's share of kMaxQueuedBytes: what it touches, when it says (the
// runtime's own markers, timestamps and waits, touch nothing).
size_t queued_bytes_of(const Kernel& kernel) {
  const size_t bytes = kernel.bytes();
  return bytes == SIZE_MAX ? 0 : bytes;
}

uint64_t now_ns() {
  return static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
          .count());
}

// A marker in a stream: stamps the time the stream reached it (events).
class TimeStamp final : public Kernel {
 public:
  explicit TimeStamp(std::shared_ptr<std::atomic<int64_t>> slot) : slot_(std::move(slot)) {}
  const char* name() const noexcept override { return "Event record"; }
  void run() override { slot_->store(static_cast<int64_t>(now_ns()), std::memory_order_release); }

 private:
  std::shared_ptr<std::atomic<int64_t>> slot_;
};

// Holds a stream until another stream reaches a position (Event::block).
class StreamWait final : public Kernel {
 public:
  StreamWait(const Stream& other, uint64_t seq) : other_(other), seq_(seq) {}
  const char* name() const noexcept override { return "Stream wait"; }
  void run() override { other_.wait_for(seq_); }

 private:
  const Stream& other_;
  uint64_t seq_;
};
}  // namespace

void set_launch_observer(LaunchObserver observer) { g_launch_observer.store(observer); }
void set_correlation_source(CorrelationSource source) { g_correlation_source.store(source); }

Stream::Stream(int device, int64_t id) : device_(device), id_(id) {}

Stream::~Stream() = default;  // streams are never destroyed (see stream_slot)

Stream::Executor& Stream::executor() const {
  if (Executor* e = executor_.load(std::memory_order_acquire)) return *e;
  static std::mutex create;
  std::lock_guard<std::mutex> lock(create);
  if (Executor* e = executor_.load(std::memory_order_relaxed)) return *e;
  auto* e = new Executor();
  auto* self = const_cast<Stream*>(this);
  std::thread([self, e] {
    tls_executor_of = self;
    // Named for top -H, perf and gdb: "neuron-exec" + device.stream.
    const std::string name = "neuron-exec" + std::to_string(self->device_) + "." + std::to_string(self->id_);
    pthread_setname_np(pthread_self(), name.substr(0, 15).c_str());
    for (;;) {
      std::unique_ptr<Kernel> kernel;
      uint64_t correlation = 0;
      bool skip = false;
      {
        std::unique_lock<std::mutex> lock(e->mutex);
        if (e->queue.empty()) {
          // Spin briefly before sleeping: back-to-back launches then cost no
          // wake-up on either side.
          lock.unlock();
          for (int i = 0; i < 2000 && self->completed_.load(std::memory_order_relaxed) ==
                                          self->issued_.load(std::memory_order_relaxed);
               ++i) {
            std::this_thread::yield();
          }
          lock.lock();
        }
        if (e->queue.empty() || e->running_inline) {
          e->sleeping = true;
          e->work.wait(lock, [&] { return !e->queue.empty() && !e->running_inline; });
          e->sleeping = false;
        }
        kernel = std::move(e->queue.front().kernel);
        correlation = e->queue.front().correlation;
        e->queue.pop_front();
        skip = !e->error.empty();
      }
      if (!skip) {
        try {
          self->run(*kernel, correlation);
        } catch (const std::exception& ex) {
          std::lock_guard<std::mutex> lock(e->mutex);
          e->error = failure_message(*self, *kernel, ex);
          self->failed_.store(true, std::memory_order_release);
        }
      }
      std::lock_guard<std::mutex> lock(e->mutex);
      e->queued_bytes -= queued_bytes_of(*kernel);
      e->finished.push_back(std::move(kernel));
      e->has_finished.store(true, std::memory_order_release);
      if (e->must_wake(self->completed_.fetch_add(1, std::memory_order_seq_cst) + 1)) e->done.notify_all();
    }
  }).detach();
  executor_.store(e, std::memory_order_release);
  return *e;
}

namespace {
// Kernel durations (neuron-top's busy time, the profiler's kernel times). Two
// steady_clock reads cost ~50 ns on the VMs we run on, a third of a small
// op's launch; on x86-64 a duration is measured in TSC ticks instead (10 ns a
// read), at a rate calibrated against steady_clock as the process runs.
int64_t steady_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

#if defined(__x86_64__)
uint64_t ticks() { return __rdtsc(); }

double ns_per_tick() {
  static const uint64_t tick0 = ticks();
  static const int64_t ns0 = steady_ns();
  static std::atomic<double> rate{0.0};
  thread_local uint32_t calls = 0;
  double r = rate.load(std::memory_order_relaxed);
  // Recalibrated every 4096 launches of a thread; from the first launch on
  // until 1 ms has passed (the rate is then within a few parts per million).
  if (r == 0.0 || (++calls & 4095) == 0) {
    const int64_t dn = steady_ns() - ns0;
    const uint64_t dt = ticks() - tick0;
    if (dt == 0) return 0.0;
    r = static_cast<double>(dn) / static_cast<double>(dt);
    if (dn >= 1000000) rate.store(r, std::memory_order_relaxed);
  }
  return r;
}

uint64_t elapsed_ns(uint64_t start) {
  return static_cast<uint64_t>(static_cast<double>(ticks() - start) * ns_per_tick());
}
#else
uint64_t ticks() { return static_cast<uint64_t>(steady_ns()); }
uint64_t elapsed_ns(uint64_t start) { return ticks() - start; }
#endif
}  // namespace

void Stream::run(Kernel& kernel, uint64_t correlation) {
  struct Report {  // also when the kernel throws
    Stream* s;
    const char* name;
    uint64_t correlation;
    int64_t graph_kernels;
    uint64_t start = ticks();
    ~Report() {
      const uint64_t ns = elapsed_ns(start);
      registry_kernel(s->device_, ns);  // neuron-top's busy time
      if (graph_kernels >= 0) registry_replay(s->device_);
      if (LaunchObserver observer = g_launch_observer.load(std::memory_order_relaxed)) {
        observer({s->device_, s->id_, name, ns, correlation, graph_kernels});
      }
    }
  } report{this, kernel.name(), correlation, kernel.graph_kernels()};
  DeviceAccess access;  // kernels may touch device memory (protect mode)
  kernel.run();
}

void Stream::begin_capture(CaptureRecord* record) {
  CaptureRecord* expected = nullptr;
  if (!capture_.compare_exchange_strong(expected, record, std::memory_order_acq_rel)) {
    throw CaptureError("neuron:" + std::to_string(device_) + " stream " + std::to_string(id_) +
                       " is capturing already: end that capture before beginning another");
  }
}

void Stream::capture_violation(const std::string& what) const {
  std::string msg = "neuron:" + std::to_string(device_) + " stream " + std::to_string(id_) +
                    " is capturing a graph: " + what + ". The capture is invalidated.";
  if (CaptureRecord* r = capture_.load(std::memory_order_acquire)) {
    std::lock_guard<std::mutex> lock(r->mutex);
    if (r->error.empty()) r->error = msg;
  }
  throw CaptureError(msg);
}

void Stream::launch(const std::function<void()>& fn, const char* name) {
  if (in_bad_fork()) throw BadForkError();
  // A synchronous launch runs now: nothing a replay could repeat.
  if (is_capturing()) capture_violation(std::string(name) + " runs synchronously and cannot be captured");
  struct FnKernel final : Kernel {
    const std::function<void()>& fn;
    const char* label;
    FnKernel(const std::function<void()>& f, const char* n) : fn(f), label(n) {}
    const char* name() const noexcept override { return label; }
    void run() override { fn(); }
  } kernel(fn, name);
  launch_kernel(kernel);
}

void Stream::launch_kernel(Kernel& kernel) {
  // The caller runs the kernel itself, after the queued work. (Not after other
  // synchronous launches in progress: one of them may be this launch's caller.)
  if (completed() < last_queued_.load(std::memory_order_acquire)) stalls_.fetch_add(1, std::memory_order_relaxed);
  wait_queued();
  check_error();
  issued_.fetch_add(1, std::memory_order_acq_rel);
  struct Retire {
    Stream* s;
    ~Retire() {
      const uint64_t completed = s->completed_.fetch_add(1, std::memory_order_seq_cst) + 1;
      // Completions are counted, not matched to sequence numbers: a thread
      // waiting for a queued kernel may need this one to reach its count
      // (launches from several threads interleave), so it must be woken.
      Executor* e = s->executor_.load(std::memory_order_acquire);
      if (e && e->must_wake(completed)) {
        std::lock_guard<std::mutex> lock(e->mutex);
        e->done.notify_all();
      }
    }
  } retire{this};
  InlineScope in_launch;
  run(kernel, launch_correlation());
}

void Stream::enqueue(std::unique_ptr<Kernel> kernel) {
  if (in_bad_fork()) throw BadForkError();
  // Capturing: recorded for replays, never run now (not even inline).
  if (CaptureRecord* r = capture_.load(std::memory_order_acquire)) {
    std::lock_guard<std::mutex> lock(r->mutex);
    r->kernels.push_back(std::move(kernel));
    ++r->clocks[this][this];  // fork/join bookkeeping (Graph.h)
    return;
  }
  if (launch_blocking() || tls_inline_depth > 0) {
    launch_kernel(*kernel);
    return;
  }
  if (kernel->bytes() <= kInlineBytes && run_inline_if_idle(kernel)) return;
  Executor& e = executor();
  std::vector<std::unique_ptr<Kernel>> finished;
  {
    std::unique_lock<std::mutex> lock(e.mutex);
    const size_t bytes = queued_bytes_of(*kernel);
    auto full = [&] {
      return e.queue.size() >= kMaxQueued || (e.queued_bytes > 0 && e.queued_bytes + bytes > kMaxQueuedBytes);
    };
    if (full() && tls_executor_of != this) e.wait_done(lock, 0, [&] { return !full(); });
    e.queued_bytes += bytes;
    e.queue.push_back({std::move(kernel), launch_correlation()});
    last_queued_.store(issued_.fetch_add(1, std::memory_order_acq_rel) + 1, std::memory_order_release);
    finished.swap(e.finished);
    e.has_finished.store(false, std::memory_order_relaxed);
    if (e.sleeping) e.work.notify_one();
  }
  // `finished` is destroyed here, on the caller: kernels release tensors.
}

bool Stream::run_inline_if_idle(std::unique_ptr<Kernel>& kernel) {
  Executor& e = executor();
  {
    std::lock_guard<std::mutex> lock(e.mutex);
    // Idle: nothing queued or running, and no failure pending (the kernels
    // after a failure are skipped, as on the executor).
    if (!e.queue.empty() || e.running_inline || !e.error.empty() || completed() != issued()) return false;
    e.running_inline = true;
    issued_.fetch_add(1, std::memory_order_acq_rel);
  }
  std::string error;
  {
    InlineScope in_kernel;  // work the kernel launches itself runs inline too
    try {
      run(*kernel, launch_correlation());
    } catch (const std::exception& ex) {
      error = failure_message(*this, *kernel, ex);
    }
  }
  std::vector<std::unique_ptr<Kernel>> finished;
  {
    std::lock_guard<std::mutex> lock(e.mutex);
    if (!error.empty() && e.error.empty()) {
      e.error = std::move(error);
      failed_.store(true, std::memory_order_release);
    }
    e.running_inline = false;
    const uint64_t completed = completed_.fetch_add(1, std::memory_order_seq_cst) + 1;
    finished.swap(e.finished);
    e.has_finished.store(false, std::memory_order_relaxed);
    if (e.sleeping && !e.queue.empty()) e.work.notify_one();
    if (e.must_wake(completed)) e.done.notify_all();
  }
  kernel.reset();  // on the caller, as finished kernels are
  return true;
}

void Stream::wait_for(uint64_t seq) const {
  if (completed() >= seq) return;
  for (int i = 0; i < 200; ++i) {  // short waits: spin
    if (completed() >= seq) return;
    std::this_thread::yield();
  }
  Executor* e = executor_.load(std::memory_order_acquire);
  if (!e) {  // only synchronous launches: they complete on their own threads
    while (completed() < seq) std::this_thread::yield();
    return;
  }
  std::unique_lock<std::mutex> lock(e->mutex);
  e->wait_done(lock, seq, [&] { return completed_.load(std::memory_order_seq_cst) >= seq; });
}

void Stream::check_error() const {
  Executor* e = executor_.load(std::memory_order_acquire);
  // Nothing to report or free: no lock (every synchronous launch comes here).
  if (!e || (!failed() && !e->has_finished.load(std::memory_order_acquire))) return;
  std::vector<std::unique_ptr<Kernel>> finished;
  std::string error;
  {
    std::lock_guard<std::mutex> lock(e->mutex);
    finished.swap(e->finished);
    e->has_finished.store(false, std::memory_order_relaxed);
    error.swap(e->error);
    failed_.store(false, std::memory_order_release);
  }
  finished.clear();
  if (!error.empty()) throw KernelError(error);
}

void Stream::release_finished() const {
  Executor* e = executor_.load(std::memory_order_acquire);
  if (!e) return;
  std::vector<std::unique_ptr<Kernel>> finished;
  {
    std::lock_guard<std::mutex> lock(e->mutex);
    finished.swap(e->finished);
    e->has_finished.store(false, std::memory_order_relaxed);
  }
}

void Stream::synchronize() const {
  if (is_capturing()) capture_violation("synchronize() would wait for work that does not run until a replay");
  wait_for(issued());
  check_error();
}

Stream& default_stream(int device) { return stream_slot(device, 0); }

Stream& get_stream(int device, int64_t id) { return stream_slot(device, id); }

Stream& pool_stream(int device, int priority) {
  DeviceStreams& ds = streams_of(device);
  if (priority < 0) {
    uint32_t i = ds.next_high.fetch_add(1) % Stream::kPoolSize;
    return stream_slot(device, 1 + Stream::kPoolSize + i);
  }
  uint32_t i = ds.next_normal.fetch_add(1) % Stream::kPoolSize;
  return stream_slot(device, 1 + i);
}

Stream& current_stream(int device) {
  check_device(device);
  int64_t id = static_cast<int>(tls_current_stream.size()) > device ? tls_current_stream[device] : -1;
  if (id < 0) id = 0;
  // Every op asks: an existing stream is returned without stream_slot's checks.
  if (Stream* s = streams_of_checked(device).streams[id].load(std::memory_order_acquire)) return *s;
  return stream_slot(device, id);
}

void set_current_stream(Stream& stream) {
  if (static_cast<int>(tls_current_stream.size()) < device_count()) {
    tls_current_stream.resize(device_count(), -1);
  }
  tls_current_stream[stream.device()] = stream.id();
}

std::vector<Stream*> all_streams(int device) {
  lazy_init();
  DeviceStreams& ds = streams_of(device);
  std::lock_guard<std::mutex> lock(ds.mutex);
  std::vector<Stream*> out;
  for (auto& s : ds.streams) {
    if (Stream* p = s.load()) out.push_back(p);
  }
  return out;
}

void Event::record(const Stream& stream) {
  stream_ = &stream;
  capture_id_ = 0;
  clock_.clear();
  if (CaptureRecord* r = stream.capture()) {
    std::lock_guard<std::mutex> lock(r->mutex);
    capture_id_ = r->id;
    clock_ = r->clocks[&stream];
  }
  seq_ = stream.issued();
  if (!timing_) return;
  time_ns_ = std::make_shared<std::atomic<int64_t>>(-1);
  if (stream.query() || launch_blocking()) {
    stream.wait_for(seq_);
    time_ns_->store(static_cast<int64_t>(now_ns()));
  } else {
    // Device time: stamped when the stream reaches this point. The marker is
    // itself a launch, so the record point moves past it.
    const_cast<Stream&>(stream).enqueue(std::make_unique<TimeStamp>(time_ns_));
    seq_ = stream.issued();
  }
}

bool Event::query() const {
  return stream_ == nullptr || stream_->completed() >= seq_;
}

void Event::synchronize() const {
  if (!stream_) return;
  if (stream_->is_capturing()) stream_->capture_violation("an event of it cannot be synchronized with");
  stream_->wait_for(seq_);
  stream_->check_error();
}

namespace {
std::string stream_name(const Stream& s) {
  return "neuron:" + std::to_string(s.device()) + " stream " + std::to_string(s.id());
}
}  // namespace

void Event::block(const Stream& stream) const {
  if (!stream_) return;
  Stream& target = const_cast<Stream&>(stream);
  CaptureRecord* const into = stream.capture();
  if (capture_id_ != 0) {
    // Recorded in a capture: `stream` joins it (fork), or, already in it,
    // is ordered after the recording point (join). The capture records no
    // wait: replays keep issue order (Graph.h).
    CaptureRecord* const r = stream_->capture();
    if (!r || r->id != capture_id_) {
      const std::string what = "the event was recorded during a graph capture that has ended: it cannot be waited for outside that capture";
      if (into) stream.capture_violation(what);
      throw CaptureError(stream_name(stream) + ": " + what);
    }
    if (into && into != r) {
      stream.capture_violation("the event was recorded in another graph's capture: captures cannot wait for each other");
    }
    if (!into) {
      target.begin_capture(r);  // refuses a stream that began capturing meanwhile
      std::lock_guard<std::mutex> lock(r->mutex);
      r->joined.push_back(&target);
      r->clocks[&stream][&stream] = 1;  // the join itself must be joined back
    }
    std::lock_guard<std::mutex> lock(r->mutex);
    CaptureClock& clock = r->clocks[&stream];
    for (const auto& [s, n] : clock_) clock[s] = std::max(clock[s], n);
    return;
  }
  if (into) {
    // As CUDA's capture isolation: work outside the capture would not be
    // waited for by a replay.
    stream.capture_violation(
        "waiting for an event recorded outside the capture (before it began, or on a stream not in it) cannot be "
        "captured: wait for it before capture_begin(), or record the event inside the capture");
  }
  // Work queued on `stream` after this call must not start before the
  // recorded position of the event's stream is reached.
  if (stream_ == &stream || query()) return;
  target.enqueue(std::make_unique<StreamWait>(*stream_, seq_));
}

double Event::elapsed_ms(const Event& end) const {
  if (!timing_ || !end.timing_) {
    throw Error("elapsed_time needs both events created with enable_timing=True");
  }
  if (!recorded() || !end.recorded()) {
    throw Error("elapsed_time needs both events to be recorded first");
  }
  synchronize();
  end.synchronize();
  return static_cast<double>(end.time_ns_->load() - time_ns_->load()) / 1e6;
}

int Event::device() const { return stream_ ? stream_->device() : -1; }

}  // namespace neuronrt
