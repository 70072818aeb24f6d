#include <gtest/gtest.h>

#include "csrc/runtime/Error.h"
#include "csrc/runtime/Stream.h"

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
