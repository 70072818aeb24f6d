#include "NeuronAllocator.h"

#include <c10/core/CachingDeviceAllocator.h>
#include <c10/core/CPUAllocator.h>

#include <cstring>
#include <atomic>
#include <mutex>

#include "NeuronFunctions.h"
#include "csrc/runtime/Runtime.h"

namespace at::neuron {
namespace {

// torch.profiler(profile_memory=True): every device allocation and free.
void report_to_profiler(void* ptr, int64_t delta, int device) {
  if (!c10::memoryProfilingEnabled() || device < 0) return;
  auto s = neuronrt::memory_stats(device);
  c10::reportMemoryUsageToProfiler(ptr, delta, s.allocated_bytes[neuronrt::kAllPools].current,
                                   s.reserved_bytes[neuronrt::kAllPools].current,
                                   c10::Device(c10::DeviceType::PrivateUse1, static_cast<c10::DeviceIndex>(device)));
}

void* rt_allocate(c10::DeviceIndex device, size_t nbytes) {
  void* ptr = rt_call([&] { return neuronrt::malloc(device, nbytes); });
  if (ptr) report_to_profiler(ptr, static_cast<int64_t>(neuronrt::allocation_size(ptr)), device);
  return ptr;
}

void to_c10(const neuronrt::StatArray& in, c10::CachingAllocator::StatArray& out) {
  for (size_t i = 0; i < in.size(); ++i) {
    out[i].current = in[i].current;
    out[i].peak = in[i].peak;
    out[i].allocated = in[i].allocated;
    out[i].freed = in[i].freed;
  }
}

class NeuronDeviceAllocator final : public c10::DeviceAllocator {
 public:
  c10::DataPtr allocate(size_t nbytes) override {
    c10::DeviceIndex device = current_device();
    void* ptr = rt_allocate(device, nbytes);
    return {ptr, ptr, &device_free, device_of_index(device)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &device_free; }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    rt_call([&] {
      neuronrt::memcpy(dest, src, count, neuronrt::MemcpyKind::DeviceToDevice,
                       neuronrt::current_stream(neuronrt::current_device()));
    });
  }
  bool initialized() override { return true; }
  void emptyCache(c10::MempoolId_t) override {
    rt_call([] { neuronrt::empty_cache(); });
  }
  void recordStream(const c10::DataPtr&, c10::Stream) override {}
  c10::CachingDeviceAllocator::DeviceStats getDeviceStats(c10::DeviceIndex device) override {
    // Memory of tensors whose last users were kernels that have run is free.
    auto s = rt_call([&] { return neuronrt::memory_stats(device); });
    c10::CachingDeviceAllocator::DeviceStats out;
    to_c10(s.allocation, out.allocation);
    to_c10(s.segment, out.segment);
    to_c10(s.active, out.active);
    to_c10(s.allocated_bytes, out.allocated_bytes);
    to_c10(s.reserved_bytes, out.reserved_bytes);
    to_c10(s.active_bytes, out.active_bytes);
    to_c10(s.requested_bytes, out.requested_bytes);
    out.num_alloc_retries = s.num_alloc_retries;
    out.num_ooms = s.num_ooms;
    out.num_device_alloc = s.num_device_alloc;
    out.num_device_free = s.num_device_free;
    return out;
  }
  void resetAccumulatedStats(c10::DeviceIndex device) override {
    rt_call([&] { neuronrt::reset_accumulated_memory_stats(device); });
  }
  void resetPeakStats(c10::DeviceIndex device) override {
    rt_call([&] { neuronrt::reset_peak_memory_stats(device); });
  }
  std::pair<size_t, size_t> getMemoryInfo(c10::DeviceIndex device) override {
    return rt_call([&] { return neuronrt::mem_get_info(device); });
  }
};

NeuronDeviceAllocator g_device_allocator;
REGISTER_ALLOCATOR(c10::DeviceType::PrivateUse1, &g_device_allocator);

thread_local StagingScope* tls_staging = nullptr;

}  // namespace

// Sits in front of ATen's CPU allocator. Outside a StagingScope it forwards
// to the allocator it replaced.
class StagingAllocator final : public c10::Allocator {
 public:
  explicit StagingAllocator(c10::Allocator* base) : base_(base) {}

  c10::DataPtr allocate(size_t nbytes) override {
    StagingScope* scope = tls_staging;
    if (!scope) return base_->allocate(nbytes);
    void* ptr = rt_allocate(scope->device_, nbytes);
    if (ptr) scope->staged_.push_back(ptr);
    return {ptr, ptr, &device_free, c10::Device(c10::DeviceType::CPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &raw_delete; }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    std::memcpy(dest, src, count);
  }

  static void raw_delete(void* ptr);
  c10::Allocator* base_;
};

namespace {
StagingAllocator* g_staging = nullptr;
}  // namespace

void StagingAllocator::raw_delete(void* ptr) {
  if (ptr && neuronrt::pointer_device(ptr) >= 0) {
    device_free(ptr);
  } else if (auto del = g_staging->base_->raw_deleter()) {
    del(ptr);
  }
}

void device_free(void* ptr) {
  if (ptr && c10::memoryProfilingEnabled()) {
    const int device = neuronrt::pointer_device(ptr);
    const auto size = static_cast<int64_t>(neuronrt::allocation_size(ptr));
    neuronrt::free(ptr);
    report_to_profiler(ptr, -size, device);
    return;
  }
  neuronrt::free(ptr);
}

c10::Allocator* device_allocator() { return &g_device_allocator; }

StagingScope::StagingScope(c10::DeviceIndex device) : device_(device), prev_(tls_staging) { tls_staging = this; }

StagingScope::~StagingScope() { end(); }

void StagingScope::end() {
  if (!active_) return;
  active_ = false;
  tls_staging = prev_;
}

StorageKind StagingScope::kind_of(const c10::StorageImpl& storage) const {
  if (storage.device_type() == c10::DeviceType::PrivateUse1) return StorageKind::Device;
  const void* data = storage.data();
  if (!data) return storage.nbytes() > 0 ? StorageKind::NoMemory : StorageKind::Host;
  for (const void* p : staged_) {
    if (p == data) return StorageKind::Staged;
  }
  return StorageKind::Host;
}

namespace {
std::atomic<AllocationContextHook> g_context_hook{nullptr};
}  // namespace

void set_allocation_context_hook(AllocationContextHook hook) { g_context_hook.store(hook); }

AllocationContext::AllocationContext() : hook_(g_context_hook.load(std::memory_order_relaxed)) {
  if (hook_) hook_(true);
}

AllocationContext::~AllocationContext() {
  if (hook_) hook_(false);
}

void install_staging_allocator() {
  static std::once_flag once;
  std::call_once(once, [] {
    g_staging = new StagingAllocator(c10::GetCPUAllocator());
    c10::SetCPUAllocator(g_staging, /*priority=*/100);
  });
}

}  // namespace at::neuron
