#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "csrc/runtime/Philox.h"

TEST(Philox, KnownAnswer) {
  // Random123 known-answer vector for philox4x32-10 with zero key and counter.
  auto r = neuronrt::philox4x32(0, 0, 0);
  EXPECT_EQ(r[0], 0x6627e8d5u);
  EXPECT_EQ(r[1], 0xe169c58du);
  EXPECT_EQ(r[2], 0xbc57ac4cu);
  EXPECT_EQ(r[3], 0x9b00dbd8u);
}

TEST(Philox, StreamsAreReproducibleAndOffsetAddressable) {
  std::vector<float> a(10), b(10), tail(6);
  neuronrt::philox_uniform(a.data(), a.size(), 42, 0);
  neuronrt::philox_uniform(b.data(), b.size(), 42, 0);
  EXPECT_EQ(a, b);
  neuronrt::philox_uniform(tail.data(), tail.size(), 42, 4);  // skip one block
  for (int i = 0; i < 6; ++i) EXPECT_EQ(tail[i], a[4 + i]);
  neuronrt::philox_uniform(b.data(), b.size(), 43, 0);
  EXPECT_NE(a, b);
}

TEST(Philox, UniformMoments) {
  std::vector<float> v(1 << 16);
  neuronrt::philox_uniform(v.data(), v.size(), 7, 0);
  double mean = 0;
  for (float x : v) {
    ASSERT_GE(x, 0.0f);
    ASSERT_LT(x, 1.0f);
    mean += x;
  }
  mean /= v.size();
  EXPECT_NEAR(mean, 0.5, 0.01);
  EXPECT_EQ(neuronrt::philox_offset_increment(5), 8u);
}
