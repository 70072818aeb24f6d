// The runtime's own kernels for cases of ATen ops, run by the host path in
// place of the op's CPU kernel.
//
// Matmuls with a few rows (a decode step's projections): `mm` and `addmm`
// (bias row or matrix, beta = alpha = 1) in float32, with the weight a
// transposed row-major matrix as nn.Linear and Inductor pass it. One to four rows run
// neuronrt::gemv_f32 (runtime/Gemv.h): bound by reading the weights once,
// which the CPU kernel (a GEMM library) does at about a third of the memory
// bandwidth. Five to kGemmMaxRows rows run neuronrt::gemm_f32 (runtime/Gemm.h):
// register tiles on the unpacked weight, where the CPU kernel packs it per
// call. Both split the weight's rows across the caller's thread count of the
// runtime's workers (runtime/Workers.h). Small weights (< 64 KiB) keep the
// CPU kernel. Results differ from the CPU kernel's by summation order only
// (matmul tolerances).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <utility>

#include "HostExecution.h"
#include "csrc/runtime/Runtime.h"

namespace at::neuron {
namespace {

constexpr int64_t kMinWeightBytes = 64 * 1024;
// The most rows the GEMM kernel takes, prefill chunks included: with the
// weights from memory (a model's) it ran 104-110 GFLOP/s at 96-512 rows
// where MKL, packing the weight per call, ran 72-100 (in a vLLM batch's
// 198-row prefill, half the kernel's rate); `small_gemm.py --cold`. More rows
// were not measured clearly on the shared host, so they keep the CPU kernel.
constexpr int64_t kGemmMaxRows = 512;
// Rows of the weight per thread chunk: at least this many bytes each.
constexpr int64_t kChunkBytes = 128 * 1024;

std::atomic<int64_t> gemv_calls_{0};
std::atomic<int64_t> gemm_calls_{0};

const c10::FunctionSchema* schema_of(const char* name, const char* overload) {
  return &c10::Dispatcher::singleton().findSchemaOrThrow(name, overload).schema();
}

bool f32(const at::Tensor& t) {
  return t.defined() && t.scalar_type() == at::kFloat && t.layout() == c10::kStrided && !t.is_neg() && !t.is_conj();
}

// The bytes a strided tensor spans (its strides are non-negative here).
std::pair<uintptr_t, uintptr_t> span(const at::Tensor& t) {
  int64_t last = 0;
  for (int64_t d = 0; d < t.dim(); ++d) last += (t.size(d) - 1) * t.stride(d);
  const auto begin = reinterpret_cast<uintptr_t>(t.const_data_ptr());
  return {begin, begin + static_cast<uintptr_t>(last + 1) * t.element_size()};
}

// Disjoint memory (at::get_overlap_status gives up on non-dense views).
bool apart(const at::Tensor& out, const at::Tensor& in) {
  const auto [b0, e0] = span(out);
  const auto [b1, e1] = span(in);
  return e0 <= b1 || e1 <= b0;
}

// Whether a kernel computes bias + a @ wt: a [M, K] (M <= kGemmMaxRows), wt
// [K, N] with wt.t() row-major, a bias row or matrix. (The output is checked
// by fits.)
bool covers(const at::Tensor& a, const at::Tensor& wt, const at::Tensor* bias) {
  if (!f32(a) || !f32(wt) || (bias && !f32(*bias))) return false;
  if (a.dim() != 2 || wt.dim() != 2) return false;
  const int64_t m = a.size(0), k = a.size(1), n = wt.size(1);
  if (m < 1 || m > kGemmMaxRows || k < 1 || wt.size(0) != k || n < 1) return false;
  if (n * k * 4 < kMinWeightBytes || a.stride(1) != 1 || wt.stride(0) != 1) return false;
  if (!bias) return true;
  // A bias row: [N], or [1 or M, N] broadcast over the rows; or a matrix
  // [M, N] with dense rows (Inductor folds a residual add into addmm).
  const at::Tensor& b = *bias;
  return (b.dim() == 1 && b.size(0) == n && b.stride(0) == 1) ||
         (b.dim() == 2 && b.size(1) == n && b.stride(1) == 1 && (b.size(0) == 1 || b.size(0) == m));
}

// The bias's row stride for the kernels: 0 for one row broadcast.
int64_t bias_row_stride(const at::Tensor& b) { return b.dim() == 2 && b.size(0) > 1 ? b.stride(0) : 0; }

// Whether `out` can take the result in place: [M, N] float32 with dense rows
// that do not overlap each other (e.g. a stride-0 expanded out=) or an input.
bool fits(const at::Tensor& out, const at::Tensor& a, const at::Tensor& wt, const at::Tensor* bias) {
  const int64_t m = a.size(0), n = wt.size(1);
  if (!f32(out) || out.dim() != 2 || out.size(0) != m || out.size(1) != n || out.stride(1) != 1) return false;
  if (m > 1 && out.stride(0) < n) return false;
  return apart(out, a) && apart(out, wt) && (!bias || apart(out, *bias));
}

// out = bias + a @ wt, for a call covers() and fits() accept.
void matmul(const at::Tensor& a, const at::Tensor& wt, const at::Tensor* bias, const at::Tensor& out) {
  const int64_t m = a.size(0), k = a.size(1), n = wt.size(1);
  const float* pa = a.const_data_ptr<float>();
  const float* pw = wt.const_data_ptr<float>();
  const float* pb = bias ? bias->const_data_ptr<float>() : nullptr;
  const int64_t ldb = bias ? bias_row_stride(*bias) : 0;
  float* po = out.mutable_data_ptr<float>();
  const int64_t lda = a.stride(0), ldw = wt.stride(1), ldo = out.stride(0);
  // Past a pass of 64 rows (the GEMM's, runtime/Gemm.h) a weight row is
  // more work: grains grow with the passes, so a long prefill split keeps
  // its few large chunks (each chunk streams the activations once more).
  const int64_t grain = std::max<int64_t>(16, kChunkBytes / (k * 4)) * ((m + 63) / 64);
  const int threads = at::get_num_threads();
  // The runtime's workers, not at::parallel_for: see runtime/Workers.h.
  if (m <= neuronrt::kGemvMaxRows) {
    gemv_calls_.fetch_add(1, std::memory_order_relaxed);
    neuronrt::parallel_for(threads, n, grain, [&](int64_t begin, int64_t end) {
      neuronrt::gemv_f32(m, begin, end, k, pa, lda, pw, ldw, pb, ldb, po, ldo);
    });
    return;
  }
  // Split in whole register tiles of weight rows.
  constexpr int64_t block = neuronrt::kGemmColumnBlock;
  gemm_calls_.fetch_add(1, std::memory_order_relaxed);
  neuronrt::parallel_for(threads, (n + block - 1) / block, grain / block, [&](int64_t begin, int64_t end) {
    neuronrt::gemm_f32(m, begin * block, std::min(end * block, n), k, pa, lda, pw, ldw, pb, ldb, po, ldo);
  });
}

bool is_one(const c10::IValue& v) { return v.isScalar() && v.toScalar().equal(1); }

// Runs the call when a runtime kernel covers it; the stack then holds the
// op's return, as after the CPU kernel. (Functional forms reach here from
// the synchronous host path, which maps their host output back.)
bool device_kernel(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  static const auto* mm = schema_of("aten::mm", "");
  static const auto* mm_out = schema_of("aten::mm", "out");
  static const auto* addmm = schema_of("aten::addmm", "");
  static const auto* addmm_out = schema_of("aten::addmm", "out");
  const c10::FunctionSchema* schema = &op.schema();
  const bool is_mm = schema == mm || schema == mm_out;
  if (!is_mm && schema != addmm && schema != addmm_out) return false;
  const bool given_out = schema == mm_out || schema == addmm_out;
  auto& s = *stack;
  const size_t args = (is_mm ? 2 : 5) + (given_out ? 1 : 0);
  const size_t first = s.size() - args;
  if (!is_mm && (!is_one(s[first + 3]) || !is_one(s[first + 4]))) return false;
  const at::Tensor& a = s[first + (is_mm ? 0 : 1)].toTensor();
  const at::Tensor& wt = s[first + (is_mm ? 1 : 2)].toTensor();
  const at::Tensor* bias = is_mm ? nullptr : &s[first].toTensor();
  if (!covers(a, wt, bias)) return false;
  at::Tensor out = given_out ? s.back().toTensor() : at::empty({a.size(0), wt.size(1)}, a.options());
  if (given_out && !fits(out, a, wt, bias)) return false;
  matmul(a, wt, bias, out);
  torch::jit::drop(s, args);
  s.emplace_back(std::move(out));
  return true;
}

}  // namespace

int64_t gemv_calls() { return gemv_calls_.load(std::memory_order_relaxed); }
int64_t gemm_calls() { return gemm_calls_.load(std::memory_order_relaxed); }

void run_host_kernel(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  if (device_kernel(op, stack)) return;
  op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), stack);
}

}  // namespace at::neuron
