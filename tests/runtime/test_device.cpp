#include <gtest/gtest.h>

#include <thread>

#include "csrc/runtime/Device.h"
#include "csrc/runtime/Error.h"

TEST(Device, DefaultTopology) {
  // CTest runs without NEURON_RT_* overrides: two cores of 16 GiB.
  EXPECT_EQ(neuronrt::device_count(), 2);
  EXPECT_EQ(neuronrt::device_properties(0).total_memory, size_t{16} << 30);
}

TEST(Device, CurrentDeviceIsThreadLocal) {
  neuronrt::set_device(1);
  EXPECT_EQ(neuronrt::current_device(), 1);
  int seen = -1;
  std::thread([&] { seen = neuronrt::current_device(); }).join();
  EXPECT_EQ(seen, 0);
  EXPECT_EQ(neuronrt::exchange_device(0), 1);
  EXPECT_EQ(neuronrt::current_device(), 0);
}

TEST(Device, InvalidIndexThrows) {
  EXPECT_THROW(neuronrt::set_device(2), neuronrt::InvalidDeviceError);
  EXPECT_THROW(neuronrt::set_device(-1), neuronrt::InvalidDeviceError);
  EXPECT_EQ(neuronrt::current_device(), 0);
}

TEST(Device, ParsesConfiguration) {
  EXPECT_EQ(neuronrt::parse_bytes("16G", 0), size_t{16} << 30);
  EXPECT_EQ(neuronrt::parse_bytes("512MiB", 0), size_t{512} << 20);
  EXPECT_EQ(neuronrt::parse_bytes("1024", 0), 1024u);
  EXPECT_EQ(neuronrt::parse_bytes(nullptr, 7), 7u);
  EXPECT_THROW(neuronrt::parse_bytes("12 parsecs", 0), neuronrt::Error);
  EXPECT_EQ(neuronrt::parse_core_list("0-3"), (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(neuronrt::parse_core_list("1,3"), (std::vector<int>{1, 3}));
  EXPECT_THROW(neuronrt::parse_core_list("a-b"), neuronrt::Error);
}
