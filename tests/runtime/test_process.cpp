#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <thread>

#include "csrc/runtime/CachingAllocator.h"
#include "csrc/runtime/Process.h"
#include "csrc/runtime/Stream.h"

namespace {

// Runs `child` in a forked process; returns its exit status (0 = pass).
template <typename F>
int in_child(F&& child) {
  pid_t pid = fork();
  if (pid == 0) _exit(child());
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

}  // namespace

// CTest runs every test in its own process, so each starts uninitialized.
TEST(Process, ChildForkedBeforeInitializationWorks) {
  ASSERT_FALSE(neuronrt::is_initialized());
  int rc = in_child([] {
    void* p = neuronrt::CachingAllocator::instance().allocate(0, 64);
    neuronrt::CachingAllocator::instance().free(p);
    return neuronrt::in_bad_fork() ? 1 : 0;
  });
  EXPECT_EQ(rc, 0);
}

TEST(Process, ChildForkedAfterInitializationRaisesAndNeverBlocks) {
  auto& alloc = neuronrt::CachingAllocator::instance();
  void* inherited = alloc.allocate(0, 64);
  ASSERT_TRUE(neuronrt::is_initialized());
  // Another thread holds the runtime's locks across the fork, as a thread
  // running kernels may: the child must still not block.
  std::atomic<bool> running{false}, stop{false};
  std::thread busy([&] {
    running = true;
    while (!stop) alloc.free(alloc.allocate(0, 128));
  });
  while (!running) std::this_thread::yield();
  int rc = in_child([&] {
    if (!neuronrt::in_bad_fork()) return 1;
    try {
      alloc.allocate(0, 64);
      return 2;
    } catch (const neuronrt::BadForkError&) {
    }
    try {
      neuronrt::default_stream(0).launch([] {});
      return 3;
    } catch (const neuronrt::BadForkError&) {
    }
    alloc.free(inherited);  // a no-op: the memory goes with the process
    return 0;
  });
  stop = true;
  busy.join();
  EXPECT_EQ(rc, 0);
  EXPECT_FALSE(neuronrt::in_bad_fork());
  alloc.free(inherited);
}
