// vLLM's paged attention (`_C::cpu_attention_with_kv_cache`) on device memory.
//
// vLLM's CPU kernel, run as a queued custom op (QueuedCustomOps.cpp), builds
// a work plan for tiles of up to 128 keys and 8 query heads, packs the
// queries, and pads the keys to 32: at a decode step's shapes (SmolLM2: 16
// sequences, 3 key/value heads of 3 query heads each, ~50 keys) that is
// about 140 µs a layer, 7 % of a 1-thread step. This kernel reads the same
// cache in place, in the layout vLLM's cache write gives it on x86 for
// float32 (its "vec" ISA: per block and head, K column-major [head_dim,
// block_size], V row-major [block_size, head_dim]), and for each (sequence,
// key/value head) scores the query heads that share it block by block over
// the block table, takes a max-subtracted softmax and the weighted sum of
// values, all in float32, in one queued launch. Prefill rows and decode rows
// take the same path (row t of a sequence's q_len sees the first
// seq_len - q_len + t + 1 keys when causal). Anything else (other dtypes,
// ALiBi, sinks, soft-capping, sliding windows, quantized caches) runs vLLM's
// own kernel as before.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "HostExecution.h"
#include "OpTracking.h"
#include "VectorLoops.h"
#include "csrc/runtime/Runtime.h"

namespace at::neuron {
namespace {

constexpr int64_t kSlotTile = 16;     // keys scored together (one AVX-512 vector)
constexpr int64_t kMaxHeadDim = 512;  // the accumulators' stack space

struct Paged {
  at::Tensor q, k, v, out, starts, lens, table;  // host aliases
  int64_t seqs = 0, kv_heads = 0, group = 0, head_dim = 0, block_size = 0;
  int64_t q_s0 = 0, q_s1 = 0, o_s0 = 0, o_s1 = 0, k_s0 = 0, k_s1 = 0, v_s0 = 0, v_s1 = 0, t_s0 = 0;
  float scale = 1.0f;
  bool causal = true;
};

// 16 keys' partial scores: GCC's vector type (one AVX-512 register, two AVX
// ones, four SSE ones in the baseline clone), so the sums stay in registers.
typedef float Tile __attribute__((vector_size(kSlotTile * sizeof(float))));

inline Tile load_tile(const float* p) {
  Tile t;
  std::memcpy(&t, p, sizeof(t));
  return t;
}

// scores[g][j] = scale * q_g . K[:, j] for the `n` keys of one block (K
// column-major [head_dim, block_size]). Tiles of 32 keys are read whole (the
// block size is a multiple of 32) and only the first n kept. With the group
// size known (kG > 0), every query head's sums stay in registers and each
// key load serves all of them; else one head at a time.
template <int64_t kD, int64_t kG>
NEURON_ISA_CLONES void score_block(const float* const* q, int64_t group, const float* __restrict__ kb,
                                   int64_t block_size, int64_t head_dim, int64_t n, float scale,
                                   float* __restrict__ scores, int64_t scores_stride) {
  const int64_t D = kD > 0 ? kD : head_dim;
  constexpr int64_t G = kG > 0 ? kG : 1;
  for (int64_t c = 0; c < n; c += 2 * kSlotTile) {
    for (int64_t g0 = 0; g0 < group; g0 += G) {
      Tile acc[G][2] = {};
      for (int64_t d = 0; d < D; ++d) {
        const Tile k0 = load_tile(kb + d * block_size + c), k1 = load_tile(kb + d * block_size + c + kSlotTile);
        for (int64_t g = 0; g < G; ++g) {
          const float qd = q[g0 + g][d];
          acc[g][0] += qd * k0;
          acc[g][1] += qd * k1;
        }
      }
      for (int64_t g = 0; g < G; ++g) {
        float* __restrict__ dst = scores + (g0 + g) * scores_stride + c;
        const Tile lo = acc[g][0] * scale, hi = acc[g][1] * scale;
        std::memcpy(dst, &lo, sizeof(lo));  // the scores' stride has room for whole tiles
        std::memcpy(dst + kSlotTile, &hi, sizeof(hi));
      }
    }
  }
}

// In place over the first n of a row padded to whole tiles: row <- exp(row
// - max(row)), 0 past n; returns the sum.
NEURON_ISA_CLONES
float softmax_numerator(float* __restrict__ row, int64_t n) {
  const int64_t padded = (n + kSlotTile - 1) / kSlotTile * kSlotTile;
  for (int64_t j = n; j < padded; ++j) row[j] = -std::numeric_limits<float>::infinity();
  Tile m = load_tile(row);
  for (int64_t c = kSlotTile; c < padded; c += kSlotTile) {
    const Tile t = load_tile(row + c);
    m = t > m ? t : m;
  }
  float mx = m[0];
  for (int64_t x = 1; x < kSlotTile; ++x) mx = std::max(mx, m[x]);
  Tile sum = {};
  for (int64_t c = 0; c < padded; c += kSlotTile) {
    float e[kSlotTile];
    for (int64_t x = 0; x < kSlotTile; ++x) e[x] = exp_clamped(row[c + x] - mx);
    for (int64_t x = 0; x < kSlotTile; ++x) e[x] = c + x < n ? e[x] : 0.0f;
    std::memcpy(row + c, e, sizeof(e));
    sum += load_tile(e);
  }
  float total = 0.0f;
  for (int64_t x = 0; x < kSlotTile; ++x) total += sum[x];
  return total;
}

// acc[:] += sum_j p[j] * V[j, :] for the n keys of one block (V row-major);
// two keys at a time, into two sums, for two FMA chains per vector.
template <int64_t kD>
NEURON_ISA_CLONES void accumulate_block(const float* __restrict__ p, const float* __restrict__ vb, int64_t head_dim,
                                        int64_t n, float* __restrict__ acc) {
  const int64_t D = kD > 0 ? kD : head_dim;
  float even[kD > 0 ? kD : kMaxHeadDim] = {}, odd[kD > 0 ? kD : kMaxHeadDim] = {};
  int64_t j = 0;
  for (; j + 1 < n; j += 2) {
    const float w0 = p[j], w1 = p[j + 1];
    const float* __restrict__ r0 = vb + j * D;
    const float* __restrict__ r1 = r0 + D;
    for (int64_t d = 0; d < D; ++d) {
      even[d] += w0 * r0[d];
      odd[d] += w1 * r1[d];
    }
  }
  if (j < n) {
    const float w = p[j];
    const float* __restrict__ r = vb + j * D;
    for (int64_t d = 0; d < D; ++d) even[d] += w * r[d];
  }
  for (int64_t d = 0; d < D; ++d) acc[d] += even[d] + odd[d];
}

// One (sequence, key/value head): every query row of the sequence.
template <int64_t kD, int64_t kG>
void run_item(const Paged& P, int64_t s, int64_t h, std::vector<float>& scratch) {
  const int32_t* starts = P.starts.const_data_ptr<int32_t>();
  const int32_t* lens = P.lens.const_data_ptr<int32_t>();
  const int32_t* table = P.table.const_data_ptr<int32_t>() + s * P.t_s0;
  const float* q = P.q.const_data_ptr<float>();
  const float* k = P.k.const_data_ptr<float>();
  const float* v = P.v.const_data_ptr<float>();
  float* out = P.out.data_ptr<float>();
  const int64_t q0 = starts[s], q_len = starts[s + 1] - q0, seq_len = lens[s];
  const int64_t G = P.group, D = P.head_dim, BS = P.block_size;
  const int64_t stride = (seq_len + 2 * kSlotTile - 1) / (2 * kSlotTile) * (2 * kSlotTile);
  scratch.resize(G * stride + G * D);
  float* scores = scratch.data();
  float* acc = scores + G * stride;
  const float* qrows[64];
  float inv[64];
  for (int64_t t = 0; t < q_len; ++t) {
    const int64_t keys = std::clamp<int64_t>(P.causal ? seq_len - q_len + t + 1 : seq_len, 0, seq_len);
    for (int64_t g = 0; g < G; ++g) qrows[g] = q + (q0 + t) * P.q_s0 + (h * G + g) * P.q_s1;
    std::fill(acc, acc + G * D, 0.0f);
    for (int64_t j = 0; j < keys; j += BS) {
      const int64_t block = table[j / BS];
      score_block<kD, kG>(qrows, G, k + block * P.k_s0 + h * P.k_s1, BS, D, std::min(BS, keys - j), P.scale, scores + j,
                      stride);
    }
    for (int64_t g = 0; g < G; ++g) {
      const float sum = softmax_numerator(scores + g * stride, keys);
      inv[g] = sum > 0.0f ? 1.0f / sum : 0.0f;
    }
    for (int64_t j = 0; j < keys; j += BS) {
      const float* vb = v + table[j / BS] * P.v_s0 + h * P.v_s1;
      for (int64_t g = 0; g < G; ++g) {
        accumulate_block<kD>(scores + g * stride + j, vb, D, std::min(BS, keys - j), acc + g * D);
      }
    }
    for (int64_t g = 0; g < G; ++g) {
      float* o = out + (q0 + t) * P.o_s0 + (h * G + g) * P.o_s1;
      for (int64_t d = 0; d < D; ++d) o[d] = acc[g * D + d] * inv[g];
    }
  }
}

using Item = void (*)(const Paged&, int64_t, int64_t, std::vector<float>&);

template <int64_t kD>
Item pick_for_group(int64_t group) {
  switch (group) {
    case 1: return &run_item<kD, 1>;
    case 2: return &run_item<kD, 2>;
    case 3: return &run_item<kD, 3>;
    case 4: return &run_item<kD, 4>;
    case 6: return &run_item<kD, 6>;
    case 8: return &run_item<kD, 8>;
    default: return &run_item<kD, 0>;
  }
}

// The common head and group sizes with compile-time sizes (registers, no
// alias checks); others through the general loops.
Item pick_item(int64_t head_dim, int64_t group) {
  return head_dim == 64 ? pick_for_group<64>(group) : head_dim == 128 ? pick_for_group<128>(group)
                                                                        : pick_for_group<0>(group);
}

void run(const Paged& P) {
  at::parallel_for(0, P.seqs * P.kv_heads, 1, [&](int64_t begin, int64_t end) {
    thread_local std::vector<float> scratch;
    auto item = pick_item(P.head_dim, P.group);
    for (int64_t i = begin; i < end; ++i) item(P, i / P.kv_heads, i % P.kv_heads, scratch);
  });
}

bool on(const at::Tensor& t, const c10::Device& device) { return t.device() == device; }

// The arguments this kernel takes, else nullopt (vLLM's kernel runs).
std::optional<Paged> plan(const torch::jit::Stack& stack, size_t base) {
  auto arg = [&](size_t i) -> const c10::IValue& { return stack[base + i]; };
  const at::Tensor& query = arg(0).toTensor();
  const at::Tensor& key_cache = arg(1).toTensor();
  const at::Tensor& value_cache = arg(2).toTensor();
  const at::Tensor& output = arg(3).toTensor();
  const at::Tensor& starts = arg(4).toTensor();
  const at::Tensor& lens = arg(5).toTensor();
  const at::Tensor& table = arg(10).toTensor();
  const c10::Device device = query.device();
  if (device.type() != c10::DeviceType::PrivateUse1) return std::nullopt;
  for (const at::Tensor* t : {&key_cache, &value_cache, &output, &starts, &lens, &table}) {
    if (!on(*t, device)) return std::nullopt;
  }
#if !defined(__x86_64__)
  return std::nullopt;  // vLLM's cache write picks another layout off x86
#endif
  if (!arg(8).isNone() || !arg(13).isNone() || !arg(14).isNone()) return std::nullopt;  // ALiBi, sinks, dynamic
  if (arg(11).toDouble() != 0.0 || arg(9).toInt() > 0) return std::nullopt;            // soft-cap, window
  if (arg(17).toStringRef() != "auto") return std::nullopt;                             // quantized cache
  for (const at::Tensor* t : {&query, &key_cache, &value_cache, &output}) {
    if (t->scalar_type() != at::kFloat) return std::nullopt;
  }
  for (const at::Tensor* t : {&starts, &lens, &table}) {
    if (t->scalar_type() != at::kInt) return std::nullopt;
  }
  if (query.dim() != 3 || output.dim() != 3 || key_cache.dim() != 4 || value_cache.dim() != 4 || table.dim() != 2 ||
      starts.dim() != 1 || lens.dim() != 1) {
    return std::nullopt;
  }
  // Decode-like batches only (at most two query rows a sequence on average):
  // with the cache cold it reads it 1.3x faster than vLLM's kernel, but
  // prefill's many rows a sequence run faster in vLLM's tiles (0.6-0.9x).
  if (query.size(0) > 2 * lens.numel()) return std::nullopt;
  const int64_t D = query.size(2), H = query.size(1), KVH = key_cache.size(1), BS = key_cache.size(2);
  // vLLM's "vec" layout is the one for these sizes (others: "vec16").
  if (D % 32 != 0 || BS % 32 != 0 || D > kMaxHeadDim || KVH == 0 || H % KVH != 0 || H / KVH > 64) return std::nullopt;
  if (key_cache.size(3) != D || value_cache.sizes() != key_cache.sizes() || output.sizes() != query.sizes()) {
    return std::nullopt;
  }
  if (query.stride(2) != 1 || output.stride(2) != 1 || key_cache.stride(2) != D || key_cache.stride(3) != 1 ||
      value_cache.stride(2) != D || value_cache.stride(3) != 1 || table.stride(1) != 1 || !starts.is_contiguous() ||
      !lens.is_contiguous() || starts.numel() < lens.numel() + 1) {
    return std::nullopt;
  }
  Paged P;
  P.q = host_alias(query);
  P.k = host_alias(key_cache);
  P.v = host_alias(value_cache);
  P.out = host_alias(output);
  P.starts = host_alias(starts);
  P.lens = host_alias(lens);
  P.table = host_alias(table);
  P.seqs = lens.numel();
  P.kv_heads = KVH;
  P.group = H / KVH;
  P.head_dim = D;
  P.block_size = BS;
  P.q_s0 = query.stride(0);
  P.q_s1 = query.stride(1);
  P.o_s0 = output.stride(0);
  P.o_s1 = output.stride(1);
  P.k_s0 = key_cache.stride(0);
  P.k_s1 = key_cache.stride(1);
  P.v_s0 = value_cache.stride(0);
  P.v_s1 = value_cache.stride(1);
  P.t_s0 = table.stride(0);
  P.scale = static_cast<float>(arg(6).toDouble());
  P.causal = arg(7).toBool();
  return P;
}

void paged_attention(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const size_t n = op.schema().arguments().size();
  TORCH_CHECK(n == 18, "paged attention: unexpected schema ", op.schema());
  const size_t base = stack->size() - n;
  std::optional<Paged> P = plan(*stack, base);
  if (!P) return queue_custom_op(op, stack);
  const c10::DeviceIndex index = (*stack)[base].toTensor().device().index();
  torch::jit::drop(*stack, n);
  // The bound on queued bytes is about memory the host dropped; the cache
  // stays vLLM's, so only the rows count.
  const size_t bytes = P->q.nbytes() + P->out.nbytes();
  note_executed("neuron::paged_attention");  // in the op record: tests check which kernel ran
  queue_host_work(neuronrt::current_stream(index), "paged_attention", bytes, [P = std::move(*P)] { run(P); });
}

}  // namespace

void register_paged_attention(const std::string& qualified) {
  register_neuron_kernel(
      qualified, c10::BoxedKernel::makeFromFunction<&paged_attention>(),
      [](const std::string& qualified, const c10::OperatorHandle& op) {
        const auto& args = op.schema().arguments();
        // vLLM 0.32's signature, checked by name: a changed op keeps vLLM's kernel.
        static const char* expected[] = {"query", "key_cache", "value_cache", "output", "query_start_loc", "seq_lens",
                                         "scale", "causal", "alibi_slopes", "sliding_window_size", "block_table",
                                         "softcap", "scheduler_metadata", "s_aux", "dynamic_causal", "k_scale",
                                         "v_scale", "kv_cache_dtype"};
        TORCH_CHECK(args.size() == std::size(expected) && op.schema().returns().empty(), qualified,
                    " does not have vLLM's cpu_attention_with_kv_cache signature: ", op.schema());
        for (size_t i = 0; i < args.size(); ++i) {
          TORCH_CHECK(args[i].name() == expected[i], qualified, ": argument ", i, " is '", args[i].name(),
                      "', expected '", expected[i], "'");
        }
      });
}

}  // namespace at::neuron
