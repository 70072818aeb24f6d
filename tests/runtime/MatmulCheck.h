// The reference check the GEMV and GEMM kernel tests share: one call of a
// kernel build (both take the same arguments) against a float64 reference.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

namespace matmul_check {

using KernelFn = void (*)(int64_t rows, int64_t n_begin, int64_t n_end, int64_t k, const float* a, int64_t lda,
                          const float* w, int64_t ldw, const float* bias, int64_t ldb, float* out, int64_t ldo);

struct Build {
  const char* name;
  KernelFn fn;
};

struct Case {
  int64_t rows, n, k, lda, ldw, ldo, begin, end;
  bool bias;
  int64_t ldb = 0;  // 0: one bias row; else a bias matrix's row stride
};

// Runs `c` on random operands: columns [begin, end) must match the reference
// and the rest of the output stay untouched.
inline void check(const Build& build, const Case& c) {
  std::mt19937 gen(static_cast<uint32_t>(c.rows * 1000003 + c.n * 131 + c.k));
  std::normal_distribution<float> dist;
  std::vector<float> a(c.rows * c.lda), w(c.n * c.ldw), bias(c.n + (c.rows - 1) * c.ldb);
  std::vector<float> out(c.rows * c.ldo, -7.0f);
  for (auto* v : {&a, &w, &bias}) {
    for (float& x : *v) x = dist(gen);
  }
  build.fn(c.rows, c.begin, c.end, c.k, a.data(), c.lda, w.data(), c.ldw, c.bias ? bias.data() : nullptr, c.ldb,
           out.data(), c.ldo);
  const std::string what = std::string(build.name) + " rows=" + std::to_string(c.rows) + " n=" + std::to_string(c.n) +
                           " k=" + std::to_string(c.k);
  for (int64_t m = 0; m < c.rows; ++m) {
    for (int64_t j = 0; j < c.ldo; ++j) {
      const float got = out[m * c.ldo + j];
      if (j < c.begin || j >= c.end) {
        ASSERT_EQ(got, -7.0f) << what << ": wrote outside its range at " << m << "," << j;
        continue;
      }
      double ref = c.bias ? bias[m * c.ldb + j] : 0.0, mag = std::fabs(ref);
      for (int64_t i = 0; i < c.k; ++i) {
        ref += double(a[m * c.lda + i]) * double(w[j * c.ldw + i]);
        mag += std::fabs(double(a[m * c.lda + i]) * double(w[j * c.ldw + i]));
      }
      // float32 sums of k + 1 terms in any order: within (k + 1) units of
      // rounding (2^-24) of the magnitudes' sum.
      ASSERT_NEAR(got, ref, double(c.k + 1) * 0x1p-24 * mag + 1e-6) << what << " at " << m << "," << j;
    }
  }
}

}  // namespace matmul_check
