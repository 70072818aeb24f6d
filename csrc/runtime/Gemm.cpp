#include "Gemm.h"

#include "gemm/GemmKernels.h"

namespace neuronrt {
namespace {

struct Build {
  gemm::GemmFn fn;
  const char* isa;
};

Build pick() {
#if defined(__x86_64__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f")) return {gemm::avx512::gemm_f32, "avx512"};
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return {gemm::avx2::gemm_f32, "avx2"};
#endif
  return {gemm::generic::gemm_f32, "generic"};
}

const Build& build() {
  static const Build b = pick();
  return b;
}

}  // namespace

void gemm_f32(int64_t rows, int64_t n_begin, int64_t n_end, int64_t k, const float* a, int64_t lda, const float* w,
              int64_t ldw, const float* bias, int64_t ldb, float* out, int64_t ldo) {
  build().fn(rows, n_begin, n_end, k, a, lda, w, ldw, bias, ldb, out, ldo);
}

const char* gemm_isa() { return build().isa; }

}  // namespace neuronrt
