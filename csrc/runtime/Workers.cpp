#include "Workers.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <mutex>
#include <thread>
#include <vector>

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

// Set while this thread runs a range: a split inside it runs on the thread.
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

  // Runs the split on `parts` threads (caller included) if the workers are
  // free; false if another caller holds them.
  bool run(int parts, int64_t n, RangeFn fn, void* ctx) {
    std::unique_lock<std::mutex> lock(busy_, std::try_to_lock);
    if (!lock.owns_lock()) return false;
    grow(parts - 1);
    fn_ = fn;
    ctx_ = ctx;
    n_ = n;
    parts_ = parts;
    done_.store(0, std::memory_order_relaxed);
    // Every worker acknowledges every job (those without a range too), so
    // none still reads this job's fields when the next one replaces them.
    const int workers = static_cast<int>(workers_);
    generation_.fetch_add(1, std::memory_order_seq_cst);
    if (sleepers_.load(std::memory_order_seq_cst) > 0) generation_.notify_all();
    range(0);
    // The workers' ranges take as long as the caller's; a worker the
    // scheduler took off its core gets the core back by the yields.
    for (int i = 0; done_.load(std::memory_order_acquire) < workers; ++i) {
      if (i < 4096) {
        relax();
      } else {
        std::this_thread::yield();
      }
    }
    return true;
  }

 private:
  void range(int part) const noexcept {
    const int64_t begin = n_ * part / parts_, end = n_ * (part + 1) / parts_;
    if (begin < end) fn_(ctx_, begin, end);
  }

  void grow(int workers) {
    while (workers_ < static_cast<size_t>(workers)) {
      const int index = static_cast<int>(workers_);
      std::thread([this, index, seen = generation_.load()] { loop(index + 1, seen); }).detach();
      ++workers_;
    }
  }

  void loop(int part, uint64_t seen) {
    for (;;) {
      auto start = std::chrono::steady_clock::now();
      for (int i = 0;; ++i) {
        const uint64_t g = generation_.load(std::memory_order_acquire);
        if (g != seen) {
          seen = g;
          break;
        }
        if ((i & 255) == 255 && std::chrono::steady_clock::now() - start > kSpin) {
          sleepers_.fetch_add(1, std::memory_order_seq_cst);
          generation_.wait(seen, std::memory_order_seq_cst);
          sleepers_.fetch_sub(1, std::memory_order_relaxed);
          start = std::chrono::steady_clock::now();
        } else {
          relax();
        }
      }
      if (part < parts_) {
        tls_in_range = true;
        range(part);
        tls_in_range = false;
      }
      done_.fetch_add(1, std::memory_order_release);
    }
  }

  std::mutex busy_;  // one split at a time
  size_t workers_ = 0;
  // The job, written by the caller before it bumps generation_.
  RangeFn fn_ = nullptr;
  void* ctx_ = nullptr;
  int64_t n_ = 0;
  int parts_ = 0;
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> sleepers_{0};
  std::atomic<int> done_{0};
};

std::atomic<int64_t> g_splits{0};

}  // namespace

void parallel_for(int threads, int64_t n, int64_t grain, RangeFn fn, void* ctx) {
  if (n <= 0) return;
  const int64_t most = std::max<int64_t>(1, n / std::max<int64_t>(grain, 1));
  const int parts = static_cast<int>(std::min<int64_t>(std::max(threads, 1), most));
  if (parts > 1 && !tls_in_range && !in_bad_fork()) {
    tls_in_range = true;
    const bool split = Pool::get().run(parts, n, fn, ctx);
    tls_in_range = false;
    if (split) {
      g_splits.fetch_add(1, std::memory_order_relaxed);
      return;
    }
  }
  fn(ctx, 0, n);
}

int64_t parallel_splits() noexcept { return g_splits.load(std::memory_order_relaxed); }

}  // namespace neuronrt
