#include "Runtime.h"

#include <cstring>
#include <functional>

#include "CachingAllocator.h"
#include "Protect.h"

namespace neuronrt {

bool host_accessible() noexcept { return true; }

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

void launch(Stream& stream, Kernel& kernel) {
  stream.launch([&] { kernel.run(); }, kernel.name());
}

void launch_async(Stream& stream, std::unique_ptr<Kernel> kernel) { stream.enqueue(std::move(kernel)); }

}  // namespace neuronrt
