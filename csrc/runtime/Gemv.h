// Matrix-vector products of a few rows: the matmuls of a decode step.
//
// With one to four rows of activations against a weight matrix, a matmul
// reads every weight once and does two flops per weight: it is bound by
// memory bandwidth, and a GEMM library's blocking for reuse only costs
// there (at one thread, MKL's sgemm/sgemv read ~6.5 GB/s on this project's
// machine, a plain reduction 15-20 GB/s). These kernels stream the weights
// once, front to back, a row at a time against every activation row.
// One build per ISA (gemv/GemvKernels.inc), picked once per process.
#pragma once

#include <cstdint>

namespace neuronrt {

// out[m * ldo + n] = sum_k a[m * lda + k] * w[n * ldw + k]  (+ bias[m * ldb + n])
// for m < rows (1..4) and n in [n_begin, n_end), in float32; `bias` may be
// null, ldb 0 (one bias row) or a row stride (a matrix added, e.g. a residual). Rows of `a` and `w` are contiguous in k; `out` does not overlap the
// inputs. Callers split [0, N) across threads.
void gemv_f32(int64_t rows, int64_t n_begin, int64_t n_end, int64_t k, const float* a, int64_t lda, const float* w,
              int64_t ldw, const float* bias, int64_t ldb, float* out, int64_t ldo);

// The most activation rows gemv_f32 takes.
constexpr int64_t kGemvMaxRows = 4;

// Which build gemv_f32 uses: "avx512", "avx2" or "generic".
const char* gemv_isa();

}  // namespace neuronrt
