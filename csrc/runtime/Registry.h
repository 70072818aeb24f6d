// The per-host registry of processes using the runtime: what neuron-ls and
// neuron-top read. Each initialized process keeps one small shared-memory
// file, /dev/shm/neuron-rt.<pid>, with its command line and, per device, the
// HBM it holds and the time its kernels ran. The file is removed at exit; a
// reader ignores files of processes that no longer exist (crashed ones).
// Updates are relaxed atomic stores into the mapping: no locks, no syscalls.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

namespace neuronrt {

constexpr int kRegistryMaxDevices = 128;

// The file's layout, version 3. It is defined here only: the tools
// (neuron_tools/_registry.py) read the offsets below through
// neuron_tools._rtinfo.registry_layout(), so a change here needs no mirror.
struct RegistryDevice {
  std::atomic<uint64_t> allocated_bytes;  // in client allocations
  std::atomic<uint64_t> reserved_bytes;   // held from the system (used + cached)
  std::atomic<uint64_t> busy_ns;          // total time kernels ran
  std::atomic<uint64_t> launches;
  uint64_t capacity;                      // HBM budget
  int32_t physical_core;                  // index in NEURON_RT_VISIBLE_CORES
  int32_t reserved_;
  std::atomic<uint64_t> graph_replays;    // replays of device graphs (each also one launch)
};

struct RegistryRecord {
  char magic[8];  // "NRTREG1\0"
  uint32_t version;
  int32_t pid;
  uint64_t start_unix_ns;
  int32_t device_count;
  int32_t reserved_;
  char command[256];
  // The configuration the runtime resolved (NEURON_RT_TARGET and friends):
  // the tools show what the process really has, not a re-parse of their own
  // environment.
  char target[32];        // "trn2"; empty without NEURON_RT_TARGET
  char device_name[64];   // DeviceProperties::name, the same for every device
  RegistryDevice devices[kRegistryMaxDevices];
};

constexpr uint32_t kRegistryVersion = 3;
constexpr char kRegistryMagic[8] = "NRTREG1";
constexpr const char* kRegistryPathPrefix = "/dev/shm/neuron-rt.";

// This process's record (created at first use), or nullptr when the
// registry is unavailable (no /dev/shm) or disabled (NEURON_RT_REGISTRY=0).
RegistryRecord* registry();

// Accounting hooks.
void registry_memory(int device, uint64_t allocated, uint64_t reserved) noexcept;
void registry_kernel(int device, uint64_t ns) noexcept;
void registry_replay(int device) noexcept;

}  // namespace neuronrt
