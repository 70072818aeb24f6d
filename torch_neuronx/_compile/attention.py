"""Neuron's fused SDPA ops in C++ wrappers lower to the host flash kernels,
whose arguments and results are all tensors (docs/compile.md, "Attention (SDPA)")."""
from __future__ import annotations

import torch
from torch._inductor.virtualized import V

from .device import _is_neuron

aten = torch.ops.aten


def fused_attention(query, key, value, attn_bias=None, dropout_p=0.0, is_causal=False, return_debug_mask=False,
                    *, scale=None):
    if not V.graph.cpp_wrapper or not _is_neuron(query.get_device()):
        return None
    from torch._inductor.lowering import empty, fallback_handler

    out, logsumexp = fallback_handler(aten._scaled_dot_product_flash_attention_for_cpu.default,
                                      add_to_fallback_set=False)(query, key, value, dropout_p, is_causal,
                                                                 attn_mask=attn_bias, scale=scale)
    q_len, kv_len = query.get_size()[-2], key.get_size()[-2]
    # The fused op has no dropout here, so its seed and offset carry nothing;
    # the backward (the fused op's, as in JIT graphs) reads them as placeholders.
    seed, offset = (empty([], dtype=torch.int64, device=query.get_device()) for _ in range(2))
    return out, logsumexp, None, None, q_len, kv_len, seed, offset, None


def fused_attention_backward(grad_out, query, key, value, attn_bias, grad_input_mask, out, logsumexp, cum_seq_q,
                             cum_seq_k, max_q, max_k, dropout_p, is_causal, philox_seed, philox_offset, *, scale=None):
    if not V.graph.cpp_wrapper or not _is_neuron(query.get_device()):
        return None
    from torch._inductor.lowering import fallback_handler

    if grad_input_mask[3]:
        raise NotImplementedError("neuron fused attention does not compute gradients of attn_mask")
    grads = fallback_handler(aten._scaled_dot_product_flash_attention_for_cpu_backward.default,
                             add_to_fallback_set=False)(grad_out, query, key, value, out, logsumexp, dropout_p,
                                                        is_causal, attn_mask=attn_bias, scale=scale)
    return *grads, None


def register() -> None:
    from .lowering import chain

    chain(aten._scaled_dot_product_fused_attention_overrideable.default, fused_attention)
    chain(aten._scaled_dot_product_fused_attention_overrideable_backward.default, fused_attention_backward)
