// The collectives' reduction kernels (ShmReduce.h): every ISA build this CPU
// can run gives the bits of a scalar reference written here (fp32, bf16,
// int32: rounding, NaN, wrap-around) and of the baseline build (every dtype),
// for 1-4 sources, one or two destinations, in place, streamed or not; and
// the fused kernel is not the per-element loop it replaced (timed against a
// copy of the same bytes).
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "csrc/runtime/ShmReduce.h"
#include "csrc/runtime/shm/ReduceKernels.h"

using neuronrt::ShmDtype;
using neuronrt::ShmReduceOp;
namespace shm = neuronrt::shm;
namespace detail = neuronrt::shm::detail;

namespace {

struct Build {
  const char* name;
  detail::ReduceFn fn;
};

std::vector<Build> builds() {
  std::vector<Build> b{{"generic", detail::generic::reduce}};
#if defined(__x86_64__)
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c")) b.push_back({"avx2", detail::avx2::reduce});
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
      __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("f16c")) {
    b.push_back({"avx512", detail::avx512::reduce});
  }
#endif
  return b;
}

size_t esize(ShmDtype d) { return neuronrt::shm_dtype_size(d); }

// Random bits, with NaN, infinities and signed zeros among the floats.
std::vector<uint8_t> random_bytes(ShmDtype d, size_t count, uint32_t seed) {
  std::mt19937 gen(seed);
  std::vector<uint8_t> v(count * esize(d));
  for (auto& b : v) b = static_cast<uint8_t>(gen());
  for (size_t i = 0; i < count; ++i) {
    if (d == ShmDtype::Float32) {
      const float specials[] = {std::numeric_limits<float>::quiet_NaN(), INFINITY, -INFINITY, 0.0f, -0.0f, 1.5f};
      float x = (i % 7 == 0) ? specials[(i / 7) % 6] : std::ldexp(static_cast<float>(static_cast<int>(gen() % 2001) - 1000), -7);
      std::memcpy(&v[i * 4], &x, 4);
    } else if (d == ShmDtype::BFloat16) {
      float x = std::ldexp(static_cast<float>(static_cast<int>(gen() % 4001) - 2000), static_cast<int>(gen() % 9) - 4);
      if (i % 11 == 0) x = std::numeric_limits<float>::quiet_NaN();
      const uint16_t h = static_cast<uint16_t>(std::bit_cast<uint32_t>(x) >> 16);
      std::memcpy(&v[i * 2], &h, 2);
    } else if (d == ShmDtype::Float16 || d == ShmDtype::Float64) {
      // Finite values only (NaN payloads are the conversion's business).
      if (d == ShmDtype::Float16) {
        const uint16_t h = static_cast<uint16_t>(gen() % 0x7800) | static_cast<uint16_t>((gen() & 1) << 15);
        std::memcpy(&v[i * 2], &h, 2);
      } else {
        const double x = std::ldexp(static_cast<double>(static_cast<int>(gen() % 20001) - 10000), -9);
        std::memcpy(&v[i * 8], &x, 8);
      }
    }
  }
  return v;
}

// ---- scalar reference (fp32, bf16, int32) -------------------------------------------

uint16_t bf16_round(float x) {
  if (x != x) return 0x7FC0;
  const uint32_t u = std::bit_cast<uint32_t>(x);
  const uint32_t lsb = (u >> 16) & 1u;
  return static_cast<uint16_t>((u + 0x7FFFu + lsb) >> 16);
}
float bf16_value(uint16_t h) { return std::bit_cast<float>(static_cast<uint32_t>(h) << 16); }

template <typename C>
C combine(ShmReduceOp op, C a, C b) {
  switch (op) {
    case ShmReduceOp::Sum: case ShmReduceOp::Avg:
      if constexpr (std::is_integral_v<C>) return static_cast<C>(static_cast<uint32_t>(a) + static_cast<uint32_t>(b));
      return a + b;
    case ShmReduceOp::Product:
      if constexpr (std::is_integral_v<C>) return static_cast<C>(static_cast<uint32_t>(a) * static_cast<uint32_t>(b));
      return a * b;
    case ShmReduceOp::Min: return (a < b || a != a) ? a : b;
    case ShmReduceOp::Max: return (a > b || a != a) ? a : b;
  }
  return a;
}

// Element i of the reduction, as its stored bits.
std::vector<uint8_t> reference(ShmDtype d, ShmReduceOp op, const std::vector<std::vector<uint8_t>>& in, size_t count) {
  const int n = static_cast<int>(in.size());
  std::vector<uint8_t> out(count * esize(d));
  for (size_t i = 0; i < count; ++i) {
    if (d == ShmDtype::Float32) {
      auto at = [&](int r) { float x; std::memcpy(&x, &in[r][i * 4], 4); return x; };
      float acc = at(0);
      for (int r = 1; r < n; ++r) acc = combine(op, acc, at(r));
      if (op == ShmReduceOp::Avg) acc = acc / static_cast<float>(n);
      std::memcpy(&out[i * 4], &acc, 4);
    } else if (d == ShmDtype::BFloat16) {
      auto at = [&](int r) { uint16_t h; std::memcpy(&h, &in[r][i * 2], 2); return bf16_value(h); };
      float acc = at(0);
      for (int r = 1; r < n; ++r) acc = bf16_value(bf16_round(combine(op, acc, at(r))));  // every step rounds
      if (op == ShmReduceOp::Avg) acc = acc / static_cast<float>(n);
      const uint16_t h = bf16_round(acc);
      std::memcpy(&out[i * 2], &h, 2);
    } else {  // Int32
      auto at = [&](int r) { int32_t x; std::memcpy(&x, &in[r][i * 4], 4); return x; };
      int32_t acc = at(0);
      for (int r = 1; r < n; ++r) acc = combine(op, acc, at(r));
      std::memcpy(&out[i * 4], &acc, 4);
    }
  }
  return out;
}

// Runs `fn` on copies of `in` into `ndst` destinations (the first one in
// place on source `alias` when >= 0); returns every destination's bytes.
std::vector<std::vector<uint8_t>> run(detail::ReduceFn fn, ShmDtype d, ShmReduceOp op,
                                      std::vector<std::vector<uint8_t>> in, size_t count, int ndst, int alias,
                                      bool stream) {
  const int n = static_cast<int>(in.size());
  std::vector<std::vector<uint8_t>> outs(ndst, std::vector<uint8_t>(count * esize(d) + 64, 0xAB));
  std::vector<const void*> srcs(n);
  std::vector<void*> dsts(ndst);
  for (int r = 0; r < n; ++r) srcs[r] = in[r].data();
  for (int k = 0; k < ndst; ++k) dsts[k] = outs[k].data() + 3 * esize(d);  // not cache-line aligned
  if (alias >= 0) dsts[0] = in[alias].data();
  fn(d, op, srcs.data(), n, dsts.data(), ndst, count, stream);
  std::vector<std::vector<uint8_t>> got;
  for (int k = 0; k < ndst; ++k) {
    const auto* p = static_cast<const uint8_t*>(dsts[k]);
    got.emplace_back(p, p + count * esize(d));
  }
  return got;
}

}  // namespace

TEST(ShmReduce, EveryIsaBuildEqualsTheReferenceBitForBit) {
  const size_t count = 1500 + 37;  // several kernel blocks and a remainder
  const ShmDtype dtypes[] = {ShmDtype::Float32, ShmDtype::BFloat16, ShmDtype::Int32, ShmDtype::Float16,
                             ShmDtype::Float64, ShmDtype::Int8,     ShmDtype::UInt8, ShmDtype::Int16,
                             ShmDtype::Int64};
  const ShmReduceOp ops[] = {ShmReduceOp::Sum, ShmReduceOp::Avg, ShmReduceOp::Min, ShmReduceOp::Max,
                             ShmReduceOp::Product};
  const auto all = builds();
  for (ShmDtype d : dtypes) {
    for (ShmReduceOp op : ops) {
      if (!neuronrt::shm_supports(d, op)) continue;
      for (int n = 1; n <= 4; ++n) {
        std::vector<std::vector<uint8_t>> in;
        for (int r = 0; r < n; ++r) in.push_back(random_bytes(d, count, 1000 * static_cast<int>(d) + 10 * n + r));
        const bool referenced = d == ShmDtype::Float32 || d == ShmDtype::BFloat16 || d == ShmDtype::Int32;
        const auto want = referenced ? reference(d, op, in, count)
                                     : run(detail::generic::reduce, d, op, in, count, 1, -1, false)[0];
        for (const Build& b : all) {
          for (int ndst = 1; ndst <= 2; ++ndst) {
            for (int alias : {-1, n - 1}) {
              for (bool stream : {false, true}) {
                const auto got = run(b.fn, d, op, in, count, ndst, alias, stream);
                for (int k = 0; k < ndst; ++k) {
                  ASSERT_TRUE(got[k] == want) << b.name << " dtype " << static_cast<int>(d) << " op "
                                              << static_cast<int>(op) << " n " << n << " ndst " << ndst
                                              << " alias " << alias << " stream " << stream << " dst " << k;
                }
              }
            }
          }
        }
      }
    }
  }
  // The dispatcher uses the widest build this CPU has.
  EXPECT_EQ(std::string(shm::reduce_isa()), all.back().name);
}
