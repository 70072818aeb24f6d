"""Transformers attention on ``neuron`` without copying grouped keys and values.

Transformers' ``sdpa`` attention passes ``enable_gqa=True`` to
``scaled_dot_product_attention`` only on CUDA-like devices without a mask
(``use_gqa_in_sdpa``); everywhere else, and always with a mask (a static cache
has one), it first repeats each key/value head for its group of query heads
(``repeat_kv``), a copy of the whole cache per layer and step. Our SDPA takes
grouped heads directly (the decode kernel, csrc/aten/DecodeAttention.cpp, reads
each key/value head once for its group), so that copy is pure cost: about
0.9 ms of a SmolLM2-135M decode step (60 copies of 168 KB) in a graph replay.

``register()`` adds the attention implementation ``"neuron_sdpa"`` through
Transformers' registration API (``AttentionInterface`` and
``AttentionMaskInterface``): ``sdpa`` with ``enable_gqa=True`` when a mask is
given, and ``sdpa`` itself otherwise. Use it with
``from_pretrained(..., attn_implementation="neuron_sdpa")`` or
``model.set_attn_implementation("neuron_sdpa")`` (``use_grouped_attention``).
"""
from __future__ import annotations

import torch

NAME = "neuron_sdpa"


def sdpa_grouped_attention_forward(module, query, key, value, attention_mask, dropout=0.0, scaling=None,
                                   is_causal=None, **kwargs):
    """Transformers' ``sdpa_attention_forward``, with grouped key/value heads passed as they are."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    groups = getattr(module, "num_key_value_groups", 1)
    # Without a mask Transformers already passes grouped heads (and may crop
    # the keys for a causal prefill); position biases and attention weights
    # keep its path.
    if (attention_mask is None or groups == 1 or kwargs.get("position_bias") is not None
            or kwargs.get("output_attentions", False) or query.shape[1] != key.shape[1] * groups):
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, **kwargs)
    # With a mask, Transformers' sdpa never sets is_causal (the mask says it).
    out = torch.nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask=attention_mask, dropout_p=dropout, scale=scaling, is_causal=False,
        enable_gqa=True)
    return out.transpose(1, 2).contiguous(), None


def register() -> str:
    """Registers ``"neuron_sdpa"`` with Transformers (idempotent); returns the name."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(NAME, sdpa_grouped_attention_forward)
    AttentionMaskInterface.register(NAME, sdpa_mask)  # the masks sdpa gets
    return NAME


def use_grouped_attention(model) -> None:
    """Switches a loaded Transformers model from ``sdpa`` to ``"neuron_sdpa"`` (other implementations stay)."""
    if getattr(model.config, "_attn_implementation", None) == "sdpa":
        model.set_attn_implementation(register())
