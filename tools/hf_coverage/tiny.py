"""Build tiny, random-weight causal-LM models offline from Transformers config defaults.

``build_tiny_model(model_type)`` instantiates the model_type's config class with its
defaults (no Hub access), shrinks every size-like field with a single, name-based
rule table (``_RULES``), selects a small set of representative layers (so that
hybrid / alternating architectures keep one layer of each kind), recurses into nested
sub-configs, applies a small per-architecture override table (``QUIRKS``), builds the
model with ``AutoModelForCausalLM.from_config`` under a fixed seed, re-initialises the
weights with a fan-in scaled normal (see ``reinit_weights``) and returns it in fp32 /
eval mode.

Nothing here is architecture-specific except ``QUIRKS``: if a new architecture fails
to build, first try to express the fix as a generic rule, otherwise add a quirk entry.

Run ``python tools/hf_coverage/tiny.py llama gpt2 ...`` to print the tiny config and
the parameter count for some model types (``--all`` for the whole frozen list).
"""

from __future__ import annotations

import copy
import dataclasses
import math
from typing import Any, Callable

# --------------------------------------------------------------------------------------
# Target sizes
# --------------------------------------------------------------------------------------

HIDDEN = 64
NUM_LAYERS = 2  # minimum; up to MAX_LAYERS when a hybrid needs one layer of each kind
MAX_LAYERS = 4
HEADS = 4
HEAD_DIM = HIDDEN // HEADS  # 16
KV_HEADS = 2  # GQA models; MHA stays MHA, MQA stays MQA
INTERMEDIATE = 128
MOE_INTERMEDIATE = 32
VOCAB = 512
MAX_POS = 256
ORIG_MAX_POS = 64  # rope scaling "original_max_position_embeddings"
EXPERTS = 4
TOP_K = 2
SLIDING_WINDOW = 12  # < prompt (10) + max_new_tokens (8) so windows actually slide
SSM_STATE = 16
SSM_HEADS = 8
SSM_HEAD_DIM = 16  # SSM_HEADS * SSM_HEAD_DIM == expand(2) * HIDDEN
SSM_CHUNK = 8
LORA_RANK = 32  # MLA q/kv low-rank dims
MAX_PARAMS = 20_000_000


class ConfigTooLarge(RuntimeError):
    """The shrunk model still has more than MAX_PARAMS parameters."""


class NotInVersion(RuntimeError):
    """model_type unknown to the installed Transformers or has no causal-LM class."""


# --------------------------------------------------------------------------------------
# Generic, name-based shrinking rules
# --------------------------------------------------------------------------------------
# A rule gets (value, orig, ctx) where ``orig`` is the original (default) config dict of
# the (sub)config being shrunk and ``ctx`` carries derived info (e.g. the new layer
# count). Rules only fire for int values (never bool / None / str) unless noted.


def _const(new: int) -> Callable[[Any, dict, dict], Any]:
    return lambda v, orig, ctx: new


def _cap(new: int) -> Callable[[Any, dict, dict], Any]:
    return lambda v, orig, ctx: min(v, new)


def _kv_heads(v, orig, ctx):
    heads = next((orig[k] for k in ("num_attention_heads", "n_head", "n_heads") if isinstance(orig.get(k), int)), None)
    if v == 1:
        return 1  # MQA
    if heads is not None and v == heads:
        return ctx.get("heads", HEADS)  # MHA
    return KV_HEADS


def _linear_value_heads(v, orig, ctx):
    k = orig.get("linear_num_key_heads")
    if isinstance(k, int) and k > 0 and v % k == 0:
        return 2 * (v // k)
    return 2


def _hidden_multiple(factor: float):
    """Sizes defined as a multiple of hidden in the original config keep that ratio."""

    def rule(v, orig, ctx):
        h = orig.get("hidden_size") or orig.get("d_model") or orig.get("n_embd")
        if isinstance(h, int) and h > 0:
            return max(8, int(round(HIDDEN * v / h)))
        return int(HIDDEN * factor)

    return rule


def _offset(v, orig, ctx):
    return min(v, 1)


def _moe_end(v, orig, ctx):
    return ctx["num_layers"] - 1


_SIZE_GROUPS: list[tuple[Callable, tuple[str, ...]]] = [
    # model width / attention shape
    (_const(HIDDEN), ("hidden_size", "n_embd", "n_embed", "d_model", "word_embed_proj_dim", "lru_width")),
    (_const(HEADS), ("num_attention_heads", "n_head", "n_heads", "index_n_heads", "linear_num_heads")),
    (_kv_heads, ("num_key_value_heads", "num_kv_heads", "multi_query_group_num", "kv_n_heads",
                 "num_global_key_value_heads")),
    (_const(HEAD_DIM), ("head_dim", "kv_channels", "attention_head_dim", "index_head_dim", "linear_key_head_dim",
                        "linear_value_head_dim", "linear_head_dim", "query_pre_attn_scalar", "qk_nope_head_dim",
                        "v_head_dim")),
    (_hidden_multiple(2.0), ("attention_hidden_size",)),
    # linear attention (gated delta-net style): value heads stay a multiple of key heads
    (_const(2), ("linear_num_key_heads",)),
    (_linear_value_heads, ("linear_num_value_heads",)),
    # MLP / MoE
    (_const(INTERMEDIATE), ("intermediate_size", "ffn_dim", "dff", "n_inner", "ffn_hidden_size",
                            "intermediate_size_mlp", "d_ff")),
    (_const(MOE_INTERMEDIATE), ("moe_intermediate_size", "shared_expert_intermediate_size",
                                "moe_shared_expert_intermediate_size", "expert_ffn_hidden_size",
                                "shared_intermediate_size", "moe_latent_size")),
    (_cap(EXPERTS), ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts")),
    (_cap(TOP_K), ("num_experts_per_tok", "top_k_experts", "moe_k", "moe_top_k", "num_experts_per_token",
                   "moe_topk")),
    (_cap(1), ("n_shared_experts", "num_shared_experts", "moe_num_shared_experts", "topk_group",
               "first_k_dense_replace", "num_dense_layers", "moe_layer_start_index")),
    (_cap(2), ("n_group", "n_groups", "mamba_n_groups", "zero_expert_num")),
    (_moe_end, ("moe_layer_end_index",)),
    # vocab / positions
    (_const(VOCAB), ("vocab_size", "vocab_size_per_layer_input")),
    (_const(MAX_POS), ("max_position_embeddings", "n_positions", "n_ctx", "max_seq_len", "context_length")),
    (_const(ORIG_MAX_POS), ("original_max_position_embeddings",)),
    (_const(SLIDING_WINDOW), ("sliding_window", "attention_chunk_size", "window_size", "attention_window_size",
                              "local_window_size")),
    # MLA (DeepSeek-style low-rank attention) and sparse-attention indexers
    (_const(LORA_RANK), ("kv_lora_rank", "q_lora_rank")),
    (_const(8), ("qk_rope_head_dim", "rotary_dim", "index_topk")),
    (_const(HEAD_DIM + 8), ("qk_head_dim",)),  # = qk_nope_head_dim + qk_rope_head_dim
    # state-space / recurrent blocks
    (_const(SSM_STATE), ("state_size", "ssm_state_size", "mamba_d_state", "d_state")),
    (_const(SSM_HEADS), ("mamba_n_heads", "mamba_num_heads")),
    (_const(SSM_HEAD_DIM), ("mamba_d_head", "mamba_head_dim")),
    (_const(SSM_HEADS * SSM_HEAD_DIM), ("mamba_d_ssm",)),
    (_const(SSM_CHUNK), ("chunk_size", "mamba_chunk_size", "block_size")),
    (_const(8), ("time_step_rank", "mamba_dt_rank")),
    # misc low-rank / per-layer-input widths
    (_const(8), ("adapter_rank", "laurel_rank")),
    (_const(16), ("hidden_size_per_layer_input",)),
    # layer patterns: periods of 2 so a 2-layer model still has both kinds
    (_cap(2), ("sliding_window_pattern", "_sliding_window_pattern", "global_attn_every_n_layers",
               "no_rope_layer_interval", "attn_layer_period", "expert_layer_period", "interleave_moe_layer_step")),
    (_offset, ("attn_layer_offset", "expert_layer_offset")),
    # multi-token-prediction heads / KV sharing are not exercised by generate(): drop them
    (_const(0), ("num_nextn_predict_layers", "num_mtp_layers", "num_kv_shared_layers")),
]
_RULES: dict[str, Callable] = {name: rule for rule, names in _SIZE_GROUPS for name in names}

# Fields whose class default is None but which some modeling code reads unconditionally
# (real checkpoints always set them): fill them when the default is None.
NONE_DEFAULTS: dict[str, Any] = {"head_dim": HEAD_DIM, "num_key_value_heads": HEADS}

# (a, b): if a == b in the original config, a is set to b's tiny value (e.g. MLA models
# whose rotary ``head_dim`` is ``qk_rope_head_dim``).
COUPLED = (("head_dim", "qk_rope_head_dim"),)

# Keys holding the number of layers.
LAYER_KEYS = ("num_hidden_layers", "n_layer", "n_layers", "num_layers")
# Keys holding a list of layer indices.
INDEX_LIST_KEYS = ("moe_layers", "full_attn_idxs", "mlp_only_layers", "attn_layer_indices", "hybrid_layer_ids")
# Keys that hold a per-layer value list (also any list whose length == number of layers).
PER_LAYER_KEYS = ("layer_types", "layers_block_type", "mlp_layer_types", "no_rope_layers", "indexer_types")
# Keys set to ``num_layers`` (e.g. "use sliding window above layer N").
NUM_LAYER_VALUED = ("max_window_layers",)
# Dict-valued config entries that hold per-layer overrides keyed by layer index.
PER_LAYER_DICT_KEYS = ("per_layer_config",)
# Non-field kwargs that the config __post_init__ understands and we want to forward.
EXTRA_KWARGS = ("per_layer_config",)
# Base PreTrainedConfig fields we never touch / forward.
_SKIP_FIELDS = {"transformers_version", "architectures", "id2label", "label2id", "dtype"}


# --------------------------------------------------------------------------------------
# Per-architecture overrides (applied after the generic rules; values may be callables
# taking the shrunk kwargs dict). Keep this table small and explain every entry.
# --------------------------------------------------------------------------------------
QUIRKS: dict[str, dict[str, Any]] = {
    # gpt-neo encodes its layer pattern as [[pattern, repeat]].
    "gpt_neo": {"attention_types": [[["global", "local"], 1]]},
    # RecurrentGemma cycles ``block_types``; keep one recurrent and one attention block.
    "recurrent_gemma": {"block_types": ["recurrent", "attention"]},
    # Mamba2 ``num_heads`` are SSM heads: num_heads * head_dim == expand * hidden_size.
    "mamba2": {"num_heads": SSM_HEADS, "head_dim": SSM_HEAD_DIM},
    # LFM2-MoE's default has layer_types=None (checkpoints set it): one conv, one attention layer.
    "lfm2_moe": {"layer_types": ["conv", "full_attention"], "num_dense_layers": 1},
    # dots1 defaults leave the MoE sizes None (checkpoints set them).
    "dots1": {"n_routed_experts": EXPERTS, "num_experts_per_tok": TOP_K, "n_shared_experts": 1, "first_k_dense_replace": 1},
    # DbrxAttention reads attn_config.rope_theta, which the default sub-config lacks.
    # ... and its default clip_qkv=None crashes in clamp(); DBRX checkpoints use 8.
    "dbrx": {"attn_config": lambda out: {**out["attn_config"], "rope_theta": 500000.0, "clip_qkv": 8.0}},
    # DeepSeek-V2 default leaves num_experts_per_tok None (checkpoints set it).
    "deepseek_v2": {"num_experts_per_tok": TOP_K},
    # Hybrid Mamba2/attention models default to *all* Mamba layers; real checkpoints
    # interleave attention (and generate() needs at least one attention layer).
    "granitemoehybrid": {"layer_types": ["linear_attention", "full_attention"]},
    "bamba": {"attn_layer_indices": [1]},
    # Zamba ties one shared transformer block across "hybrid" layers: needs >= 2 of them;
    # its attention works on 2 * hidden_size, so head_dim = 2 * hidden / heads.
    "zamba": {
        "num_hidden_layers": 3,
        "layers_block_type": ["linear_attention", "hybrid", "hybrid"],
        "attention_head_dim": 2 * HIDDEN // HEADS,
    },
}


# --------------------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------------------


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _orig_num_layers(d: dict) -> int | None:
    for k in LAYER_KEYS:
        if _is_int(d.get(k)):
            return d[k]
    for k in PER_LAYER_KEYS:
        if isinstance(d.get(k), list) and d[k]:
            return len(d[k])
    return None


def _freeze(v: Any) -> Any:
    if isinstance(v, list):
        return tuple(_freeze(x) for x in v)
    if isinstance(v, dict):
        return tuple(sorted((k, _freeze(x)) for k, x in v.items()))
    return v


def select_layers(d: dict, n_orig: int) -> list[int]:
    """Pick original layer indices so that each distinct per-layer "kind" is kept.

    The kind of layer i is the tuple of all per-layer list values at i plus membership
    in every index list plus its per_layer_config override. The first occurrence of
    each kind is kept (in original order), capped at MAX_LAYERS, and padded with the
    next layers up to NUM_LAYERS.
    """
    columns: list[list[Any]] = []
    for k, v in d.items():
        if isinstance(v, list) and len(v) == n_orig and n_orig > 1 and (k in PER_LAYER_KEYS or k not in INDEX_LIST_KEYS):
            if len({_freeze(x) for x in v}) > 1:
                columns.append([_freeze(x) for x in v])
    for k in INDEX_LIST_KEYS:
        v = d.get(k)
        if isinstance(v, list) and v and all(_is_int(i) for i in v):
            s = set(v)
            col = [i in s for i in range(n_orig)]
            if len(set(col)) > 1:
                columns.append(col)
    for k in PER_LAYER_DICT_KEYS:
        v = d.get(k)
        if isinstance(v, dict) and v:
            col = [_freeze(v.get(f"{i:02d}", v.get(str(i), v.get(i)))) for i in range(n_orig)]
            if len(set(col)) > 1:
                columns.append(col)
    kinds_seen: set = set()
    keep: list[int] = []
    for i in range(n_orig):
        kind = tuple(c[i] for c in columns)
        if kind not in kinds_seen:
            kinds_seen.add(kind)
            keep.append(i)
        if len(keep) >= MAX_LAYERS:
            break
    i = 0
    while len(keep) < min(NUM_LAYERS, n_orig):
        if i not in keep:
            keep.append(i)
        i += 1
    return sorted(keep)


def _shrink_rope(rp: Any, head_dim: int) -> Any:
    if not isinstance(rp, dict):
        return rp
    out = {}
    for k, v in rp.items():
        if isinstance(v, dict):
            out[k] = _shrink_rope(v, head_dim)
        elif k == "original_max_position_embeddings" and _is_int(v):
            out[k] = ORIG_MAX_POS
        elif k == "max_position_embeddings" and _is_int(v):
            out[k] = MAX_POS
        elif k in ("short_factor", "long_factor") and isinstance(v, list):
            rot = int(head_dim * rp.get("partial_rotary_factor", 1.0)) // 2
            out[k] = (list(v) * (rot // max(len(v), 1) + 1))[:rot]
        elif k == "mrope_section" and isinstance(v, list) and v:
            half = head_dim // 2
            tot = sum(v)
            sec = [max(1, round(x * half / tot)) for x in v]
            sec[0] += half - sum(sec)
            out[k] = sec
        else:
            out[k] = v
    return out


def _partial_rotary_factors(d: dict) -> list[float]:
    facs = []
    if isinstance(d.get("partial_rotary_factor"), (int, float)) and not isinstance(d.get("partial_rotary_factor"), bool):
        facs.append(float(d["partial_rotary_factor"]))
    rp = d.get("rope_parameters")
    stack = [rp]
    while stack:
        x = stack.pop()
        if isinstance(x, dict):
            if isinstance(x.get("partial_rotary_factor"), (int, float)):
                facs.append(float(x["partial_rotary_factor"]))
            stack.extend(v for v in x.values() if isinstance(v, dict))
    return facs


def _pick_head_dim(d: dict) -> int:
    """HEAD_DIM, or the smallest larger one giving an even rotary dim for every partial factor."""
    facs = _partial_rotary_factors(d)
    for hd in (HEAD_DIM, 24, 32, 48, 64):
        if all(int(hd * f) >= 2 and int(hd * f) % 2 == 0 for f in facs):
            return hd
    return HEAD_DIM


def _remap_token_ids(v: Any) -> Any:
    if _is_int(v):
        return v % VOCAB if v >= VOCAB else v
    if isinstance(v, list):
        return [_remap_token_ids(x) for x in v]
    return v


def shrink_config_dict(cls: type, orig: dict, model_type: str | None = None) -> dict:
    """Return constructor kwargs for a tiny version of config class ``cls`` given its default dict."""
    field_names = {f.name for f in dataclasses.fields(cls)} if dataclasses.is_dataclass(cls) else set(orig)
    sub_configs = getattr(cls, "sub_configs", {}) or {}
    n_orig = _orig_num_layers(orig)
    keep = select_layers(orig, n_orig) if n_orig else None
    n_new = len(keep) if keep else NUM_LAYERS
    head_dim = _pick_head_dim(orig)
    ctx = {"num_layers": n_new, "head_dim": head_dim, "keep": keep}

    out: dict[str, Any] = {}
    for k, v in orig.items():
        if k in _SKIP_FIELDS or (k not in field_names and k not in EXTRA_KWARGS and k not in sub_configs):
            continue
        if k in sub_configs and isinstance(v, dict):
            sub_cls = sub_configs[k]
            out[k] = shrink_config_dict(sub_cls, v, getattr(sub_cls, "model_type", None))
        elif k in LAYER_KEYS and _is_int(v):
            out[k] = n_new
        elif k in NUM_LAYER_VALUED and _is_int(v):
            out[k] = n_new
        elif k.endswith("_token_id") or k.endswith("_token_ids"):
            out[k] = _remap_token_ids(v)
        elif k == "rope_parameters":
            out[k] = _shrink_rope(v, head_dim)
        elif k in INDEX_LIST_KEYS and isinstance(v, list) and keep:
            s = set(v)
            out[k] = [new for new, old in enumerate(keep) if old in s]
        elif k in PER_LAYER_DICT_KEYS and isinstance(v, dict) and keep:
            new_d = {}
            for new_i, old_i in enumerate(keep):
                ov = v.get(f"{old_i:02d}", v.get(str(old_i), v.get(old_i)))
                if ov is not None:
                    new_d[new_i] = _shrink_per_layer_override(ov, orig, head_dim)
            out[k] = new_d
        elif isinstance(v, list) and keep and n_orig and len(v) == n_orig and (k in PER_LAYER_KEYS or n_orig > 1):
            out[k] = [_shrink_value(k, v[i], orig, ctx) for i in keep]
        elif v is None and k in NONE_DEFAULTS:
            out[k] = NONE_DEFAULTS[k]
        else:
            out[k] = _shrink_value(k, v, orig, ctx)
    # head_dim may need to be larger than HEAD_DIM for odd partial-rotary factors
    if head_dim != HEAD_DIM and _is_int(out.get("head_dim")):
        out["head_dim"] = head_dim
    for a, b in COUPLED:
        if a in out and b in out and orig.get(a) == orig.get(b):
            out[a] = out[b]
    if model_type and model_type in QUIRKS:
        for k, v in QUIRKS[model_type].items():
            out[k] = v(out) if callable(v) else copy.deepcopy(v)
    return out


def _shrink_value(k: str, v: Any, orig: dict, ctx: dict) -> Any:
    rule = _RULES.get(k)
    if rule is None or not _is_int(v):
        return v
    return rule(v, orig, ctx)


def _shrink_per_layer_override(ov: dict, orig: dict, head_dim: int) -> dict:
    """Per-layer overrides keep their ratio to the global value (e.g. global head_dim 512 vs 256)."""
    res = {}
    for k, v in ov.items():
        if _is_int(v) and _is_int(orig.get(k)) and orig[k] > 0 and k in _RULES:
            new_global = _RULES[k](orig[k], orig, {"num_layers": NUM_LAYERS})
            if k == "head_dim":
                new_global = head_dim
            res[k] = max(1, int(round(v * new_global / orig[k])))
        else:
            res[k] = v
    return res


# --------------------------------------------------------------------------------------
# Public API
# --------------------------------------------------------------------------------------


def causal_lm_class_name(model_type: str) -> str | None:
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(model_type)


def tiny_config(model_type: str):
    """Tiny config object for ``model_type`` built from the config class defaults."""
    from transformers import CONFIG_MAPPING

    if causal_lm_class_name(model_type) is None or model_type not in CONFIG_MAPPING:
        raise NotInVersion(f"{model_type!r} has no causal-LM class in this Transformers version")
    cls = CONFIG_MAPPING[model_type]
    orig = cls().to_dict()
    kwargs = shrink_config_dict(cls, orig, model_type)
    return cls(**kwargs)


def reinit_weights(model, seed: int = 0) -> None:
    """Re-initialise every >=2-D weight with N(0, 1/fan_in) using a private generator.

    HF inits use std=initializer_range (0.02), which on a 64-wide model gives nearly
    uniform logits and tiny per-layer contributions, so numerical bugs in attention /
    MLP / SSM blocks would hide under the tolerance. Fan-in scaling keeps activations
    and logits O(1). Norm weights, biases and 1-D SSM parameters (A_log, D, dt_bias)
    keep the architecture's own init.
    """
    import torch

    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for _, p in sorted(model.named_parameters(), key=lambda kv: kv[0]):
            if p.ndim >= 2 and p.is_floating_point():
                fan_in = p.shape[-1] if p.ndim == 2 else max(p.shape[-1], p.shape[-2]) if p.ndim == 3 else p[0].numel()
                std = 1.0 / math.sqrt(max(fan_in, 1))
                p.copy_(torch.randn(p.shape, generator=gen, dtype=torch.float32).to(p.dtype) * std)


def build_tiny_model(model_type: str, seed: int = 0, init: str = "scaled", max_params: int = MAX_PARAMS,
                     attn_implementation: str | None = None):
    """Return (model, config, n_params). Raises NotInVersion / ConfigTooLarge."""
    import torch
    from transformers import AutoModelForCausalLM

    cfg = tiny_config(model_type)
    torch.manual_seed(seed)
    kwargs = {"dtype": torch.float32}
    if attn_implementation:
        kwargs["attn_implementation"] = attn_implementation
    with torch.device("meta"):
        meta_model = AutoModelForCausalLM.from_config(copy.deepcopy(cfg), **kwargs)
    n_params = sum(p.numel() for p in meta_model.parameters())
    del meta_model
    if n_params > max_params:
        raise ConfigTooLarge(f"{model_type}: {n_params / 1e6:.1f}M parameters > {max_params / 1e6:.0f}M")
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg, **kwargs)
    if init == "scaled":
        reinit_weights(model, seed)
    model = model.float().eval()
    return model, cfg, n_params


if __name__ == "__main__":  # pragma: no cover - debugging helper
    import argparse
    import json
    import sys
    import traceback

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model_types", nargs="*")
    ap.add_argument("--all", action="store_true", help="all architectures of the frozen list")
    ap.add_argument("--config", action="store_true", help="print the tiny config")
    ap.add_argument("--build", action="store_true", help="also instantiate the model (default: config only)")
    a = ap.parse_args()
    names = list(a.model_types)
    if a.all:
        sys.path.insert(0, __import__("os").path.dirname(__file__))
        from architectures import ARCHITECTURES

        names = list(ARCHITECTURES)
    for name in names:
        try:
            if a.build:
                _, cfg, n = build_tiny_model(name)
                print(f"OK    {name:22s} {n / 1e6:6.2f}M params")
            else:
                cfg = tiny_config(name)
                print(f"OK    {name:22s} (config)")
            if a.config:
                print(json.dumps(cfg.to_diff_dict(), indent=1, default=str))
        except Exception as e:  # noqa: BLE001
            print(f"FAIL  {name:22s} {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:400])
            if len(names) == 1:
                traceback.print_exc()
