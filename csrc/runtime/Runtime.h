// The neuron runtime API: the one interface through which the PyTorch layer
// (csrc/aten, csrc/python, later csrc/distributed) reaches NeuronCores and
// their memory. It is shaped like the runtime of real hardware (CUDA runtime,
// Neuron runtime), so a hardware runtime can implement this header and the
// layers above stay as they are. docs/runtime.md maps each call to its
// PyTorch consumer.
//
// The host runtime implements it with host memory: device memory is owned by
// the caching allocator (CachingAllocator.h), streams and events are in
// Stream.h, devices in Device.h.
#pragma once

#include <cstddef>
#include <memory>

#include "Device.h"
#include "Stream.h"

namespace neuronrt {

// ---- Capabilities -----------------------------------------------------------

// True if device memory may be mapped into the host address space while a
// kernel launched by the runtime runs (host kernels then take raw pointers).
// True for the host runtime; false for hardware whose HBM the host cannot map.
bool host_accessible() noexcept;

// ---- Memory -----------------------------------------------------------------

// Allocates `bytes` of `device` memory (nullptr for 0). Throws
// OutOfMemoryError past the device's capacity, after waiting for the
// device's queued kernels to release what they hold.
void* malloc(int device, size_t bytes);
// Frees the device's kernels that have run, and with them the memory they
// held (memory statistics call it first).
void release_finished_kernels(int device);
// Returns memory from malloc() to the device's cache. Never throws.
void free(void* ptr) noexcept;
// The device whose memory contains `ptr`, or -1 if it is not device memory.
int pointer_device(const void* ptr) noexcept;

enum class MemcpyKind { HostToDevice, DeviceToHost, DeviceToDevice };

// Copies `bytes` and returns when the copy is complete (after the work
// queued before it on `stream`).
void memcpy(void* dst, const void* src, size_t bytes, MemcpyKind kind, Stream& stream);
// Sets `bytes` of device memory to `value`, in order on `stream`.
void memset(void* dst, int value, size_t bytes, Stream& stream);

// ---- Kernels ----------------------------------------------------------------

// A unit of device work. The host runtime runs it with device memory mapped
// into the host address space (see host_accessible()).
class Kernel {
 public:
  virtual ~Kernel() = default;
  virtual const char* name() const noexcept = 0;
  virtual void run() = 0;
  // An estimate of the bytes of memory the kernel touches. A stream runs a
  // small kernel on the launching thread when it has nothing queued (handing
  // it to the executor would cost more than running it); unknown: never.
  virtual size_t bytes() const noexcept { return SIZE_MAX; }
};

// Runs `kernel` in order on `stream` and returns when it has run. Errors
// raised by the kernel propagate.
void launch(Stream& stream, Kernel& kernel);
// Queues `kernel` on `stream` and returns at once; the stream owns it until it
// has run. Errors surface at the stream's next synchronization point as
// KernelError (Stream.h). NEURON_RT_LAUNCH_BLOCKING=1 makes this launch().
// A small kernel (Kernel::bytes) on an idle stream runs before this returns,
// with the same error reporting.
void launch_async(Stream& stream, std::unique_ptr<Kernel> kernel);

// ---- Streams and events -------------------------------------------------------
// Stream and Event (Stream.h): record, wait (Event::block), query,
// synchronize, elapsed time; synchronize_device (Device.h).

}  // namespace neuronrt
