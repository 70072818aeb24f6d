#include "Stream.h"

#include <array>
#include <memory>
#include <mutex>
#include <thread>

#include "Device.h"
#include "Error.h"
#include "Process.h"
#include "Protect.h"
#include "Registry.h"

namespace neuronrt {
namespace {

constexpr int kStreamsPerDevice = 1 + 2 * Stream::kPoolSize;

struct DeviceStreams {
  std::array<std::atomic<Stream*>, kStreamsPerDevice> streams{};
  std::atomic<uint32_t> next_normal{0};
  std::atomic<uint32_t> next_high{0};
  std::mutex mutex;
};

DeviceStreams& streams_of(int device) {
  static std::vector<std::unique_ptr<DeviceStreams>> all = [] {
    std::vector<std::unique_ptr<DeviceStreams>> v;
    for (int i = 0; i < device_count(); ++i) {
      v.push_back(std::make_unique<DeviceStreams>());
    }
    return v;
  }();
  check_device(device);
  return *all[device];
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

Stream::Stream(int device, int64_t id) : device_(device), id_(id) {}

namespace {
std::atomic<LaunchObserver> g_launch_observer{nullptr};
}  // namespace

void set_launch_observer(LaunchObserver observer) { g_launch_observer.store(observer); }

void Stream::launch(const std::function<void()>& fn, const char* name) {
  if (in_bad_fork()) throw BadForkError();
  issued_.fetch_add(1);
  const auto start = std::chrono::steady_clock::now();
  struct Retire {  // also when the kernel throws
    Stream* s;
    const char* name;
    std::chrono::steady_clock::time_point start;
    ~Retire() {
      auto ns = static_cast<uint64_t>(
          std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start).count());
      registry_kernel(s->device_, ns);  // neuron-top's busy time
      if (LaunchObserver observer = g_launch_observer.load(std::memory_order_relaxed)) {
        observer({s->device_, s->id_, name, ns});
      }
      s->completed_.fetch_add(1);
    }
  } retire{this, name, start};
  DeviceAccess access;  // kernels may touch device memory (protect mode)
  fn();
}

void Stream::wait_for(uint64_t seq) const {
  while (completed_.load() < seq) std::this_thread::yield();
}

void Stream::synchronize() const { wait_for(issued()); }

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
  if (static_cast<int>(tls_current_stream.size()) <= device) {
    return default_stream(device);
  }
  int64_t id = tls_current_stream[device];
  return id < 0 ? default_stream(device) : get_stream(device, id);
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
  seq_ = stream.issued();
  // Work is complete when launch() returns, so the record point is reached
  // as soon as the earlier launches finished.
  stream.wait_for(seq_);
  if (timing_) time_ = std::chrono::steady_clock::now();
}

bool Event::query() const {
  return stream_ == nullptr || stream_->completed() >= seq_;
}

void Event::synchronize() const {
  if (stream_) stream_->wait_for(seq_);
}

void Event::block(const Stream& stream) const {
  // Launches run to completion in issue order, so `stream` cannot overtake
  // the recorded position; waiting here keeps the guarantee explicit.
  (void)stream;
  synchronize();
}

double Event::elapsed_ms(const Event& end) const {
  if (!timing_ || !end.timing_) {
    throw Error("elapsed_time needs both events created with enable_timing=True");
  }
  if (!recorded() || !end.recorded()) {
    throw Error("elapsed_time needs both events to be recorded first");
  }
  end.synchronize();
  return std::chrono::duration<double, std::milli>(end.time_ - time_).count();
}

int Event::device() const { return stream_ ? stream_->device() : -1; }

}  // namespace neuronrt
