// SDPA for one query position: the decode step of a generating model.
//
// The host flash kernel tiles queries and keys for long sequences; for a
// single query row per head its setup outweighs the work (SmolLM2's 9 heads
// × 100 keys × 64: 17 µs per call in a graph replay, this kernel 11 µs;
// benchmarks/decode_attention.py). This kernel reads q, k, v and the mask
// through their strides (a static cache's slice, HF's expanded key/value
// heads, a broadcast mask); for each (batch, key/value head) it scores the
// query heads that share it in one GEMV pass over the keys, takes a
// max-subtracted softmax and the weighted sum of values in float32, and the
// whole call runs as one queued launch, so graph capture records it like any
// queued kernel.
#include "DecodeAttention.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "HostExecution.h"
#include "OpTracking.h"
#include "VectorLoops.h"
#include "csrc/runtime/Runtime.h"

namespace at::neuron {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// A tensor's bytes and strides (in elements) as the kernel reads them; the
// alias keeps the device memory alive until the kernel has run.
struct View {
  at::Tensor alias;
  int64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
};

View view_of(const at::Tensor& t) {
  return {host_alias(t), t.stride(0), t.stride(1), t.stride(2), t.stride(3)};
}

// A mask broadcastable to [B, H, 1, S]: stride 0 along its broadcast and
// missing leading dimensions.
View mask_view_of(const at::Tensor& m) {
  int64_t strides[4] = {0, 0, 0, 0};
  for (int64_t i = 0; i < m.dim(); ++i) {
    if (m.size(i) != 1) strides[4 - m.dim() + i] = m.stride(i);
  }
  return {host_alias(m), strides[0], strides[1], strides[2], strides[3]};
}

struct Problem {
  int64_t B, H, group, S, E;
  float scale;
  View q, k, v, mask, out;  // mask: expanded to [B, H, 1, S], or no alias
  at::Tensor lse;           // [B, H, 1] float32 alias, contiguous
};

inline float to_float(float x) { return x; }
inline float to_float(c10::BFloat16 x) { return static_cast<float>(x); }
inline float to_float(c10::Half x) { return static_cast<float>(x); }

// Row `n` elements at stride `step` as float32: the row itself when it
// already is one, else converted into `buf`.
template <class T>
const float* row(const T* p, int64_t step, int64_t n, float* buf) {
  if constexpr (std::is_same_v<T, float>) {
    if (step == 1) return p;
  }
  for (int64_t i = 0; i < n; ++i) buf[i] = to_float(p[i * step]);
  return buf;
}

template <class M>
float mask_term(const M* m) {
  if constexpr (std::is_same_v<M, bool>) {
    return *m ? 0.f : kNegInf;
  } else {
    return to_float(*m);
  }
}

// The rows [0, S) of a [S, E] slab at row stride `ld` (elements contiguous
// when `step` is 1) as float32: the slab itself when it already is one, else
// converted into `buf`. Returns the pointer and its row stride.
template <class T>
std::pair<const float*, int64_t> slab(const T* p, int64_t ld, int64_t step, int64_t S, int64_t E,
                                      std::vector<float>& buf) {
  if constexpr (std::is_same_v<T, float>) {
    if (step == 1) return {p, ld};
  }
  buf.resize(S * E);
  for (int64_t s = 0; s < S; ++s) row(p + s * ld, step, E, buf.data() + s * E);
  return {buf.data(), E};
}

// x[i] = exp(x[i] - max) for scores at most `max`; returns their sum. libm's
// expf is a call per element (the softmax's largest cost for ~100 keys);
// exp_clamped is written so the loop vectorises. Exponents below -87 (and
// masked keys' -inf) give exactly 0.
NEURON_ISA_CLONES
float exp_shifted(float* x, int64_t n, float max) {
  for (int64_t i = 0; i < n; ++i) {
    const float d = x[i] - max;
    x[i] = d < -87.f ? 0.f : exp_clamped(d);
  }
  float acc[8] = {};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int j = 0; j < 8; ++j) acc[j] += x[i + j];
  }
  float sum = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
  for (; i < n; ++i) sum += x[i];
  return sum;
}

// acc[r][e] = sum_s w[r][s] * v[s][e] for the `rows` query heads sharing one
// value head: each value row is read once for all of them. The loops
// vectorise; on x86-64 the widest ISA the machine has is picked at load time.
NEURON_ISA_CLONES
void weighted_sum(int64_t rows, int64_t S, int64_t E, const float* w, int64_t ldw, const float* v, int64_t ldv,
                  float* acc) {
  std::fill(acc, acc + rows * E, 0.f);
  for (int64_t s = 0; s < S; ++s) {
    const float* vs = v + s * ldv;
    for (int64_t r = 0; r < rows; ++r) {
      const float p = w[r * ldw + s];
      if (p == 0.f) continue;  // masked keys
      float* a = acc + r * E;
      for (int64_t e = 0; e < E; ++e) a[e] += p * vs[e];
    }
  }
}

// The same sums (same order over s) for a head size known at compile time:
// one query head at a time, its E sums held in registers across the keys
// instead of loaded and stored per key (the value slab is re-read from cache
// per head).
template <int E>
NEURON_ISA_CLONES void weighted_sum_fixed(int64_t rows, int64_t S, const float* w, int64_t ldw, const float* v,
                                                int64_t ldv, float* acc) {
  for (int64_t r = 0; r < rows; ++r) {
    float a[E] = {};
    const float* wr = w + r * ldw;
    for (int64_t s = 0; s < S; ++s) {
      const float p = wr[s];
      if (p == 0.f) continue;  // masked keys
      const float* vs = v + s * ldv;
      for (int e = 0; e < E; ++e) a[e] += p * vs[e];
    }
    std::copy(a, a + E, acc + r * E);
  }
}

// One (batch, key/value head) pair and the `group` query heads that share it.
template <class T, class M>
void run(const Problem& p) {
  const T* q = p.q.alias.const_data_ptr<T>();
  const T* k = p.k.alias.const_data_ptr<T>();
  const T* v = p.v.alias.const_data_ptr<T>();
  const M* mask = p.mask.alias.defined() ? p.mask.alias.const_data_ptr<M>() : nullptr;
  T* out = p.out.alias.data_ptr<T>();
  float* lse = p.lse.data_ptr<float>();
  const int64_t S = p.S, E = p.E, G = p.group, Hk = p.H / G;
  const int64_t grain = std::max<int64_t>(1, 65536 / std::max<int64_t>(1, G * S * E));
  at::parallel_for(0, p.B * Hk, grain, [&](int64_t begin, int64_t end) {
    std::vector<float> qrows(G * E), scores(G * S), acc(G * E), kbuf, vbuf;
    for (int64_t bk = begin; bk < end; ++bk) {
      const int64_t b = bk / Hk, hk = bk % Hk, h0 = hk * G;
      for (int64_t r = 0; r < G; ++r) {
        const T* qr = q + b * p.q.s0 + (h0 + r) * p.q.s1;
        for (int64_t e = 0; e < E; ++e) qrows[r * E + e] = to_float(qr[e * p.q.s3]);
      }
      auto [kf, ldk] = slab(k + b * p.k.s0 + hk * p.k.s1, p.k.s2, p.k.s3, S, E, kbuf);
      for (int64_t r0 = 0; r0 < G; r0 += neuronrt::kGemvMaxRows) {
        const int64_t rows = std::min(neuronrt::kGemvMaxRows, G - r0);
        neuronrt::gemv_f32(rows, 0, S, E, qrows.data() + r0 * E, E, kf, ldk, nullptr, 0, scores.data() + r0 * S, S);
      }
      for (int64_t r = 0; r < G; ++r) {
        float* sc = scores.data() + r * S;
        const M* mr = mask ? mask + b * p.mask.s0 + (h0 + r) * p.mask.s1 : nullptr;
        float max = kNegInf;
        for (int64_t s = 0; s < S; ++s) {
          float x = sc[s] * p.scale;
          if (mr) x += mask_term(mr + s * p.mask.s3);
          sc[s] = x;
          max = std::max(max, x);
        }
        if (max == kNegInf) {  // no key allowed: zero weights, a zero output and log-sum-exp, as the CPU kernel
          std::fill(sc, sc + S, 0.f);
          lse[b * p.H + h0 + r] = 0.f;
          continue;
        }
        const float sum = exp_shifted(sc, S, max);
        const float inv = 1.f / sum;
        for (int64_t s = 0; s < S; ++s) sc[s] *= inv;
        lse[b * p.H + h0 + r] = max + std::log(sum);
      }
      auto [vf, ldv] = slab(v + b * p.v.s0 + hk * p.v.s1, p.v.s2, p.v.s3, S, E, vbuf);
      if (E == 64) {
        weighted_sum_fixed<64>(G, S, scores.data(), S, vf, ldv, acc.data());
      } else {
        weighted_sum(G, S, E, scores.data(), S, vf, ldv, acc.data());
      }
      for (int64_t r = 0; r < G; ++r) {
        T* o = out + b * p.out.s0 + (h0 + r) * p.out.s1;
        for (int64_t e = 0; e < E; ++e) o[e * p.out.s3] = static_cast<T>(acc[r * E + e]);
      }
    }
  });
}

template <class T>
void run_for_mask(const Problem& p) {
  if (!p.mask.alias.defined()) return run<T, float>(p);
  switch (p.mask.alias.scalar_type()) {
    case at::kBool: return run<T, bool>(p);
    case at::kFloat: return run<T, float>(p);
    case at::kBFloat16: return run<T, c10::BFloat16>(p);
    case at::kHalf: return run<T, c10::Half>(p);
    default: TORCH_INTERNAL_ASSERT(false, "decode attention: unexpected mask dtype");
  }
}

bool is_kernel_dtype(c10::ScalarType t) { return t == at::kFloat || t == at::kBFloat16 || t == at::kHalf; }

}  // namespace

bool decode_attention_applies(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                              const std::optional<at::Tensor>& mask, bool is_causal) {
  if (is_causal || q.dim() != 4 || k.dim() != 4 || v.dim() != 4) return false;
  for (const at::Tensor* t : {&q, &k, &v, mask && mask->defined() ? &*mask : nullptr}) {
    if (!t) continue;
    if (t->unsafeGetTensorImpl()->has_symbolic_sizes_strides() || t->device() != q.device() ||
        t->layout() != c10::kStrided || t->is_neg() || t->is_conj() || t->_is_zerotensor() || t->requires_grad()) {
      return false;
    }
  }
  if (q.device().type() != c10::DeviceType::PrivateUse1) return false;
  const auto dtype = q.scalar_type();
  if (!is_kernel_dtype(dtype) || k.scalar_type() != dtype || v.scalar_type() != dtype) return false;
  const int64_t B = q.size(0), H = q.size(1), E = q.size(3), S = k.size(2), Hk = k.size(1);
  if (q.size(2) != 1 || S == 0 || B == 0 || H == 0 || E == 0) return false;
  if (k.size(0) != B || v.size(0) != B || v.size(1) != Hk || v.size(2) != S || k.size(3) != E || v.size(3) != E) {
    return false;
  }
  if (Hk == 0 || H % Hk != 0) return false;
  if (mask && mask->defined()) {
    const auto mt = mask->scalar_type();
    if (mt != at::kBool && mt != at::kFloat && mt != dtype) return false;
    if (mask->dim() > 4 || !at::is_expandable_to(mask->sizes(), {B, H, 1, S})) return false;
  }
  return true;
}

void decode_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                      const std::optional<at::Tensor>& mask, double scale, const at::Tensor& out,
                      const at::Tensor& lse) {
  TORCH_INTERNAL_ASSERT(lse.is_contiguous() && lse.numel() == q.size(0) * q.size(1));
  Problem p;
  p.B = q.size(0);
  p.H = q.size(1);
  p.group = p.H / k.size(1);
  p.S = k.size(2);
  p.E = q.size(3);
  p.scale = static_cast<float>(scale);
  p.q = view_of(q);
  p.k = view_of(k);
  p.v = view_of(v);
  p.out = view_of(out);
  p.lse = host_alias(lse);
  size_t bytes = q.nbytes() + k.nbytes() + v.nbytes() + out.nbytes();
  if (mask && mask->defined()) {
    p.mask = mask_view_of(*mask);
    bytes += mask->nbytes();
  }
  note_executed("neuron::decode_attention");  // in the op record: tests check which kernel ran
  auto& stream = neuronrt::current_stream(q.device().index());
  queue_host_work(stream, "decode_attention", bytes, [p = std::move(p), dtype = q.scalar_type()] {
    switch (dtype) {
      case at::kFloat: return run_for_mask<float>(p);
      case at::kBFloat16: return run_for_mask<c10::BFloat16>(p);
      case at::kHalf: return run_for_mask<c10::Half>(p);
      default: TORCH_INTERNAL_ASSERT(false, "decode attention: unexpected dtype");
    }
  });
}

}  // namespace at::neuron
