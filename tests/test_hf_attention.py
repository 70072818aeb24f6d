"""torch_neuronx.hf_attention: Transformers' sdpa attention with grouped key/value
heads passed to SDPA as they are ("neuron_sdpa"): outputs as sdpa's (which
repeats the heads first), generate() tokens equal CPU greedy."""
import copy

import pytest
import torch

transformers = pytest.importorskip("transformers")

from conftest import assert_same, tiny_llama  # noqa: E402
from torch_neuronx import hf_attention  # noqa: E402


class _Module(torch.nn.Module):
    num_key_value_groups = 3
    is_causal = True


@pytest.mark.parametrize("q_len", [1, 5])
@pytest.mark.parametrize("mask_kind", ["bool", "additive", None])
def test_forward_equals_sdpa_with_repeated_heads(q_len, mask_kind):
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 6, q_len, 16, generator=g)
    k = torch.randn(2, 2, 12, 16, generator=g)
    v = torch.randn(2, 2, 12, 16, generator=g)
    mask = None
    if mask_kind:
        keep = torch.rand(2, 1, q_len, 12, generator=g) > 0.3
        keep[..., 0] = True
        mask = keep if mask_kind == "bool" else torch.where(keep, 0.0, float("-inf"))
    ref, _ = sdpa_attention_forward(_Module(), q, k, v, mask, scaling=0.25)
    dev = [t.to("neuron") if t is not None else None for t in (q, k, v, mask)]
    out, weights = hf_attention.sdpa_grouped_attention_forward(_Module(), *dev, scaling=0.25)
    assert weights is None and out.shape == ref.shape
    assert_same(out, ref)


def test_registered_and_selected_for_sdpa_models_only():
    model = tiny_llama()
    model.set_attn_implementation("eager")
    hf_attention.use_grouped_attention(model)
    assert model.config._attn_implementation == "eager"
    model.set_attn_implementation("sdpa")
    hf_attention.use_grouped_attention(model)
    assert model.config._attn_implementation == hf_attention.NAME
    from transformers import AttentionInterface

    assert AttentionInterface()[hf_attention.NAME] is hf_attention.sdpa_grouped_attention_forward


@pytest.mark.parametrize("compiled", [False, True])
def test_static_cache_generate_equals_cpu_greedy(compiled):
    cpu = tiny_llama()
    cpu.set_attn_implementation("sdpa")
    dev = copy.deepcopy(cpu).to("neuron")
    hf_attention.use_grouped_attention(dev)
    ids = torch.randint(0, 128, (2, 6), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[1, :2] = 0  # left padding
    kw = dict(max_new_tokens=12, do_sample=False, cache_implementation="static")
    ref = cpu.generate(ids, attention_mask=mask, disable_compile=True, **kw)
    if compiled:
        kw["compile_config"] = transformers.CompileConfig(backend="neuron", mode="reduce-overhead")
    else:
        kw["disable_compile"] = True
    out = dev.generate(ids.to("neuron"), attention_mask=mask.to("neuron"), **kw)
    assert torch.equal(out.cpu(), ref)
