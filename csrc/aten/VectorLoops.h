// Pieces shared by the attention kernels whose loops are written for the
// vectoriser (DecodeAttention.cpp, PagedAttention.cpp).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

// A function marked so is built for AVX-512, AVX2 and the baseline, and the
// best one for the CPU is picked at load (GCC's target_clones).
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define NEURON_ISA_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define NEURON_ISA_CLONES
#endif

namespace at::neuron {

// exp(max(x, -87)) for x <= 88: Cephes' single-precision exp (range
// reduction by ln 2, a degree-6 polynomial, ~1 ulp) as straight-line code the
// vectoriser keeps in registers (libm's expf is a call per element).
inline float exp_clamped(float x) {
  const float c = std::max(x, -87.0f);
  const float k = std::floor(c * 1.44269504088896341f + 0.5f);
  float r = c - k * 0.693359375f;
  r = r - k * -2.12194440e-4f;
  float y = 1.9875691500e-4f;
  y = y * r + 1.3981999507e-3f;
  y = y * r + 8.3334519073e-3f;
  y = y * r + 4.1665795894e-2f;
  y = y * r + 1.6666665459e-1f;
  y = y * r + 5.0000001201e-1f;
  y = y * r * r + r + 1.0f;
  const int32_t bits = (static_cast<int32_t>(k) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  return y * scale;
}

}  // namespace at::neuron
