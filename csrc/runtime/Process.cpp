#include "Process.h"

#include <pthread.h>

#include <atomic>

namespace neuronrt {
namespace {

std::atomic<bool> g_initialized{false};
std::atomic<bool> g_bad_fork{false};

void on_fork_child() {
  // Only async-signal-safe work here. A grandchild inherits the flag.
  if (g_initialized.load(std::memory_order_relaxed)) g_bad_fork.store(true, std::memory_order_relaxed);
}

const bool g_fork_handler_installed = [] {
  pthread_atfork(nullptr, nullptr, &on_fork_child);
  return true;
}();

}  // namespace

BadForkError::BadForkError()
    : Error("Cannot re-initialize neuron in forked subprocess: the neuron runtime was initialized before the "
            "fork. To use neuron with multiprocessing, use the 'spawn' start method "
            "(torch.multiprocessing.set_start_method('spawn')).") {}

void mark_initialized() noexcept {
  (void)g_fork_handler_installed;
  if (!g_initialized.load(std::memory_order_relaxed)) g_initialized.store(true, std::memory_order_relaxed);
}

bool is_initialized() noexcept { return g_initialized.load(std::memory_order_relaxed); }

bool in_bad_fork() noexcept { return g_bad_fork.load(std::memory_order_relaxed); }

void lazy_init() {
  if (in_bad_fork()) throw BadForkError();
  mark_initialized();
}

}  // namespace neuronrt
