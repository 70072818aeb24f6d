// NeuronCore enumeration and the calling thread's current device.
//
// One device index is one logical NeuronCore. The host runtime emulates each
// core with host memory, so "HBM" is an accounting budget enforced by the
// caching allocator rather than a physical limit.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace neuronrt {

struct DeviceProperties {
  std::string name;          // "NeuronCore-v3 (host runtime)"
  size_t total_memory = 0;   // HBM capacity in bytes
  int physical_core = 0;     // index in NEURON_RT_VISIBLE_CORES
  int major = 3;             // NeuronCore generation
  int minor = 0;
};

// Number of visible cores. Reads NEURON_RT_VISIBLE_CORES ("0-3", "1,3") or
// NEURON_RT_NUM_CORES once; defaults to 2. Never throws.
int device_count() noexcept;

// Throws InvalidDeviceError unless 0 <= device < device_count().
void check_device(int device);

int current_device() noexcept;
void set_device(int device);
// Sets the device and returns the previous one.
int exchange_device(int device);

const DeviceProperties& device_properties(int device);

// Waits for all work on all streams of `device`.
void synchronize_device(int device);

// Parses "16G", "512MiB", "1073741824" into bytes; returns fallback when
// `text` is null or empty; throws Error on malformed input.
size_t parse_bytes(const char* text, size_t fallback);

// Parses a core list such as "0-3" or "1,3,5"; throws Error when malformed.
std::vector<int> parse_core_list(const std::string& text);

}  // namespace neuronrt
