// The small-M GEMM kernels, one build per ISA (GemmKernels.inc); Gemm.cpp
// picks one.
#pragma once

#include <cstdint>

namespace neuronrt::gemm {

using GemmFn = void (*)(int64_t rows, int64_t n_begin, int64_t n_end, int64_t k, const float* a, int64_t lda,
                        const float* w, int64_t ldw, const float* bias, int64_t ldb, float* out,
                        int64_t ldo);

namespace generic {
void gemm_f32(int64_t, int64_t, int64_t, int64_t, const float*, int64_t, const float*, int64_t, const float*, int64_t,
              float*, int64_t);
}
namespace avx2 {
void gemm_f32(int64_t, int64_t, int64_t, int64_t, const float*, int64_t, const float*, int64_t, const float*, int64_t,
              float*, int64_t);
}
namespace avx512 {
void gemm_f32(int64_t, int64_t, int64_t, int64_t, const float*, int64_t, const float*, int64_t, const float*, int64_t,
              float*, int64_t);
}

}  // namespace neuronrt::gemm
