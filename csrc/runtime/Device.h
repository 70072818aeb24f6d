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

// The device configuration read from NEURON_RT_VISIBLE_CORES,
// NEURON_RT_NUM_CORES and NEURON_RT_HBM_BYTES.
struct DeviceConfig {
  std::vector<int> cores;  // physical core of each device index
  size_t hbm_bytes = 0;    // HBM budget per device
  // Empty when valid; otherwise one line per malformed variable naming it,
  // its value and the accepted forms. A malformed configuration has no cores.
  std::string error;
};

// Validates the raw variable values (null or empty = unset). Never throws:
// errors are reported in DeviceConfig::error.
// `default_cores` and `default_hbm` apply when their variables are unset
// (the NEURON_RT_TARGET model's, or 2 cores of 16 GiB).
DeviceConfig parse_device_config(const char* visible_cores, const char* num_cores,
                                 const char* hbm_bytes, int default_cores = 2,
                                 size_t default_hbm = size_t{16} << 30);

// Number of visible cores. Reads NEURON_RT_VISIBLE_CORES ("0-3", "1,3") or
// NEURON_RT_NUM_CORES once; defaults to 2. Never throws (PyTorch's
// deviceCount contract): a malformed configuration counts 0 devices and is
// raised by check_configuration() and every checked device entry point.
int device_count() noexcept;

// Empty when the environment's device configuration is valid.
const std::string& configuration_error() noexcept;

// Throws ConfigurationError when the environment's configuration is malformed.
void check_configuration();

// Throws ConfigurationError for a malformed configuration, otherwise
// InvalidDeviceError unless 0 <= device < device_count().
void check_device(int device);

int current_device() noexcept;
void set_device(int device);
// Sets the device and returns the previous one.
int exchange_device(int device);

const DeviceProperties& device_properties(int device);

// Waits for all work on all streams of `device`.
void synchronize_device(int device);

// Parses a positive size such as "16G", "16GiB", "1.5G", "512MiB" or
// "1073741824" into bytes (all suffixes are binary: K = KB = KiB = 1024);
// returns fallback when `text` is null or empty; throws Error otherwise.
size_t parse_bytes(const char* text, size_t fallback);

// Parses a core list such as "0-3" or "1,3,5" (ascending ranges, no
// duplicates, indices 0..kMaxCoreIndex); throws Error when malformed.
std::vector<int> parse_core_list(const std::string& text);

// Parses a device count 1..kMaxDevices; throws Error when malformed.
int parse_core_count(const std::string& text);

// c10::DeviceIndex is an int8_t, so at most 128 devices are addressable.
constexpr int kMaxDevices = 128;
constexpr int kMaxCoreIndex = kMaxDevices - 1;

}  // namespace neuronrt
