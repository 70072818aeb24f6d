#include <gtest/gtest.h>
#include <sys/mman.h>

#include <cstdio>
#include <cstring>
#include <thread>
#include <vector>

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

// Among free blocks of one size the most recently freed is handed out first
// (its lines are the likeliest in cache); oldest first, a stream of
// same-size outputs cycled through every block it had in flight.
TEST(CachingAllocator, ReusesTheMostRecentlyFreedBlockFirst) {
  auto& a = CachingAllocator::instance();
  for (size_t size : {size_t{1000}, size_t{4} << 20}) {  // a small block, a huge-page segment
    a.empty_cache(0);
    std::vector<void*> held;
    for (int i = 0; i < 4; ++i) held.push_back(a.allocate(0, size));
    for (void* p : held) a.free(p);  // freed oldest first: held[3] is the most recent
    for (int round = 0; round < 3; ++round) {
      void* p = a.allocate(0, size);
      EXPECT_EQ(p, held[3]) << size << " bytes, round " << round;
      a.free(p);
    }
    void* x = a.allocate(0, size);
    void* y = a.allocate(0, size);
    EXPECT_EQ(x, held[3]);
    EXPECT_EQ(y, held[2]);
    a.free(x);
    a.free(y);
  }
  a.empty_cache(0);
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

namespace {
// Whether the mapping holding `p` was advised for huge pages ("hg" in smaps'
// VmFlags): the advice is ours, whether the kernel has THP or not.
bool advised_huge(const void* p) {
  FILE* f = std::fopen("/proc/self/smaps", "r");
  if (!f) return false;
  char line[512];
  bool in_vma = false, advised = false;
  const auto addr = reinterpret_cast<uintptr_t>(p);
  while (std::fgets(line, sizeof line, f)) {
    unsigned long lo = 0, hi = 0;
    if (std::sscanf(line, "%lx-%lx ", &lo, &hi) == 2 && std::strchr(line, '-') < std::strchr(line, ' ')) {
      in_vma = addr >= lo && addr < hi;
    } else if (in_vma && std::strncmp(line, "VmFlags:", 8) == 0) {
      advised = std::strstr(line, " hg") != nullptr;
      break;
    }
  }
  std::fclose(f);
  return advised;
}
}  // namespace

// Medium blocks (k/v projection weights: 442 KB) share 2 MiB huge-page slabs:
// a slab counts once in reserved bytes and segments, its blocks in allocated
// bytes; a partly used slab stays through empty_cache, an empty one goes.
TEST(CachingAllocator, MediumBlocksShareHugePageSlabs) {
  auto& a = CachingAllocator::instance();
  a.empty_cache(0);
  const size_t n = 576 * 192 * 4;   // rounds to the 448 KiB class: 4 per 2 MiB
  const size_t cls = 448 << 10;
  ASSERT_EQ(CachingAllocator::slab_bytes(cls), size_t{2} << 20);
  const auto before = a.stats(0);
  std::vector<void*> p;
  for (int i = 0; i < 5; ++i) p.push_back(a.allocate(0, n));
  const auto base = reinterpret_cast<uintptr_t>(p[0]);
  EXPECT_EQ(base % (size_t{2} << 20), 0u);
  for (int i = 1; i < 4; ++i) EXPECT_EQ(reinterpret_cast<uintptr_t>(p[i]), base + i * cls);
  EXPECT_TRUE(advised_huge(p[0]));
  EXPECT_TRUE(advised_huge(p[4]));
  auto during = a.stats(0);
  EXPECT_EQ(during.reserved_bytes[0].current - before.reserved_bytes[0].current, int64_t{4} << 20);
  EXPECT_EQ(during.segment[0].current - before.segment[0].current, 2);
  EXPECT_EQ(during.allocated_bytes[0].current - before.allocated_bytes[0].current, int64_t(5 * cls));
  EXPECT_EQ(during.requested_bytes[0].current - before.requested_bytes[0].current, int64_t(5 * n));
  EXPECT_EQ(a.block_size(p[1]), cls);
  EXPECT_EQ(a.device_of(static_cast<char*>(p[3]) + cls - 1), 0);

  // The snapshot names each block and the slab holding it.
  size_t in_slab = 0;
  for (const auto& b : a.snapshot()) {
    if (b.segment_address == base) {
      EXPECT_EQ(b.segment_size, size_t{2} << 20);
      in_slab++;
    }
  }
  EXPECT_EQ(in_slab, 4u);

  // A freed block is reused by the fullest slab first.
  a.free(p[1]);
  void* q = a.allocate(0, n);
  EXPECT_EQ(q, p[1]);
  p[1] = q;
  // Empty the first slab but for one block, empty the second: empty_cache
  // returns only the second.
  for (int i : {1, 2, 3, 4}) a.free(p[i]);
  a.empty_cache(0);
  EXPECT_EQ(a.stats(0).reserved_bytes[0].current - before.reserved_bytes[0].current, int64_t{2} << 20);
  EXPECT_EQ(a.device_of(p[4]), -1);
  EXPECT_EQ(a.device_of(p[1]), 0);  // a free block of a live slab is still device memory
  EXPECT_THROW(a.free(p[1]), neuronrt::Error);  // already free
  a.free(p[0]);
  a.empty_cache(0);
  EXPECT_EQ(a.stats(0).reserved_bytes[0].current, before.reserved_bytes[0].current);
  EXPECT_EQ(a.stats(0).segment[0].current, before.segment[0].current);
}

// Large segments are advised for huge pages too, and come from their own
// mapping, whatever glibc's heap holds (docs/runtime.md).
TEST(CachingAllocator, LargeSegmentsAreHugePageMappings) {
  auto& a = CachingAllocator::instance();
  void* p = a.allocate(0, size_t{7} << 19);  // 3.5 MiB: rounded to 4 MiB of huge pages
  EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % (size_t{2} << 20), 0u);
  EXPECT_TRUE(advised_huge(p));
  static_cast<char*>(p)[(size_t{7} << 19) - 1] = 1;
  a.free(p);
  a.empty_cache(0);
  EXPECT_EQ(a.device_of(p), -1);
}

// A slab counts against the budget whole: the block that needs a new slab
// past the budget fails with an OOM after the cache was released, and the
// device stays usable.
TEST(CachingAllocator, SlabsRespectTheBudget) {
  auto& a = CachingAllocator::instance();
  a.empty_cache(1);
  const auto [free0, total] = a.mem_info(1);
  const auto reserved = static_cast<size_t>(a.stats(1).reserved_bytes[0].current);
  a.set_memory_fraction(1, static_cast<double>(reserved + (size_t{3} << 20)) / static_cast<double>(total));
  void* cached = a.allocate(1, 512 << 10);  // 4 in a 2 MiB slab
  a.free(cached);
  std::vector<void*> p;
  for (int i = 0; i < 4; ++i) p.push_back(a.allocate(1, 448 << 10));  // a second slab: 4 MiB > 3 MiB,
  const auto retries = a.stats(1).num_alloc_retries;                   // after releasing the cached one
  EXPECT_GE(retries, 1u);
  EXPECT_THROW(a.allocate(1, 448 << 10), neuronrt::OutOfMemoryError);
  for (void* q : p) a.free(q);
  void* again = a.allocate(1, 448 << 10);
  EXPECT_EQ(a.device_of(again), 1);
  a.free(again);
  a.set_memory_fraction(1, 1.0);
  a.empty_cache(1);
}

// A capture's medium blocks come from slabs of its pool only; when the pool
// ends its slabs serve the device.
TEST(CachingAllocator, PrivatePoolsHaveTheirOwnSlabs) {
  auto& a = CachingAllocator::instance();
  a.empty_cache(0);
  const size_t n = 448 << 10;
  void* outside = a.allocate(0, n);  // a device slab with 3 free blocks
  const neuronrt::MempoolId id{7, 7};
  a.retain_pool(0, id);
  a.begin_allocate_to_pool(0, id);
  void* inside = a.allocate(0, n);
  a.end_allocate_to_pool(0, std::this_thread::get_id());
  EXPECT_NE(reinterpret_cast<uintptr_t>(inside) >> 21, reinterpret_cast<uintptr_t>(outside) >> 21);
  EXPECT_EQ(a.pool_reserved_bytes(0, id), size_t{2} << 20);
  a.free(inside);
  void* other = a.allocate(0, n);  // not the pool's free block
  EXPECT_NE(other, inside);
  a.release_pool(0, id);
  EXPECT_EQ(a.pool_reserved_bytes(0, id), 0u);
  a.free(other);
  a.free(outside);
  const auto reserved = a.stats(0).reserved_bytes[0].current;
  a.empty_cache(0);  // both slabs are empty now
  EXPECT_EQ(a.stats(0).reserved_bytes[0].current, reserved - (int64_t{4} << 20));
}
