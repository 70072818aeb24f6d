#include "Registry.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "Device.h"
#include "Target.h"

namespace neuronrt {
namespace {

std::string path_of(int pid) { return kRegistryPathPrefix + std::to_string(pid); }

void read_command(char* out, size_t size) {
  std::FILE* f = std::fopen("/proc/self/cmdline", "rb");
  if (!f) return;
  size_t n = std::fread(out, 1, size - 1, f);
  std::fclose(f);
  for (size_t i = 0; i + 1 < n; ++i) {
    if (out[i] == '\0') out[i] = ' ';  // argv is NUL-separated
  }
  out[n] = '\0';
}

RegistryRecord* g_record = nullptr;
int g_owner = 0;

void remove_record() {
  // A child forked after the record was made shares the mapping but does
  // not own the file: only the creating process removes it.
  if (g_record && getpid() == g_owner) ::unlink(path_of(g_owner).c_str());
}

RegistryRecord* create() {
  const char* env = std::getenv("NEURON_RT_REGISTRY");
  if (env && std::strcmp(env, "0") == 0) return nullptr;
  const int pid = static_cast<int>(getpid());
  const std::string path = path_of(pid);
  int fd = ::open(path.c_str(), O_CREAT | O_RDWR | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return nullptr;
  void* p = nullptr;
  if (::ftruncate(fd, sizeof(RegistryRecord)) == 0) {
    p = ::mmap(nullptr, sizeof(RegistryRecord), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  }
  ::close(fd);
  if (p == MAP_FAILED || p == nullptr) {
    ::unlink(path.c_str());
    return nullptr;
  }
  auto* r = static_cast<RegistryRecord*>(p);  // zero-filled by ftruncate
  r->version = kRegistryVersion;
  r->pid = pid;
  r->start_unix_ns = static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch())
          .count());
  read_command(r->command, sizeof r->command);
  const int n = std::min(device_count(), kRegistryMaxDevices);
  try {
    std::strncpy(r->target, target().name.c_str(), sizeof r->target - 1);
    if (n > 0) std::strncpy(r->device_name, device_properties(0).name.c_str(), sizeof r->device_name - 1);
    for (int d = 0; d < n; ++d) {
      r->devices[d].capacity = device_properties(d).total_memory;
      r->devices[d].physical_core = device_properties(d).physical_core;
    }
  } catch (...) {  // a configuration error: devices unusable, keep zeros
  }
  r->device_count = n;
  std::memcpy(r->magic, kRegistryMagic, sizeof r->magic);  // last: readers skip records without it
  g_owner = pid;
  std::atexit(&remove_record);
  return r;
}

}  // namespace

RegistryRecord* registry() {
  static RegistryRecord* record = g_record = create();
  return record;
}

void registry_memory(int device, uint64_t allocated, uint64_t reserved) noexcept {
  RegistryRecord* r = registry();
  if (!r || device < 0 || device >= kRegistryMaxDevices) return;
  r->devices[device].allocated_bytes.store(allocated, std::memory_order_relaxed);
  r->devices[device].reserved_bytes.store(reserved, std::memory_order_relaxed);
}

void registry_kernel(int device, uint64_t ns) noexcept {
  RegistryRecord* r = registry();
  if (!r || device < 0 || device >= kRegistryMaxDevices) return;
  r->devices[device].busy_ns.fetch_add(ns, std::memory_order_relaxed);
  r->devices[device].launches.fetch_add(1, std::memory_order_relaxed);
}

void registry_replay(int device) noexcept {
  RegistryRecord* r = registry();
  if (!r || device < 0 || device >= kRegistryMaxDevices) return;
  r->devices[device].graph_replays.fetch_add(1, std::memory_order_relaxed);
}

}  // namespace neuronrt
