#include "OpTracking.h"

#include <atomic>
#include <mutex>
#include <set>
#include <unordered_set>

namespace at::neuron {
namespace {

std::mutex g_mutex;
std::set<std::string> g_executed;
std::map<std::string, int64_t> g_fallback;
// Bumped by clear_executed_ops: threads drop their cache of noted names.
std::atomic<uint64_t> g_epoch{0};

struct NotedNames {
  uint64_t epoch = 0;
  std::unordered_set<const char*> names;
};
thread_local NotedNames t_noted;

}  // namespace

void note_executed(const char* name) {
  const uint64_t epoch = g_epoch.load(std::memory_order_acquire);
  if (t_noted.epoch != epoch) {
    t_noted.names.clear();
    t_noted.epoch = epoch;
  }
  if (!t_noted.names.insert(name).second) return;
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
