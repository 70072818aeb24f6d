#include "Runtime.h"

#include <cstring>
#include <functional>

#include "CachingAllocator.h"
#include "Protect.h"

namespace neuronrt {

std::shared_ptr<void> host_access() { return std::make_shared<DeviceAccess>(); }

namespace {
// Before an allocation fails: queued kernels hold the tensors they use, so let
// them run and free those that have. (The allocation may come from inside a
// synchronous launch, which is not waited for.)
void reclaim(int device) {
  for (Stream* s : all_streams(device)) s->wait_queued();
  release_finished_kernels(device);
}
}  // namespace

void* malloc(int device, size_t bytes) {
  static const bool hooked = [] {
    CachingAllocator::instance().set_reclaim_hook(&reclaim);
    return true;
  }();
  (void)hooked;
  return CachingAllocator::instance().allocate(device, bytes);
}

void release_finished_kernels(int device) {
  for (Stream* s : all_streams(device)) s->release_finished();
}

void empty_cache(int device) {
  const int first = device < 0 ? 0 : device;
  const int last = device < 0 ? device_count() : device + 1;
  for (int d = first; d < last; ++d) release_finished_kernels(d);
  CachingAllocator::instance().empty_cache(device);
}

DeviceStats memory_stats(int device) {
  release_finished_kernels(device);
  return CachingAllocator::instance().stats(device);
}

void reset_peak_memory_stats(int device) { CachingAllocator::instance().reset_peak_stats(device); }

void reset_accumulated_memory_stats(int device) { CachingAllocator::instance().reset_accumulated_stats(device); }

std::pair<size_t, size_t> mem_get_info(int device) { return CachingAllocator::instance().mem_info(device); }

void set_memory_fraction(int device, double fraction) {
  CachingAllocator::instance().set_memory_fraction(device, fraction);
}

size_t allocation_size(const void* ptr) { return CachingAllocator::instance().block_size(ptr); }

std::vector<BlockInfo> memory_snapshot() {
  for (int d = 0; d < device_count(); ++d) release_finished_kernels(d);
  return CachingAllocator::instance().snapshot();
}

void set_memory_observer(AllocatorObserver observer) { CachingAllocator::instance().set_observer(observer); }

void free(void* ptr) noexcept {
  try {
    CachingAllocator::instance().free(ptr);
  } catch (...) {
    // A pointer the allocator does not own: nothing of ours to release.
  }
}

int pointer_device(const void* ptr) noexcept {
  try {
    return CachingAllocator::instance().device_of(ptr);
  } catch (...) {
    return -1;
  }
}

void memcpy(void* dst, const void* src, size_t bytes, MemcpyKind kind, Stream& stream) {
  if (bytes == 0) return;
  // One address space on the host runtime; the kind names the copy.
  const char* name = kind == MemcpyKind::HostToDevice   ? "Memcpy HtoD"
                     : kind == MemcpyKind::DeviceToHost ? "Memcpy DtoH"
                                                        : "Memcpy DtoD";
  auto body = [&] { std::memcpy(dst, src, bytes); };
  stream.launch(std::ref(body), name);  // (a reference: no std::function allocation)
}

void memset(void* dst, int value, size_t bytes, Stream& stream) {
  if (bytes == 0) return;
  auto body = [&] { std::memset(dst, value, bytes); };
  stream.launch(std::ref(body), "Memset");
}

void launch_async(Stream& stream, std::unique_ptr<Kernel> kernel) { stream.enqueue(std::move(kernel)); }

}  // namespace neuronrt
