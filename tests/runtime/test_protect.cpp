#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>

#include "csrc/runtime/Protect.h"
#include "csrc/runtime/Runtime.h"

namespace {

// Runs `child` in a fresh process with NEURON_RT_PROTECT=1; returns its
// status: exit code, or 128 + signal.
template <typename F>
int in_protected_child(F&& child) {
  pid_t pid = fork();
  if (pid == 0) {
    setenv("NEURON_RT_PROTECT", "1", 1);
    _exit(child());
  }
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

}  // namespace

// Each CTest case is its own process, which has not read NEURON_RT_PROTECT
// yet, so the forked child reads the value it sets.
TEST(Protect, RuntimeCopiesAndKernelsReachDeviceMemory) {
  int rc = in_protected_child([] {
    if (!neuronrt::protect_enabled()) return 1;
    auto* p = static_cast<int*>(neuronrt::malloc(0, 4096));
    int in[4] = {1, 2, 3, 4}, out[4] = {};
    neuronrt::Stream& s = neuronrt::default_stream(0);
    neuronrt::memcpy(p, in, sizeof in, neuronrt::MemcpyKind::HostToDevice, s);
    struct Double : neuronrt::Kernel {
      int* p;
      const char* name() const noexcept override { return "double"; }
      void run() override {
        for (int i = 0; i < 4; ++i) p[i] *= 2;
      }
    } k;
    k.p = p;
    s.launch([&] { k.run(); }, k.name());
    neuronrt::memcpy(out, p, sizeof out, neuronrt::MemcpyKind::DeviceToHost, s);
    neuronrt::free(p);
    return out[0] == 2 && out[3] == 8 ? 0 : 2;
  });
  EXPECT_EQ(rc, 0);
}

TEST(Protect, HostAccessOutsideTheRuntimeFaults) {
  int rc = in_protected_child([] {
    auto* p = static_cast<volatile int*>(neuronrt::malloc(0, 64));
    return *p == 12345 ? 3 : 4;  // must fault before returning
  });
  EXPECT_EQ(rc, 128 + SIGSEGV);
}

// A cached (freed) block stays protected, also while a launch runs: only
// blocks in use are opened.
TEST(Protect, CachedBlockFaultsInsideALaunch) {
  int rc = in_protected_child([] {
    auto* p = static_cast<volatile int*>(neuronrt::malloc(0, 4096));
    neuronrt::free(const_cast<int*>(p));  // back to the cache, still mapped
    int seen = 0;
    neuronrt::default_stream(0).launch([&] { seen = *p; }, "use_after_free");
    return seen == 12345 ? 3 : 4;  // must fault before returning
  });
  EXPECT_EQ(rc, 128 + SIGSEGV);
}

TEST(Protect, CachedBlockFaultsOnTheHost) {
  int rc = in_protected_child([] {
    auto* p = static_cast<volatile int*>(neuronrt::malloc(0, 4096));
    neuronrt::free(const_cast<int*>(p));
    return *p == 12345 ? 3 : 4;
  });
  EXPECT_EQ(rc, 128 + SIGSEGV);
}

// A block allocated inside a launch is usable there and protected after it.
TEST(Protect, BlockAllocatedInsideALaunchIsProtectedAfterIt) {
  int inside = in_protected_child([] {
    int* q = nullptr;
    neuronrt::default_stream(0).launch([&] {
      q = static_cast<int*>(neuronrt::malloc(0, 4096));
      q[0] = 7;
    }, "alloc_inside");
    int out = 0;
    neuronrt::memcpy(&out, q, sizeof out, neuronrt::MemcpyKind::DeviceToHost, neuronrt::default_stream(0));
    return out == 7 ? 0 : 2;
  });
  EXPECT_EQ(inside, 0);
  int after = in_protected_child([] {
    volatile int* q = nullptr;
    neuronrt::default_stream(0).launch([&] { q = static_cast<int*>(neuronrt::malloc(0, 4096)); }, "alloc_inside");
    return *q == 12345 ? 3 : 4;  // must fault
  });
  EXPECT_EQ(after, 128 + SIGSEGV);
}

// Freed and reused inside one launch, then freed again: the scope still
// protects it when it closes (it was opened), and a new allocation reusing
// the cached block is opened by the next launch.
TEST(Protect, BlockFreedInsideALaunchIsProtectedAfterIt) {
  int rc = in_protected_child([] {
    auto* p = static_cast<int*>(neuronrt::malloc(0, 4096));
    neuronrt::default_stream(0).launch([&] {
      p[0] = 5;
      neuronrt::free(p);
    }, "free_inside");
    auto* again = static_cast<int*>(neuronrt::malloc(0, 4096));  // the cached block
    if (again != p) return 5;
    int v = 0;
    neuronrt::default_stream(0).launch([&] { v = again[0]; }, "reuse");
    if (v != 5) return 6;
    return *static_cast<volatile int*>(again) == 12345 ? 3 : 4;  // must fault
  });
  EXPECT_EQ(rc, 128 + SIGSEGV);
}

// Live neighbours of a cached block are opened (in runs of adjacent
// segments) without opening the cached block between them.
TEST(Protect, CachedBlockBetweenLiveOnesFaultsInsideALaunch) {
  auto child = [](bool touch_cached) {
    return in_protected_child([touch_cached] {
      int* p[3];
      for (auto*& q : p) q = static_cast<int*>(neuronrt::malloc(0, 4096));
      neuronrt::free(p[1]);
      int sum = 0;
      neuronrt::default_stream(0).launch([&] {
        p[0][0] = 1;
        p[2][0] = 2;
        sum = p[0][0] + p[2][0];
        if (touch_cached) sum += *static_cast<volatile int*>(p[1]);
      }, "neighbours");
      return sum == 3 ? 0 : 2;
    });
  };
  EXPECT_EQ(child(false), 0);
  EXPECT_EQ(child(true), 128 + SIGSEGV);
}
