// Device graphs: stream capture and replay (CUDA graphs' model).
//
// Graph::capture_begin(stream) puts `stream` in capture mode: kernels
// enqueued on it (and on streams that join it through events: fork/join,
// see CaptureRecord) are recorded into the graph instead of running, and the
// calling thread's allocations on the stream's device come from the graph's
// private memory pool (CachingAllocator.h). Work that would run or wait now
// (a synchronous launch, a stream, event or device synchronize, a copy to
// the host) raises CaptureError and invalidates the capture; capture_end()
// then discards it and raises, and the stream is usable again.
// replay(stream) is one launch: a kernel that runs the recorded kernels in
// order, in stream order with other work (like any small kernel, a replay
// touching at most Stream::kInlineBytes runs on the caller when the stream
// is idle). Every recorded kernel keeps the
// tensors it uses alive, so the static inputs and outputs of a capture stay
// valid while the graph lives.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "Error.h"
#include "Runtime.h"

namespace neuronrt {

// Pool ids (MempoolId, MemoryStats.h): {graph-made id, 0} for a graph's
// own pool, {0, handle id} for graph_pool_handle(); {0, 0} is "no pool".
// A new id for a pool several graphs may share (torch.cuda.graph_pool_handle).
MempoolId graph_pool_handle();

// A capture-rule violation (work that cannot be recorded, or a host wait
// while capturing).
class CaptureError : public Error {
 public:
  using Error::Error;
};

// Fork/join capture (as CUDA's): a stream that waits for an event recorded
// in the capture joins it (Event::block) and records into the same list;
// every joined stream must be joined back (the capturing stream waits for
// its last work) before capture_end. The kernels of all the streams are kept
// in one list in issue order, which replays run in order: a wait is issued
// after the work it waits for, so issue order honours every recorded
// dependency (the branches do not overlap in a replay).
class Stream;
using CaptureClock = std::map<const Stream*, uint64_t>;

// What a capturing stream records (the Graph owns it; replays share it).
struct CaptureRecord {
  CaptureRecord();
  const uint64_t id;  // unique per capture: events recorded in it name it
  std::mutex mutex;
  std::vector<std::unique_ptr<Kernel>> kernels;
  // Streams that joined the capture (not the capturing stream itself).
  std::vector<Stream*> joined;
  // Per stream in the capture, how much of each stream's capture it is
  // ordered after (a vector clock): clocks[s][s] counts s's own recorded
  // kernels (plus one for a joined stream's join), clocks[s][t] the part of
  // t's that s waited for. capture_end checks that the capturing stream is
  // ordered after every joined stream's last work.
  std::map<const Stream*, CaptureClock> clocks;
  std::string error;  // the first violation: the capture is invalid
  // The bytes the recorded kernels touch (SIZE_MAX: unknown), set at
  // capture_end: a small graph's replay on an idle stream runs on the
  // caller, as a small kernel does (Stream.h).
  size_t bytes = SIZE_MAX;
  // Held by a running replay: replays of one graph on several streams run
  // one at a time (as CUDA orders launches of one graph), since they share
  // the recorded kernels (and the static tensors).
  std::mutex replay_mutex;
};

class Graph {
 public:
  Graph() = default;
  ~Graph();
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;

  // Starts capturing `stream`. `pool` {0, 0} makes a new private pool;
  // another graph's pool() or a graph_pool_handle() shares that pool.
  void capture_begin(Stream& stream, MempoolId pool = {0, 0});
  // Ends the capture; raises CaptureError (and discards the capture) if a
  // capture rule was violated meanwhile.
  void capture_end();
  // Queues one launch on `stream` that runs the recorded kernels in order.
  void replay(Stream& stream);
  // Drops the recorded kernels and the graph's hold on its pool; the graph
  // can capture again. Aborts a capture in progress.
  void reset() noexcept;

  bool capturing() const { return stream_ != nullptr; }
  bool captured() const { return captured_; }
  MempoolId pool() const { return pool_; }
  int device() const { return device_; }
  // The recorded kernels' names, in replay order.
  std::vector<std::string> kernel_names() const;

 private:
  void end(bool* valid, std::string* error);

  std::shared_ptr<CaptureRecord> record_;
  Stream* stream_ = nullptr;  // while capturing
  std::thread::id thread_;    // the capturing thread
  MempoolId pool_{0, 0};
  int device_ = -1;
  bool holds_pool_ = false;
  bool captured_ = false;
};

}  // namespace neuronrt
