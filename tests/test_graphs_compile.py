"""torch.compile(backend="neuron", mode="reduce-overhead"): compiled graphs
captured into neuron graphs and replayed, against eager CPU on the same
inputs; the fallbacks and their one logged reason."""
import copy
import logging

import pytest
import torch

from conftest import assert_same, tiny_llama
from torch_neuronx._compile import graphs

TOL = dict(rtol=1e-5, atol=1e-5)


@pytest.fixture(autouse=True)
def _fresh():
    torch._dynamo.reset()
    torch.neuron.reset_dynamo_metrics()
    graphs.reset_graph_stats()
    yield
    torch._dynamo.reset()


def _compile(fn, **kwargs):
    return torch.compile(fn, backend="neuron", mode="reduce-overhead", **kwargs)


def _encoder_layer():
    torch.manual_seed(0)
    return torch.nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True).eval()


@pytest.fixture
def no_mha_fastpath():
    # Inductor then compiles the layer itself (the fast path is one fallback op).
    enabled = torch.backends.mha.get_fastpath_enabled()
    torch.backends.mha.set_fastpath_enabled(False)
    yield
    torch.backends.mha.set_fastpath_enabled(enabled)


def test_transformer_layer_replays_and_equals_cpu(no_mha_fastpath):
    cpu = _encoder_layer()
    f = _compile(copy.deepcopy(cpu).to("neuron"))
    with torch.no_grad():
        for i in range(5):
            x = torch.randn(2, 8, 32)
            assert_same(f(x.to("neuron")), cpu(x), **TOL)
            # first call: warm-up; second: capture + replay; then replays
            assert graphs.graph_stats() == {"captures": int(i >= 1), "replays": i, "fallbacks": 0}
    metrics = torch.neuron.get_dynamo_metrics()
    assert metrics["frames_total"] == 1 and metrics["recompiles"] == 0


@pytest.mark.parametrize("dynamic", [False, True])
def test_each_input_shape_gets_its_graph(dynamic):
    torch.manual_seed(1)
    w = torch.randn(16, 16)
    wn = w.to("neuron")
    f = _compile(lambda x: torch.softmax(torch.tanh(x @ wn) * 2.0, -1).sum(0), dynamic=dynamic)
    shapes = [(4, 16), (7, 16)]
    for _ in range(3):
        for shape in shapes:
            x = torch.randn(shape)
            assert_same(f(x.to("neuron")), torch.softmax(torch.tanh(x @ w) * 2.0, -1).sum(0), **TOL)
    stats = graphs.graph_stats()
    assert stats["captures"] == 2 and stats["replays"] == 4 and stats["fallbacks"] == 0
    # dynamic=True: one compiled graph, a neuron graph per size; False: a compile per shape
    assert torch.neuron.get_dynamo_metrics()["frames_total"] == (1 if dynamic else 2)


def test_inputs_mutated_by_the_graph_are_updated():
    def step(x, acc):
        acc.add_(x * 2)
        return acc.sum(0)

    f = _compile(step)
    acc_cpu, acc = torch.zeros(5, 3), torch.zeros(5, 3, device="neuron")
    for _ in range(4):
        x = torch.randn(5, 3)
        assert_same(f(x.to("neuron"), acc), step(x, acc_cpu), **TOL)
        assert_same(acc, acc_cpu, **TOL)  # mutated in the caller's tensor, not only in the graph's copy
    other_cpu, other = torch.ones(5, 3), torch.ones(5, 3, device="neuron")  # another tensor, same shape
    x = torch.randn(5, 3)
    assert_same(f(x.to("neuron"), other), step(x, other_cpu), **TOL)
    assert_same(other, other_cpu, **TOL)
    assert_same(acc, acc_cpu, **TOL)
    assert graphs.graph_stats()["replays"] == 4


def test_static_inputs_are_used_in_place():
    cache_cpu, cache = torch.zeros(6, 4), torch.zeros(6, 4, device="neuron")
    torch._dynamo.mark_static_address(cache)  # as Transformers' static KV cache

    def write(pos, v, cache):
        cache.index_copy_(0, pos, v)
        return cache * 1.0

    f = _compile(write)
    for i in range(6):
        v = torch.randn(1, 4)
        pos = torch.tensor([i])
        assert_same(f(pos.to("neuron"), v.to("neuron"), cache), write(pos, v, cache_cpu), **TOL)
        assert_same(cache, cache_cpu)
    assert graphs.graph_stats() == {"captures": 1, "replays": 5, "fallbacks": 0}
    # A new static tensor (a new cache): the graph read the old address, so it is captured again.
    cache_cpu, cache = torch.ones(6, 4), torch.ones(6, 4, device="neuron")
    torch._dynamo.mark_static_address(cache)
    for i in range(2):
        v = torch.randn(1, 4)
        pos = torch.tensor([i])
        assert_same(f(pos.to("neuron"), v.to("neuron"), cache), write(pos, v, cache_cpu), **TOL)
        assert_same(cache, cache_cpu)
    assert graphs.graph_stats()["replays"] == 7


def test_a_parameter_that_moves_is_captured_again():
    # Same Parameter object, new storage: Dynamo's guards pass, the graph reads
    # the old address, so the replay's static-address check must capture again.
    torch.manual_seed(0)
    lin = torch.nn.Linear(4, 3)
    lin_n = copy.deepcopy(lin).to("neuron")
    f = _compile(lin_n)
    x = torch.randn(2, 4)
    with torch.no_grad():
        for _ in range(3):
            assert_same(f(x.to("neuron")), lin(x), **TOL)
        assert graphs.graph_stats() == {"captures": 1, "replays": 2, "fallbacks": 0}
        lin.weight.data = torch.randn(3, 4)
        lin_n.weight.data = lin.weight.data.to("neuron")
        assert_same(f(x.to("neuron")), lin(x), **TOL)
    assert graphs.graph_stats() == {"captures": 2, "replays": 3, "fallbacks": 0}


def test_static_address_check_matches_data_ptr():
    from torch_neuronx._C import _tensors_data_ptrs_at_indices_equal as equal

    ts = [torch.zeros(2, device="neuron") for _ in range(4)]
    ptrs = [ts[i].data_ptr() for i in (1, 3)]
    assert equal(ts, ptrs, [1, 3])
    assert not equal([ts[0], ts[1], ts[2], torch.zeros(2, device="neuron")], ptrs, [1, 3])
    with pytest.raises(RuntimeError, match="as many data pointers as indices"):
        equal(ts, ptrs, [1])
    with pytest.raises(RuntimeError, match="out of range"):
        equal(ts, ptrs, [1, 4])
    with pytest.raises(RuntimeError, match="not a tensor"):
        equal([ts[0], 3], ptrs[:1], [1])


def test_outputs_are_overwritten_by_the_next_replay():
    f = _compile(lambda x: x * 3)
    a, b, c = (torch.full((4,), v, device="neuron") for v in (1.0, 2.0, 5.0))
    f(a)  # warm-up: a fresh output
    out_b = f(b)
    kept = out_b.clone()
    f(c)  # replays into the same static output
    assert_same(out_b, torch.full((4,), 15.0))
    assert_same(kept, torch.full((4,), 6.0))


def test_replays_allocate_nothing():
    torch.manual_seed(2)
    w = torch.randn(32, 32, device="neuron")
    f = _compile(lambda x: torch.sigmoid(x @ w + 1.0) @ w)
    x = torch.randn(8, 32, device="neuron")
    f(x), f(x)  # warm-up, capture
    torch.neuron.synchronize()
    before = torch.neuron.memory_allocated()
    for _ in range(3):
        out = f(torch.randn(8, 32, device="neuron"))
        del out
    torch.neuron.synchronize()
    assert torch.neuron.memory_allocated() == before
    assert graphs.graph_stats()["replays"] == 4


def _fallback_records(caplog):
    return [r for r in caplog.records if r.name == graphs.__name__]


def _dropout_fn(w):
    return lambda x: torch.nn.functional.dropout(x @ w, 0.5, training=True)


def test_uncapturable_graph_falls_back_with_one_logged_reason(caplog):
    # Random ops capture only in the "philox" rng mode; the default draws
    # from the CPU generator's engine, which a replay cannot restart.
    assert torch.neuron.get_rng_mode() == "cpu"
    torch.manual_seed(5)
    w = torch.randn(16, 16)
    f = _compile(_dropout_fn(w.to("neuron")))
    with caplog.at_level(logging.WARNING, logger=graphs.__name__):
        for _ in range(4):
            x = torch.randn(8, 16)
            out = f(x.to("neuron")).cpu()
            kept = out != 0
            assert 0 < kept.sum() < out.numel()
            torch.testing.assert_close(out[kept], ((x @ w) * 2)[kept], **TOL)  # dropped or scaled by 1/(1-p)
    records = _fallback_records(caplog)
    assert len(records) == 1, [r.getMessage() for r in records]
    assert "capture failed" in records[0].getMessage() and "philox" in records[0].getMessage()
    assert graphs.graph_stats() == {"captures": 0, "replays": 0, "fallbacks": 1}
    assert torch._dynamo.utils.counters["inductor"]["cudagraph_skips"] >= 1


def test_random_ops_replay_the_eager_sequence_in_philox_mode(philox_rng):
    torch.manual_seed(6)
    w = torch.randn(16, 16, device="neuron")
    xs = [torch.randn(8, 16, device="neuron") for _ in range(5)]
    runs = {}
    for mode in ("reduce-overhead", "default"):
        torch._dynamo.reset()
        f = torch.compile(_dropout_fn(w), backend="neuron", mode=mode)
        torch.neuron.manual_seed(123)
        runs[mode] = [f(x).cpu() for x in xs]
    assert graphs.graph_stats() == {"captures": 1, "replays": 4, "fallbacks": 0}
    masks = [(out == 0) for out in runs["reduce-overhead"]]
    assert all(not torch.equal(a, b) for a, b in zip(masks, masks[1:]))  # fresh numbers every replay
    for got, want in zip(runs["reduce-overhead"], runs["default"]):
        assert torch.equal(got, want)


def test_fused_encoder_fast_path_replays():
    cpu = _encoder_layer()  # eval + no_grad: the fused fast path, one host fallback op
    f = _compile(copy.deepcopy(cpu).to("neuron"))
    with torch.no_grad():
        for _ in range(4):
            x = torch.randn(2, 8, 32)
            assert_same(f(x.to("neuron")), cpu(x), **TOL)
    assert graphs.graph_stats() == {"captures": 1, "replays": 3, "fallbacks": 0}


def test_cpu_tensors_in_the_graph_fall_back(caplog):
    f = _compile(lambda x, c: (x * 2, c + 1))
    with caplog.at_level(logging.WARNING, logger=graphs.__name__):
        for k in range(3):
            x, c = torch.full((3,), float(k)), torch.full((2,), float(k))
            y, d = f(x.to("neuron"), c)
            assert_same(y, x * 2)
            assert d.device.type == "cpu" and torch.equal(d, c + 1)
    records = _fallback_records(caplog)
    assert len(records) == 1 and "CPU tensors" in records[0].getMessage()


def test_training_graphs_fall_back_and_train_like_eager(caplog):
    torch.manual_seed(3)
    cpu = torch.nn.Linear(8, 4)
    dev = copy.deepcopy(cpu).to("neuron")
    f = _compile(dev)
    x = torch.randn(5, 8)
    with caplog.at_level(logging.WARNING, logger=graphs.__name__):
        for _ in range(2):
            f(x.to("neuron")).square().sum().backward()
            cpu(x).square().sum().backward()
    assert_same(dev.weight.grad, cpu.weight.grad, rtol=1e-4, atol=1e-5)
    messages = [r.getMessage() for r in _fallback_records(caplog)]
    assert len(messages) == 2 and all("training graph" in m for m in messages)  # forward, backward


def test_default_mode_captures_nothing():
    f = torch.compile(lambda x: x * 2 + 1, backend="neuron")
    for _ in range(3):
        f(torch.ones(3, device="neuron"))
    assert graphs.graph_stats() == {"captures": 0, "replays": 0, "fallbacks": 0}


def test_generate_with_static_cache_replays_one_graph_per_decode_step():
    transformers = pytest.importorskip("transformers")
    cpu = tiny_llama()
    dev = copy.deepcopy(cpu).to("neuron")
    ids = torch.randint(0, 128, (2, 6), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[1, :2] = 0  # left padding
    new = 16
    kw = dict(max_new_tokens=new, do_sample=False, cache_implementation="static")
    ref = cpu.generate(ids, attention_mask=mask, disable_compile=True, **kw)
    config = transformers.CompileConfig(backend="neuron", mode="reduce-overhead")

    out = dev.generate(ids.to("neuron"), attention_mask=mask.to("neuron"), compile_config=config, **kw)
    assert torch.equal(out.cpu(), ref)
    # The prefill runs eagerly; of the new - 1 decode steps the first is the warm-up.
    assert graphs.graph_stats() == {"captures": 1, "replays": new - 2, "fallbacks": 0}
    frames = torch.neuron.get_dynamo_metrics()["frames_total"]

    graphs.reset_graph_stats()
    out = dev.generate(ids.to("neuron"), attention_mask=mask.to("neuron"), compile_config=config, **kw)
    assert torch.equal(out.cpu(), ref)
    # A new cache: captured again at the first step, then every step is one replay.
    assert graphs.graph_stats() == {"captures": 1, "replays": new - 1, "fallbacks": 0}
    assert torch.neuron.get_dynamo_metrics()["frames_total"] == frames
