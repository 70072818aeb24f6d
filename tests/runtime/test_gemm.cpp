// The small-M GEMM kernels (Gemm.h): every ISA build this CPU can run matches
// a float64 reference within float32 matmul rounding, for rows around the
// register tile's (whole tiles and every leftover) and the 64-row passes, weight rows around the
// 4-row blocks, lengths around the vector width and the K blocks, padded
// leading dimensions, a bias row or matrix, and a sub-range of output columns (what one
// thread computes), leaving the rest of the output untouched.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "MatmulCheck.h"
#include "csrc/runtime/Gemm.h"
#include "csrc/runtime/gemm/GemmKernels.h"

namespace gemm = neuronrt::gemm;

namespace {

using matmul_check::Build;

std::vector<Build> builds() {
  std::vector<Build> b{{"generic", gemm::generic::gemm_f32}};
#if defined(__x86_64__)
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) b.push_back({"avx2", gemm::avx2::gemm_f32});
  if (__builtin_cpu_supports("avx512f")) b.push_back({"avx512", gemm::avx512::gemm_f32});
#endif
  return b;
}

using matmul_check::Case;
using matmul_check::check;

TEST(Gemm, MatchesReferenceInEveryBuild) {
  for (const Build& b : builds()) {
    for (int64_t rows : {1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 15, 16, 17, 33, 65, 130}) {
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
