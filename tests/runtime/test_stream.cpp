#include <gtest/gtest.h>

#include "csrc/runtime/Error.h"
#include "csrc/runtime/Runtime.h"
#include "csrc/runtime/Stream.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <functional>
#include <pthread.h>
#include <string>
#include <thread>

TEST(Stream, DefaultAndPoolStreams) {
  auto& d = neuronrt::default_stream(0);
  EXPECT_EQ(d.id(), 0);
  auto& hi = neuronrt::pool_stream(0, -1);
  auto& lo = neuronrt::pool_stream(0, 0);
  EXPECT_EQ(hi.priority(), -1);
  EXPECT_EQ(lo.priority(), 0);
  EXPECT_NE(&hi, &lo);
  EXPECT_EQ(&neuronrt::get_stream(0, hi.id()), &hi);
  EXPECT_THROW(neuronrt::get_stream(0, 1000), neuronrt::Error);
}

TEST(Stream, LaunchesInOrderAndCounts) {
  auto& s = neuronrt::pool_stream(1, 0);
  std::vector<int> order;
  uint64_t before = s.issued();
  s.launch([&] { order.push_back(1); });
  s.launch([&] { order.push_back(2); });
  EXPECT_EQ(order, (std::vector<int>{1, 2}));
  EXPECT_EQ(s.issued(), before + 2);
  EXPECT_TRUE(s.query());
  EXPECT_THROW(s.launch([] { throw neuronrt::Error("kernel failed"); }), neuronrt::Error);
  EXPECT_TRUE(s.query());  // a failed launch still retires
}

TEST(Stream, CurrentStreamIsPerDevice) {
  auto& s = neuronrt::pool_stream(0, 0);
  neuronrt::set_current_stream(s);
  EXPECT_EQ(&neuronrt::current_stream(0), &s);
  EXPECT_EQ(neuronrt::current_stream(1).id(), 0);
  neuronrt::set_current_stream(neuronrt::default_stream(0));
}

TEST(Event, RecordQueryElapsed) {
  auto& s = neuronrt::default_stream(0);
  neuronrt::Event start(true), end(true), untimed;
  EXPECT_TRUE(start.query());  // unrecorded events are complete
  start.record(s);
  s.launch([] {
    volatile double x = 0;
    for (int i = 0; i < 200000; ++i) x = x + i;
  });
  end.record(s);
  EXPECT_TRUE(end.query());
  EXPECT_GT(start.elapsed_ms(end), 0.0);
  untimed.record(s);
  EXPECT_THROW(start.elapsed_ms(untimed), neuronrt::Error);
  EXPECT_EQ(end.device(), 0);
}

namespace {
// A queued kernel that runs `fn`.
class FnKernel final : public neuronrt::Kernel {
 public:
  explicit FnKernel(std::function<void()> fn, const char* name = "test kernel", size_t bytes = SIZE_MAX)
      : fn_(std::move(fn)), name_(name), bytes_(bytes) {}
  const char* name() const noexcept override { return name_; }
  void run() override { fn_(); }
  size_t bytes() const noexcept override { return bytes_; }

 private:
  std::function<void()> fn_;
  const char* name_;
  size_t bytes_;
};

std::unique_ptr<neuronrt::Kernel> kernel(std::function<void()> fn, const char* name = "test kernel") {
  return std::make_unique<FnKernel>(std::move(fn), name);
}
}  // namespace

TEST(Executor, QueuedKernelsRunInOrderOnAnotherThread) {
  auto& s = neuronrt::pool_stream(0, 0);
  std::atomic<bool> release{false};
  std::vector<int> order;
  std::thread::id ran_on;
  char name[16] = {};
  s.enqueue(kernel([&] {
    while (!release.load()) std::this_thread::yield();
    ran_on = std::this_thread::get_id();
    pthread_getname_np(pthread_self(), name, sizeof(name));
    order.push_back(1);
  }));
  s.enqueue(kernel([&] { order.push_back(2); }));
  EXPECT_FALSE(s.query());  // enqueue returned while the first kernel waits
  release = true;
  // A synchronous launch runs after the queued work.
  s.launch([&] { order.push_back(3); });
  EXPECT_EQ(order, (std::vector<int>{1, 2, 3}));
  EXPECT_NE(ran_on, std::this_thread::get_id());
  // Named for top -H / perf: the device and the stream.
  EXPECT_EQ(std::string(name), "neuron-exec0." + std::to_string(s.id()));
  EXPECT_TRUE(s.query());
}

TEST(Executor, SmallKernelsOnAnIdleStreamRunOnTheCaller) {
  auto& s = neuronrt::pool_stream(0, 0);
  s.synchronize();
  const size_t small = neuronrt::Stream::kInlineBytes;
  std::thread::id ran_on;
  s.enqueue(std::make_unique<FnKernel>([&] { ran_on = std::this_thread::get_id(); }, "small", small));
  EXPECT_EQ(ran_on, std::this_thread::get_id());  // ran before enqueue returned
  EXPECT_TRUE(s.query());
  // Its failure is kept for the next synchronization point.
  s.enqueue(std::make_unique<FnKernel>([] { throw std::runtime_error("bad index"); }, "small failing", small));
  EXPECT_THROW(s.synchronize(), neuronrt::KernelError);
  // Behind queued work, a small kernel is queued (it may depend on it).
  std::atomic<bool> release{false};
  s.enqueue(kernel([&] {
    while (!release.load()) std::this_thread::yield();
  }));
  std::thread::id later_on;
  s.enqueue(std::make_unique<FnKernel>([&] { later_on = std::this_thread::get_id(); }, "small", small));
  EXPECT_FALSE(s.query());
  release = true;
  s.synchronize();
  EXPECT_NE(later_on, std::this_thread::get_id());
  // Larger kernels always go to the executor.
  s.enqueue(std::make_unique<FnKernel>([&] { ran_on = std::this_thread::get_id(); }, "large", small + 1));
  s.synchronize();
  EXPECT_NE(ran_on, std::this_thread::get_id());
}

TEST(Executor, EnqueueWaitsWhenTheQueueIsFull) {
  // A launch loop faster than the device stays kMaxQueued kernels ahead at
  // most (it ran away before: millions of queued kernels and their memory).
  auto& s = neuronrt::pool_stream(0, 0);
  std::atomic<int> ran{0};
  size_t most_ahead = 0;
  const size_t n = 3 * neuronrt::Stream::kMaxQueued;
  for (size_t i = 0; i < n; ++i) {
    s.enqueue(kernel([&] {
      std::this_thread::sleep_for(std::chrono::microseconds(20));
      ++ran;
    }));
    most_ahead = std::max<size_t>(most_ahead, s.issued() - s.completed());
  }
  s.synchronize();
  EXPECT_EQ(ran.load(), static_cast<int>(n));
  EXPECT_LE(most_ahead, neuronrt::Stream::kMaxQueued + 1);  // + the one running
  EXPECT_GE(most_ahead, neuronrt::Stream::kMaxQueued / 2);  // the loop did run ahead
}

TEST(Executor, EnqueueWaitsWhenQueuedKernelsTouchTooManyBytes) {
  // Queued kernels hold their operands (also those the host dropped): a loop
  // of large kernels stays kMaxQueuedBytes ahead at most (it held 16 GiB of
  // dropped tensors before), and a kernel larger than that runs alone.
  auto& s = neuronrt::pool_stream(0, 0);
  constexpr size_t kMax = neuronrt::Stream::kMaxQueuedBytes;
  const size_t each = kMax / 8;
  std::atomic<size_t> in_flight{0};  // bytes of the kernels not yet run
  size_t most = 0;
  int ran = 0;
  for (int i = 0; i < 64; ++i) {
    const size_t bytes = i == 40 ? 2 * kMax : each;
    in_flight += bytes;
    s.enqueue(std::make_unique<FnKernel>(
        [&, bytes] {
          std::this_thread::sleep_for(std::chrono::microseconds(200));
          ++ran;
          in_flight -= bytes;
        },
        "large kernel", bytes));
    // Everything counted now has been enqueued and has not finished.
    const size_t now = in_flight.load();
    EXPECT_TRUE(now <= kMax || now == 2 * kMax) << "kernel " << i << ": " << now << " bytes in flight";
    if (bytes == each) most = std::max(most, now);
  }
  s.synchronize();
  EXPECT_EQ(ran, 64);
  EXPECT_GE(most, kMax / 2);  // the loop did run ahead
}

TEST(Executor, WaitersWakeOnSynchronousCompletions) {
  // Completions are counted: a synchronous launch from another thread that
  // finishes last is what brings the count to a waiter's target, so it must
  // wake the waiter (it did not: three threads hung in .item()).
  auto& s = neuronrt::pool_stream(1, 0);
  s.synchronize();
  std::atomic<bool> entered{false}, release{false}, synced{false};
  std::thread holder([&] {
    s.launch([&] {
      entered = true;
      while (!release.load()) std::this_thread::yield();
    }, "held");
  });
  while (!entered.load()) std::this_thread::yield();
  s.enqueue(kernel([] {}));  // queued behind nothing: the executor runs it now
  while (s.completed() + 1 < s.issued()) std::this_thread::yield();
  std::thread waiter([&] {
    s.synchronize();
    synced = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));  // the waiter sleeps in wait_for
  release = true;
  holder.join();
  for (int i = 0; i < 2000 && !synced.load(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  EXPECT_TRUE(synced.load());
  if (synced.load()) {
    waiter.join();
  } else {
    waiter.detach();  // would hang forever
  }
}

TEST(Executor, WaitersForDifferentPositionsEachWakeAtTheirOwn) {
  // A completion wakes waiters only once the count reaches the smallest
  // position waited for; after that waiter leaves, the next smallest must
  // still be woken (by the executor and by synchronous launches alike).
  auto& s = neuronrt::pool_stream(0, 0);
  s.synchronize();
  for (int round = 0; round < 20; ++round) {
    std::atomic<bool> release{false};
    s.enqueue(kernel([&] {
      while (!release.load()) std::this_thread::yield();
    }));
    std::vector<uint64_t> positions;
    for (int i = 0; i < 8; ++i) {
      for (int j = 0; j < 4; ++j) s.enqueue(kernel([] {}));
      positions.push_back(s.issued());
    }
    std::vector<uint64_t> seen(positions.size());
    std::atomic<int> woken{0};
    std::vector<std::thread> waiters;
    for (size_t i = 0; i < positions.size(); ++i) {
      waiters.emplace_back([&, i] {
        s.wait_for(positions[i]);
        seen[i] = s.completed();
        ++woken;
      });
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));  // most waiters now sleep
    std::thread launcher([&] { s.launch([] {}, "synchronous"); });
    release = true;
    for (int i = 0; i < 2000 && woken.load() < static_cast<int>(waiters.size()); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    EXPECT_EQ(woken.load(), static_cast<int>(waiters.size())) << "round " << round;
    if (woken.load() < static_cast<int>(waiters.size())) {
      for (auto& t : waiters) t.detach();  // they would hang forever
      launcher.detach();
      return;
    }
    launcher.join();
    for (auto& t : waiters) t.join();
    for (size_t i = 0; i < positions.size(); ++i) EXPECT_GE(seen[i], positions[i]);
  }
}

TEST(Executor, FailedKernelIsReportedAtTheNextSynchronization) {
  auto& s = neuronrt::pool_stream(0, 0);
  bool later_ran = false;
  s.enqueue(kernel([] { throw std::runtime_error("index 7 is out of bounds"); }, "aten::index_select"));
  s.enqueue(kernel([&] { later_ran = true; }));
  try {
    s.synchronize();
    FAIL() << "no KernelError";
  } catch (const neuronrt::KernelError& e) {
    EXPECT_NE(std::string(e.what()).find("aten::index_select: index 7 is out of bounds"), std::string::npos);
  }
  EXPECT_FALSE(later_ran);  // kernels queued after a failure are skipped
  EXPECT_NO_THROW(s.synchronize());  // reported once
  s.enqueue(kernel([&] { later_ran = true; }));
  s.synchronize();
  EXPECT_TRUE(later_ran);
}

TEST(Executor, EventsOrderStreamsAndTimeDeviceWork) {
  auto& producer = neuronrt::pool_stream(0, 0);
  auto& consumer = neuronrt::pool_stream(0, -1);
  std::atomic<bool> release{false};
  std::atomic<int> value{0};
  neuronrt::Event start(true), end(true);
  start.record(producer);
  producer.enqueue(kernel([&] {
    while (!release.load()) std::this_thread::yield();
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    value = 1;
  }));
  end.record(producer);
  end.block(consumer);
  int seen = -1;
  consumer.enqueue(kernel([&] { seen = value.load(); }));
  EXPECT_FALSE(end.query());
  release = true;
  consumer.synchronize();
  EXPECT_EQ(seen, 1);  // the consumer waited for the producer's event
  EXPECT_TRUE(end.query());
  EXPECT_GE(start.elapsed_ms(end), 20.0);  // device time of the producer's kernel
}

TEST(Executor, WorkLaunchedInsideASynchronousLaunchRunsInline) {
  auto& s = neuronrt::pool_stream(0, 0);
  std::vector<int> order;
  s.launch([&] {
    s.enqueue(kernel([&] { order.push_back(1); }));
    order.push_back(2);  // the nested kernel has run: its result is usable here
  });
  EXPECT_EQ(order, (std::vector<int>{1, 2}));
}
