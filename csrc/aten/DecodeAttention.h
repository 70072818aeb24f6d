// SDPA for a single query position (decode): Attention.cpp's fused path
// takes it instead of the host flash kernel where it applies.
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>

namespace at::neuron {

// Whether decode_attention covers this call: 4-D neuron float32/bfloat16/
// float16 q, k, v with one query position (L == 1), key/value heads a divisor
// of the query heads, equal head dims, no causal mask, no input requiring
// grad (training keeps the flash kernel, bit for bit CPU's), and a boolean or
// additive mask (float32 or q's dtype) broadcastable to [B, H, 1, S].
bool decode_attention_applies(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                              const std::optional<at::Tensor>& mask, bool is_causal);

// Queues one kernel on q's current stream that writes softmax(q·kᵀ·scale +
// mask)·v into `out` ([B, H, 1, E], q's dtype) and the log-sum-exp of the
// scaled scores into `lse` ([B, H, 1] float32), computing in float32. A row
// with no allowed key gets zeros and a log-sum-exp of 0, as the CPU kernel.
void decode_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                      const std::optional<at::Tensor>& mask, double scale, const at::Tensor& out,
                      const at::Tensor& lse);

}  // namespace at::neuron
