#include <gtest/gtest.h>
#include <sys/mman.h>

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

// Shareable segments (single-copy collectives): large blocks are memfds a
// peer could map; the fd maps the same bytes; small blocks stay private; a
// released segment counts in shared_releases so peers drop their mappings.
TEST(CachingAllocator, ShareableSegmentsAreMemfdsOnceEnabled) {
  auto& a = CachingAllocator::instance();
  a.empty_cache(0);
  void* before = a.allocate(0, 1 << 20);
  EXPECT_EQ(a.shared_buffer(before, 1 << 20).serial, 0u);  // not enabled yet
  a.set_shareable(true);
  void* big = a.allocate(0, 3 << 20);
  void* small = a.allocate(0, 4096);
  const auto sb = a.shared_buffer(static_cast<char*>(big) + 4096, 1 << 20);
  ASSERT_NE(sb.serial, 0u);
  EXPECT_GE(sb.fd, 0);
  EXPECT_EQ(sb.offset, 4096u);
  EXPECT_GE(sb.segment_bytes, size_t{3} << 20);
  EXPECT_EQ(a.shared_buffer(small, 4096).serial, 0u);
  // A range running past the segment is not shareable.
  EXPECT_EQ(a.shared_buffer(big, sb.segment_bytes + 1).serial, 0u);
  // Another mapping of the fd sees the block's bytes.
  static_cast<char*>(big)[4096] = 42;
  void* view = ::mmap(nullptr, sb.segment_bytes, PROT_READ, MAP_SHARED, static_cast<int>(sb.fd), 0);
  ASSERT_NE(view, MAP_FAILED);
  EXPECT_EQ(static_cast<char*>(view)[4096], 42);
  ::munmap(view, sb.segment_bytes);
  a.free(big);
  a.free(small);
  a.free(before);
  a.empty_cache(0);
  void* again = a.allocate(0, 3 << 20);
  const auto sb2 = a.shared_buffer(again, 3 << 20);
  EXPECT_GT(sb2.serial, sb.serial);  // serials are never reused
  EXPECT_EQ(sb2.releases, sb.releases + 1);
  a.set_shareable(false);
  a.free(again);
  a.empty_cache(0);
}
