"""isin against a few test elements (csrc/aten/Isin.cpp): its own kernel,
equal to CPU; other calls take ATen's kernel, also equal to CPU."""
import os

import pytest
import torch

import torch_neuronx
from conftest import assert_same

_FEW = "neuron::isin_few"


def _isin(elements, test, invert):
    torch_neuronx._op_support.clear_op_tracking()
    out = torch.isin(elements.neuron(), test.neuron(), invert=invert)
    return out, _FEW in torch_neuronx.get_executed_ops()


g = torch.Generator().manual_seed(0)
FEW = [
    (torch.arange(49152), torch.tensor([2])),  # generate()'s EOS suppression over the vocabulary
    (torch.arange(1000), torch.tensor([7, 0])),
    (torch.randint(0, 20, (7, 9), generator=g), torch.tensor([[3, 5], [7, 19]])),
    (torch.randint(0, 20, (7, 9), generator=g).int(), torch.tensor([3, 5, 1, 2, 9, 9, 4, 0], dtype=torch.int32)),
    (torch.tensor([0.0, -0.0, float("nan"), 1.5, float("inf")]), torch.tensor([-0.0, float("nan"), float("inf")])),
    (torch.randn(100, generator=g).round().half(), torch.tensor([1.0, -1.0]).half()),
    (torch.randn(100, generator=g).round().bfloat16(), torch.tensor([0.0]).bfloat16()),
    (torch.randint(0, 9, (64,), generator=g).to(torch.uint8), torch.tensor([3], dtype=torch.uint8)),
]
OTHER = [
    (torch.randint(0, 5, (10, 10), generator=g).t(), torch.tensor([1, 2])),  # non-contiguous elements
    (torch.arange(100), torch.arange(50)),  # many test elements
    (torch.arange(10), torch.tensor([1.0, 2.5])),  # test elements of another dtype
    (torch.arange(10), torch.tensor([], dtype=torch.long)),
    (torch.tensor([], dtype=torch.long), torch.tensor([1])),
]


@pytest.mark.parametrize("invert", [False, True])
@pytest.mark.parametrize("case", range(len(FEW) + len(OTHER)))
def test_isin_matches_cpu(case, invert):
    elements, test = (FEW + OTHER)[case]
    want = torch.isin(elements, test, invert=invert)
    got, few = _isin(elements, test, invert)
    # (NEURON_RT_STRICT=1 takes ATen's kernel always: its host path checks results.)
    assert few == (case < len(FEW) and os.environ.get("NEURON_RT_STRICT") != "1")
    assert got.dtype == want.dtype and got.shape == want.shape and got.stride() == want.stride()
    assert_same(got, want)


def test_isin_errors_like_cpu():
    e, t = torch.tensor([True, False]), torch.tensor([True])
    with pytest.raises(RuntimeError, match="Unsupported input type encountered for isin"):
        torch.isin(e, t)
    with pytest.raises(RuntimeError, match="Unsupported input type encountered for isin"):
        torch.isin(e.neuron(), t.neuron())


def test_isin_is_captured_and_replayed():
    vocab = torch.arange(300, device="neuron")
    eos = torch.tensor([5], device="neuron")
    graph = torch.neuron.NeuronGraph()
    with torch.neuron.graph(graph):
        out = torch.isin(vocab, eos)
    for token in (5, 299, 0):
        eos.fill_(token)
        graph.replay()
        assert_same(out, torch.isin(torch.arange(300), torch.tensor([token])))
