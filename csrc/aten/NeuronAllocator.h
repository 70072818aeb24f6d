// The PyTorch-facing allocators: device (HBM through the runtime's caching
// allocator) and staging (ATen's CPU allocator, redirected to the device
// while a host kernel runs so its fresh outputs land in device memory).
#pragma once

#include <c10/core/Allocator.h>
#include <c10/core/StorageImpl.h>
#include <c10/util/SmallVector.h>

namespace at::neuron {

// Frees memory obtained from the runtime's caching allocator.
void device_free(void* ptr);
// The registered c10::DeviceAllocator for PrivateUse1.
c10::Allocator* device_allocator();

// What backs a storage a host kernel returned: how it becomes a neuron
// storage (HostExecution.cpp, adopt_storage).
enum class StorageKind {
  Device,    // a neuron storage
  Staged,    // HBM the kernel allocated through the staging allocator
  NoMemory,  // no bytes behind it (a ZeroTensor's)
  Host,      // host memory from elsewhere (e.g. an intra-op worker thread's)
};

// While alive, allocations through ATen's CPU allocator on this thread are
// served from `device`'s HBM (the DataPtr still says CPU; callers rewrap).
// The scope records what it served, so it can tell staged storages apart.
class StagingScope {
 public:
  explicit StagingScope(c10::DeviceIndex device);
  ~StagingScope();
  StagingScope(const StagingScope&) = delete;
  StagingScope& operator=(const StagingScope&) = delete;

  // Ends the redirection early; the record stays for kind_of.
  void end();
  StorageKind kind_of(const c10::StorageImpl& storage) const;

 private:
  friend class StagingAllocator;
  c10::DeviceIndex device_;
  StagingScope* prev_;
  bool active_ = true;
  c10::SmallVector<const void*, 4> staged_;
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
