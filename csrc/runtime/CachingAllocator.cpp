#include "CachingAllocator.h"

#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <memory>

#include "Device.h"
#include "Error.h"
#include "Process.h"
#include "Protect.h"
#include "Registry.h"

namespace neuronrt {
namespace {

const size_t kPageBytes = static_cast<size_t>(::sysconf(_SC_PAGESIZE));

// Private segments of 1.5 MiB or more start on a huge-page boundary and ask
// for transparent huge pages: kernels that stream large tensors (the GEMV
// over a decode step's weights) then read at the memory's rate. At one thread
// on a Zen 4 VM, SmolLM2's decode weights read at 19-20 GB/s in 4 KiB pages,
// 21-22 with huge pages over only the huge pages each segment covers, 25 over
// whole segments (the lm_head alone: 26 against 34-36). A segment is
// therefore rounded up to whole huge pages when that adds at most a third
// (3.5 -> 4 MiB); otherwise only the huge pages it covers get them (2.5 MiB:
// one), so no segment grows by more than a third. Medium blocks share slabs
// of whole huge pages instead (slab_bytes). A hint: without THP (or with
// `never`), the segment is an ordinary one.
//
// These segments are mapped from the kernel, not taken from malloc: glibc
// serves large aligned requests from its heap once its mmap threshold has
// grown (every free of a large mmapped chunk raises it, up to 32 MiB), and
// heap memory that was touched before is backed by 4 KiB pages already;
// madvise does not change pages that exist. A fresh mapping advised before
// its first touch gets huge pages whatever the process did before.
constexpr size_t kHugePageBytes = size_t{2} << 20;

size_t round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }

// `size` rounded up to a quarter step between powers of two: internal waste
// is bounded to 25 %.
size_t quarter_step(size_t size) {
  const size_t pow2 = size_t{1} << (63 - __builtin_clzll(size));
  return round_up(size, pow2 / 4);
}

// `bytes` (whole pages) at a huge-page boundary, the first `huge` of them
// advised for huge pages; nullptr when the kernel refuses.
void* map_huge_aligned(size_t bytes, size_t huge) {
  const size_t span = bytes + kHugePageBytes;
  void* raw = ::mmap(nullptr, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) return nullptr;
  const auto base = reinterpret_cast<uintptr_t>(raw);
  const uintptr_t start = round_up(base, kHugePageBytes);
  if (start > base) ::munmap(raw, start - base);
  if (base + span > start + bytes) ::munmap(reinterpret_cast<void*>(start + bytes), base + span - start - bytes);
  ::madvise(reinterpret_cast<void*>(start), huge, MADV_HUGEPAGE);
  return reinterpret_cast<void*>(start);
}

// A private segment of `bytes`; `*mapped` is its mapping's length (0: malloc).
void* allocate_private(size_t align, size_t bytes, size_t* mapped) {
  const size_t whole = round_up(bytes, kHugePageBytes);
  const size_t huge = whole - bytes <= bytes / 3 ? whole : bytes / kHugePageBytes * kHugePageBytes;
  *mapped = 0;
  if (huge == 0) return std::aligned_alloc(align, bytes);
  const size_t length = round_up(std::max(bytes, huge), kPageBytes);
  void* ptr = map_huge_aligned(length, huge);
  if (ptr) *mapped = length;
  return ptr;
}

// Shareable segments each hold an fd: use at most a quarter of the
// process's limit, so sockets and files keep working.
size_t shared_fd_budget() {
  static const size_t budget = [] {
    struct rlimit rl {};
    if (::getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY) return size_t{1024};
    return static_cast<size_t>(rl.rlim_cur) / 4;
  }();
  return budget;
}

StatPool pool_of(size_t size) {
  return size <= CachingAllocator::kSmallSize ? kSmallPool : kLargePool;
}

void publish(int device, const DeviceStats& s) {
  registry_memory(device, static_cast<uint64_t>(s.allocated_bytes[kAllPools].current),
                  static_cast<uint64_t>(s.reserved_bytes[kAllPools].current));
}

void update(StatArray& stats, size_t size, int64_t delta) {
  for (int idx : {static_cast<int>(kAllPools), static_cast<int>(pool_of(size))}) {
    if (delta >= 0) stats[idx].increase(delta);
    else stats[idx].decrease(-delta);
  }
}

}  // namespace

void Stat::increase(int64_t n) {
  current += n;
  if (current > peak) peak = current;
  allocated += n;
}

void Stat::decrease(int64_t n) {
  current -= n;
  freed += n;
}

CachingAllocator& CachingAllocator::instance() {
  // Leaked on purpose: tensors may be freed during interpreter shutdown,
  // after static destructors would have run.
  static CachingAllocator* inst = new CachingAllocator();
  return *inst;
}

size_t CachingAllocator::round_size(size_t size) {
  if (size <= kSmallSize) {
    constexpr size_t kStep = 512;
    return std::max(kStep, (size + kStep - 1) / kStep * kStep);
  }
  return quarter_step(size);
}

// Slab blocks come in the quarter-power-of-two classes (256, 320, 384, 448,
// 512, 640, 768, 896, 1024, 1280 KiB): at most a quarter of internal waste,
// as above 1 MiB, and ten classes, so few slabs are partly used at a time. A
// slab is the fewest huge pages (up to four) its class fills to within an
// eighth (448 KiB: 4 in 2 MiB; 768 KiB: 5 in 4 MiB).
namespace {
size_t slab_class(size_t rounded) { return quarter_step(rounded); }
}  // namespace

size_t CachingAllocator::slab_bytes(size_t block) {
  if (block < kSlabMin || block >= kSlabMax) return 0;
  for (size_t pages = 1; pages < 4; ++pages) {
    const size_t bytes = pages * kHugePageBytes;
    if (bytes % block <= bytes / 8) return bytes;
  }
  return 4 * kHugePageBytes;
}

bool CachingAllocator::use_slabs(size_t rounded) const {
  return rounded >= kSlabMin && slab_class(rounded) < kSlabMax && !protect_enabled() && !shareable_ &&
         shareable_holds_ == 0;
}

// The fullest slab of this class and owner with a free block: filling those
// first lets the others empty, and empty_cache returns empty ones.
CachingAllocator::Block* CachingAllocator::take_from_slab(DeviceState& ds, PrivatePool* pool, size_t size) {
  auto best = ds.open_slabs.end();
  for (auto it = ds.open_slabs.begin(); it != ds.open_slabs.end(); ++it) {
    if ((*it)->block_size != size || (*it)->pool != pool) continue;
    if (best == ds.open_slabs.end() || (*it)->used > (*best)->used) best = it;
  }
  if (best == ds.open_slabs.end()) return nullptr;
  Slab* slab = *best;
  Block* b = slab->free.back();
  slab->free.pop_back();
  slab->used++;
  if (slab->free.empty()) {  // full: no longer looked at
    *best = ds.open_slabs.back();
    ds.open_slabs.pop_back();
  }
  return b;
}

CachingAllocator::Block* CachingAllocator::new_slab(DeviceState& ds, int device, PrivatePool* pool, size_t size) {
  const size_t bytes = slab_bytes(size);
  void* ptr = map_huge_aligned(bytes, bytes);
  if (!ptr) return nullptr;
  auto slab = std::make_unique<Slab>(Slab{device, ptr, bytes, size, pool});
  slab->slots = bytes / size;
  for (size_t i = slab->slots; i-- > 0;) {  // lowest address handed out first
    auto* b = new Block{device, size, 0, static_cast<char*>(ptr) + i * size, false};
    b->slab = slab.get();
    segments_.emplace(reinterpret_cast<uintptr_t>(b->ptr), b);
    slab->free.push_back(b);
  }
  notify(AllocatorEvent::Action::SegmentAlloc, device, ptr, bytes);
  update(ds.stats.segment, size, 1);
  update(ds.stats.reserved_bytes, size, static_cast<int64_t>(bytes));
  ds.stats.num_device_alloc++;
  ds.open_slabs.push_back(slab.get());
  ds.slabs.push_back(std::move(slab));
  return take_from_slab(ds, pool, size);
}

void CachingAllocator::release_slab(DeviceState& ds, Slab* slab) {
  notify(AllocatorEvent::Action::SegmentFree, slab->device, slab->ptr, slab->bytes);
  update(ds.stats.segment, slab->block_size, -1);
  update(ds.stats.reserved_bytes, slab->block_size, -static_cast<int64_t>(slab->bytes));
  ds.stats.num_device_free++;
  for (Block* b : slab->free) {
    segments_.erase(reinterpret_cast<uintptr_t>(b->ptr));
    delete b;
  }
  ::munmap(slab->ptr, slab->bytes);
  std::erase(ds.open_slabs, slab);
  ds.slabs.erase(std::find_if(ds.slabs.begin(), ds.slabs.end(), [&](const auto& s) { return s.get() == slab; }));
}

CachingAllocator::DeviceState& CachingAllocator::state(int device) const {
  check_device(device);
  if (devices_.empty()) {
    for (int i = 0; i < device_count(); ++i) {
      auto ds = std::make_unique<DeviceState>();
      ds->device = i;
      ds->capacity = device_properties(i).total_memory;
      devices_.push_back(std::move(ds));
    }
  }
  return *devices_[device];
}

CachingAllocator::Block* CachingAllocator::take_cached(DeviceState& ds, size_t size) {
  auto it = ds.cache.lower_bound(size);
  // Blocks are not split, so only reuse one that wastes at most a quarter.
  if (it == ds.cache.end() || it->first > size + size / 4) return nullptr;
  auto node = ds.cache.extract(it);
  Block* b = node.mapped();
  ds.spare_nodes.push_back(std::move(node));
  return b;
}

void CachingAllocator::release_block(DeviceState& ds, Block* b) {
  notify(AllocatorEvent::Action::SegmentFree, b->device, b->ptr, b->size);
  update(ds.stats.segment, b->size, -1);
  update(ds.stats.reserved_bytes, b->size, -static_cast<int64_t>(b->size));
  ds.stats.num_device_free++;
  segments_.erase(reinterpret_cast<uintptr_t>(b->ptr));
  if (protect_enabled()) protect_remove_segment(b->ptr);  // unmaps a private segment
  if (b->fd >= 0) {
    destroy_shared_mapping({b->fd, b->ptr, b->mapped});
    shared_fds_--;
    shared_releases_++;
  } else if (b->mapped_private) {
    ::munmap(b->ptr, b->mapped);
  } else if (!protect_enabled()) {
    std::free(b->ptr);
  }
  delete b;
}

void CachingAllocator::release_cached(DeviceState& ds) {
  bool released = !ds.cache.empty();
  for (auto& [size, b] : ds.cache) release_block(ds, b);
  ds.cache.clear();
  // Wholly free slabs of no private pool; a partly used one stays.
  for (size_t i = ds.slabs.size(); i-- > 0;) {
    Slab* slab = ds.slabs[i].get();
    if (slab->used == 0 && !slab->pool) {
      release_slab(ds, slab);
      released = true;
    }
  }
  if (released) publish(ds.device, ds.stats);
}

bool CachingAllocator::has_cached(const DeviceState& ds) const {
  if (!ds.cache.empty()) return true;
  for (const auto& slab : ds.slabs) {
    if (slab->used == 0 && !slab->pool) return true;
  }
  return false;
}

void CachingAllocator::set_reclaim_hook(ReclaimHook hook) {
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  reclaim_hook_ = hook;
}

void* CachingAllocator::allocate(int device, size_t size) {
  lazy_init();  // before the lock: a bad fork may have inherited it held
  if (size == 0) return nullptr;
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  DeviceState& ds = state(device);
  size_t rounded = round_size(size);
  const bool slab = use_slabs(rounded);
  if (slab) rounded = slab_class(rounded);
  // Bytes a new segment for this request reserves.
  const size_t needed = slab ? slab_bytes(rounded) : rounded;
  // A capturing thread allocates from its graph's pool only: blocks of the
  // device's cache may be handed to other work while the graph replays.
  PrivatePool* pool = nullptr;
  if (!allocating_to_pool_.empty()) {
    auto p = allocating_to_pool_.find({device, std::this_thread::get_id()});
    if (p != allocating_to_pool_.end()) pool = p->second;
  }
  auto take = [&]() -> Block* {
    if (slab) return take_from_slab(ds, pool, rounded);
    if (!pool) return take_cached(ds, rounded);
    auto it = pool->cache.lower_bound(rounded);
    if (it == pool->cache.end() || it->first > rounded + rounded / 4) return nullptr;
    Block* cached = it->second;
    pool->cache.erase(it);
    return cached;
  };
  auto reserved = [&] { return static_cast<size_t>(ds.stats.reserved_bytes[kAllPools].current); };
  Block* b = take();
  if (!b && !pool && reserved() + needed > ds.capacity && reclaim_hook_) {
    reclaim_hook_(device);
    b = take();
  }
  if (!b) {
    if (reserved() + needed > ds.capacity && has_cached(ds)) {
      ds.stats.num_alloc_retries++;
      release_cached(ds);
    }
    if (slab) {
      if (reserved() + needed <= ds.capacity) b = new_slab(ds, device, pool, rounded);
    } else {
      void* ptr = nullptr;
      SharedMapping shared;
      size_t mapped = 0;
      if (reserved() + rounded <= ds.capacity) {
        // Protect mode needs whole pages per segment.
        size_t align = protect_enabled() ? protect_page_size() : kAlignment;
        size_t bytes = (rounded + align - 1) / align * align;
        if ((shareable_ || shareable_holds_ > 0) && rounded >= kShareableMin && shared_fds_ < shared_fd_budget()) {
          shared = create_shared_mapping((rounded + kPageBytes - 1) / kPageBytes * kPageBytes);
          ptr = shared.base;  // nullptr: fall back to private memory
          bytes = shared.bytes;
        }
        if (ptr) {
          if (protect_enabled()) protect_add_segment(ptr, bytes);
        } else {
          ptr = protect_enabled() ? protect_map_segment(bytes) : allocate_private(align, bytes, &mapped);
        }
      }
      if (ptr) {
        b = new Block{device, rounded, size, ptr, false};
        if (shared.base) {
          b->fd = shared.fd;
          b->serial = ++shared_serial_;
          b->mapped = shared.bytes;
          shared_fds_++;
        } else if (mapped) {
          b->mapped_private = true;
          b->mapped = mapped;
        }
        b->pool = pool;
        segments_.emplace(reinterpret_cast<uintptr_t>(ptr), b);
        notify(AllocatorEvent::Action::SegmentAlloc, device, ptr, rounded);
        update(ds.stats.segment, rounded, 1);
        update(ds.stats.reserved_bytes, rounded, static_cast<int64_t>(rounded));
        ds.stats.num_device_alloc++;
      }
    }
    if (!b) {
      ds.stats.num_ooms++;
      notify(AllocatorEvent::Action::Oom, device, nullptr, size);
      throw OutOfMemoryError(device, size,
                             static_cast<size_t>(ds.stats.allocated_bytes[kAllPools].current),
                             reserved(), ds.capacity);
    }
  }
  b->in_use = true;
  if (protect_enabled()) protect_set_live(b->ptr, true);
  b->requested = size;
  update(ds.stats.allocation, b->size, 1);
  update(ds.stats.active, b->size, 1);
  update(ds.stats.allocated_bytes, b->size, static_cast<int64_t>(b->size));
  update(ds.stats.active_bytes, b->size, static_cast<int64_t>(b->size));
  update(ds.stats.requested_bytes, b->size, static_cast<int64_t>(size));
  notify(AllocatorEvent::Action::Alloc, device, b->ptr, b->size);
  publish(device, ds.stats);
  return b->ptr;
}

void CachingAllocator::free(void* ptr) {
  // In a bad fork the memory goes away with the process; the lock may be held.
  if (!ptr || in_bad_fork()) return;
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  auto it = segments_.find(reinterpret_cast<uintptr_t>(ptr));
  if (it == segments_.end() || !it->second->in_use) {
    throw Error("neuron allocator: free of a pointer it does not own");
  }
  Block* b = it->second;
  DeviceState& ds = state(b->device);
  b->in_use = false;
  if (protect_enabled()) protect_set_live(b->ptr, false);
  update(ds.stats.allocation, b->size, -1);
  update(ds.stats.active, b->size, -1);
  update(ds.stats.allocated_bytes, b->size, -static_cast<int64_t>(b->size));
  update(ds.stats.active_bytes, b->size, -static_cast<int64_t>(b->size));
  update(ds.stats.requested_bytes, b->size, -static_cast<int64_t>(b->requested));
  if (b->slab) {
    if (b->slab->free.empty()) ds.open_slabs.push_back(b->slab);
    b->slab->used--;
    b->slab->free.push_back(b);
  } else if (b->pool) {  // first among its size: handed out next (DeviceState::cache)
    b->pool->cache.emplace_hint(b->pool->cache.lower_bound(b->size), b->size, b);
  } else if (ds.spare_nodes.empty()) {
    ds.cache.emplace_hint(ds.cache.lower_bound(b->size), b->size, b);
  } else {
    auto node = std::move(ds.spare_nodes.back());
    ds.spare_nodes.pop_back();
    node.key() = b->size;
    node.mapped() = b;
    ds.cache.insert(ds.cache.lower_bound(b->size), std::move(node));
  }
  notify(AllocatorEvent::Action::Free, b->device, b->ptr, b->size);
  publish(b->device, ds.stats);
}

void CachingAllocator::empty_cache(int device) {
  if (in_bad_fork()) throw BadForkError();
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  if (device >= 0) {
    release_cached(state(device));
    return;
  }
  for (int d = 0; d < device_count(); ++d) release_cached(state(d));
}

DeviceStats CachingAllocator::stats(int device) const {
  if (in_bad_fork()) throw BadForkError();
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  return state(device).stats;
}

void CachingAllocator::reset_peak_stats(int device) {
  if (in_bad_fork()) throw BadForkError();
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  DeviceStats& s = state(device).stats;
  for (StatArray* a : {&s.allocation, &s.segment, &s.active, &s.allocated_bytes,
                       &s.reserved_bytes, &s.active_bytes, &s.requested_bytes}) {
    for (Stat& st : *a) st.reset_peak();
  }
}

void CachingAllocator::reset_accumulated_stats(int device) {
  if (in_bad_fork()) throw BadForkError();
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  DeviceStats& s = state(device).stats;
  for (StatArray* a : {&s.allocation, &s.segment, &s.active, &s.allocated_bytes,
                       &s.reserved_bytes, &s.active_bytes, &s.requested_bytes}) {
    for (Stat& st : *a) st.reset_accumulated();
  }
  s.num_alloc_retries = s.num_ooms = s.num_device_alloc = s.num_device_free = 0;
}

std::pair<size_t, size_t> CachingAllocator::mem_info(int device) const {
  if (in_bad_fork()) throw BadForkError();
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  const DeviceState& ds = state(device);
  size_t reserved = static_cast<size_t>(ds.stats.reserved_bytes[kAllPools].current);
  return {ds.capacity - std::min(reserved, ds.capacity), ds.capacity};
}

int CachingAllocator::device_of(const void* ptr) const {
  if (in_bad_fork()) return -1;
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  auto addr = reinterpret_cast<uintptr_t>(ptr);
  auto it = segments_.upper_bound(addr);
  if (it == segments_.begin()) return -1;
  --it;
  const Block* b = it->second;
  return addr < it->first + b->size ? b->device : -1;
}

size_t CachingAllocator::block_size(const void* ptr) const {
  if (in_bad_fork()) return 0;
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  auto it = segments_.find(reinterpret_cast<uintptr_t>(ptr));
  return it == segments_.end() ? 0 : it->second->size;
}

void CachingAllocator::set_observer(AllocatorObserver observer) {
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  observer_ = observer;
}

std::vector<BlockInfo> CachingAllocator::snapshot() const {
  if (in_bad_fork()) throw BadForkError();
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  std::vector<BlockInfo> out;
  out.reserve(segments_.size());
  for (const auto& [addr, b] : segments_) {
    const uintptr_t seg = b->slab ? reinterpret_cast<uintptr_t>(b->slab->ptr) : addr;
    out.push_back({b->device, addr, b->size, b->requested, b->in_use, seg, b->slab ? b->slab->bytes : b->size});
  }
  return out;
}

void CachingAllocator::set_memory_fraction(int device, double fraction) {
  if (!(fraction >= 0.0 && fraction <= 1.0)) {
    throw Error("memory fraction must be in [0, 1], got " + std::to_string(fraction));
  }
  if (in_bad_fork()) throw BadForkError();
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  state(device).capacity = static_cast<size_t>(static_cast<double>(device_properties(device).total_memory) * fraction);
}

void CachingAllocator::set_shareable(bool enabled) {
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  shareable_ = enabled;
}

std::shared_ptr<void> CachingAllocator::hold_shareable() {
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  ++shareable_holds_;
  return std::shared_ptr<void>(nullptr, [this](void*) {
    std::lock_guard<std::recursive_mutex> lock(mutex_);
    --shareable_holds_;
  });
}

SharedBuffer CachingAllocator::shared_buffer(const void* ptr, size_t bytes) const {
  if (in_bad_fork()) return {};
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  const auto addr = reinterpret_cast<uintptr_t>(ptr);
  auto it = segments_.upper_bound(addr);
  if (it == segments_.begin()) return {};
  --it;
  const Block* b = it->second;
  if (b->fd < 0 || addr - it->first > b->mapped || bytes > b->mapped - (addr - it->first)) return {};
  return {b->serial, b->fd, b->mapped, addr - it->first, shared_releases_};
}

void CachingAllocator::retain_pool(int device, MempoolId id) {
  if (id == MempoolId{0, 0}) throw Error("neuron allocator: {0, 0} names no memory pool");
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  state(device);  // checks the device
  auto& pool = pools_[{device, id.first, id.second}];
  if (!pool) pool = std::make_unique<PrivatePool>();
  pool->holders++;
}

void CachingAllocator::release_pool(int device, MempoolId id) {
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  auto it = pools_.find({device, id.first, id.second});
  if (it == pools_.end() || --it->second->holders > 0) return;
  PrivatePool* pool = it->second.get();
  for (auto& [key, p] : allocating_to_pool_) {
    if (p == pool) throw Error("neuron allocator: releasing a memory pool that a capture allocates from");
  }
  DeviceState& ds = state(device);
  for (auto& [size, b] : pool->cache) {
    b->pool = nullptr;
    ds.cache.emplace(size, b);
  }
  for (auto& [addr, b] : segments_) {
    if (b->pool == pool) b->pool = nullptr;  // to the device's cache when freed
  }
  for (auto& slab : ds.slabs) {
    if (slab->pool == pool) slab->pool = nullptr;
  }
  pools_.erase(it);
}

void CachingAllocator::begin_allocate_to_pool(int device, MempoolId id) {
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  auto it = pools_.find({device, id.first, id.second});
  if (it == pools_.end()) throw Error("neuron allocator: allocating to a memory pool that no graph holds");
  if (!allocating_to_pool_.emplace(std::make_pair(device, std::this_thread::get_id()), it->second.get()).second) {
    throw Error("neuron allocator: this thread already allocates to a memory pool on neuron:" +
                std::to_string(device));
  }
}

void CachingAllocator::end_allocate_to_pool(int device, std::thread::id thread) {
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  allocating_to_pool_.erase({device, thread});
}

size_t CachingAllocator::pool_reserved_bytes(int device, MempoolId id) const {
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  auto it = pools_.find({device, id.first, id.second});
  if (it == pools_.end()) return 0;
  size_t bytes = 0;
  for (const auto& [addr, b] : segments_) {
    if (b->pool == it->second.get()) bytes += b->size;
  }
  for (const auto& slab : state(device).slabs) {
    if (slab->pool == it->second.get()) bytes += slab->bytes;
  }
  return bytes;
}

}  // namespace neuronrt
