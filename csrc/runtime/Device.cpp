#include "Device.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>

#include "Error.h"
#include "Philox.h"
#include "Target.h"
#include "Stream.h"

namespace neuronrt {
namespace {


std::string trim(const std::string& text) {
  size_t b = 0, e = text.size();
  while (b < e && std::isspace(static_cast<unsigned char>(text[b]))) ++b;
  while (e > b && std::isspace(static_cast<unsigned char>(text[e - 1]))) --e;
  return text.substr(b, e - b);
}

bool all_digits(const std::string& text) {
  return !text.empty() &&
         std::all_of(text.begin(), text.end(), [](unsigned char c) { return std::isdigit(c); });
}

// A non-negative decimal integer no larger than `max`; no sign, no spaces.
int parse_index(const std::string& text, int max, const char* what) {
  if (!all_digits(text)) {
    throw Error(std::string(what) + " '" + text + "' is not a non-negative decimal integer");
  }
  if (text.size() > 6 || std::stoi(text) > max) {
    throw Error(std::string(what) + " " + text + " exceeds the maximum " + std::to_string(max));
  }
  return std::stoi(text);
}

std::string describe(const char* variable, const char* value, const Error& e, const char* accepted) {
  return std::string(variable) + "='" + value + "' is invalid (" + e.what() + "). Accepted: " + accepted + ".";
}

const DeviceConfig& environment_config() {
  static const DeviceConfig config = [] {
    const TargetModel& t = target();
    DeviceConfig c = parse_device_config(std::getenv("NEURON_RT_VISIBLE_CORES"), std::getenv("NEURON_RT_NUM_CORES"),
                                         std::getenv("NEURON_RT_HBM_BYTES"), t.cores_per_chip, t.hbm_per_core);
    for (const std::string* e : {&target_error(), &launch_blocking_error(), &rng_mode_error()}) {
      if (e->empty()) continue;
      c.error += (c.error.empty() ? "" : "\n") + *e;
      c.cores.clear();
    }
    return c;
  }();
  return config;
}

struct Topology {
  std::vector<DeviceProperties> devices;
};

const Topology& topology() {
  static const Topology topo = [] {
    Topology t;
    const DeviceConfig& config = environment_config();
    for (int core : config.cores) {
      DeviceProperties p;
      const TargetModel& model = target();
      p.name = model.core_name + " (" + (model.name.empty() ? "" : model.name + ", ") + "host runtime)";
      p.major = model.major;
      p.total_memory = config.hbm_bytes;
      p.physical_core = core;
      t.devices.push_back(p);
    }
    return t;
  }();
  return topo;
}

thread_local int tls_current_device = 0;

}  // namespace

DeviceConfig parse_device_config(const char* visible_cores, const char* num_cores, const char* hbm_bytes,
                                 int default_cores, size_t default_hbm) {
  DeviceConfig config;
  auto fail = [&](const std::string& line) {
    if (!config.error.empty()) config.error += "\n";
    config.error += line;
  };
  // Every variable that is set is validated, even one that another overrides:
  // a malformed value is a mistake whichever variable wins.
  std::vector<int> visible;
  if (visible_cores && *visible_cores) {
    try {
      visible = parse_core_list(visible_cores);
    } catch (const Error& e) {
      fail(describe("NEURON_RT_VISIBLE_CORES", visible_cores, e,
                    "a comma-separated list of distinct core indices or ascending ranges, e.g. '0-3', '1,3' or "
                    "'0-1,4'"));
    }
  }
  int count = default_cores;
  if (num_cores && *num_cores) {
    try {
      count = parse_core_count(num_cores);
    } catch (const Error& e) {
      fail(describe("NEURON_RT_NUM_CORES", num_cores, e,
                    ("a device count from 1 to " + std::to_string(kMaxDevices) + ", e.g. '2'").c_str()));
    }
  }
  try {
    config.hbm_bytes = parse_bytes(hbm_bytes, default_hbm);
  } catch (const Error& e) {
    fail(describe("NEURON_RT_HBM_BYTES", hbm_bytes, e,
                  "a positive byte count with an optional binary suffix K, M, G or T (also written KB/KiB, ...), "
                  "e.g. '16G', '16GiB', '1.5G' or '1073741824'"));
  }
  if (!config.error.empty()) return config;
  if (visible_cores && *visible_cores) {
    config.cores = std::move(visible);
  } else {
    for (int i = 0; i < count; ++i) config.cores.push_back(i);
  }
  return config;
}

size_t parse_bytes(const char* text, size_t fallback) {
  if (!text || !*text) return fallback;
  const std::string s = trim(text);
  // Digits with an optional fraction, then an optional unit: no sign, no
  // exponent, no hex (strtod would take all three).
  size_t i = 0;
  while (i < s.size() && std::isdigit(static_cast<unsigned char>(s[i]))) ++i;
  size_t int_digits = i;
  size_t frac_digits = 0;
  if (i < s.size() && s[i] == '.') {
    ++i;
    while (i < s.size() && std::isdigit(static_cast<unsigned char>(s[i]))) ++i, ++frac_digits;
  }
  if (int_digits + frac_digits == 0) {
    throw Error("not a size: expected digits, got '" + s + "'");
  }
  const std::string number = s.substr(0, i);
  std::string unit;
  for (char c : trim(s.substr(i))) unit.push_back(static_cast<char>(std::toupper(static_cast<unsigned char>(c))));
  int shift = 0;
  if (unit.empty() || unit == "B") shift = 0;
  else if (unit == "K" || unit == "KB" || unit == "KIB") shift = 10;
  else if (unit == "M" || unit == "MB" || unit == "MIB") shift = 20;
  else if (unit == "G" || unit == "GB" || unit == "GIB") shift = 30;
  else if (unit == "T" || unit == "TB" || unit == "TIB") shift = 40;
  else throw Error("unknown unit '" + s.substr(i) + "'");
  const long double bytes = std::strtold(number.c_str(), nullptr) * std::ldexp(1.0L, shift);
  if (bytes < 1) throw Error("the size must be at least 1 byte");
  if (bytes >= std::ldexp(1.0L, 62)) throw Error("the size is too large");
  return static_cast<size_t>(bytes);
}

std::vector<int> parse_core_list(const std::string& text) {
  std::vector<int> cores;
  std::vector<bool> seen(kMaxCoreIndex + 1, false);
  size_t pos = 0;
  while (true) {
    size_t comma = text.find(',', pos);
    const std::string item = trim(text.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos));
    if (item.empty()) throw Error("empty entry in the core list");
    size_t dash = item.find('-');
    int lo, hi;
    if (dash == std::string::npos) {
      lo = hi = parse_index(item, kMaxCoreIndex, "core index");
    } else {
      lo = parse_index(trim(item.substr(0, dash)), kMaxCoreIndex, "core index");
      hi = parse_index(trim(item.substr(dash + 1)), kMaxCoreIndex, "core index");
      if (hi < lo) throw Error("descending range '" + item + "'");
    }
    for (int c = lo; c <= hi; ++c) {
      if (seen[c]) throw Error("core " + std::to_string(c) + " is listed twice");
      seen[c] = true;
      cores.push_back(c);
    }
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  if (static_cast<int>(cores.size()) > kMaxDevices) {
    throw Error("more than " + std::to_string(kMaxDevices) + " cores");
  }
  return cores;
}

int parse_core_count(const std::string& text) {
  int n = parse_index(trim(text), kMaxDevices, "device count");
  if (n == 0) throw Error("the device count must be at least 1");
  return n;
}

int device_count() noexcept {
  return static_cast<int>(topology().devices.size());
}

const std::string& configuration_error() noexcept { return environment_config().error; }

void check_configuration() {
  if (!configuration_error().empty()) {
    throw ConfigurationError("the NeuronCore configuration in the environment is malformed, so no neuron device "
                             "is usable:\n" + configuration_error());
  }
}

void check_device(int device) {
  check_configuration();
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
  std::vector<Stream*> streams = all_streams(device);
  for (Stream* s : streams) {
    if (s->is_capturing()) s->capture_violation("a device synchronize would wait for work that does not run until a replay");
  }
  for (Stream* s : streams) s->wait_for(s->issued());
  for (Stream* s : streams) s->check_error();
}

}  // namespace neuronrt
