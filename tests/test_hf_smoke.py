"""Fast smoke test of Hugging Face Transformers on ``neuron``.

A tiny random-weight Llama (hidden 64, 2 layers, 4 heads, 2 KV heads, vocab 128) is built
on CPU under a fixed seed and copied to ``neuron``; greedy generation on a left-padded
batch of two must produce exactly the CPU tokens, with a dynamic cache and with an eager
static cache, and after a ``save_pretrained`` / ``from_pretrained(device_map="neuron")``
round trip. The fallback report is printed (``pytest -s``) at the end of each test.
"""

from __future__ import annotations

import copy
import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

transformers = pytest.importorskip("transformers")
import torch_neuronx  # noqa: E402
from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM  # noqa: E402

DEV = "neuron"
VOCAB = 128
PAD = 0
MAX_NEW = 8


@pytest.fixture(autouse=True)
def fallback_report():
    torch_neuronx.reset_fallback_report()
    yield
    print(f"\nfallback report: {torch_neuronx.fallback_report()}")


def tiny_config():
    return LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        pad_token_id=PAD,
        bos_token_id=1,
        eos_token_id=2,
        tie_word_embeddings=False,
    )


@pytest.fixture(scope="module")
def cpu_model():
    torch.manual_seed(0)
    model = LlamaForCausalLM(tiny_config())
    # random init is ~N(0, 0.02): scale up so the greedy tokens are decisive (no near-ties)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0.0, 1.0 / p.shape[-1] ** 0.5)
    return model.eval()


@pytest.fixture(scope="module")
def neuron_model(cpu_model):
    model = copy.deepcopy(cpu_model).to(DEV)
    assert next(model.parameters()).device.type == DEV
    return model


@pytest.fixture(scope="module")
def batch():
    """Two prompts of lengths 6 and 10, left-padded to 10."""
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(3, VOCAB, (2, 10), generator=g)
    mask = torch.ones_like(ids)
    ids[0, :4] = PAD
    mask[0, :4] = 0
    return ids, mask


GEN_KWARGS = dict(
    max_new_tokens=MAX_NEW,
    min_new_tokens=MAX_NEW,  # EOS suppressed: always MAX_NEW tokens
    do_sample=False,
    pad_token_id=PAD,
    bos_token_id=1,
    eos_token_id=2,
)


def generation_config(static=False, **extra):
    gc = GenerationConfig(**GEN_KWARGS, **extra)
    if static:
        gc.cache_implementation = "static"
        gc.disable_compile = True  # eager forward on the static cache
    return gc


def generate(model, ids, mask, **kw):
    device = next(model.parameters()).device
    with torch.no_grad():
        out = model.generate(input_ids=ids.to(device), attention_mask=mask.to(device), **kw)
    seq = out.sequences if hasattr(out, "sequences") else out
    assert seq.device == device
    return (seq.cpu(), out) if seq is not out else seq.cpu()


def test_neuron_available_in_transformers():
    from transformers.utils import is_torch_neuron_available

    assert is_torch_neuron_available()
    assert is_torch_neuron_available(check_device=True)


def test_logits_match_cpu(cpu_model, neuron_model, batch):
    ids, mask = batch
    with torch.no_grad():
        ref = cpu_model(input_ids=ids, attention_mask=mask).logits
        out = neuron_model(input_ids=ids.to(DEV), attention_mask=mask.to(DEV)).logits
    assert out.device.type == DEV
    valid = mask.bool()  # padded positions are garbage by construction
    torch.testing.assert_close(out.cpu()[valid], ref[valid], rtol=1e-4, atol=1e-4)


def test_greedy_generate_dynamic_cache(cpu_model, neuron_model, batch):
    ids, mask = batch
    ref = generate(cpu_model, ids, mask, generation_config=generation_config())
    out = generate(neuron_model, ids, mask, generation_config=generation_config())
    assert ref.shape == (2, 10 + MAX_NEW)
    assert torch.equal(out, ref), f"\nneuron: {out.tolist()}\ncpu:    {ref.tolist()}"


@pytest.mark.parametrize("how", ["generation_config", "kwargs"])
def test_greedy_generate_static_cache_eager(cpu_model, neuron_model, batch, how):
    ids, mask = batch
    ref = generate(cpu_model, ids, mask, generation_config=generation_config())
    if how == "generation_config":
        out, res = generate(neuron_model, ids, mask,
                            generation_config=generation_config(static=True, return_dict_in_generate=True))
    else:
        out, res = generate(neuron_model, ids, mask, **GEN_KWARGS, return_dict_in_generate=True,
                            cache_implementation="static", disable_compile=True)
    cache = res.past_key_values
    assert type(cache).__name__ == "StaticCache", type(cache)
    assert cache.layers[0].keys.device.type == DEV
    assert getattr(neuron_model, "_compiled_call", None) is None  # eager: nothing was compiled
    assert torch.equal(out, ref), f"\nneuron: {out.tolist()}\ncpu:    {ref.tolist()}"


def test_generate_scores_close(cpu_model, neuron_model, batch):
    ids, mask = batch
    kw = dict(generation_config=generation_config(output_logits=True, return_dict_in_generate=True))
    with torch.no_grad():
        ref = cpu_model.generate(input_ids=ids, attention_mask=mask, **kw)
        out = neuron_model.generate(input_ids=ids.to(DEV), attention_mask=mask.to(DEV), **kw)
    assert torch.equal(out.sequences.cpu(), ref.sequences)
    for a, b in zip(out.logits, ref.logits):
        assert a.device.type == DEV
        torch.testing.assert_close(a.cpu(), b, rtol=1e-4, atol=1e-4)


def test_from_pretrained_device_map_neuron(cpu_model, batch, tmp_path):
    ids, mask = batch
    cpu_model.save_pretrained(tmp_path)
    loaded = LlamaForCausalLM.from_pretrained(tmp_path, device_map=DEV).eval()
    for name, p in loaded.named_parameters():
        assert p.device.type == DEV, name
    assert loaded.device.type == DEV
    torch.testing.assert_close(loaded.model.embed_tokens.weight.cpu(), cpu_model.model.embed_tokens.weight)
    ref = generate(cpu_model, ids, mask, generation_config=generation_config())
    out = generate(loaded, ids, mask, generation_config=generation_config())
    assert torch.equal(out, ref), f"\nneuron: {out.tolist()}\ncpu:    {ref.tolist()}"
