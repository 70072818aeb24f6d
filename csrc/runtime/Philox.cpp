#include "Philox.h"

#include <cstdlib>
#include <cstring>

namespace neuronrt {
namespace {

constexpr uint32_t kPhiloxM0 = 0xD2511F53u;
constexpr uint32_t kPhiloxM1 = 0xCD9E8D57u;
constexpr uint32_t kPhiloxW0 = 0x9E3779B9u;
constexpr uint32_t kPhiloxW1 = 0xBB67AE85u;

inline void mulhilo(uint32_t a, uint32_t b, uint32_t& hi, uint32_t& lo) {
  uint64_t p = static_cast<uint64_t>(a) * b;
  hi = static_cast<uint32_t>(p >> 32);
  lo = static_cast<uint32_t>(p);
}

}  // namespace

PhiloxOutput philox4x32(uint64_t seed, uint64_t offset, uint64_t subsequence) {
  uint32_t k0 = static_cast<uint32_t>(seed);
  uint32_t k1 = static_cast<uint32_t>(seed >> 32);
  PhiloxOutput c = {static_cast<uint32_t>(offset), static_cast<uint32_t>(offset >> 32),
                    static_cast<uint32_t>(subsequence),
                    static_cast<uint32_t>(subsequence >> 32)};
  for (int round = 0; round < 10; ++round) {
    uint32_t hi0, lo0, hi1, lo1;
    mulhilo(kPhiloxM0, c[0], hi0, lo0);
    mulhilo(kPhiloxM1, c[2], hi1, lo1);
    c = {hi1 ^ c[1] ^ k0, lo1, hi0 ^ c[3] ^ k1, lo0};
    k0 += kPhiloxW0;
    k1 += kPhiloxW1;
  }
  return c;
}

void philox_uniform(float* out, size_t n, uint64_t seed, uint64_t offset) {
  constexpr float kScale = 1.0f / 16777216.0f;  // 24 mantissa bits
  for (size_t i = 0; i < n; i += 4) {
    PhiloxOutput r = philox4x32(seed, (offset >> 2) + i / 4);
    for (size_t j = 0; j < 4 && i + j < n; ++j) {
      out[i + j] = static_cast<float>(r[j] >> 8) * kScale;
    }
  }
}

// ---- TORCH_NEURONX_RNG -----------------------------------------------------------

namespace {
struct RngModeSetting {
  RngMode mode = RngMode::Cpu;
  std::string error;
};

const RngModeSetting& rng_mode_from_env() {
  static const RngModeSetting s = [] {
    RngModeSetting out;
    const char* v = std::getenv("TORCH_NEURONX_RNG");
    if (v && *v) {
      if (std::strcmp(v, "philox") == 0) {
        out.mode = RngMode::Philox;
      } else if (std::strcmp(v, "cpu") != 0) {
        out.error = std::string("TORCH_NEURONX_RNG='") + v + "' is invalid. Accepted: cpu or philox.";
      }
    }
    return out;
  }();
  return s;
}
}  // namespace

RngMode rng_mode_setting() noexcept { return rng_mode_from_env().mode; }
const std::string& rng_mode_error() noexcept { return rng_mode_from_env().error; }

}  // namespace neuronrt
