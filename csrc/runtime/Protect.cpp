#include "Protect.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <vector>


namespace neuronrt {
namespace {

struct Segment {
  void* ptr;
  size_t bytes;
  bool live = false;  // holds a block handed out by the allocator
  bool open = false;  // made accessible by the current scope(s)
};

// Only live segments are opened: the cost of a scope follows the memory in
// use, not the cache. Cached segments stay PROT_NONE throughout.
struct State {
  std::mutex mutex;
  int depth = 0;  // live DeviceAccess scopes, all threads
  std::map<void*, Segment> segments;  // every registered segment
  std::map<void*, Segment*> live;     // those with live == true
  std::vector<Segment*> opened;       // those with open == true
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

void open(State& s, Segment& seg) {
  set_access(seg.ptr, seg.bytes, true);
  seg.open = true;
  s.opened.push_back(&seg);
}

Segment& find(State& s, void* ptr) {
  auto it = s.segments.find(ptr);
  if (it == s.segments.end()) {
    std::fprintf(stderr, "NEURON_RT_PROTECT: %p is not a registered segment\n", ptr);
    std::abort();
  }
  return it->second;
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
    for (auto& [ptr, seg] : s.live) open(s, *seg);
  }
}

DeviceAccess::~DeviceAccess() {
  if (!active_) return;
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  if (--s.depth == 0) {
    // Also the segments freed inside the scope: they were accessible.
    for (Segment* seg : s.opened) {
      set_access(seg->ptr, seg->bytes, false);
      seg->open = false;
    }
    s.opened.clear();
  }
}

void protect_add_segment(void* ptr, size_t bytes) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  Segment& seg = s.segments.emplace(ptr, Segment{ptr, bytes}).first->second;
  if (s.depth == 0) {
    set_access(ptr, bytes, false);
  } else {  // fresh memory is accessible already; closing the scope protects it
    seg.open = true;
    s.opened.push_back(&seg);
  }
}

void protect_set_live(void* ptr, bool live) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  Segment& seg = find(s, ptr);
  seg.live = live;
  if (live) {
    s.live.emplace(ptr, &seg);
    // Allocated inside a scope: usable by the running launch at once.
    if (s.depth > 0 && !seg.open) open(s, seg);
  } else {
    s.live.erase(ptr);  // an open segment stays open until the scope closes
  }
}

void protect_remove_segment(void* ptr) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  auto it = s.segments.find(ptr);
  if (it == s.segments.end()) return;
  Segment& seg = it->second;
  if (seg.open) s.opened.erase(std::find(s.opened.begin(), s.opened.end(), &seg));
  s.live.erase(ptr);
  set_access(ptr, seg.bytes, true);  // free() writes into the chunk
  s.segments.erase(it);
}

}  // namespace neuronrt
