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
