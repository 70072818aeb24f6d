// Matrix products of a few to a few hundred rows: a batched decode step's
// matmuls (vLLM with 5-64 sequences in flight) and short prefill chunks.
//
// Past four rows a matmul is no longer bound by reading the weights once
// (gemv, Gemv.h) but by the FMA units. A GEMM library packs the weights to
// reach them, which for a few rows costs as much as the product (MKL's sgemm
// reached 38-75 GFLOP/s at 16 rows, one thread, on this project's machine).
// This kernel works on the weight as nn.Linear stores it, row-major [N, K]:
// a tile of MR activation rows x 4 weight rows keeps MR * 4 accumulators in
// registers, vectors along K, each activation load reused across the 4
// weight rows and each weight load across the MR activation rows; the
// horizontal sums come at the end of the tile, transposed into one vector.
// One build per ISA (gemm/GemmKernels.inc), picked once per process.
#pragma once

#include <cstdint>

namespace neuronrt {

// out[m * ldo + n] = sum_k a[m * lda + k] * w[n * ldw + k]  (+ bias[m * ldb + n])
// for m < rows (any number >= 1) and n in [n_begin, n_end), in float32;
// `bias` may be null, ldb 0 (one bias row) or a row stride (a matrix added,
// e.g. a residual). Rows of `a` and `w` are contiguous in k; `out` does not
// overlap the inputs. Callers split [0, N) across threads, best at multiples
// of kGemmColumnBlock.
void gemm_f32(int64_t rows, int64_t n_begin, int64_t n_end, int64_t k, const float* a, int64_t lda, const float* w,
              int64_t ldw, const float* bias, int64_t ldb, float* out, int64_t ldo);

// Weight rows of one register tile.
constexpr int64_t kGemmColumnBlock = 4;

// Which build gemm_f32 uses: "avx512", "avx2" or "generic".
const char* gemm_isa();

}  // namespace neuronrt
