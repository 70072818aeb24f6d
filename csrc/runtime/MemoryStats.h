// Memory statistics and events of device memory, in the CUDA caching
// allocator's vocabulary (allocated/reserved/active bytes, current/peak/
// allocated/freed, retries, OOMs), so torch.neuron.memory_stats() reads like
// torch.cuda.memory_stats(). Part of the runtime API (Runtime.h); the caching
// allocator (CachingAllocator.h) produces them.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <utility>

namespace neuronrt {

// A private memory pool's id, as torch's MempoolId_t ({0, 0}: none; graphs,
// Graph.h).
using MempoolId = std::pair<uint64_t, uint64_t>;

// Blocks up to this size come from the small pool.
constexpr size_t kSmallPoolLimit = size_t{1} << 20;

struct Stat {
  int64_t current = 0;
  int64_t peak = 0;
  int64_t allocated = 0;  // accumulated increases
  int64_t freed = 0;      // accumulated decreases
  void increase(int64_t n);
  void decrease(int64_t n);
  void reset_peak() { peak = current; }
  void reset_accumulated() { allocated = freed = 0; }
};

// Index into a StatArray.
enum StatPool : int { kAllPools = 0, kSmallPool = 1, kLargePool = 2 };
using StatArray = std::array<Stat, 3>;

struct DeviceStats {
  StatArray allocation;       // COUNT: live client allocations
  StatArray segment;          // COUNT: segments obtained from the system
  StatArray active;           // COUNT: blocks in use
  StatArray allocated_bytes;  // SUM: bytes in client allocations (rounded)
  StatArray reserved_bytes;   // SUM: bytes held from the system (used + cached)
  StatArray active_bytes;     // SUM: bytes in active blocks
  StatArray requested_bytes;  // SUM: bytes the client asked for (unrounded)
  int64_t num_alloc_retries = 0;  // cache flushes forced by the capacity
  int64_t num_ooms = 0;
  int64_t num_device_alloc = 0;
  int64_t num_device_free = 0;
};

// What the allocator did, for memory-history recording (see set_observer).
struct AllocatorEvent {
  enum class Action { Alloc, Free, SegmentAlloc, SegmentFree, Oom };
  Action action;
  int device;
  uintptr_t address;
  size_t size;  // rounded block size (requested size for Oom)
};
// Called with the allocator's lock held: it must not call the allocator.
using AllocatorObserver = void (*)(const AllocatorEvent&);

// One block of a snapshot, and the segment holding it: a segment is one
// block, or a slab of equal medium blocks (CachingAllocator.h).
struct BlockInfo {
  int device;
  uintptr_t address;
  size_t size;
  size_t requested;
  bool in_use;
  uintptr_t segment_address = 0;
  size_t segment_size = 0;
};

}  // namespace neuronrt
