"""generate() on neuron with a static cache: Transformers auto-compiles the
decode step (default Inductor, mode="reduce-overhead"); tokens equal CPU eager
and nothing recompiles after warm-up."""
import copy

import pytest
import torch

transformers = pytest.importorskip("transformers")

from conftest import tiny_llama  # noqa: E402


def test_static_cache_compiled_decode_no_recompiles():
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    cpu = tiny_llama()
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


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_beam_search_and_attention_implementations_match_cpu(attn):
    cpu = tiny_llama()
    cpu.config._attn_implementation = attn
    dev = copy.deepcopy(cpu).to("neuron")
    ids = torch.randint(0, 128, (2, 5), generator=torch.Generator().manual_seed(2))
    mask = torch.ones_like(ids)
    mask[0, :1] = 0
    kw = dict(max_new_tokens=10, do_sample=False, num_beams=3, num_return_sequences=2)
    ref = cpu.generate(ids, attention_mask=mask, **kw)
    out = dev.generate(ids.to("neuron"), attention_mask=mask.to("neuron"), **kw)
    assert torch.equal(out.cpu(), ref)


def test_seeded_sampling_is_reproducible_on_neuron():
    dev = tiny_llama().to("neuron")
    ids = torch.randint(0, 128, (2, 5), generator=torch.Generator().manual_seed(3)).to("neuron")
    kw = dict(max_new_tokens=12, do_sample=True, top_k=20, temperature=1.5)
    torch.manual_seed(7)
    a = dev.generate(ids, **kw)
    torch.manual_seed(7)
    b = dev.generate(ids, **kw)
    torch.manual_seed(8)
    c = dev.generate(ids, **kw)
    assert a.device.type == "neuron"
    assert torch.equal(a.cpu(), b.cpu())
    assert not torch.equal(a.cpu(), c.cpu())
