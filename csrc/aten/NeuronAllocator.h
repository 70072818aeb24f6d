// The PyTorch-facing allocators: device (HBM through the runtime's caching
// allocator) and staging (ATen's CPU allocator, redirected to the device
// while a host kernel runs so its fresh outputs land in device memory).
#pragma once

#include <c10/core/Allocator.h>

namespace at::neuron {

// Frees memory obtained from the runtime's caching allocator.
void device_free(void* ptr);
// The registered c10::DeviceAllocator for PrivateUse1.
c10::Allocator* device_allocator();

// While alive, allocations through ATen's CPU allocator on this thread are
// served from `device`'s HBM (the DataPtr still says CPU; callers rewrap).
class StagingScope {
 public:
  explicit StagingScope(c10::DeviceIndex device);
  ~StagingScope();
  StagingScope(const StagingScope&) = delete;
  StagingScope& operator=(const StagingScope&) = delete;

 private:
  int prev_;
};

// Installs the staging hook in front of ATen's CPU allocator (idempotent).
void install_staging_allocator();

// Memory-history recording (csrc/python/MemorySnapshot.cpp) labels each
// allocation with the Python stack of the op that made it. Op entry points
// open an AllocationContext before taking any lock; while recording, it calls
// the installed hook, which captures the stack (taking the GIL if it must).
using AllocationContextHook = void (*)(bool enter);
void set_allocation_context_hook(AllocationContextHook hook);

class AllocationContext {
 public:
  AllocationContext();
  ~AllocationContext();
  AllocationContext(const AllocationContext&) = delete;
  AllocationContext& operator=(const AllocationContext&) = delete;

 private:
  AllocationContextHook hook_;
};

}  // namespace at::neuron
