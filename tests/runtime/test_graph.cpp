#include <gtest/gtest.h>

#include "csrc/runtime/CachingAllocator.h"
#include "csrc/runtime/Error.h"
#include "csrc/runtime/Graph.h"
#include "csrc/runtime/Runtime.h"
#include "csrc/runtime/Stream.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

namespace {

// A re-runnable kernel that calls `fn` (counts its runs).
class FnKernel final : public neuronrt::Kernel {
 public:
  FnKernel(const char* name, std::function<void()> fn) : name_(name), fn_(std::move(fn)) {}
  const char* name() const noexcept override { return name_; }
  size_t bytes() const noexcept override { return 0; }  // small: would run inline outside capture
  void run() override { fn_(); }

 private:
  const char* name_;
  std::function<void()> fn_;
};

std::unique_ptr<neuronrt::Kernel> kernel(const char* name, std::function<void()> fn) {
  return std::make_unique<FnKernel>(name, std::move(fn));
}

}  // namespace

TEST(Graph, CaptureRecordsWithoutRunningAndReplaysInOrder) {
  auto& s = neuronrt::pool_stream(0, 0);
  std::vector<int> order;
  neuronrt::Graph g;
  g.capture_begin(s);
  EXPECT_TRUE(s.is_capturing());
  const uint64_t issued = s.issued();
  s.enqueue(kernel("a", [&] { order.push_back(1); }));
  s.enqueue(kernel("b", [&] { order.push_back(2); }));
  EXPECT_TRUE(order.empty());       // recorded, not run (not even inline)
  EXPECT_EQ(s.issued(), issued);    // nothing issued
  g.capture_end();
  EXPECT_FALSE(s.is_capturing());
  EXPECT_TRUE(g.captured());
  EXPECT_EQ(g.kernel_names(), (std::vector<std::string>{"a", "b"}));
  for (int i = 0; i < 3; ++i) g.replay(s);
  s.synchronize();
  EXPECT_EQ(order, (std::vector<int>{1, 2, 1, 2, 1, 2}));
  EXPECT_EQ(s.issued(), issued + 3);  // one launch per replay
}

TEST(Graph, ReplayHonoursStreamOrder) {
  auto& s = neuronrt::pool_stream(0, 0);
  std::vector<int> order;
  neuronrt::Graph g;
  g.capture_begin(s);
  s.enqueue(kernel("g", [&] { order.push_back(2); }));
  g.capture_end();
  s.enqueue(kernel("before", [&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    order.push_back(1);
  }));
  g.replay(s);
  s.enqueue(kernel("after", [&] { order.push_back(3); }));
  s.synchronize();
  EXPECT_EQ(order, (std::vector<int>{1, 2, 3}));
}

TEST(Graph, HostWaitsInvalidateTheCaptureAndTheStreamStaysUsable) {
  auto& s = neuronrt::pool_stream(0, 0);
  struct Case {
    const char* what;
    std::function<void()> op;
  };
  neuronrt::Event ev;
  std::vector<Case> cases = {
      {"launch", [&] { s.launch([] {}, "aten::nonzero"); }},
      {"synchronize", [&] { s.synchronize(); }},
      {"device", [&] { neuronrt::synchronize_device(0); }},
      {"event", [&] {
         ev.record(s);
         ev.synchronize();
       }},
      {"memcpy", [&] {
         int host = 0;
         int dev = 0;
         neuronrt::memcpy(&host, &dev, sizeof(int), neuronrt::MemcpyKind::DeviceToHost, s);
       }},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    neuronrt::Graph g;
    g.capture_begin(s);
    try {
      c.op();
      ADD_FAILURE() << "no error";
    } catch (const neuronrt::CaptureError& e) {
      EXPECT_NE(std::string(e.what()).find("is capturing"), std::string::npos) << e.what();
    }
    try {
      g.capture_end();
      ADD_FAILURE() << "capture_end accepted an invalidated capture";
    } catch (const neuronrt::CaptureError& e) {
      EXPECT_NE(std::string(e.what()).find("invalidated"), std::string::npos) << e.what();
    }
    EXPECT_FALSE(g.captured());
    EXPECT_FALSE(s.is_capturing());
    int ran = 0;
    s.launch([&] { ran = 1; });
    s.synchronize();
    EXPECT_EQ(ran, 1);
  }
}

TEST(Graph, RulesAndReset) {
  auto& s = neuronrt::pool_stream(0, 0);
  neuronrt::Graph g;
  EXPECT_THROW(g.replay(s), neuronrt::CaptureError);
  EXPECT_THROW(g.capture_end(), neuronrt::CaptureError);
  g.capture_begin(s);
  neuronrt::Graph other;
  EXPECT_THROW(other.capture_begin(s), neuronrt::CaptureError);  // one capture per stream
  EXPECT_THROW(g.replay(s), neuronrt::CaptureError);
  int runs = 0;
  s.enqueue(kernel("k", [&] { ++runs; }));
  g.capture_end();
  EXPECT_THROW(g.capture_begin(s), neuronrt::CaptureError);  // holds one
  g.replay(s);
  g.reset();
  EXPECT_FALSE(g.captured());
  g.capture_begin(s);
  s.enqueue(kernel("k2", [&] { runs += 10; }));
  g.capture_end();
  g.replay(s);
  s.synchronize();
  EXPECT_EQ(runs, 11);
}

TEST(Graph, ReplayErrorsNameTheKernel) {
  auto& s = neuronrt::pool_stream(0, 0);
  neuronrt::Graph g;
  g.capture_begin(s);
  s.enqueue(kernel("failing", [] { throw neuronrt::Error("boom"); }));
  g.capture_end();
  try {
    g.replay(s);     // raises here with NEURON_RT_LAUNCH_BLOCKING=1
    s.synchronize();  // else here, as a queued kernel's failure
    ADD_FAILURE() << "no error";
  } catch (const neuronrt::Error& e) {
    EXPECT_NE(std::string(e.what()).find("failing (a kernel of the graph): boom"), std::string::npos) << e.what();
  }
}

TEST(Graph, CaptureAllocatesFromThePrivatePool) {
  auto& alloc = neuronrt::CachingAllocator::instance();
  auto& s = neuronrt::pool_stream(0, 0);
  const size_t n = 1 << 20;
  // A cached block of the device that a capture must not take.
  void* cached = alloc.allocate(0, n);
  alloc.free(cached);
  auto g = std::make_unique<neuronrt::Graph>();
  g->capture_begin(s);
  void* a = alloc.allocate(0, n);
  EXPECT_NE(a, cached);
  // Another thread's allocations do not come from the pool.
  void* b = nullptr;
  std::thread([&] { b = alloc.allocate(0, n); }).join();
  EXPECT_EQ(b, cached);
  alloc.free(a);  // back to the pool, not the device's cache
  void* c = alloc.allocate(0, n);
  EXPECT_EQ(c, a);
  alloc.free(c);
  g->capture_end();
  // A 1 MiB block comes from a huge-page slab, which the pool holds whole.
  EXPECT_EQ(alloc.pool_reserved_bytes(0, g->pool()),
            neuronrt::CachingAllocator::slab_bytes(neuronrt::CachingAllocator::round_size(n)));
  void* d = alloc.allocate(0, n);  // outside capture: the pool's block stays private
  EXPECT_NE(d, a);
  alloc.free(d);
  alloc.free(b);

  // A second graph sharing the pool reuses its block.
  neuronrt::Graph g2;
  g2.capture_begin(s, g->pool());
  void* e = alloc.allocate(0, n);
  EXPECT_EQ(e, a);
  alloc.free(e);
  g2.capture_end();
  const neuronrt::MempoolId pool = g->pool();
  g.reset();  // g2 still holds the pool
  EXPECT_GT(alloc.pool_reserved_bytes(0, pool), 0u);
  g2.reset();  // the last holder: the block returns to the device's cache
  EXPECT_EQ(alloc.pool_reserved_bytes(0, pool), 0u);
  // The device's cache holds it now, with the two other blocks freed above.
  std::vector<void*> taken;
  for (int i = 0; i < 3; ++i) taken.push_back(alloc.allocate(0, n));
  EXPECT_NE(std::find(taken.begin(), taken.end(), a), taken.end());
  for (void* p : taken) alloc.free(p);
}

TEST(Graph, BlocksInUseWhenThePoolEndsReturnToTheDeviceCache) {
  auto& alloc = neuronrt::CachingAllocator::instance();
  auto& s = neuronrt::pool_stream(0, 0);
  const size_t n = 3 << 20;
  void* a = nullptr;
  neuronrt::MempoolId pool;
  {
    neuronrt::Graph g;
    g.capture_begin(s, neuronrt::graph_pool_handle());
    a = alloc.allocate(0, n);  // a static output the caller keeps
    g.capture_end();
    pool = g.pool();
    EXPECT_EQ(pool.first, 0u);  // a handle's id
  }
  EXPECT_EQ(alloc.pool_reserved_bytes(0, pool), 0u);
  const auto before = alloc.stats(0).allocated_bytes[neuronrt::kAllPools].current;
  alloc.free(a);
  EXPECT_LT(alloc.stats(0).allocated_bytes[neuronrt::kAllPools].current, before);
  void* b = alloc.allocate(0, n);
  EXPECT_EQ(b, a);
  alloc.free(b);
}

namespace {
// Counts recorded() notifications (Graph::capture_end) and runs.
class RecordedKernel final : public neuronrt::Kernel {
 public:
  RecordedKernel(std::atomic<int>* notified, std::atomic<int>* ran) : notified_(notified), ran_(ran) {}
  const char* name() const noexcept override { return "recorded"; }
  void recorded() noexcept override { notified_->fetch_add(1); }
  void run() override { ran_->fetch_add(1); }

 private:
  std::atomic<int>* notified_;
  std::atomic<int>* ran_;
};

std::vector<neuronrt::LaunchRecord> g_launches;
void observe(const neuronrt::LaunchRecord& r) { g_launches.push_back(r); }
}  // namespace

TEST(Graph, CaptureEndTellsEachKernelItWasRecorded) {
  auto& s = neuronrt::pool_stream(0, 0);
  std::atomic<int> notified{0}, ran{0};
  neuronrt::Graph g;
  g.capture_begin(s);
  s.enqueue(std::make_unique<RecordedKernel>(&notified, &ran));
  s.enqueue(std::make_unique<RecordedKernel>(&notified, &ran));
  EXPECT_EQ(notified.load(), 0);  // not before the capture is complete
  g.capture_end();
  EXPECT_EQ(notified.load(), 2);  // once each
  g.replay(s);
  g.replay(s);
  s.synchronize();
  EXPECT_EQ(notified.load(), 2);
  EXPECT_EQ(ran.load(), 4);
  // An eager kernel is never told.
  s.enqueue(std::make_unique<RecordedKernel>(&notified, &ran));
  s.synchronize();
  EXPECT_EQ(notified.load(), 2);
  EXPECT_EQ(ran.load(), 5);
}

TEST(Graph, AReplayIsOneLaunchCarryingItsKernelCount) {
  auto& s = neuronrt::pool_stream(0, 0);
  neuronrt::Graph g;
  g.capture_begin(s);
  for (int i = 0; i < 5; ++i) s.enqueue(kernel("k", [] {}));
  g.capture_end();
  neuronrt::Graph empty;
  empty.capture_begin(s);
  empty.capture_end();
  s.synchronize();
  g_launches.clear();
  neuronrt::set_launch_observer(&observe);
  g.replay(s);
  empty.replay(s);
  s.enqueue(kernel("plain", [] {}));
  s.synchronize();
  neuronrt::set_launch_observer(nullptr);
  ASSERT_EQ(g_launches.size(), 3u);
  EXPECT_STREQ(g_launches[0].name, "Graph replay");
  EXPECT_EQ(g_launches[0].graph_kernels, 5);
  EXPECT_EQ(g_launches[1].graph_kernels, 0);  // an empty graph's replay is still a replay
  EXPECT_STREQ(g_launches[2].name, "plain");
  EXPECT_EQ(g_launches[2].graph_kernels, -1);
}

namespace {
// A kernel of unknown size (Kernel::bytes() default): never run inline.
class UnsizedKernel final : public neuronrt::Kernel {
 public:
  explicit UnsizedKernel(std::function<void()> fn) : fn_(std::move(fn)) {}
  const char* name() const noexcept override { return "unsized"; }
  void run() override { fn_(); }

 private:
  std::function<void()> fn_;
};
}  // namespace

TEST(Graph, ASmallReplayOnAnIdleStreamRunsOnTheCaller) {
  auto& s = neuronrt::pool_stream(0, 0);
  std::thread::id small_ran, unsized_ran;
  neuronrt::Graph small, unsized;
  small.capture_begin(s);
  s.enqueue(kernel("small", [&] { small_ran = std::this_thread::get_id(); }));
  small.capture_end();
  unsized.capture_begin(s);
  s.enqueue(kernel("small", [] {}));
  s.enqueue(std::make_unique<UnsizedKernel>([&] { unsized_ran = std::this_thread::get_id(); }));
  unsized.capture_end();
  s.synchronize();
  small.replay(s);  // idle stream, 0 bytes: before replay() returns, on this thread
  EXPECT_EQ(small_ran, std::this_thread::get_id());
  unsized.replay(s);
  s.synchronize();
  EXPECT_NE(unsized_ran, std::this_thread::get_id());  // the executor
  EXPECT_NE(unsized_ran, std::thread::id());
}

TEST(Graph, ReplaysOfOneGraphOnTwoStreamsRunOneAtATime) {
  auto& a = neuronrt::pool_stream(0, 0);
  auto& b = neuronrt::pool_stream(0, -1);
  int inside = 0, overlaps = 0, runs = 0;  // plain ints: the replays must not overlap
  neuronrt::Graph g;
  g.capture_begin(a);
  a.enqueue(std::make_unique<UnsizedKernel>([&] {
    if (inside++ != 0) ++overlaps;
    std::this_thread::sleep_for(std::chrono::microseconds(50));
    ++runs;
    --inside;
  }));
  g.capture_end();
  for (int i = 0; i < 50; ++i) {
    g.replay(a);
    g.replay(b);
  }
  a.synchronize();
  b.synchronize();
  EXPECT_EQ(overlaps, 0);
  EXPECT_EQ(runs, 100);
}

// Fork/join capture (Graph.h): a side stream that waits for an event of the
// capture records into it; replays run both streams' kernels in issue order.
TEST(Graph, ForkJoinCaptureRecordsBothStreamsInIssueOrder) {
  auto& s0 = neuronrt::pool_stream(0, 0);
  auto& s1 = neuronrt::pool_stream(0, 0);
  ASSERT_NE(&s0, &s1);
  std::vector<int> order;
  neuronrt::Graph g;
  g.capture_begin(s0);
  s0.enqueue(kernel("a", [&] { order.push_back(1); }));
  neuronrt::Event fork;
  fork.record(s0);
  fork.block(s1);
  EXPECT_TRUE(s1.is_capturing());
  s1.enqueue(kernel("b", [&] { order.push_back(2); }));
  s0.enqueue(kernel("c", [&] { order.push_back(3); }));
  neuronrt::Event join;
  join.record(s1);
  join.block(s0);
  s0.enqueue(kernel("d", [&] { order.push_back(4); }));
  EXPECT_TRUE(order.empty());
  g.capture_end();
  EXPECT_FALSE(s0.is_capturing());
  EXPECT_FALSE(s1.is_capturing());
  EXPECT_EQ(g.kernel_names(), (std::vector<std::string>{"a", "b", "c", "d"}));
  g.replay(s0);
  g.replay(s0);
  s0.synchronize();
  EXPECT_EQ(order, (std::vector<int>{1, 2, 3, 4, 1, 2, 3, 4}));
  // Both streams work normally afterwards.
  int ran = 0;
  s1.enqueue(kernel("after", [&] { ran = 1; }));
  s1.synchronize();
  EXPECT_EQ(ran, 1);
}

TEST(Graph, AJoinThroughAnotherJoinedStreamCounts) {
  auto& s0 = neuronrt::pool_stream(0, 0);
  auto& s1 = neuronrt::pool_stream(0, 0);
  auto& s2 = neuronrt::pool_stream(0, 0);
  neuronrt::Graph g;
  g.capture_begin(s0);
  neuronrt::Event e0, e2, e1;
  e0.record(s0);
  e0.block(s1);
  e0.block(s2);
  s2.enqueue(kernel("s2", [] {}));
  e2.record(s2);
  e2.block(s1);  // s1 is ordered after s2's work
  s1.enqueue(kernel("s1", [] {}));
  e1.record(s1);
  e1.block(s0);  // so s0 joins both back
  g.capture_end();
  EXPECT_TRUE(g.captured());
}

TEST(Graph, UnjoinedStreamsDiscardTheCaptureAndStayUsable) {
  auto& s0 = neuronrt::pool_stream(0, 0);
  auto& s1 = neuronrt::pool_stream(0, 0);
  for (bool work_after_join : {false, true}) {
    SCOPED_TRACE(work_after_join);
    neuronrt::Graph g;
    g.capture_begin(s0);
    neuronrt::Event fork, join;
    fork.record(s0);
    fork.block(s1);
    s1.enqueue(kernel("side", [] {}));
    if (work_after_join) {  // joined back, then more work: that part is unjoined
      join.record(s1);
      join.block(s0);
      s1.enqueue(kernel("late", [] {}));
    }
    try {
      g.capture_end();
      ADD_FAILURE() << "capture_end accepted an unjoined stream";
    } catch (const neuronrt::CaptureError& e) {
      EXPECT_NE(std::string(e.what()).find("unjoined"), std::string::npos) << e.what();
    }
    EXPECT_FALSE(g.captured());
    EXPECT_FALSE(s0.is_capturing());
    EXPECT_FALSE(s1.is_capturing());
    int ran = 0;
    s1.enqueue(kernel("after", [&] { ran = 1; }));
    s1.synchronize();
    EXPECT_EQ(ran, 1);
  }
}

TEST(Graph, EventsDoNotCrossTheCaptureBoundary) {
  auto& s0 = neuronrt::pool_stream(0, 0);
  auto& s1 = neuronrt::pool_stream(0, 0);
  // An event recorded before the capture, waited for in it.
  {
    neuronrt::Event before;
    before.record(s1);
    neuronrt::Graph g;
    g.capture_begin(s0);
    try {
      before.block(s0);
      ADD_FAILURE() << "no error";
    } catch (const neuronrt::CaptureError& e) {
      EXPECT_NE(std::string(e.what()).find("recorded outside the capture"), std::string::npos) << e.what();
    }
    EXPECT_THROW(g.capture_end(), neuronrt::CaptureError);
    EXPECT_FALSE(s0.is_capturing());
  }
  // An event recorded in a capture, waited for after it ended.
  {
    neuronrt::Graph g;
    neuronrt::Event inside;
    g.capture_begin(s0);
    inside.record(s0);
    g.capture_end();
    try {
      inside.block(s1);
      ADD_FAILURE() << "no error";
    } catch (const neuronrt::CaptureError& e) {
      EXPECT_NE(std::string(e.what()).find("capture that has ended"), std::string::npos) << e.what();
    }
    EXPECT_FALSE(s1.is_capturing());
  }
  // An event of one capture waited for by a stream in another capture.
  {
    neuronrt::Graph g0;
    neuronrt::Event e;
    g0.capture_begin(s0);
    e.record(s0);
    std::thread([&] {  // one capture per thread (its allocations go to the pool)
      neuronrt::Graph g1;
      g1.capture_begin(s1);
      EXPECT_THROW(e.block(s1), neuronrt::CaptureError);
      EXPECT_THROW(g1.capture_end(), neuronrt::CaptureError);  // invalidated
    }).join();
    g0.capture_end();
    EXPECT_TRUE(g0.captured());
  }
  int ran = 0;
  s0.enqueue(kernel("after", [&] { ran = 1; }));
  s0.synchronize();
  EXPECT_EQ(ran, 1);
}

namespace {

// Logs its prefetch() and run() calls ("p3", "r3").
class PrefetchLogKernel final : public neuronrt::Kernel {
 public:
  PrefetchLogKernel(int id, std::vector<std::string>* log) : id_(id), log_(log) {}
  const char* name() const noexcept override { return "prefetch-log"; }
  size_t bytes() const noexcept override { return 0; }
  void run() override { log_->push_back("r" + std::to_string(id_)); }
  void prefetch() const noexcept override { log_->push_back("p" + std::to_string(id_)); }

 private:
  int id_;
  std::vector<std::string>* log_;
};

}  // namespace

TEST(Graph, AReplayPrefetchesEachKernelOnceBeforeItRuns) {
  auto& s = neuronrt::pool_stream(0, 0);
  std::vector<std::string> log;
  constexpr int kKernels = 20;  // more than the replay's prefetch distance
  neuronrt::Graph g;
  g.capture_begin(s);
  for (int i = 0; i < kKernels; ++i) s.enqueue(std::make_unique<PrefetchLogKernel>(i, &log));
  g.capture_end();
  for (int replay = 0; replay < 2; ++replay) {
    log.clear();
    g.replay(s);
    s.synchronize();
    ASSERT_EQ(log.size(), 2u * kKernels);
    std::vector<std::string> runs;
    for (const std::string& e : log) {
      if (e[0] == 'r') runs.push_back(e);
    }
    for (int i = 0; i < kKernels; ++i) {
      const std::string id = std::to_string(i);
      EXPECT_EQ(runs[i], "r" + id);  // the order is unchanged
      auto p = std::find(log.begin(), log.end(), "p" + id);
      auto r = std::find(log.begin(), log.end(), "r" + id);
      ASSERT_NE(p, log.end());
      EXPECT_LT(p, r) << "kernel " << i << " ran before its prefetch";
      EXPECT_EQ(std::count(log.begin(), log.end(), "p" + id), 1);
    }
  }
  // An eager launch is not prefetched.
  log.clear();
  s.enqueue(std::make_unique<PrefetchLogKernel>(99, &log));
  s.synchronize();
  EXPECT_EQ(log, (std::vector<std::string>{"r99"}));
}
