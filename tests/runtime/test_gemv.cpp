// The GEMV kernels (Gemv.h): every ISA build this CPU can run matches a
// float64 reference within float32 matmul rounding, for 1-4 activation rows,
// lengths around the vector width and the 4-row blocks, lengths that take the
// two-pass path (rows past half of L1), padded leading
// dimensions, a bias row or matrix, and a sub-range of output columns (what
// one thread computes), leaving the rest of the output untouched.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "MatmulCheck.h"
#include "csrc/runtime/Gemv.h"
#include "csrc/runtime/gemv/GemvKernels.h"

namespace gemv = neuronrt::gemv;

namespace {

using matmul_check::Build;

std::vector<Build> builds() {
  std::vector<Build> b{{"generic", gemv::generic::gemv_f32}};
#if defined(__x86_64__)
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) b.push_back({"avx2", gemv::avx2::gemv_f32});
  if (__builtin_cpu_supports("avx512f")) b.push_back({"avx512", gemv::avx512::gemv_f32});
#endif
  return b;
}

using matmul_check::Case;
using matmul_check::check;

TEST(Gemv, MatchesReferenceInEveryBuild) {
  for (const Build& b : builds()) {
    for (int64_t rows = 1; rows <= neuronrt::kGemvMaxRows; ++rows) {
      for (int64_t k : {1, 15, 16, 17, 64, 100, 576}) {
        for (int64_t n : {1, 3, 4, 5, 13, 64}) {
          check(b, {rows, n, k, k, k, n, 0, n, false});
          check(b, {rows, n, k, k + 3, k + 5, n + 2, 0, n, true});
          check(b, {rows, n, k, k, k, n, 0, n, true, n + 1});  // a bias matrix
        }
      }
      // One thread's share of the columns.
      check(b, {rows, 50, 33, 33, 40, 50, 9, 31, true});
      // Three or four rows past half of L1 run two rows at a time over blocks
      // of weight rows (several blocks here), and a tail past the 16 lanes.
      for (int64_t k : {1100, 1536, 1543}) {
        check(b, {rows, 300, k, k, k, 300, 0, 300, true});
        check(b, {rows, 300, k, k + 3, k + 5, 302, 7, 290, true, 301});  // a bias matrix
        check(b, {rows, 300, k, k, k, 300, 100, 101, false});
      }
    }
  }
}

TEST(Gemv, PicksTheWidestBuild) {
  const std::string isa = neuronrt::gemv_isa();
  EXPECT_EQ(isa, builds().back().name);
}

}  // namespace
