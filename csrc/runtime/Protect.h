// Protect mode (NEURON_RT_PROTECT=1): device memory is inaccessible to the
// host (PROT_NONE) except while the runtime itself works on it, i.e. inside a
// kernel launch or a runtime copy. A host read or write that bypasses the
// runtime API then faults at the offending instruction instead of silently
// working because device memory happens to be host memory. This is how the
// test suite proves that the PyTorch layer goes through the seam.
//
// Access is process-wide (page protection cannot be per thread): while any
// thread is inside the runtime, the pages of all live allocations are
// accessible.
#pragma once

#include <cstddef>

namespace neuronrt {

// Whether protect mode is on (NEURON_RT_PROTECT, read once).
bool protect_enabled() noexcept;

// Page granularity of protected segments.
size_t protect_page_size() noexcept;

// RAII: device memory is accessible while at least one DeviceAccess lives.
class DeviceAccess {
 public:
  DeviceAccess();
  ~DeviceAccess();
  DeviceAccess(const DeviceAccess&) = delete;
  DeviceAccess& operator=(const DeviceAccess&) = delete;

 private:
  bool active_;
};

// The allocator maps its private segments here: whole pages, registered,
// inaccessible (nullptr when out of memory). The kernel places consecutive
// mappings next to each other, so a scope opens a run of live segments with
// one mprotect.
void* protect_map_segment(size_t bytes);
// Segments mapped elsewhere (shareable memory) are registered by the
// allocator. Removal unregisters a segment (and unmaps one mapped above)
// before the allocator releases it.
void protect_add_segment(void* ptr, size_t bytes);
void protect_remove_segment(void* ptr);
// The allocator marks a segment live when it hands out its block and not live
// when the block returns to the cache. A scope opens only live segments (and
// those that become live inside it), so its cost follows the memory in use;
// cached segments stay inaccessible, also inside a scope.
void protect_set_live(void* ptr, bool live);

}  // namespace neuronrt
