#include "Workers.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <mutex>
#include <pthread.h>
#include <string>
#include <thread>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "Process.h"

namespace neuronrt {
namespace {

// How long a worker waits awake for the next job: longer than the gaps
// between a decode step's matmuls (the other kernels between them), much
// shorter than the gaps between steps.
constexpr auto kSpin = std::chrono::microseconds(200);
// Pauses before an idle worker yields its core instead (a few us): the
// threads that need that core between our splits -- the executor's OpenMP
// worker (attention, Inductor's kernels), the engine's Python, our caller
// when both share a core -- get it at once rather than when the scheduler
// takes it from a spinning thread; with nothing else runnable a yield
// returns at once, so the wake-up stays as short.
constexpr int kWorkerPauses = 128;
// The caller (a stream's executor) waiting for the chunks workers still run
// yields only after much longer: on a loaded host a yield hands its core to
// another process for a time slice.
constexpr int kCallerPauses = 4096;
// Chunks per thread: threads take chunks until none is left, so a worker
// that starts late (woken, or off its core) costs the split little.
constexpr int64_t kChunksPerThread = 4;
// And chunks of at most this many grains: in a long split (an LM head's
// 113 MB of weights) a thread that loses its core holds at most one such
// chunk (~1 MB of weights, well under a time slice of work) for the others
// to wait on at the end, not an eighth of the split.
constexpr int64_t kMostGrainsPerChunk = 8;
// A claim packs the job number above the next chunk index.
constexpr int kIndexBits = 16;
constexpr uint64_t kIndexMask = (uint64_t{1} << kIndexBits) - 1;

// Set while this thread runs a chunk (the caller's chunks included): a split
// inside it runs on the thread, and never waits for the workers it holds.
thread_local bool tls_in_range = false;

inline void relax() {
#if defined(__x86_64__)
  _mm_pause();
#else
  std::this_thread::yield();
#endif
}

class Pool {
 public:
  static Pool& get() {
    static Pool* pool = new Pool();  // never destroyed: its threads outlive static destructors
    return *pool;
  }

  // Runs the split on up to `threads` threads (caller included) if the
  // workers are free; false if another caller holds them.
  bool run(int threads, int64_t n, int64_t grain, RangeFn fn, void* ctx) {
    std::unique_lock<std::mutex> lock(busy_, std::try_to_lock);
    if (!lock.owns_lock()) return false;
    grow(threads - 1);
    const int64_t even = (n + threads * kChunksPerThread - 1) / (threads * kChunksPerThread);
    // (and no more chunks than a claim can count)
    const int64_t chunk = std::max({grain, std::min(even, grain * kMostGrainsPerChunk), (n + int64_t{kIndexMask} - 1) / int64_t{kIndexMask}});
    const int64_t chunks = (n + chunk - 1) / chunk;
    fn_.store(fn, std::memory_order_relaxed);
    ctx_.store(ctx, std::memory_order_relaxed);
    n_.store(n, std::memory_order_relaxed);
    chunk_.store(chunk, std::memory_order_relaxed);
    chunks_.store(chunks, std::memory_order_relaxed);
    helpers_.store(threads - 1, std::memory_order_relaxed);
    done_.store(0, std::memory_order_relaxed);
    const uint64_t job = ++jobs_;
    // The claim publishes the job's fields (release); a worker's successful
    // claim of one of its chunks keeps the job current until that chunk is
    // done, so the fields it reads then are this job's.
    claim_.store(job << kIndexBits, std::memory_order_release);
    published_.store(job, std::memory_order_seq_cst);
    if (sleepers_.load(std::memory_order_seq_cst) > 0) published_.notify_all();
    work(job);
    // Chunks that workers claimed and still run; a worker the scheduler took
    // off its core gets the core back by the yields.
    for (int i = 0; done_.load(std::memory_order_acquire) < chunks; ++i) {
      if (i < kCallerPauses) {
        relax();
      } else {
        std::this_thread::yield();
      }
    }
    return true;
  }

 private:
  // Claims and runs chunks of `job` until none is left.
  void work(uint64_t job) noexcept {
    for (;;) {
      uint64_t c = claim_.load(std::memory_order_acquire);
      if ((c >> kIndexBits) != job) return;  // done, and another job published
      const auto index = static_cast<int64_t>(c & kIndexMask);
      if (index >= chunks_.load(std::memory_order_relaxed)) return;
      if (!claim_.compare_exchange_weak(c, c + 1, std::memory_order_acq_rel, std::memory_order_relaxed)) continue;
      const int64_t chunk = chunk_.load(std::memory_order_relaxed);
      const int64_t begin = index * chunk;
      const int64_t end = std::min(n_.load(std::memory_order_relaxed), begin + chunk);
      tls_in_range = true;
      fn_.load(std::memory_order_relaxed)(ctx_.load(std::memory_order_relaxed), begin, end);
      tls_in_range = false;
      done_.fetch_add(1, std::memory_order_release);
    }
  }

  void grow(int workers) {
    while (workers_ < workers) {
      const int index = workers_++;
      // It starts from the job before the one being published, so it joins that one.
      std::thread([this, index, seen = published_.load()] { loop(index, seen); }).detach();
    }
  }

  void loop(int index, uint64_t seen) {
    pthread_setname_np(pthread_self(), ("neuron-work" + std::to_string(index)).substr(0, 15).c_str());
    for (;;) {
      auto start = std::chrono::steady_clock::now();
      for (int i = 0;; ++i) {
        const uint64_t job = published_.load(std::memory_order_acquire);
        if (job != seen) {
          seen = job;
          break;
        }
        if ((i & 15) == 15 && std::chrono::steady_clock::now() - start > kSpin) {
          sleepers_.fetch_add(1, std::memory_order_seq_cst);
          published_.wait(seen, std::memory_order_seq_cst);
          sleepers_.fetch_sub(1, std::memory_order_relaxed);
          start = std::chrono::steady_clock::now();
        } else if (i < kWorkerPauses) {
          relax();
        } else {
          std::this_thread::yield();
        }
      }
      // Workers beyond the job's thread count sit it out.
      if (index < helpers_.load(std::memory_order_relaxed)) work(seen);
    }
  }

  std::mutex busy_;  // one split at a time
  int workers_ = 0;
  uint64_t jobs_ = 0;
  // The current job, written by the caller before it publishes the claim.
  std::atomic<RangeFn> fn_{nullptr};
  std::atomic<void*> ctx_{nullptr};
  std::atomic<int64_t> n_{0}, chunk_{0}, chunks_{0};
  std::atomic<int> helpers_{0};
  std::atomic<uint64_t> claim_{0};      // job << kIndexBits | next chunk
  std::atomic<int64_t> done_{0};        // chunks run
  std::atomic<uint64_t> published_{0};  // the newest job: workers wait for it to change
  std::atomic<int> sleepers_{0};
};

std::atomic<int64_t> g_splits{0};

}  // namespace

void parallel_for(int threads, int64_t n, int64_t grain, RangeFn fn, void* ctx) {
  if (n <= 0) return;
  grain = std::max<int64_t>(grain, 1);
  // More threads than cores only adds spinning workers that take turns.
  static const int64_t cores = std::max(1u, std::thread::hardware_concurrency());
  const int64_t most = std::min({std::max<int64_t>(1, n / grain), cores, int64_t{kIndexMask / kChunksPerThread}});
  threads = static_cast<int>(std::min<int64_t>(std::max(threads, 1), most));
  if (threads > 1 && !tls_in_range && !in_bad_fork() && Pool::get().run(threads, n, grain, fn, ctx)) {
    g_splits.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  fn(ctx, 0, n);
}

int64_t parallel_splits() noexcept { return g_splits.load(std::memory_order_relaxed); }

}  // namespace neuronrt
