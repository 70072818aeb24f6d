#include "OpTracking.h"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <iterator>
#include <mutex>
#include <set>

namespace at::neuron {
namespace {

std::mutex g_mutex;
std::set<std::string> g_executed;
std::map<std::string, int64_t> g_fallback;
// Bumped by clear_executed_ops: threads drop their cache of noted names.
std::atomic<uint64_t> g_epoch{0};

// Each thread caches the names it has noted since the last clear in a small
// direct-mapped table, so that noting an op again costs a load and a compare
// on the op path (a collision only costs another insertion under the lock).
constexpr int kSlots = 256;
thread_local const char* t_slots[kSlots];
thread_local uint64_t t_epoch = 0;

int slot_of(const char* name) {
  return static_cast<int>((reinterpret_cast<uintptr_t>(name) * 0x9E3779B97F4A7C15ULL) >> 56);
}

}  // namespace

void note_executed(const char* name) {
  const uint64_t epoch = g_epoch.load(std::memory_order_relaxed);
  const int slot = slot_of(name);
  if (t_epoch == epoch && t_slots[slot] == name) return;
  if (t_epoch != epoch) {
    std::fill(std::begin(t_slots), std::end(t_slots), nullptr);
    t_epoch = epoch;
  }
  t_slots[slot] = name;
  std::lock_guard<std::mutex> lock(g_mutex);
  g_executed.emplace(name);
}

bool note_fallback(const c10::OperatorName& op) {
  std::string key = c10::toString(op);
  std::lock_guard<std::mutex> lock(g_mutex);
  return g_fallback[key]++ == 0;
}

void note_executed_name(const std::string& name) {
  std::lock_guard<std::mutex> lock(g_mutex);
  g_executed.insert(name);
}

void note_fallback_name(const std::string& name) {
  std::lock_guard<std::mutex> lock(g_mutex);
  ++g_fallback[name];
}

std::vector<std::string> executed_ops() {
  std::lock_guard<std::mutex> lock(g_mutex);
  return {g_executed.begin(), g_executed.end()};
}

std::map<std::string, int64_t> fallback_ops() {
  std::lock_guard<std::mutex> lock(g_mutex);
  return g_fallback;
}

void clear_executed_ops() {
  std::lock_guard<std::mutex> lock(g_mutex);
  g_executed.clear();
  g_epoch.fetch_add(1, std::memory_order_release);
}

void clear_fallback_ops() {
  std::lock_guard<std::mutex> lock(g_mutex);
  g_fallback.clear();
}

}  // namespace at::neuron
