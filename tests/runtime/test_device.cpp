#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
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
  EXPECT_EQ(neuronrt::parse_bytes("16GiB", 0), size_t{16} << 30);
  EXPECT_EQ(neuronrt::parse_bytes("16gb", 0), size_t{16} << 30);
  EXPECT_EQ(neuronrt::parse_bytes("1.5K", 0), 1536u);
  EXPECT_EQ(neuronrt::parse_bytes(" 2 M ", 0), size_t{2} << 20);
  EXPECT_THROW(neuronrt::parse_bytes("12 parsecs", 0), neuronrt::Error);
  EXPECT_EQ(neuronrt::parse_core_list("0-3"), (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(neuronrt::parse_core_list("1,3"), (std::vector<int>{1, 3}));
  EXPECT_EQ(neuronrt::parse_core_list("0-1, 4"), (std::vector<int>{0, 1, 4}));
  EXPECT_THROW(neuronrt::parse_core_list("a-b"), neuronrt::Error);
  EXPECT_EQ(neuronrt::parse_core_count("3"), 3);
}

TEST(Device, RejectsMalformedSizes) {
  for (const char* bad : {"lots", "-1", "10P", "0", "1e9", "0x10", "inf", "nan", "G", ".", "1.2.3",
                          "16 GiBs", "99999999T"}) {
    EXPECT_THROW(neuronrt::parse_bytes(bad, 0), neuronrt::Error) << bad;
  }
}

TEST(Device, RejectsMalformedCoreLists) {
  for (const char* bad : {"abc", "3-1", "-5", "1,1", "0-2,1", "0,,1", "0,", ",0", "1-", "-", "+1", "0x1", "128",
                          "0-200", "1.5"}) {
    EXPECT_THROW(neuronrt::parse_core_list(bad), neuronrt::Error) << bad;
  }
}

TEST(Device, RejectsMalformedCoreCounts) {
  for (const char* bad : {"abc", "-5", "0", "3-1", "2.0", "", "129", "1e3", "4 cores"}) {
    EXPECT_THROW(neuronrt::parse_core_count(bad), neuronrt::Error) << bad;
  }
}

TEST(Device, ConfigurationErrorNamesTheVariable) {
  auto ok = neuronrt::parse_device_config(nullptr, nullptr, nullptr);
  EXPECT_TRUE(ok.error.empty());
  EXPECT_EQ(ok.cores, (std::vector<int>{0, 1}));
  EXPECT_EQ(ok.hbm_bytes, size_t{16} << 30);

  auto visible = neuronrt::parse_device_config("2-3", "1", "1G");
  EXPECT_TRUE(visible.error.empty()) << visible.error;
  EXPECT_EQ(visible.cores, (std::vector<int>{2, 3}));
  EXPECT_EQ(visible.hbm_bytes, size_t{1} << 30);

  struct Case {
    const char* visible;
    const char* num;
    const char* hbm;
    const char* variable;
  };
  for (const Case& c : {Case{nullptr, "abc", nullptr, "NEURON_RT_NUM_CORES='abc'"},
                        Case{nullptr, "-5", nullptr, "NEURON_RT_NUM_CORES='-5'"},
                        Case{"3-1", nullptr, nullptr, "NEURON_RT_VISIBLE_CORES='3-1'"},
                        Case{"0,0", nullptr, nullptr, "NEURON_RT_VISIBLE_CORES='0,0'"},
                        Case{nullptr, nullptr, "lots", "NEURON_RT_HBM_BYTES='lots'"},
                        Case{nullptr, nullptr, "-1", "NEURON_RT_HBM_BYTES='-1'"},
                        Case{nullptr, nullptr, "10P", "NEURON_RT_HBM_BYTES='10P'"},
                        // A malformed count is reported even when the core list wins.
                        Case{"0-1", "abc", nullptr, "NEURON_RT_NUM_CORES='abc'"}}) {
    auto config = neuronrt::parse_device_config(c.visible, c.num, c.hbm);
    EXPECT_NE(config.error.find(c.variable), std::string::npos) << config.error;
    EXPECT_NE(config.error.find("Accepted:"), std::string::npos) << config.error;
    EXPECT_TRUE(config.cores.empty());
  }
}

// Registered a second time by CMake with NEURON_RT_NUM_CORES=abc (test
// "DeviceEnvironment.MalformedNumCores.env"): the process-wide topology then has
// no devices and every checked entry point raises ConfigurationError.
TEST(DeviceEnvironment, MalformedNumCores) {
  const char* num = std::getenv("NEURON_RT_NUM_CORES");
  if (!num || std::string(num) != "abc") GTEST_SKIP() << "runs under NEURON_RT_NUM_CORES=abc only";
  EXPECT_EQ(neuronrt::device_count(), 0);
  EXPECT_NE(neuronrt::configuration_error().find("NEURON_RT_NUM_CORES='abc'"), std::string::npos);
  EXPECT_THROW(neuronrt::check_configuration(), neuronrt::ConfigurationError);
  EXPECT_THROW(neuronrt::set_device(0), neuronrt::ConfigurationError);
  EXPECT_THROW(neuronrt::device_properties(0), neuronrt::ConfigurationError);
}

TEST(Device, DefaultEnvironmentIsValid) {
  EXPECT_EQ(neuronrt::configuration_error(), "");
  EXPECT_NO_THROW(neuronrt::check_configuration());
}
