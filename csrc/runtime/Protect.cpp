#include "Protect.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>


namespace neuronrt {
namespace {

struct State {
  std::mutex mutex;
  int depth = 0;  // live DeviceAccess scopes, all threads
  std::map<void*, size_t> segments;
};

State& state() {
  static State* s = new State();  // leaked: frees may run during shutdown
  return *s;
}

void set_access(void* ptr, size_t bytes, bool accessible) {
  // Segments are whole pages we own, so this cannot fail short of a kernel
  // refusing mappings; a protection left wrong would mislead, so stop.
  if (mprotect(ptr, bytes, accessible ? PROT_READ | PROT_WRITE : PROT_NONE) != 0) {
    std::perror("NEURON_RT_PROTECT: mprotect");
    std::abort();
  }
}

}  // namespace

bool protect_enabled() noexcept {
  static const bool enabled = [] {
    const char* v = std::getenv("NEURON_RT_PROTECT");
    return v && *v && std::strcmp(v, "0") != 0;
  }();
  return enabled;
}

size_t protect_page_size() noexcept {
  static const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  return page;
}

DeviceAccess::DeviceAccess() : active_(protect_enabled()) {
  if (!active_) return;
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  if (s.depth++ == 0) {
    for (auto& [ptr, bytes] : s.segments) set_access(ptr, bytes, true);
  }
}

DeviceAccess::~DeviceAccess() {
  if (!active_) return;
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  if (--s.depth == 0) {
    for (auto& [ptr, bytes] : s.segments) set_access(ptr, bytes, false);
  }
}

void protect_add_segment(void* ptr, size_t bytes) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  s.segments.emplace(ptr, bytes);
  if (s.depth == 0) set_access(ptr, bytes, false);
}

void protect_remove_segment(void* ptr) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  auto it = s.segments.find(ptr);
  if (it == s.segments.end()) return;
  set_access(it->first, it->second, true);  // free() writes into the chunk
  s.segments.erase(it);
}

}  // namespace neuronrt
