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
#include <utility>
#include <vector>

#include "Device.h"
#include "Error.h"
#include "MemoryStats.h"
#include "Philox.h"
#include "Process.h"
#include "Stream.h"
#include "Target.h"

namespace neuronrt {

// ---- What a runtime must provide ----------------------------------------------
// Device memory is host-mappable while the runtime works on it: the kernels
// of the PyTorch layer (csrc/aten's routes, compiled graphs, the NKI
// executor) are host code that takes raw pointers into device memory inside a
// launch, and copies use memcpy. This is a requirement of those layers, not a
// capability they test: a runtime whose HBM the host cannot map would provide
// device kernels for the routes instead (docs/runtime.md, "The seam"). Protect
// mode (NEURON_RT_PROTECT=1) proves the layers touch device memory only inside
// launches and copies.

// Keeps device memory host-accessible while the returned token lives, as a
// launch does in protect mode: for a transport outside the runtime that moves
// host views of device memory on its own threads (Gloo in the c10d backend),
// and for the few host reads of a result outside a kernel.
std::shared_ptr<void> host_access();

// ---- Memory -----------------------------------------------------------------

// Allocates `bytes` of `device` memory (nullptr for 0). Throws
// OutOfMemoryError past the device's capacity, after waiting for the
// device's queued kernels to release what they hold.
void* malloc(int device, size_t bytes);
// Frees the device's kernels that have run, and with them the memory they
// held (memory statistics call it first).
void release_finished_kernels(int device);
// Returns the cached memory of `device` (all devices for -1) to the system,
// after releasing the kernels that have run (their tensors' memory is cached
// only then): torch.neuron.empty_cache().
void empty_cache(int device = -1);
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

// ---- Memory statistics and control (MemoryStats.h) -----------------------------
// Statistics first release the kernels that have run: memory of tensors whose
// last users were finished kernels is free.
DeviceStats memory_stats(int device);
void reset_peak_memory_stats(int device);
void reset_accumulated_memory_stats(int device);
// (free, total) bytes of the device's HBM budget.
std::pair<size_t, size_t> mem_get_info(int device);
// Caps the device's budget at `fraction` of its capacity.
void set_memory_fraction(int device, double fraction);
// The rounded size of the block holding `ptr` (device memory).
size_t allocation_size(const void* ptr);
// Every block of every device, for memory snapshots.
std::vector<BlockInfo> memory_snapshot();
// Records allocator events (memory history); nullptr stops.
void set_memory_observer(AllocatorObserver observer);

// ---- Kernels ----------------------------------------------------------------

// A unit of device work. The host runtime runs it with device memory mapped
// into the host address space (see the requirement above).
class Kernel {
 public:
  virtual ~Kernel() = default;
  virtual const char* name() const noexcept = 0;
  virtual void run() = 0;
  // An estimate of the bytes of memory the kernel touches. A stream runs a
  // small kernel on the launching thread when it has nothing queued (handing
  // it to the executor would cost more than running it); unknown: never.
  virtual size_t bytes() const noexcept { return SIZE_MAX; }
  // Called once when a graph has recorded the kernel (Graph.h): it will run
  // at every replay, so it may prepare a cheaper re-runnable form of itself
  // (at its first run, where device memory is accessible).
  virtual void recorded() noexcept {}
  // A graph replay: the number of recorded kernels it runs (-1: not a replay).
  virtual int64_t graph_kernels() const noexcept { return -1; }
  // Called by a graph replay a few kernels before run(): start loading the
  // state run() reads through this object (a prepared kernel object, an
  // argument stack) into the caches, which the replay's large kernels have
  // flushed since the last replay.
  // Hints only (prefetch_range): no effect on results.
  virtual void prefetch() const noexcept {}
};

// Prefetch hints for the cache lines of [p, p + bytes), at most `max_bytes`.
inline void prefetch_range(const void* p, size_t bytes, size_t max_bytes = 4096) noexcept {
  const char* c = static_cast<const char*>(p);
  const size_t n = bytes < max_bytes ? bytes : max_bytes;
  for (size_t i = 0; i < n; i += 64) __builtin_prefetch(c + i);
}

// Launches. Synchronous: Stream::launch(fn, name) runs `fn` in order on the
// stream and returns when it has run (errors propagate); the PyTorch layer's
// host kernels, copies and compiled graphs use it. Asynchronous, below:
// queues `kernel` on `stream` and returns at once; the stream owns it until it
// has run. Errors surface at the stream's next synchronization point as
// KernelError (Stream.h). NEURON_RT_LAUNCH_BLOCKING=1 makes it synchronous.
// A small kernel (Kernel::bytes) on an idle stream runs before this returns,
// with the same error reporting.
void launch_async(Stream& stream, std::unique_ptr<Kernel> kernel);

// ---- Streams and events -------------------------------------------------------
// Stream and Event (Stream.h): record, wait (Event::block), query,
// synchronize, elapsed time; synchronize_device (Device.h).

}  // namespace neuronrt

// The runtime's services, on top of the API above: stream capture into
// graphs, the decode GEMV and small-M GEMM
// kernels split across the runtime's workers, the NKI program executor (it launches its
// programs as Kernels), and the intra-node collectives with the peer mapping
// of device memory (the c10d backend's transport). With the headers above,
// these are everything the layers above csrc/runtime include
// (tests/test_layers.py).
#include "Gemm.h"
#include "Gemv.h"
#include "Graph.h"
#include "PeerMemory.h"
#include "ShmCollectives.h"
#include "Workers.h"
#include "nki/Executor.h"
