"""generate() on neuron with a static cache: Transformers auto-compiles the
decode step (default Inductor, mode="reduce-overhead"); tokens equal CPU eager
and nothing recompiles after warm-up."""
import copy

import pytest
import torch

transformers = pytest.importorskip("transformers")


def _tiny_llama():
    cfg = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, vocab_size=128, max_position_embeddings=256)
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(cfg).eval()


def test_static_cache_compiled_decode_no_recompiles():
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    cpu = _tiny_llama()
    dev = copy.deepcopy(cpu).to("neuron")
    ids = torch.randint(0, 128, (2, 6), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[1, :2] = 0  # left padding
    kw = dict(max_new_tokens=64, do_sample=False, cache_implementation="static")
    ref = cpu.generate(ids, attention_mask=mask, disable_compile=True, **kw)

    out = dev.generate(ids.to("neuron"), attention_mask=mask.to("neuron"), **kw)  # warm-up: compiles
    assert torch.equal(out.cpu(), ref)
    graphs = counters["stats"]["unique_graphs"]
    assert graphs >= 1, "the decode step was not compiled"
    recompiles = sum(counters["recompiles"].values())

    out = dev.generate(ids.to("neuron"), attention_mask=mask.to("neuron"), **kw)
    assert torch.equal(out.cpu(), ref)
    assert counters["stats"]["unique_graphs"] == graphs
    assert sum(counters["recompiles"].values()) == recompiles == 0
