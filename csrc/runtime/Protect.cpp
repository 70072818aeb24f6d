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
  bool mapped = false;  // mapped by protect_map_segment (unmapped on removal)
};

// Only live segments are opened, so the cost of a scope follows the memory
// in use, not the cache; cached segments stay PROT_NONE throughout.
struct State {
  std::mutex mutex;
  int depth = 0;  // live DeviceAccess scopes, all threads
  std::map<void*, Segment> segments;  // every registered segment
  std::map<void*, Segment*> live;     // those with live == true, by address
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

// Calls `fn(start, bytes)` once per run of address-adjacent segments in
// [first, last) (sorted by address): one mprotect per run, not per segment.
template <typename It, typename Fn>
void for_each_run(It first, It last, Fn&& fn) {
  char* start = nullptr;
  char* end = nullptr;
  for (; first != last; ++first) {
    Segment& seg = **first;
    auto* p = static_cast<char*>(seg.ptr);
    if (p != end) {
      if (start) fn(start, static_cast<size_t>(end - start));
      start = p;
    }
    end = p + seg.bytes;
  }
  if (start) fn(start, static_cast<size_t>(end - start));
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
    std::vector<Segment*>& opened = s.opened;
    for (auto& [ptr, seg] : s.live) {
      seg->open = true;
      opened.push_back(seg);
    }
    for_each_run(opened.begin(), opened.end(), [](char* p, size_t n) { set_access(p, n, true); });
  }
}

DeviceAccess::~DeviceAccess() {
  if (!active_) return;
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  if (--s.depth == 0) {
    // Also the segments freed inside the scope: they were accessible.
    std::vector<Segment*>& opened = s.opened;
    std::sort(opened.begin(), opened.end(), [](Segment* a, Segment* b) { return a->ptr < b->ptr; });
    for_each_run(opened.begin(), opened.end(), [](char* p, size_t n) { set_access(p, n, false); });
    for (Segment* seg : opened) seg->open = false;
    opened.clear();
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

void* protect_map_segment(size_t bytes) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  const int prot = s.depth > 0 ? PROT_READ | PROT_WRITE : PROT_NONE;
  void* ptr = mmap(nullptr, bytes, prot, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (ptr == MAP_FAILED) return nullptr;
  Segment& seg = s.segments.emplace(ptr, Segment{ptr, bytes}).first->second;
  seg.mapped = true;
  if (s.depth > 0) {  // closing the scope protects it
    seg.open = true;
    s.opened.push_back(&seg);
  }
  return ptr;
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
  if (seg.mapped) {
    munmap(ptr, seg.bytes);
  } else {
    set_access(ptr, seg.bytes, true);  // its owner releases it
  }
  s.segments.erase(it);
}

}  // namespace neuronrt
