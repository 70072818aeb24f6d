// Philox4x32-10 counter-based random number generation (Salmon et al.,
// "Parallel random numbers: as easy as 1, 2, 3", SC'11). Stateless: a
// (key, counter) pair maps to four 32-bit outputs, which is what makes
// generator state a plain (seed, offset) pair.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

namespace neuronrt {

using PhiloxOutput = std::array<uint32_t, 4>;

// One Philox block for key `seed` and counter (offset, subsequence).
PhiloxOutput philox4x32(uint64_t seed, uint64_t offset, uint64_t subsequence = 0);

// Fills `out[0..n)` with uniform floats in [0, 1) from consecutive counters
// starting at `offset`. Offsets count 32-bit values drawn, so block
// `offset / 4` comes first and every block yields four values.
void philox_uniform(float* out, size_t n, uint64_t seed, uint64_t offset);

// Number of offset units (multiples of 4) a draw of `n` values consumes.
inline uint64_t philox_offset_increment(size_t n) {
  return (static_cast<uint64_t>(n) + 3) / 4 * 4;
}

// Where the random ops of a process draw from (TORCH_NEURONX_RNG, read once):
// Cpu (the default) runs them on CPU-style engines, so a seeded neuron run
// gives the CPU's numbers; Philox draws every value from the counter stream
// (seed, offset), the device-side scheme.
enum class RngMode { Cpu, Philox };
RngMode rng_mode_setting() noexcept;
// Empty when TORCH_NEURONX_RNG is valid (see check_configuration()).
const std::string& rng_mode_error() noexcept;

}  // namespace neuronrt
