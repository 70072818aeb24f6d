// In-order work queues (streams) and markers in them (events).
//
// The host runtime executes each launch synchronously on the calling thread,
// so a stream's work is complete when launch() returns. Streams still carry
// sequence numbers, and events record positions in them, so ordering queries
// (Event::query, Stream::query), waits and elapsed_time keep the semantics a
// hardware runtime with real queues would have.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <vector>

namespace neuronrt {

class Stream {
 public:
  static constexpr int kPoolSize = 32;
  // Stream ids: 0 is the default stream, 1..kPoolSize the normal-priority
  // pool, kPoolSize+1..2*kPoolSize the high-priority pool.
  Stream(int device, int64_t id);

  int device() const { return device_; }
  int64_t id() const { return id_; }
  // CUDA convention: lower numbers are higher priority (0 normal, -1 high).
  int priority() const { return id_ > kPoolSize ? -1 : 0; }

  // Runs `fn` in stream order. `name` (a string that outlives the call, such
  // as an op's schema name) labels the kernel for observers (the profiler).
  void launch(const std::function<void()>& fn, const char* name = "kernel");
  // Number of launches issued / completed so far.
  uint64_t issued() const { return issued_.load(); }
  uint64_t completed() const { return completed_.load(); }
  bool query() const { return completed() >= issued(); }
  void synchronize() const;
  // Blocks until the launch with sequence number `seq` has completed.
  void wait_for(uint64_t seq) const;

 private:
  int device_;
  int64_t id_;
  std::atomic<uint64_t> issued_{0};
  std::atomic<uint64_t> completed_{0};
};

// What the profiler sees of each launch, reported after it ran, on the
// launching thread.
struct LaunchRecord {
  int device;
  int64_t stream;
  const char* name;
  uint64_t duration_ns;
};
// Installs (or, with nullptr, removes) the launch observer.
using LaunchObserver = void (*)(const LaunchRecord&);
void set_launch_observer(LaunchObserver observer);

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
  void block(const Stream& stream) const;
  // Milliseconds between this event and `end`; both need enable_timing.
  double elapsed_ms(const Event& end) const;
  int device() const;

 private:
  bool timing_;
  const Stream* stream_ = nullptr;
  uint64_t seq_ = 0;
  std::chrono::steady_clock::time_point time_{};
};

}  // namespace neuronrt
