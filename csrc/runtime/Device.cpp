#include "Device.h"

#include <cctype>
#include <cstdlib>
#include <mutex>

#include "Error.h"
#include "Stream.h"

namespace neuronrt {
namespace {

constexpr int kDefaultCores = 2;
constexpr size_t kDefaultHbmBytes = size_t{16} << 30;

struct Topology {
  std::vector<DeviceProperties> devices;
};

Topology make_topology() {
  Topology topo;
  std::vector<int> cores;
  const char* visible = std::getenv("NEURON_RT_VISIBLE_CORES");
  const char* num = std::getenv("NEURON_RT_NUM_CORES");
  try {
    if (visible && *visible) {
      cores = parse_core_list(visible);
    } else {
      int n = kDefaultCores;
      if (num && *num) n = std::max(0, std::atoi(num));
      for (int i = 0; i < n; ++i) cores.push_back(i);
    }
  } catch (const Error&) {
    cores.clear();  // malformed configuration: no devices rather than a crash
  }
  size_t hbm = kDefaultHbmBytes;
  try {
    hbm = parse_bytes(std::getenv("NEURON_RT_HBM_BYTES"), kDefaultHbmBytes);
  } catch (const Error&) {
  }
  for (int core : cores) {
    DeviceProperties p;
    p.name = "NeuronCore-v3 (host runtime)";
    p.total_memory = hbm;
    p.physical_core = core;
    topo.devices.push_back(p);
  }
  return topo;
}

const Topology& topology() {
  static const Topology topo = make_topology();
  return topo;
}

thread_local int tls_current_device = 0;

}  // namespace

size_t parse_bytes(const char* text, size_t fallback) {
  if (!text || !*text) return fallback;
  char* end = nullptr;
  double value = std::strtod(text, &end);
  if (end == text || value < 0) {
    throw Error(std::string("cannot parse a byte size from '") + text + "'");
  }
  std::string unit;
  for (; *end; ++end) {
    if (!std::isspace(static_cast<unsigned char>(*end))) {
      unit.push_back(static_cast<char>(std::toupper(*end)));
    }
  }
  double scale = 1;
  if (unit.empty() || unit == "B") scale = 1;
  else if (unit == "K" || unit == "KB" || unit == "KIB") scale = 1024.0;
  else if (unit == "M" || unit == "MB" || unit == "MIB") scale = 1024.0 * 1024;
  else if (unit == "G" || unit == "GB" || unit == "GIB") scale = 1024.0 * 1024 * 1024;
  else if (unit == "T" || unit == "TB" || unit == "TIB") scale = 1024.0 * 1024 * 1024 * 1024;
  else throw Error(std::string("unknown byte unit in '") + text + "'");
  return static_cast<size_t>(value * scale);
}

std::vector<int> parse_core_list(const std::string& text) {
  std::vector<int> cores;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t comma = text.find(',', pos);
    std::string item = text.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    pos = comma == std::string::npos ? text.size() : comma + 1;
    if (item.empty()) continue;
    size_t dash = item.find('-');
    try {
      if (dash == std::string::npos) {
        cores.push_back(std::stoi(item));
      } else {
        int lo = std::stoi(item.substr(0, dash));
        int hi = std::stoi(item.substr(dash + 1));
        if (hi < lo) throw Error("descending range");
        for (int c = lo; c <= hi; ++c) cores.push_back(c);
      }
    } catch (const std::exception&) {
      throw Error("malformed core list '" + text + "'");
    }
  }
  return cores;
}

int device_count() noexcept {
  return static_cast<int>(topology().devices.size());
}

void check_device(int device) {
  if (device < 0 || device >= device_count()) {
    throw InvalidDeviceError(device, device_count());
  }
}

int current_device() noexcept { return tls_current_device; }

void set_device(int device) {
  check_device(device);
  tls_current_device = device;
}

int exchange_device(int device) {
  int prev = tls_current_device;
  if (device != prev) set_device(device);
  return prev;
}

const DeviceProperties& device_properties(int device) {
  check_device(device);
  return topology().devices[device];
}

void synchronize_device(int device) {
  check_device(device);
  for (Stream* s : all_streams(device)) s->synchronize();
}

}  // namespace neuronrt
