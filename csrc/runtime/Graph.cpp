#include "Graph.h"

#include <algorithm>
#include <atomic>

#include "CachingAllocator.h"
#include "Stream.h"

namespace neuronrt {
namespace {

std::atomic<uint64_t> g_next_pool_id{1};

// One launch that runs a graph's recorded kernels in order. It shares the
// record, so a reset (or the graph's end) while a replay is queued is safe.
class GraphKernel final : public Kernel {
 public:
  explicit GraphKernel(std::shared_ptr<CaptureRecord> record) : record_(std::move(record)) {}
  const char* name() const noexcept override { return "Graph replay"; }
  // The stream reports the replay as one launch carrying this count
  // (profiler, neuron-top); the recorded kernels are not reported one by one.
  size_t bytes() const noexcept override { return record_->bytes; }
  int64_t graph_kernels() const noexcept override { return static_cast<int64_t>(record_->kernels.size()); }
  void run() override {
    // The record is not changed after capture_end; its kernels (which may
    // keep state across runs) run in one replay at a time.
    std::lock_guard<std::mutex> lock(record_->replay_mutex);
    // A replay's state is cold at each replay when its large kernels stream
    // more than the caches hold (a decode step's weights): each kernel's
    // object is prefetched kObjectAhead kernels before it runs, and what it
    // reads through that object (Kernel::prefetch) kStateAhead kernels before.
    const std::vector<std::unique_ptr<Kernel>>& kernels = record_->kernels;
    const size_t n = kernels.size();
    for (size_t i = 0; i < std::min(n, kObjectAhead); ++i) prefetch_range(kernels[i].get(), kObjectBytes);
    for (size_t i = 0; i < std::min(n, kStateAhead); ++i) kernels[i]->prefetch();
    for (size_t i = 0; i < n; ++i) {
      if (i + kObjectAhead < n) prefetch_range(kernels[i + kObjectAhead].get(), kObjectBytes);
      if (i + kStateAhead < n) kernels[i + kStateAhead]->prefetch();
      Kernel& k = *kernels[i];
      try {
        k.run();
      } catch (const std::exception& ex) {
        throw Error(std::string(k.name()) + " (a kernel of the graph): " + ex.what());
      }
    }
  }

 private:
  static constexpr size_t kObjectAhead = 8, kStateAhead = 4, kObjectBytes = 256;
  std::shared_ptr<CaptureRecord> record_;
};

}  // namespace

namespace {
std::atomic<uint64_t> g_next_capture_id{1};
}  // namespace

CaptureRecord::CaptureRecord() : id(g_next_capture_id.fetch_add(1)) {}

MempoolId graph_pool_handle() { return {0, g_next_pool_id.fetch_add(1)}; }

Graph::~Graph() { reset(); }

void Graph::capture_begin(Stream& stream, MempoolId pool) {
  if (stream_) throw CaptureError("this graph is capturing already: call capture_end() first");
  if (captured_) throw CaptureError("this graph holds a capture already: call reset() before capturing again");
  if (stream.is_capturing()) {
    throw CaptureError("neuron:" + std::to_string(stream.device()) + " stream " + std::to_string(stream.id()) +
                       " is capturing already: end that capture first");
  }
  CachingAllocator& alloc = CachingAllocator::instance();
  const MempoolId id = pool == MempoolId{0, 0} ? MempoolId{g_next_pool_id.fetch_add(1), 0} : pool;
  alloc.retain_pool(stream.device(), id);
  try {
    alloc.begin_allocate_to_pool(stream.device(), id);
  } catch (...) {
    alloc.release_pool(stream.device(), id);
    throw;
  }
  auto record = std::make_shared<CaptureRecord>();
  try {
    stream.begin_capture(record.get());
  } catch (...) {
    alloc.end_allocate_to_pool(stream.device(), std::this_thread::get_id());
    alloc.release_pool(stream.device(), id);
    throw;
  }
  record_ = std::move(record);
  stream_ = &stream;
  thread_ = std::this_thread::get_id();
  pool_ = id;
  device_ = stream.device();
  holds_pool_ = true;
}

void Graph::end(bool* valid, std::string* error) {
  stream_->end_capture();
  CachingAllocator::instance().end_allocate_to_pool(device_, thread_);
  std::lock_guard<std::mutex> lock(record_->mutex);
  // Joined streams leave the capture with it; one whose last work the
  // capturing stream is not ordered after is unjoined (CUDA's
  // cudaErrorStreamCaptureUnjoined): replays would not order it.
  CaptureClock& origin = record_->clocks[stream_];
  for (Stream* s : record_->joined) {
    s->end_capture();
    if (record_->error.empty() && origin[s] < record_->clocks[s][s]) {
      record_->error = "neuron:" + std::to_string(s->device()) + " stream " + std::to_string(s->id()) +
                       " joined the capture of stream " + std::to_string(stream_->id()) +
                       " and was not joined back (capture unjoined): make the capturing stream wait for its last "
                       "work (capturing_stream.wait_stream(side_stream)) before capture_end()";
    }
  }
  stream_ = nullptr;
  *error = record_->error;
  *valid = error->empty();
}

void Graph::capture_end() {
  if (!stream_) throw CaptureError("capture_end() without capture_begin()");
  bool valid = false;
  std::string error;
  end(&valid, &error);
  if (!valid) {
    reset();
    throw CaptureError("the graph capture was invalidated and is discarded: " + error);
  }
  size_t bytes = 0;
  for (const std::unique_ptr<Kernel>& k : record_->kernels) {
    k->recorded();
    const size_t b = k->bytes();
    bytes = b > SIZE_MAX - bytes ? SIZE_MAX : bytes + b;
  }
  record_->bytes = bytes;
  captured_ = true;
}

void Graph::replay(Stream& stream) {
  if (stream_) throw CaptureError("replay() of a graph that is still capturing: call capture_end() first");
  if (!captured_) throw CaptureError("replay() of a graph that holds no capture");
  if (stream.device() != device_) {
    throw Error("replay() on neuron:" + std::to_string(stream.device()) + " of a graph captured on neuron:" +
                std::to_string(device_));
  }
  stream.enqueue(std::make_unique<GraphKernel>(record_));
}

void Graph::reset() noexcept {
  if (stream_) {
    bool valid;
    std::string error;
    end(&valid, &error);
  }
  // The kernels release their tensors first: blocks of the pool go back to
  // it, and with the pool to the device's cache.
  record_.reset();
  captured_ = false;
  if (holds_pool_) {
    holds_pool_ = false;
    try {
      CachingAllocator::instance().release_pool(device_, pool_);
    } catch (...) {
    }
  }
}

std::vector<std::string> Graph::kernel_names() const {
  std::vector<std::string> names;
  if (!record_) return names;
  std::lock_guard<std::mutex> lock(record_->mutex);
  for (const auto& k : record_->kernels) names.emplace_back(k->name());
  return names;
}

}  // namespace neuronrt
