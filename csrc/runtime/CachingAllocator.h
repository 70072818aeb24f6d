// Per-device caching allocator for NeuronCore HBM.
//
// Blocks are rounded to size classes (512 B steps below 1 MiB, quarter powers
// of two above) and kept in a per-device cache when freed, so steady-state
// training and decoding do not touch the system allocator. Statistics follow
// the CUDA caching allocator's vocabulary (allocated/reserved/active bytes,
// current/peak/allocated/freed, retries, OOMs) so torch.neuron.memory_stats()
// reads like torch.cuda.memory_stats().
// Private pools (device graphs, Graph.h) keep their own cache: blocks made
// for a capture are reused only by that pool's graphs while one lives.
// Medium blocks (256 KiB to 1.5 MiB) are carved out of shared huge-page slabs
// (a segment of whole 2 MiB pages holding blocks of one size class), as the
// CUDA allocator's small pool splits 2 MiB segments: they then read at the
// rate of huge pages too (CachingAllocator.cpp, docs/runtime.md).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <tuple>
#include <utility>
#include <unordered_map>
#include <vector>

#include "MemoryStats.h"
#include "PeerMemory.h"

namespace neuronrt {

class CachingAllocator {
 public:
  static constexpr size_t kSmallSize = kSmallPoolLimit;
  static constexpr size_t kAlignment = 64;
  // Rounded sizes in [kSlabMin, kSlabMax) come from slabs (not in protect
  // mode, nor while device memory is shareable: those need a segment each).
  static constexpr size_t kSlabMin = size_t{256} << 10;
  static constexpr size_t kSlabMax = size_t{3} << 19;
  // The slab size for blocks of rounded size `block` (0: not a slab size).
  static size_t slab_bytes(size_t block);

  static CachingAllocator& instance();

  // Returns nullptr for size 0. Throws OutOfMemoryError when the device's
  // capacity would be exceeded after releasing the cache.
  void* allocate(int device, size_t size);
  // Returns the block to its device's cache. Unknown pointers throw Error.
  void free(void* ptr);
  // Releases cached (unused) blocks of `device`, or of every device for -1.
  void empty_cache(int device = -1);

  DeviceStats stats(int device) const;
  void reset_peak_stats(int device);
  void reset_accumulated_stats(int device);
  // (free, total) bytes of the device's HBM budget.
  std::pair<size_t, size_t> mem_info(int device) const;

  // Device owning the allocation that contains `ptr`, or -1. Safe to call
  // without any Python lock; takes only the allocator mutex.
  int device_of(const void* ptr) const;
  // Rounded size of the live block starting at `ptr` (0 if unknown).
  size_t block_size(const void* ptr) const;

  static size_t round_size(size_t size);

  // Installs (or, with nullptr, removes) the observer of allocator events.
  void set_observer(AllocatorObserver observer);
  // Called (lock held) before an allocation fails for lack of memory: it may
  // free device memory (queued kernels release their tensors once run).
  using ReclaimHook = void (*)(int device);
  void set_reclaim_hook(ReclaimHook hook);
  // Every live segment, in use or cached, ordered by address.
  std::vector<BlockInfo> snapshot() const;
  // Caps the device's budget at `fraction` of its HBM capacity, as
  // torch.cuda.set_per_process_memory_fraction does.
  void set_memory_fraction(int device, double fraction);

  // Shareable segments (PeerMemory.h): once enabled, new segments of at least
  // kShareableMin bytes are memfd-backed so that the other processes of an
  // intra-node process group can map them (single-copy collectives). Smaller
  // segments, and any beyond the fd budget, stay private.
  static constexpr size_t kShareableMin = size_t{256} << 10;
  void set_shareable(bool enabled);
  // Shareable while the returned hold lives (counted): the device buffer
  // locator (PeerMemory.h) takes one, so device memory is shareable exactly
  // while an intra-node engine with peer access may publish it.
  std::shared_ptr<void> hold_shareable();
  // The shareable segment holding [ptr, ptr + bytes) (serial 0 if none).
  SharedBuffer shared_buffer(const void* ptr, size_t bytes) const;

  // Private pools. A pool lives while it is retained (a graph holds it);
  // blocks freed into it stay in its cache. At the last release its cached
  // blocks move to the device's cache, and its blocks still in use go there
  // when freed.
  void retain_pool(int device, MempoolId id);
  void release_pool(int device, MempoolId id);
  // Allocations of the calling thread on `device` come from pool `id` (which
  // must be retained) until end_allocate_to_pool for that thread.
  void begin_allocate_to_pool(int device, MempoolId id);
  void end_allocate_to_pool(int device, std::thread::id thread);
  // Bytes of the pool's blocks (in use and cached); 0 for no such pool.
  size_t pool_reserved_bytes(int device, MempoolId id) const;

 private:
  CachingAllocator() = default;

  struct PrivatePool;
  struct Slab;
  struct Block {
    int device;
    size_t size;       // rounded size
    size_t requested;  // client size
    void* ptr;
    bool in_use;
    int fd = -1;          // memfd of a shareable segment
    uint64_t serial = 0;  // its id for peers (0: private)
    size_t mapped = 0;    // its mapped length
    PrivatePool* pool = nullptr;  // the private pool it returns to
    bool mapped_private = false;  // own mmap of `mapped` bytes (munmap on release)
    Slab* slab = nullptr;         // the slab it was carved from
  };
  // A huge-page segment cut into equal blocks. Its blocks stay in segments_
  // (free ones too: they are its cache) until the slab is released whole.
  struct Slab {
    int device;
    void* ptr;
    size_t bytes;
    size_t block_size;
    PrivatePool* pool = nullptr;  // the private pool whose captures it serves
    std::vector<Block*> free;     // its free blocks, highest address first
    size_t used = 0;              // blocks in use
    size_t slots = 0;
  };
  struct PrivatePool {
    std::multimap<size_t, Block*> cache;  // its free blocks by size (as DeviceState's)
    int holders = 0;                      // retain_pool() count
  };
  struct DeviceState {
    // Free blocks by size; among blocks of one size the most recently freed
    // comes first, so take_cached hands it out again: its lines are the
    // likeliest still in cache. (Oldest first, a queue of same-size outputs
    // in flight cycled through them all: 4 MiB eager outputs written cold,
    // 2x the time of the op.)
    std::multimap<size_t, Block*> cache;
    // Nodes of `cache` kept for reuse: moving a block in and out of the
    // cache then allocates nothing.
    std::vector<std::multimap<size_t, Block*>::node_type> spare_nodes;
    DeviceStats stats;
    size_t capacity = 0;  // the budget in force (total_memory × fraction)
    std::vector<std::unique_ptr<Slab>> slabs;
    // The slabs with a free block: an allocation looks at these only (a
    // full slab, the common case of a process's weights, is never visited).
    std::vector<Slab*> open_slabs;
    int device = 0;
  };
  void notify(AllocatorEvent::Action action, int device, const void* ptr, size_t size) const {
    if (observer_) observer_({action, device, reinterpret_cast<uintptr_t>(ptr), size});
  }

  DeviceState& state(int device) const;
  Block* take_cached(DeviceState& ds, size_t size);
  void release_cached(DeviceState& ds);
  bool has_cached(const DeviceState& ds) const;
  void release_block(DeviceState& ds, Block* block);
  Block* take_from_slab(DeviceState& ds, PrivatePool* pool, size_t size);
  Block* new_slab(DeviceState& ds, int device, PrivatePool* pool, size_t size);
  void release_slab(DeviceState& ds, Slab* slab);
  bool use_slabs(size_t rounded) const;

  mutable std::recursive_mutex mutex_;
  mutable std::vector<std::unique_ptr<DeviceState>> devices_;
  // Every live segment (in use or cached), ordered by address.
  std::map<uintptr_t, Block*> segments_;
  AllocatorObserver observer_ = nullptr;
  bool shareable_ = false;
  size_t shareable_holds_ = 0;  // live hold_shareable() results
  size_t shared_fds_ = 0;         // open memfds of live shareable segments
  uint64_t shared_serial_ = 0;    // last serial handed out
  uint64_t shared_releases_ = 0;  // shareable segments released so far
  ReclaimHook reclaim_hook_ = nullptr;
  // Private pools by (device, id), and the threads allocating from one.
  std::map<std::tuple<int, uint64_t, uint64_t>, std::unique_ptr<PrivatePool>> pools_;
  std::map<std::pair<int, std::thread::id>, PrivatePool*> allocating_to_pool_;
};

}  // namespace neuronrt
