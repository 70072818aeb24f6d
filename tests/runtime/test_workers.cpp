#include <gtest/gtest.h>

#include "csrc/runtime/Workers.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <pthread.h>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

namespace {

// Runs a split and returns how many times each index was visited, and the
// threads that ran ranges.
struct Visits {
  std::vector<std::atomic<int>> count;
  std::mutex mutex;
  std::set<std::thread::id> threads;
  std::set<std::string> names;
  explicit Visits(int64_t n) : count(n) {}
};

// `slow`: each chunk takes 5 ms, so the workers join in (even on a loaded machine).
void split(Visits& v, int threads, int64_t n, int64_t grain, bool slow = false) {
  neuronrt::parallel_for(threads, n, grain, [&](int64_t begin, int64_t end) {
    ASSERT_LE(0, begin);
    ASSERT_LT(begin, end);
    ASSERT_LE(end, n);
    for (int64_t i = begin; i < end; ++i) v.count[i].fetch_add(1);
    if (slow) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    char name[16] = {};
    pthread_getname_np(pthread_self(), name, sizeof(name));
    std::lock_guard<std::mutex> lock(v.mutex);
    v.threads.insert(std::this_thread::get_id());
    v.names.insert(name);
  });
}

int64_t cores() { return std::max(1u, std::thread::hardware_concurrency()); }

}  // namespace

TEST(Workers, EveryIndexRunsOnce) {
  for (int threads : {1, 2, 3, 4}) {
    for (int64_t n : {1, 2, 3, 7, 64, 1000, 4097}) {
      for (int64_t grain : {1, 16, 5000}) {
        Visits v(n);
        split(v, threads, n, grain);
        for (int64_t i = 0; i < n; ++i) {
          ASSERT_EQ(v.count[i].load(), 1) << "threads " << threads << " n " << n << " grain " << grain << " i " << i;
        }
        const int64_t most = std::max<int64_t>(1, n / grain);
        EXPECT_LE(static_cast<int64_t>(v.threads.size()), std::min<int64_t>({threads, most, cores()}));
      }
    }
  }
}

TEST(Workers, SplitsRunOnSeveralThreadsAndTheCaller) {
  if (cores() < 2) GTEST_SKIP() << "one core: no split";
  const int64_t before = neuronrt::parallel_splits();
  Visits v(1 << 16);
  split(v, 3, 1 << 16, 1 << 12, /*slow=*/true);
  EXPECT_EQ(neuronrt::parallel_splits(), before + 1);
  // 8-12 chunks of 5 ms: the workers wake and take some (one thread a core at most).
  EXPECT_EQ(static_cast<int64_t>(v.threads.size()), std::min<int64_t>(3, cores()));
  EXPECT_EQ(v.threads.count(std::this_thread::get_id()), 1u);
  EXPECT_EQ(v.names.count("neuron-work0"), 1u);  // named for top -H / perf
  // One thread, or too little work for two ranges: the caller alone.
  Visits one(1 << 16);
  split(one, 1, 1 << 16, 1);
  Visits small(10);
  split(small, 4, 10, 8);
  EXPECT_EQ(neuronrt::parallel_splits(), before + 1);
  EXPECT_EQ(one.threads, std::set<std::thread::id>{std::this_thread::get_id()});
  EXPECT_EQ(small.threads, std::set<std::thread::id>{std::this_thread::get_id()});
}

TEST(Workers, LongSplitsRunInChunksOfAFewGrains) {
  if (cores() < 2) GTEST_SKIP() << "one core: no split";
  // At most 8 grains a chunk, however long the split; and never more chunks
  // than the claim's 16 bits count (a range of 1 << 20 at grain 1).
  for (auto [n, grain, most] : {std::tuple<int64_t, int64_t, int64_t>{1 << 16, 16, 128}, {1 << 20, 1, 17}}) {
    std::mutex mutex;
    int64_t calls = 0, largest = 0, covered = 0;
    neuronrt::parallel_for(2, n, grain, [&](int64_t begin, int64_t end) {
      std::lock_guard<std::mutex> lock(mutex);
      ++calls;
      largest = std::max(largest, end - begin);
      covered += end - begin;
    });
    EXPECT_EQ(covered, n);
    EXPECT_LE(largest, most) << "n " << n;
    EXPECT_GE(calls, n / most) << "n " << n;
  }
}

TEST(Workers, ConcurrentCallersEachGetTheirWholeRange) {
  // Executors of several streams split at once: the one that finds the
  // workers busy runs its range alone, and no index is lost or doubled.
  constexpr int kCallers = 4;
  constexpr int64_t kN = 20000;
  std::vector<std::thread> callers;
  std::atomic<int> failures{0};
  for (int c = 0; c < kCallers; ++c) {
    callers.emplace_back([&] {
      for (int round = 0; round < 200; ++round) {
        Visits v(kN);
        split(v, 2 + round % 3, kN, 64);
        for (int64_t i = 0; i < kN; ++i) {
          if (v.count[i].load() != 1) {
            failures.fetch_add(1);
            break;
          }
        }
      }
    });
  }
  for (auto& t : callers) t.join();
  EXPECT_EQ(failures.load(), 0);
}

TEST(Workers, SleepingWorkersWakeForTheNextSplit) {
  if (cores() < 2) GTEST_SKIP() << "one core: no split";
  Visits warm(1 << 12);
  split(warm, 2, 1 << 12, 1);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));  // past the spin: the workers sleep
  // A worker descheduled for the whole split (40 ms of chunks) on a loaded
  // host leaves one round to the caller; workers that never wake leave all.
  int both = 0;
  for (int i = 0; i < 5; ++i) {
    Visits v(1 << 12);
    split(v, 2, 1 << 12, 1 << 9, /*slow=*/true);
    for (int64_t j = 0; j < (1 << 12); ++j) ASSERT_EQ(v.count[j].load(), 1);
    both += v.threads.size() == 2u;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_GE(both, 4);
}

TEST(Workers, TheCallerFinishesWhenNoWorkerComes) {
  // Workers asleep and slow to wake: the caller takes every chunk itself
  // rather than waiting for them (it waited for a fixed share before).
  Visits warm(1 << 12);
  split(warm, 2, 1 << 12, 1);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  int caller_only = 0;
  for (int i = 0; i < 50; ++i) {
    Visits v(64);
    split(v, 2, 64, 1);
    for (int64_t j = 0; j < 64; ++j) ASSERT_EQ(v.count[j].load(), 1);
    caller_only += v.threads.size() == 1;
  }
  EXPECT_GT(caller_only, 0);
}

TEST(Workers, ASplitInsideARangeRunsOnItsThread) {
  constexpr int64_t kOuter = 64, kInner = 256;
  std::vector<std::atomic<int>> count(kOuter * kInner);
  std::atomic<int> inner_threads_mismatch{0};
  neuronrt::parallel_for(2, kOuter, 1, [&](int64_t begin, int64_t end) {
    const auto me = std::this_thread::get_id();
    for (int64_t o = begin; o < end; ++o) {
      neuronrt::parallel_for(2, kInner, 1, [&](int64_t b, int64_t e) {
        if (std::this_thread::get_id() != me) inner_threads_mismatch.fetch_add(1);
        for (int64_t i = b; i < e; ++i) count[o * kInner + i].fetch_add(1);
      });
    }
  });
  EXPECT_EQ(inner_threads_mismatch.load(), 0);
  for (auto& c : count) ASSERT_EQ(c.load(), 1);
}
