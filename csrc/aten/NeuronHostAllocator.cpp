// Pinned host memory for PrivateUse1: what pin_memory() and
// DataLoader(pin_memory=True) allocate. Pinned blocks are tracked exactly so
// is_pinned() answers for them and only them.
#include <ATen/core/CachingHostAllocator.h>

#include <cstdlib>
#include <cstring>
#include <mutex>
#include <unordered_map>

#include "NeuronHostAllocator.h"

namespace at::neuron {
namespace {

class NeuronHostAllocator final : public at::HostAllocator {
 public:
  c10::DataPtr allocate(size_t nbytes) override {
    void* ptr = nullptr;
    if (nbytes > 0) {
      ptr = std::aligned_alloc(64, (nbytes + 63) / 64 * 64);
      TORCH_CHECK_WITH(OutOfMemoryError, ptr, "failed to allocate ", nbytes, " bytes of pinned host memory");
      std::lock_guard<std::mutex> lock(mutex_);
      live_.emplace(ptr, nbytes);
      current_ += nbytes;
      peak_ = std::max(peak_, current_);
      ++allocations_;
    }
    return {ptr, ptr, &host_free, c10::Device(c10::DeviceType::CPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &host_free; }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    std::memcpy(dest, src, count);
  }
  bool record_event(void*, void*, c10::Stream) override { return true; }
  void empty_cache() override {}
  at::HostStats get_stats() override {
    std::lock_guard<std::mutex> lock(mutex_);
    at::HostStats s;
    s.allocated_bytes.current = static_cast<int64_t>(current_);
    s.allocated_bytes.peak = static_cast<int64_t>(peak_);
    s.allocations.current = static_cast<int64_t>(live_.size());
    s.allocations.allocated = static_cast<int64_t>(allocations_);
    return s;
  }
  void reset_accumulated_stats() override {
    std::lock_guard<std::mutex> lock(mutex_);
    allocations_ = 0;
  }
  void reset_peak_stats() override {
    std::lock_guard<std::mutex> lock(mutex_);
    peak_ = current_;
  }

  bool contains(const void* ptr) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (live_.empty()) return false;
    auto addr = reinterpret_cast<uintptr_t>(ptr);
    for (auto& [base, size] : live_) {
      auto b = reinterpret_cast<uintptr_t>(base);
      if (addr >= b && addr < b + size) return true;
    }
    return false;
  }

  void release(void* ptr) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto it = live_.find(ptr);
      if (it != live_.end()) {
        current_ -= it->second;
        live_.erase(it);
      }
    }
    std::free(ptr);
  }

 private:
  static void host_free(void* ptr);
  std::mutex mutex_;
  std::unordered_map<void*, size_t> live_;
  size_t current_ = 0, peak_ = 0, allocations_ = 0;
};

NeuronHostAllocator g_host_allocator;

void NeuronHostAllocator::host_free(void* ptr) {
  if (ptr) g_host_allocator.release(ptr);
}

REGISTER_HOST_ALLOCATOR(at::kPrivateUse1, &g_host_allocator);

}  // namespace

bool is_pinned_ptr(const void* ptr) { return g_host_allocator.contains(ptr); }

}  // namespace at::neuron
