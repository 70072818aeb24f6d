#include <gtest/gtest.h>

#include "csrc/runtime/CachingAllocator.h"
#include "csrc/runtime/Device.h"
#include "csrc/runtime/Error.h"

using neuronrt::CachingAllocator;

TEST(CachingAllocator, RoundsToSizeClasses) {
  EXPECT_EQ(CachingAllocator::round_size(1), 512u);
  EXPECT_EQ(CachingAllocator::round_size(513), 1024u);
  EXPECT_EQ(CachingAllocator::round_size(1 << 20), 1u << 20);
  // Above 1 MiB: quarter steps of the power of two.
  EXPECT_EQ(CachingAllocator::round_size((1 << 20) + 1), (1u << 20) + (1u << 18));
  EXPECT_EQ(CachingAllocator::round_size(3u << 20), 3u << 20);
}

TEST(CachingAllocator, TracksStatsAndReusesBlocks) {
  auto& a = CachingAllocator::instance();
  a.empty_cache(0);
  auto before = a.stats(0);
  void* p = a.allocate(0, 1000);
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(a.device_of(p), 0);
  EXPECT_EQ(a.device_of(static_cast<char*>(p) + 10), 0);  // interior pointer
  auto during = a.stats(0);
  EXPECT_EQ(during.allocated_bytes[0].current - before.allocated_bytes[0].current, 1024);
  EXPECT_EQ(during.requested_bytes[0].current - before.requested_bytes[0].current, 1000);
  a.free(p);
  auto after = a.stats(0);
  EXPECT_EQ(after.allocated_bytes[0].current, before.allocated_bytes[0].current);
  EXPECT_EQ(after.reserved_bytes[0].current, during.reserved_bytes[0].current);  // cached
  void* q = a.allocate(0, 900);
  EXPECT_EQ(q, p);  // same size class comes from the cache
  a.free(q);
  a.empty_cache(0);
  EXPECT_EQ(a.stats(0).reserved_bytes[0].current, before.reserved_bytes[0].current);
  EXPECT_EQ(a.device_of(p), -1);
}

TEST(CachingAllocator, EnforcesCapacityAndRecovers) {
  auto& a = CachingAllocator::instance();
  auto [free_bytes, total] = a.mem_info(1);
  EXPECT_GT(total, 0u);
  auto ooms = a.stats(1).num_ooms;
  EXPECT_THROW(a.allocate(1, total + 1), neuronrt::OutOfMemoryError);
  EXPECT_EQ(a.stats(1).num_ooms, ooms + 1);
  void* p = a.allocate(1, 4096);  // still usable afterwards
  EXPECT_EQ(a.device_of(p), 1);
  a.free(p);
}

TEST(CachingAllocator, ReleasesCacheBeforeFailing) {
  auto& a = CachingAllocator::instance();
  a.empty_cache(1);
  auto [free_bytes, total] = a.mem_info(1);
  // Fill the cache with a block that cannot serve the next request.
  void* big = a.allocate(1, total / 2);
  a.free(big);
  auto retries = a.stats(1).num_alloc_retries;
  void* other = a.allocate(1, total - total / 4);
  EXPECT_EQ(a.stats(1).num_alloc_retries, retries + 1);
  a.free(other);
  a.empty_cache(1);
}

TEST(CachingAllocator, RejectsForeignPointers) {
  int x = 0;
  EXPECT_THROW(CachingAllocator::instance().free(&x), neuronrt::Error);
  EXPECT_THROW(CachingAllocator::instance().allocate(99, 16), neuronrt::InvalidDeviceError);
}
