// The CUDA attention kernels' ops, for callers that use them directly rather
// than through scaled_dot_product_attention (which takes Attention.cpp's fused
// path on neuron): _scaled_dot_product_efficient_attention (context-parallel
// ring attention), _flash_attention_forward (torch.nn.attention.varlen's
// varlen_attn, packed sequences with cumulative lengths) and
// _efficient_attention_forward (attention biases, nested tensors), with their
// backward ops.
//
// One exact attention computes them all, as ATen ops on device tensors in
// float32 (float64 for float64 inputs), with the same outputs as the CUDA
// kernels: the output in the input dtype, the log-sum-exp of the scaled scores
// per query row in float32 (padded with +inf where the CUDA kernel pads), and
// placeholder RNG state. The backward ops use the given output and
// log-sum-exp, as the kernels do (ring attention passes merged ones).
// Unsupported options (dropout, paged KV, ALiBi, ...) raise.
#include <ATen/ATen.h>
#include <torch/library.h>

#include <cmath>
#include <limits>

#include "OpTracking.h"

namespace at::neuron {
namespace {

enum class Causal { kNone, kTopLeft, kBottomRight };

// Which keys a query sees: causal from the top left (SDPA's is_causal) or the
// bottom right (flash attention's), and flash attention's sliding window of
// `left`/`right` keys around the bottom-right-aligned diagonal (-1: unbounded).
struct Mask {
  Causal causal = Causal::kNone;
  int64_t left = -1, right = -1;
};

constexpr double kInf = std::numeric_limits<double>::infinity();

void check_no_dropout(const char* op, double dropout_p) {
  TORCH_CHECK(dropout_p == 0.0, op, ": neuron attention kernels have no dropout (got dropout_p=", dropout_p,
              "); use scaled_dot_product_attention, whose math path applies dropout");
}

double softmax_scale(std::optional<double> scale, const at::Tensor& q) {
  return scale ? *scale : 1.0 / std::sqrt(static_cast<double>(q.size(-1)));
}

at::ScalarType acc_type(const at::Tensor& q) {
  return q.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
}

// The log-sum-exp the memory-efficient kernels return: [n, heads, len rounded
// up to 32] float32, +inf where no row writes it (empty without compute).
at::Tensor lse_buffer(int64_t n, int64_t heads, int64_t len, bool compute, const at::Tensor& q) {
  return at::full({n, heads, compute ? (len + 31) / 32 * 32 : 0}, kInf, q.options().dtype(at::kFloat));
}

// Key/value heads shared by groups of query heads (grouped-query attention).
at::Tensor expand_heads(const at::Tensor& t, int64_t heads) {
  const int64_t kv = t.size(1);
  TORCH_CHECK(kv > 0 && heads % kv == 0, "attention: ", heads, " query heads cannot share ", kv,
              " key/value heads");
  return kv == heads ? t : t.repeat_interleave(heads / kv, 1);
}

at::Tensor reduce_heads(const at::Tensor& g, int64_t kv_heads) {
  const int64_t heads = g.size(1);
  return heads == kv_heads ? g : g.unflatten(1, {kv_heads, heads / kv_heads}).sum(2);
}

// All inputs [B, H, L|S, E] in the accumulation dtype; bias broadcastable to
// [B, H, L, S]. Returns the masked, scaled scores.
at::Tensor scores(const at::Tensor& q, const at::Tensor& k, const at::Tensor& bias, Mask mask, double scale) {
  at::Tensor s = at::matmul(q, k.transpose(-2, -1)).mul_(scale);
  if (bias.defined()) s = s + bias.to(s.scalar_type());
  const int64_t L = q.size(-2), S = k.size(-2);
  const int64_t diagonal = mask.causal == Causal::kTopLeft ? 0 : S - L;
  const int64_t right = mask.causal != Causal::kNone ? 0 : mask.right;
  if (right >= 0 || mask.left >= 0) {
    at::Tensor allowed = at::ones({L, S}, q.options().dtype(at::kBool));
    if (right >= 0) allowed = allowed.tril(diagonal + right);
    if (mask.left >= 0) allowed = allowed.triu(diagonal - mask.left);
    s = s.masked_fill(allowed.logical_not(), -kInf);
  }
  return s;
}

// Softmax probabilities from the scores and their log-sum-exp; a row with no
// allowed key (log-sum-exp -inf) gets zeros, like the kernels' output.
at::Tensor probs(const at::Tensor& s, const at::Tensor& lse) {
  at::Tensor l = lse.to(s.scalar_type());
  l = l.masked_fill(l.isneginf(), 0.0);
  return (s - l.unsqueeze(-1)).exp();
}

struct Forward {
  at::Tensor out;  // [B, H, L, Ev], accumulation dtype
  at::Tensor lse;  // [B, H, L], float32
};

Forward attention_forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& bias,
                          Mask mask, double scale) {
  const auto acc = acc_type(q);
  const int64_t heads = q.size(1);
  at::Tensor s = scores(q.to(acc), expand_heads(k.to(acc), heads), bias, mask, scale);
  at::Tensor lse = s.logsumexp(-1);
  at::Tensor out = at::matmul(probs(s, lse), expand_heads(v.to(acc), heads));
  return {out, lse.to(at::kFloat)};
}

struct Backward {
  at::Tensor dq, dk, dv;  // accumulation dtype, shaped like q, k, v
  at::Tensor ds;          // [B, H, L, S]: the scores' gradient, i.e. the bias gradient before broadcasting
};

Backward attention_backward(const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& k,
                            const at::Tensor& v, const at::Tensor& bias, const at::Tensor& out,
                            const at::Tensor& lse, Mask mask, double scale) {
  const auto acc = acc_type(q);
  const int64_t heads = q.size(1), kv_heads = k.size(1);
  at::Tensor qa = q.to(acc);
  at::Tensor ka = expand_heads(k.to(acc), heads);
  at::Tensor va = expand_heads(v.to(acc), heads);
  at::Tensor p = probs(scores(qa, ka, bias, mask, scale), lse);
  at::Tensor g = grad_out.to(acc);
  at::Tensor dv = reduce_heads(at::matmul(p.transpose(-2, -1), g), kv_heads);
  at::Tensor dp = at::matmul(g, va.transpose(-2, -1));
  at::Tensor delta = (g * out.to(acc)).sum(-1, /*keepdim=*/true);
  at::Tensor ds = p * (dp - delta);
  at::Tensor dq = at::matmul(ds, ka).mul_(scale);
  at::Tensor dk = reduce_heads(at::matmul(ds.transpose(-2, -1), qa).mul_(scale), kv_heads);
  return {dq, dk, dv, ds};
}

// [L, H, E] (one packed sequence) <-> [1, H, L, E].
at::Tensor seq_to_bhle(const at::Tensor& t) {
  return t.transpose(0, 1).unsqueeze(0);
}

at::Tensor bhle_to_seq(const at::Tensor& t) {
  return t.squeeze(0).transpose(0, 1);
}

std::vector<int64_t> host_offsets(const at::Tensor& cu_seqlens, const char* what) {
  TORCH_CHECK(cu_seqlens.dim() == 1 && cu_seqlens.numel() >= 1, what, " must be a 1-D tensor of cumulative lengths");
  at::Tensor h = cu_seqlens.to(at::kCPU, at::kLong).contiguous();
  std::vector<int64_t> out(h.data_ptr<int64_t>(), h.data_ptr<int64_t>() + h.numel());
  for (size_t i = 1; i < out.size(); ++i) {
    TORCH_CHECK(out[i] >= out[i - 1], what, " must be non-decreasing");
  }
  return out;
}

// The bias gradient in the layout CUDA's kernel allocates: the bias' shape with
// the last dimension's storage padded to a multiple of 16.
at::Tensor bias_grad_like(const at::Tensor& bias, const at::Tensor& grad) {
  auto sizes = bias.sizes().vec();
  const int64_t last = sizes.back();
  sizes.back() = (last + 15) / 16 * 16;
  at::Tensor out = at::empty(sizes, bias.options()).narrow(-1, 0, last);
  return out.copy_(grad.sum_to_size(bias.sizes()));
}

// A bias narrowed to one packed sequence's rows and columns (broadcast
// dimensions stay as they are).
at::Tensor narrow_bias(const at::Tensor& bias, int64_t q0, int64_t lq, int64_t k0, int64_t lk) {
  at::Tensor b = bias;
  if (b.size(-2) != 1) b = b.narrow(-2, q0, lq);
  if (b.size(-1) != 1) b = b.narrow(-1, k0, lk);
  return b;
}

// ---- _scaled_dot_product_efficient_attention: [B, H, L, E], causal from the top left ----

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> sdpa_efficient(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const std::optional<at::Tensor>& attn_bias,
    bool compute_log_sumexp, double dropout_p, bool is_causal, std::optional<double> scale) {
  check_no_dropout("_scaled_dot_product_efficient_attention", dropout_p);
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4,
              "_scaled_dot_product_efficient_attention: expected 4-D query, key and value");
  const int64_t B = q.size(0), H = q.size(1), L = q.size(2);
  at::Tensor bias = attn_bias ? *attn_bias : at::Tensor();
  auto fwd = attention_forward(q, k, v, bias, {is_causal ? Causal::kTopLeft : Causal::kNone},
                               softmax_scale(scale, q));
  // The kernel writes [B, L, H, Ev] memory.
  at::Tensor out = at::empty({B, L, H, v.size(3)}, q.options()).transpose(1, 2).copy_(fwd.out);
  at::Tensor lse = lse_buffer(B, H, L, compute_log_sumexp, q);
  if (compute_log_sumexp) lse.narrow(2, 0, L).copy_(fwd.lse);
  auto seed = at::zeros({}, q.options().dtype(at::kLong));
  return {out, lse, seed, seed.clone()};
}

at::Tensor blhe_like(const at::Tensor& t) {
  return at::empty({t.size(0), t.size(2), t.size(1), t.size(3)}, t.options()).transpose(1, 2);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> sdpa_efficient_backward(
    const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
    const at::Tensor& attn_bias, const at::Tensor& out, const at::Tensor& logsumexp, const at::Tensor&,
    const at::Tensor&, double dropout_p, std::array<bool, 4> grad_input_mask, bool is_causal,
    std::optional<double> scale) {
  check_no_dropout("_scaled_dot_product_efficient_attention_backward", dropout_p);
  const int64_t L = q.size(2);
  TORCH_CHECK(logsumexp.dim() == 3 && logsumexp.size(2) >= L,
              "_scaled_dot_product_efficient_attention_backward: logsumexp must be [B, H, >= L], got ",
              logsumexp.sizes());
  auto g = attention_backward(grad_out, q, k, v, attn_bias, out, logsumexp.narrow(2, 0, L),
                              {is_causal ? Causal::kTopLeft : Causal::kNone}, softmax_scale(scale, q));
  at::Tensor dbias;
  if (attn_bias.defined() && grad_input_mask[3]) dbias = bias_grad_like(attn_bias, g.ds);
  return {blhe_like(q).copy_(g.dq), blhe_like(k).copy_(g.dk), blhe_like(v).copy_(g.dv), dbias};
}

// ---- _flash_attention_forward: [B, L, H, E] or packed [total, H, E]; causal from the bottom right ----

// varlen_attn passes its window (causal: (-1, 0)) along with is_causal.
Mask flash_mask(bool is_causal, const std::optional<c10::SymInt>& window_left,
                const std::optional<c10::SymInt>& window_right) {
  Mask mask{is_causal ? Causal::kBottomRight : Causal::kNone};
  if (window_left) mask.left = window_left->guard_int(__FILE__, __LINE__);
  if (window_right) mask.right = window_right->guard_int(__FILE__, __LINE__);
  return mask;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> flash_forward(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const std::optional<at::Tensor>& cum_seq_q,
    const std::optional<at::Tensor>& cum_seq_k, c10::SymInt, c10::SymInt, double dropout_p, bool is_causal,
    bool return_debug_mask, std::optional<double> scale, std::optional<c10::SymInt> window_size_left,
    std::optional<c10::SymInt> window_size_right, const std::optional<at::Tensor>& seqused_k,
    const std::optional<at::Tensor>& alibi_slopes, const std::optional<at::Tensor>& block_table,
    std::optional<int64_t>) {
  constexpr const char* op = "_flash_attention_forward";
  check_no_dropout(op, dropout_p);
  TORCH_CHECK(!return_debug_mask, op, ": the debug attention mask exists only with dropout");
  TORCH_CHECK(!(seqused_k && seqused_k->defined()) && !(block_table && block_table->defined()), op,
              ": seqused_k and paged key/value caches (block_table) are not supported on neuron");
  TORCH_CHECK(!(alibi_slopes && alibi_slopes->defined()), op, ": ALiBi slopes are not supported on neuron");
  TORCH_CHECK(v.size(-1) == q.size(-1), op, ": query and value head dimensions must match");
  const double sc = softmax_scale(scale, q);
  const Mask causal = flash_mask(is_causal, window_size_left, window_size_right);
  at::Tensor out = at::empty_like(q);
  at::Tensor lse;
  const bool varlen = cum_seq_q && cum_seq_q->defined();
  if (!varlen) {
    TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4, op, ": expected 4-D [B, L, H, E] inputs");
    auto fwd = attention_forward(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), {}, causal, sc);
    out.copy_(fwd.out.transpose(1, 2));
    lse = fwd.lse.contiguous();
  } else {
    TORCH_CHECK(cum_seq_k && cum_seq_k->defined(), op, ": cum_seq_q needs cum_seq_k");
    TORCH_CHECK(q.dim() == 3 && k.dim() == 3 && v.dim() == 3, op, ": expected packed [total, H, E] inputs");
    auto cq = host_offsets(*cum_seq_q, "cum_seq_q");
    auto ck = host_offsets(*cum_seq_k, "cum_seq_k");
    TORCH_CHECK(cq.size() == ck.size() && cq.back() <= q.size(0) && ck.back() <= k.size(0), op,
                ": cum_seq_q and cum_seq_k must describe the same number of sequences within the inputs");
    out.zero_();
    lse = at::zeros({q.size(1), q.size(0)}, q.options().dtype(at::kFloat));
    for (size_t b = 0; b + 1 < cq.size(); ++b) {
      const int64_t q0 = cq[b], lq = cq[b + 1] - cq[b], k0 = ck[b], lk = ck[b + 1] - ck[b];
      auto fwd = attention_forward(seq_to_bhle(q.narrow(0, q0, lq)), seq_to_bhle(k.narrow(0, k0, lk)),
                                   seq_to_bhle(v.narrow(0, k0, lk)), {}, causal, sc);
      out.narrow(0, q0, lq).copy_(bhle_to_seq(fwd.out));
      lse.narrow(1, q0, lq).copy_(fwd.lse.squeeze(0));
    }
  }
  auto rng_state = at::zeros({2}, q.options().dtype(at::kUInt64));
  auto unused = at::zeros({}, q.options().dtype(at::kUInt64));
  return {out, lse, rng_state, unused, at::empty({0}, q.options())};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> flash_backward(
    const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& out,
    const at::Tensor& logsumexp, const at::Tensor& cum_seq_q, const at::Tensor& cum_seq_k, c10::SymInt, c10::SymInt,
    double dropout_p, bool is_causal, const at::Tensor&, const at::Tensor&, std::optional<double> scale,
    std::optional<c10::SymInt> window_size_left, std::optional<c10::SymInt> window_size_right) {
  constexpr const char* op = "_flash_attention_backward";
  check_no_dropout(op, dropout_p);
  const double sc = softmax_scale(scale, q);
  const Mask causal = flash_mask(is_causal, window_size_left, window_size_right);
  at::Tensor dq = at::empty_like(q), dk = at::empty_like(k), dv = at::empty_like(v);
  if (!cum_seq_q.defined()) {
    auto t = [](const at::Tensor& x) { return x.transpose(1, 2); };
    auto g = attention_backward(t(grad_out), t(q), t(k), t(v), {}, t(out), logsumexp, causal, sc);
    dq.copy_(t(g.dq));
    dk.copy_(t(g.dk));
    dv.copy_(t(g.dv));
    return {dq, dk, dv};
  }
  auto cq = host_offsets(cum_seq_q, "cum_seq_q");
  auto ck = host_offsets(cum_seq_k, "cum_seq_k");
  TORCH_CHECK(cq.size() == ck.size(), op, ": cum_seq_q and cum_seq_k must describe the same number of sequences");
  dq.zero_();
  dk.zero_();
  dv.zero_();
  for (size_t b = 0; b + 1 < cq.size(); ++b) {
    const int64_t q0 = cq[b], lq = cq[b + 1] - cq[b], k0 = ck[b], lk = ck[b + 1] - ck[b];
    auto sq = [&](const at::Tensor& x) { return seq_to_bhle(x.narrow(0, q0, lq)); };
    auto sk = [&](const at::Tensor& x) { return seq_to_bhle(x.narrow(0, k0, lk)); };
    auto g = attention_backward(sq(grad_out), sq(q), sk(k), sk(v), {}, sq(out),
                                logsumexp.narrow(1, q0, lq).unsqueeze(0), causal, sc);
    dq.narrow(0, q0, lq).copy_(bhle_to_seq(g.dq));
    dk.narrow(0, k0, lk).copy_(bhle_to_seq(g.dk));
    dv.narrow(0, k0, lk).copy_(bhle_to_seq(g.dv));
  }
  return {dq, dk, dv};
}

// ---- _efficient_attention_forward: [B, M, H, K]; packed sequences need B == 1 ----

Mask efficient_mask(const char* op, int64_t custom_mask_type) {
  TORCH_CHECK(custom_mask_type >= 0 && custom_mask_type <= 2, op,
              ": custom_mask_type must be 0 (none), 1 (causal from the top left) or 2 (from the bottom right), got ",
              custom_mask_type);
  return {static_cast<Causal>(custom_mask_type)};
}

void check_efficient_options(const char* op, double dropout_p, std::optional<int64_t> window_size) {
  check_no_dropout(op, dropout_p);
  TORCH_CHECK(!window_size, op, ": sliding-window attention is not supported on neuron");
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, c10::SymInt, c10::SymInt> efficient_forward(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const std::optional<at::Tensor>& bias_opt,
    const std::optional<at::Tensor>& cu_seqlens_q, const std::optional<at::Tensor>& cu_seqlens_k,
    std::optional<c10::SymInt> max_seqlen_q, std::optional<c10::SymInt> max_seqlen_k, double dropout_p,
    int64_t custom_mask_type, bool compute_log_sumexp, std::optional<double> scale,
    const std::optional<at::Tensor>& seqlen_k, std::optional<int64_t> window_size) {
  constexpr const char* op = "_efficient_attention_forward";
  check_efficient_options(op, dropout_p, window_size);
  TORCH_CHECK(!(seqlen_k && seqlen_k->defined()), op, ": seqlen_k is not supported on neuron");
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4, op, ": expected 4-D [B, M, H, K] inputs");
  const Mask causal = efficient_mask(op, custom_mask_type);
  const double sc = softmax_scale(scale, q);
  at::Tensor bias = bias_opt ? *bias_opt : at::Tensor();
  const int64_t B = q.size(0), M = q.size(1), N = k.size(1), H = q.size(2);
  at::Tensor out = at::empty({B, M, H, v.size(3)}, q.options());
  at::Tensor lse;
  int64_t max_q = M;
  if (!(cu_seqlens_q && cu_seqlens_q->defined())) {
    auto fwd = attention_forward(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), bias, causal, sc);
    out.copy_(fwd.out.transpose(1, 2));
    lse = lse_buffer(B, H, M, compute_log_sumexp, q);
    if (compute_log_sumexp) lse.narrow(2, 0, M).copy_(fwd.lse);
  } else {
    TORCH_CHECK(cu_seqlens_k && cu_seqlens_k->defined() && max_seqlen_q, op,
                ": cu_seqlens_q needs cu_seqlens_k and max_seqlen_q");
    TORCH_CHECK(B == 1, op, ": packed sequences (cu_seqlens) need a batch of 1, got ", B);
    auto cq = host_offsets(*cu_seqlens_q, "cu_seqlens_q");
    auto ck = host_offsets(*cu_seqlens_k, "cu_seqlens_k");
    TORCH_CHECK(cq.size() == ck.size() && cq.back() <= M && ck.back() <= N, op,
                ": cu_seqlens_q and cu_seqlens_k must describe the same number of sequences within the inputs");
    max_q = max_seqlen_q->guard_int(__FILE__, __LINE__);
    const int64_t seqs = static_cast<int64_t>(cq.size()) - 1;
    out.zero_();
    lse = lse_buffer(seqs, H, max_q, compute_log_sumexp, q);
    for (int64_t b = 0; b < seqs; ++b) {
      const int64_t q0 = cq[b], lq = cq[b + 1] - cq[b], k0 = ck[b], lk = ck[b + 1] - ck[b];
      TORCH_CHECK(lq <= max_q, op, ": a sequence of ", lq, " queries exceeds max_seqlen_q=", max_q);
      auto fwd = attention_forward(seq_to_bhle(q[0].narrow(0, q0, lq)), seq_to_bhle(k[0].narrow(0, k0, lk)),
                                   seq_to_bhle(v[0].narrow(0, k0, lk)),
                                   bias.defined() ? narrow_bias(bias, q0, lq, k0, lk) : bias, causal, sc);
      out[0].narrow(0, q0, lq).copy_(bhle_to_seq(fwd.out));
      if (compute_log_sumexp) lse[b].narrow(1, 0, lq).copy_(fwd.lse.squeeze(0));
    }
  }
  auto seed = at::zeros({}, q.options().dtype(at::kLong));
  const int64_t max_k = max_seqlen_k ? max_seqlen_k->guard_int(__FILE__, __LINE__) : N;
  return {out, lse, seed, seed.clone(), c10::SymInt(max_q), c10::SymInt(max_k)};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> efficient_backward(
    const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
    const std::optional<at::Tensor>& bias_opt, const at::Tensor& out, const std::optional<at::Tensor>& cu_seqlens_q,
    const std::optional<at::Tensor>& cu_seqlens_k, c10::SymInt, c10::SymInt, const at::Tensor& logsumexp,
    double dropout_p, const at::Tensor&, const at::Tensor&, int64_t custom_mask_type, bool bias_requires_grad,
    std::optional<double> scale, std::optional<int64_t>, std::optional<int64_t> window_size,
    bool shared_storage_dqdkdv) {
  constexpr const char* op = "_efficient_attention_backward";
  check_efficient_options(op, dropout_p, window_size);
  const Mask causal = efficient_mask(op, custom_mask_type);
  const double sc = softmax_scale(scale, q);
  at::Tensor bias = bias_opt ? *bias_opt : at::Tensor();
  at::Tensor dq, dk, dv;
  if (shared_storage_dqdkdv) {
    TORCH_CHECK(q.sizes() == k.sizes() && q.sizes() == v.sizes(), op,
                ": shared_storage_dqdkdv needs query, key and value of one shape");
    at::Tensor chunk = at::empty({q.size(0), q.size(1), 3, q.size(2), q.size(3)}, q.options());
    dq = chunk.select(2, 0), dk = chunk.select(2, 1), dv = chunk.select(2, 2);
  } else {
    dq = at::empty_like(q), dk = at::empty_like(k), dv = at::empty_like(v);
  }
  at::Tensor ds_full;  // the bias gradient, before reducing to the bias' shape
  const bool want_bias_grad = bias.defined() && bias_requires_grad;
  if (!(cu_seqlens_q && cu_seqlens_q->defined())) {
    const int64_t M = q.size(1);
    TORCH_CHECK(logsumexp.dim() == 3 && logsumexp.size(2) >= M, op, ": logsumexp must be [B, H, >= M], got ",
                logsumexp.sizes());
    auto t = [](const at::Tensor& x) { return x.transpose(1, 2); };
    auto g = attention_backward(t(grad_out), t(q), t(k), t(v), bias, t(out), logsumexp.narrow(2, 0, M), causal,
                                sc);
    dq.copy_(t(g.dq));
    dk.copy_(t(g.dk));
    dv.copy_(t(g.dv));
    ds_full = g.ds;
  } else {
    TORCH_CHECK(cu_seqlens_k && cu_seqlens_k->defined() && q.size(0) == 1, op,
                ": packed sequences need cu_seqlens_k and a batch of 1");
    auto cq = host_offsets(*cu_seqlens_q, "cu_seqlens_q");
    auto ck = host_offsets(*cu_seqlens_k, "cu_seqlens_k");
    TORCH_CHECK(cq.size() == ck.size(), op, ": cu_seqlens_q and cu_seqlens_k must describe the same sequences");
    dq.zero_();
    dk.zero_();
    dv.zero_();
    if (want_bias_grad) {
      ds_full = at::zeros({1, q.size(2), q.size(1), k.size(1)}, q.options().dtype(acc_type(q)));
    }
    for (size_t b = 0; b + 1 < cq.size(); ++b) {
      const int64_t q0 = cq[b], lq = cq[b + 1] - cq[b], k0 = ck[b], lk = ck[b + 1] - ck[b];
      auto sq = [&](const at::Tensor& x) { return seq_to_bhle(x[0].narrow(0, q0, lq)); };
      auto sk = [&](const at::Tensor& x) { return seq_to_bhle(x[0].narrow(0, k0, lk)); };
      auto g = attention_backward(sq(grad_out), sq(q), sk(k), sk(v),
                                  bias.defined() ? narrow_bias(bias, q0, lq, k0, lk) : bias, sq(out),
                                  logsumexp[b].narrow(1, 0, lq).unsqueeze(0), causal, sc);
      dq[0].narrow(0, q0, lq).copy_(bhle_to_seq(g.dq));
      dk[0].narrow(0, k0, lk).copy_(bhle_to_seq(g.dk));
      dv[0].narrow(0, k0, lk).copy_(bhle_to_seq(g.dv));
      if (want_bias_grad) ds_full.narrow(-2, q0, lq).narrow(-1, k0, lk).copy_(g.ds);
    }
  }
  at::Tensor dbias = want_bias_grad ? bias_grad_like(bias, ds_full) : at::Tensor();
  return {dq, dk, dv, dbias};
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("_scaled_dot_product_efficient_attention",
         &Noted<at::_ops::_scaled_dot_product_efficient_attention, sdpa_efficient>::call);
  m.impl("_scaled_dot_product_efficient_attention_backward",
         &Noted<at::_ops::_scaled_dot_product_efficient_attention_backward, sdpa_efficient_backward>::call);
  m.impl("_flash_attention_forward", &Noted<at::_ops::_flash_attention_forward, flash_forward>::call);
  m.impl("_flash_attention_backward", &Noted<at::_ops::_flash_attention_backward, flash_backward>::call);
  m.impl("_efficient_attention_forward", &Noted<at::_ops::_efficient_attention_forward, efficient_forward>::call);
  m.impl("_efficient_attention_backward", &Noted<at::_ops::_efficient_attention_backward, efficient_backward>::call);
}

}  // namespace at::neuron
