#include "Error.h"

#include <cstdio>

namespace neuronrt {

std::string format_bytes(size_t bytes) {
  static const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024.0 && u < 4) {
    v /= 1024.0;
    ++u;
  }
  char buf[64];
  if (u == 0) {
    std::snprintf(buf, sizeof(buf), "%zu B", bytes);
  } else {
    std::snprintf(buf, sizeof(buf), "%.2f %s", v, units[u]);
  }
  return buf;
}

InvalidDeviceError::InvalidDeviceError(int device, int count)
    // The vendor product's wording, which users' code matches on.
    : Error("Device index " + std::to_string(device) + " is out of range. Valid range is 0 to " +
            std::to_string(count - 1) + " for this process (" + std::to_string(count) +
            " NeuronCore devices)"),
      device(device),
      count(count) {}

OutOfMemoryError::OutOfMemoryError(int device, size_t requested,
                                   size_t allocated, size_t reserved,
                                   size_t capacity)
    : Error("neuron out of memory. Tried to allocate " +
            format_bytes(requested) + " on neuron:" + std::to_string(device) +
            " (HBM capacity " + format_bytes(capacity) + "; " +
            format_bytes(allocated) + " already allocated; " +
            format_bytes(reserved) +
            " reserved in total by the caching allocator). Free tensors or "
            "call torch.neuron.empty_cache(); the capacity is set by "
            "NEURON_RT_HBM_BYTES. To see what holds the memory, record it with "
            "torch.neuron.memory._record_memory_history() and save "
            "torch.neuron.memory._dump_snapshot(path) (renders with "
            "torch.cuda._memory_viz)."),
      device(device),
      requested(requested),
      allocated(allocated),
      reserved(reserved),
      capacity(capacity) {}

}  // namespace neuronrt
