// The small-M GEMM kernels (Gemm.h): every ISA build this CPU can run matches
// a float64 reference within float32 matmul rounding, for rows around the
// register tile's (whole tiles and every leftover), weight rows around the
// 4-row blocks, lengths around the vector width and the K blocks, padded
// leading dimensions, a bias row or matrix, and a sub-range of output columns (what one
// thread computes), leaving the rest of the output untouched.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "csrc/runtime/Gemm.h"
#include "csrc/runtime/gemm/GemmKernels.h"

namespace gemm = neuronrt::gemm;

namespace {

struct Build {
  const char* name;
  gemm::GemmFn fn;
};

std::vector<Build> builds() {
  std::vector<Build> b{{"generic", gemm::generic::gemm_f32}};
#if defined(__x86_64__)
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) b.push_back({"avx2", gemm::avx2::gemm_f32});
  if (__builtin_cpu_supports("avx512f")) b.push_back({"avx512", gemm::avx512::gemm_f32});
#endif
  return b;
}

struct Case {
  int64_t rows, n, k, lda, ldw, ldo, begin, end;
  bool bias;
  int64_t ldb = 0;  // 0: one bias row; else a bias matrix's row stride
};

void check(const Build& build, const Case& c) {
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
      ASSERT_NEAR(got, ref, double(c.k + 1) * 0x1p-24 * mag + 1e-6)
          << what << " at " << m << "," << j;
    }
  }
}

TEST(Gemm, MatchesReferenceInEveryBuild) {
  for (const Build& b : builds()) {
    for (int64_t rows : {1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 15, 16, 17, 33}) {
      for (int64_t k : {1, 15, 16, 17, 100, 576, 769, 1600}) {
        for (int64_t n : {1, 3, 4, 5, 13}) {
          check(b, {rows, n, k, k, k, n, 0, n, false});
          check(b, {rows, n, k, k + 3, k + 5, n + 2, 0, n, true});
          check(b, {rows, n, k, k, k, n, 0, n, true, n + 1});  // a bias matrix
        }
      }
      // One thread's share of the columns, from inside a 4-row block.
      check(b, {rows, 50, 33, 33, 40, 50, 9, 31, true});
    }
  }
}

TEST(Gemm, PicksTheWidestBuild) {
  const std::string isa = neuronrt::gemm_isa();
  EXPECT_EQ(isa, builds().back().name);
}

}  // namespace
