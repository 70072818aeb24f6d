// isin(elements, test_elements) against a few test elements.
//
// ATen's CPU kernel compares each element with the test elements through a
// per-element lambda that re-reads the test tensor's size and stride: 7 ns
// per element for one test element (334 µs over a 49,152-token vocabulary
// at 1 thread, where `==` takes 29 µs). Generation runs it per token: the
// EOS suppression of min_new_tokens / min_length tests the whole vocabulary.
// With at most kFewTestElements test elements of the elements' dtype and
// contiguous elements, this kernel compares them in one loop the compiler
// unrolls and vectorizes (`==`, the comparison ATen's kernel makes: NaN is
// in no set, -0.0 equals 0.0), as one queued launch; any other call takes
// ATen's kernel through the route table (host_call), as does every call in
// strict mode (its host path checks the results).
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <torch/library.h>

#include "Fidelity.h"
#include "HostExecution.h"
#include "OpTracking.h"
#include "csrc/runtime/Runtime.h"

namespace at::neuron {
namespace {

constexpr int64_t kFewTestElements = 8;

bool few_test_elements(const at::Tensor& elements, const at::Tensor& test) {
  const auto dtype = elements.scalar_type();
  return !strict_mode() && elements.device().type() == c10::DeviceType::PrivateUse1 && test.device() == elements.device() &&
         test.scalar_type() == dtype && test.numel() >= 1 && test.numel() <= kFewTestElements &&
         elements.is_contiguous() && elements.numel() > 0 &&
         (at::isIntegralType(dtype, /*includeBool=*/false) || at::isFloatingType(dtype));
}

template <class T, int N>
void compare(const T* e, const T (&t)[kFewTestElements], bool* out, int64_t n, bool invert) {
  for (int64_t i = 0; i < n; ++i) {
    bool hit = false;
    for (int j = 0; j < N; ++j) hit |= e[i] == t[j];
    out[i] = hit != invert;
  }
}

template <class T>
void isin_few(const at::Tensor& elements, const at::Tensor& test, const at::Tensor& out, bool invert) {
  const at::Tensor flat = test.reshape(-1);
  T t[kFewTestElements];
  const int64_t k = flat.numel();
  for (int64_t j = 0; j < kFewTestElements; ++j) t[j] = flat[std::min(j, k - 1)].item<T>();  // pad with a repeat
  const T* e = elements.const_data_ptr<T>();
  bool* o = out.data_ptr<bool>();
  const int64_t n = elements.numel();
  if (k == 1) return compare<T, 1>(e, t, o, n, invert);
  if (k == 2) return compare<T, 2>(e, t, o, n, invert);
  return compare<T, kFewTestElements>(e, t, o, n, invert);
}

at::Tensor isin(const at::Tensor& elements, const at::Tensor& test, bool assume_unique, bool invert) {
  if (!few_test_elements(elements, test)) {
    return host_call("aten::isin", "Tensor_Tensor", {elements, test, assume_unique, invert})[0].toTensor();
  }
  at::Tensor out = at::empty(elements.sizes(), elements.options().dtype(at::kBool));
  note_executed("neuron::isin_few");  // in the op record: tests check which kernel ran
  auto& stream = neuronrt::current_stream(elements.device().index());
  queue_host_work(stream, "isin", elements.nbytes() + test.nbytes() + out.nbytes(),
                  [e = host_alias(elements), t = host_alias(test), o = host_alias(out), invert] {
                    AT_DISPATCH_ALL_TYPES_AND2(at::kHalf, at::kBFloat16, e.scalar_type(), "isin_few",
                                               [&] { isin_few<scalar_t>(e, t, o, invert); });
                  });
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) { m.impl("isin.Tensor_Tensor", &isin); }

}  // namespace at::neuron
