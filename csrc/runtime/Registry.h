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

// The file's layout, version 1. Readers (torch_neuronx/tools/_registry.py)
// decode it by offsets: keep it fixed-size and append-only.
struct RegistryDevice {
  std::atomic<uint64_t> allocated_bytes;  // in client allocations
  std::atomic<uint64_t> reserved_bytes;   // held from the system (used + cached)
  std::atomic<uint64_t> busy_ns;          // total time kernels ran
  std::atomic<uint64_t> launches;
  uint64_t capacity;                      // HBM budget
  int32_t physical_core;                  // index in NEURON_RT_VISIBLE_CORES
  int32_t reserved_;
};

struct RegistryRecord {
  char magic[8];  // "NRTREG1\0"
  uint32_t version;
  int32_t pid;
  uint64_t start_unix_ns;
  int32_t device_count;
  int32_t reserved_;
  char command[256];
  RegistryDevice devices[kRegistryMaxDevices];
};

static_assert(sizeof(RegistryDevice) == 48, "registry layout is read by offsets");
static_assert(offsetof(RegistryRecord, devices) == 288, "registry layout is read by offsets");
static_assert(sizeof(RegistryRecord) == 288 + 48 * kRegistryMaxDevices, "registry layout is read by offsets");

// This process's record (created at first use), or nullptr when the
// registry is unavailable (no /dev/shm) or disabled (NEURON_RT_REGISTRY=0).
RegistryRecord* registry();

// Accounting hooks.
void registry_memory(int device, uint64_t allocated, uint64_t reserved) noexcept;
void registry_kernel(int device, uint64_t ns) noexcept;

}  // namespace neuronrt
