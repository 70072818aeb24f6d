"""Graph replays: the prepared kernels a replay runs (csrc/aten/ReplayKernels.h)
give the eager results bit for bit, follow changed inputs, survive many replays,
report failures by op name, show in the profiler as one event, and allocate nothing."""
import gc

import pytest
import torch

from conftest import assert_same


def _capture(fn, *args):
    g = torch.neuron.NeuronGraph()
    with torch.neuron.graph(g):
        out = fn(*args)
    return g, out


def _settle():
    """Frees earlier tests' cyclic garbage (tensors held by tracebacks) now: a
    collection during the checked window would move the memory baseline."""
    gc.collect()
    torch.neuron.synchronize()


def _eager(fn, *cpu_args):
    """`fn` run eagerly on neuron over copies of `cpu_args` (the exact reference)."""
    out = fn(*[a.to("neuron") for a in cpu_args])
    return out.cpu()


# Ops with a prepared replay form (out= and in-place overloads), and ops
# without one (they keep the dispatcher call); mixed in one graph.
CASES = {
    "add": lambda x, y: x + y,
    "add_alpha": lambda x, y: torch.add(x, y, alpha=0.75),
    "sub": lambda x, y: x - y * 0.5,
    "mul_scalar": lambda x, y: x * 1.0001,
    "div": lambda x, y: x / (y * y + 1),
    "unary": lambda x, y: torch.sigmoid(x) + torch.tanh(y) - torch.exp(x * 0.1) + torch.neg(y),
    "sqrt_rsqrt": lambda x, y: torch.sqrt(x * x + 1) * torch.rsqrt(y * y + 1),
    "activations": lambda x, y: torch.nn.functional.gelu(x) + torch.nn.functional.silu(y)
    + torch.nn.functional.gelu(y, approximate="tanh"),
    "broadcast": lambda x, y: x[:, :1] * y[:1, :] + x,
    "non_contiguous": lambda x, y: x.t() * y.t() + 1,
    "in_place": lambda x, y: x.clone().mul_(y).add_(1.5).sigmoid_().sub_(y, alpha=2).div_(3),
    "matmul_mixed": lambda x, y: torch.tanh(x @ y.t()) * 2 + x.sum(),
    "rms_norm": lambda x, y: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * y,
    "pow": lambda x, y: x.clone().pow_(3) + y.abs().pow(0.5) + (x.abs() + 1).pow(-1.5),
    "reductions": lambda x, y: x.sum(0) + y.mean(dim=(0, 1)) + x.t().sum(1, keepdim=True).squeeze(1)
    + y.mean(1, dtype=torch.float32).to(y.dtype),
    "cat": lambda x, y: torch.cat([x, y * 2, x.t()], dim=1) + torch.cat([x[:, :3], y[:, 3:]], -1).sum(1, keepdim=True),
    "rotate_half": lambda x, y: x * y + torch.cat((-x[..., 8:], x[..., :8]), dim=-1) * y,
    "where_fill_arange": lambda x, y: torch.where(x > y, x, y.t()) + x.clone().fill_(0.25) * y
    + torch.arange(16, device=x.device, dtype=x.dtype) * 0.0625 * x + torch.arange(-6, 10, device=x.device).to(x.dtype) * 0.125,
    "index_copy": lambda x, y: x.clone().index_copy_(0, torch.arange(4, device=x.device) * 3 + 1, y[:4] * 2)
    + x.view(1, 16, 16).clone().index_copy_(1, torch.arange(2, device=x.device) + 5, y[None, :2]).view(16, 16),
}


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_replay_equals_eager_bit_for_bit_and_follows_the_inputs(case, dtype):
    fn = CASES[case]
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(16, 16, generator=gen).to("neuron", dtype)
    y = torch.randn(16, 16, generator=gen).to("neuron", dtype)
    g, out = _capture(fn, x, y)
    for _ in range(3):  # each replay after new inputs, written in place
        rx, ry = torch.randn(16, 16, generator=gen).to(dtype), torch.randn(16, 16, generator=gen).to(dtype)
        x.copy_(rx)
        y.copy_(ry)
        g.replay()
        expect = _eager(fn, rx, ry)
        assert out.dtype == expect.dtype
        assert torch.equal(out.cpu(), expect), case
        tol = {} if dtype == torch.float32 else {"rtol": 2e-2, "atol": 2e-2}
        assert_same(out, fn(rx.float(), ry.float()).to(dtype), **tol)


def test_integer_inputs_with_float_scalars_follow_the_inputs():
    # int * float scalar: the iterator would convert the input at build time,
    # so these kernels keep the dispatcher call; the replays must still read x.
    x = torch.arange(10, dtype=torch.int32, device="neuron")
    g, out = _capture(lambda t: torch.sigmoid(t) + t * 1.5 - t, x)
    for k in range(3):
        ref = torch.arange(10, dtype=torch.int32) * (k + 2) - 7
        x.copy_(ref)
        g.replay()
        assert out.dtype == torch.float32
        assert torch.equal(out.cpu(), _eager(lambda t: torch.sigmoid(t) + t * 1.5 - t, ref))


def test_integer_chain_is_exact():
    x = torch.arange(-20, 20, dtype=torch.int64, device="neuron")
    fn = lambda t: (t * 3 + 7) * (t - 2) - t.neg()  # noqa: E731
    g, out = _capture(fn, x)
    ref = torch.randint(-1000, 1000, (40,))
    x.copy_(ref)
    g.replay()
    assert torch.equal(out.cpu(), fn(ref))


def test_many_replays_of_a_long_chain():
    x = torch.linspace(-1, 1, 64, device="neuron")

    def chain(t):
        for i in range(120):
            t = [lambda u: u * 1.0001, lambda u: u + 0.001, torch.sigmoid, torch.tanh][i % 4](t)
        return t

    g, out = _capture(chain, x)
    for k in range(200):
        if k % 50 == 0:
            ref = torch.linspace(-1, 1, 64) * (k + 1)
            x.copy_(ref)
        g.replay()
    torch.neuron.synchronize()
    assert torch.equal(out.cpu(), _eager(chain, ref))


# Prepared reductions, cat copies and index_copy_ at sizes past the intra-op
# grain (ATen splits reductions and copies across threads there), over
# non-contiguous inputs, with a legacy empty cat input, and with dtypes that
# keep ATen's impl (an int32 sum into int64, a bfloat16 mean via fp32).
def _sizes_and_layouts(x, y, pos):
    rows = torch.cat((-x[:, 512:], x[:, :512], torch.empty(0, device=x.device)), dim=-1)
    cache = torch.zeros(4, 96, 1024, device=x.device).index_copy_(1, pos, y.view(4, 16, 1024) * 2)
    return (
        x.pow(2).mean(-1, keepdim=True) + x.t().mean(0).unsqueeze(1),
        x.sum(0) + y.sum(dim=(0, 1)) + y.t().sum(1),
        rows * y,
        cache.sum(1),
        (x * 100).int().sum(1).float() + x.bfloat16().mean(1).float(),
    )


@pytest.mark.parametrize("threads", [1, 2])
def test_prepared_reductions_and_copies_at_other_sizes_and_layouts(threads):
    prev = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        gen = torch.Generator().manual_seed(1)
        x = torch.randn(64, 1024, generator=gen).to("neuron")
        y = torch.randn(64, 1024, generator=gen).to("neuron")
        pos = torch.arange(16, device="neuron") * 5
        g, outs = _capture(_sizes_and_layouts, x, y, pos)
        for k in range(2):
            rx, ry = torch.randn(64, 1024, generator=gen), torch.randn(64, 1024, generator=gen)
            rpos = torch.randperm(96, generator=gen)[:16]
            x.copy_(rx)
            y.copy_(ry)
            pos.copy_(rpos)
            g.replay()
            expect = _sizes_and_layouts(rx.to("neuron"), ry.to("neuron"), rpos.to("neuron"))
            for o, e in zip(outs, expect):
                assert torch.equal(o.cpu(), e.cpu())
    finally:
        torch.set_num_threads(prev)


def test_replay_failure_names_the_op_and_the_device_stays_usable():
    src = torch.arange(12, dtype=torch.float32, device="neuron").reshape(4, 3)
    idx = torch.tensor([0, 2], device="neuron")
    g, out = _capture(lambda s, i: torch.index_select(s, 0, i) * 2 + 1, src, idx)
    g.replay()
    assert torch.equal(out.cpu(), torch.tensor([[1.0, 3, 5], [13, 15, 17]]))
    idx.copy_(torch.tensor([0, 99]))  # out of range: the kernel fails at replay
    with pytest.raises(RuntimeError, match=r"index_select.*a kernel of the graph"):
        g.replay()  # raises here with blocking launches
        torch.neuron.synchronize()
    idx.copy_(torch.tensor([3, 1]))
    g.replay()
    assert torch.equal(out.cpu(), torch.tensor([[19.0, 21, 23], [7, 9, 11]]))


def test_prepared_index_copy_checks_the_index_at_each_replay():
    cache = torch.zeros(2, 6, 4, device="neuron")
    pos = torch.tensor([1], device="neuron")
    new = torch.ones(2, 1, 4, device="neuron")
    g, out = _capture(lambda c, p, n: c.index_copy_(1, p, n * 2), cache, pos, new)
    g.replay()
    pos.copy_(torch.tensor([6]))  # out of range: the prepared kernel fails at replay
    with pytest.raises(RuntimeError, match=r"index_copy_.*a kernel of the graph"):
        g.replay()
        torch.neuron.synchronize()
    pos.copy_(torch.tensor([4]))
    new.copy_(torch.full((2, 1, 4), 3.0))
    g.replay()
    expect = torch.zeros(2, 6, 4)
    expect[:, 1] = 2
    expect[:, 4] = 6
    assert torch.equal(cache.cpu(), expect)


def test_hundred_replays_allocate_nothing():
    x = torch.randn(32, 32, device="neuron")
    w = torch.randn(32, 32, device="neuron")
    fn = lambda t, w: torch.nn.functional.gelu(t @ w) * 0.5 + torch.sigmoid(t)  # noqa: E731
    g, out = _capture(fn, x, w)
    g.replay()
    _settle()
    before = torch.neuron.memory_stats()
    for _ in range(100):
        g.replay()
    torch.neuron.synchronize()
    after = torch.neuron.memory_stats()
    for key in ("allocation.all.allocated", "allocated_bytes.all.allocated", "segment.all.allocated",
                "reserved_bytes.all.current", "allocated_bytes.all.current"):
        assert after[key] == before[key], key
    assert torch.equal(out.cpu(), _eager(fn, x.cpu(), w.cpu()))


def test_reset_and_delete_return_the_pool_to_the_cache():
    x = torch.randn(64, 64, device="neuron")
    _settle()
    torch.neuron.empty_cache()
    base = torch.neuron.memory_stats()
    g, out = _capture(lambda t: torch.tanh(t * 2) + t, x)
    g.replay()
    torch.neuron.synchronize()
    held = torch.neuron.memory_stats()
    assert held["allocated_bytes.all.current"] > base["allocated_bytes.all.current"]
    del out
    g.reset()  # the graph's blocks are free in the device's cache again
    torch.neuron.synchronize()
    after = torch.neuron.memory_stats()
    assert after["allocated_bytes.all.current"] == base["allocated_bytes.all.current"]
    torch.neuron.empty_cache()
    assert torch.neuron.memory_stats()["reserved_bytes.all.current"] == base["reserved_bytes.all.current"]
    # Capture again into the reset graph, then delete it.
    g2, out2 = _capture(lambda t: t * 3, x)
    g2.replay()
    assert torch.equal(out2.cpu(), x.cpu() * 3)
    del g2, out2
    torch.neuron.synchronize()
    assert torch.neuron.memory_stats()["allocated_bytes.all.current"] == base["allocated_bytes.all.current"]


def test_profiler_shows_a_replay_as_one_event_with_its_kernel_count(tmp_path):
    import json

    from torch.profiler import ProfilerActivity, profile

    x = torch.randn(8, device="neuron")
    g, out = _capture(lambda t: torch.sigmoid(t * 2 + 1), x)  # three kernels: mul, add, sigmoid
    g.replay()
    torch.neuron.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]) as prof:
        g.replay()
        g.replay()
        torch.neuron.synchronize()
    path = tmp_path / "trace.json"
    prof.export_chrome_trace(str(path))
    kernels = [e for e in json.loads(path.read_text())["traceEvents"] if e.get("cat") == "kernel"]
    replays = [e for e in kernels if e["name"] == "Graph replay"]
    assert len(replays) == 2
    assert all(e["args"]["kernels"] == 3 for e in replays)
    assert all(e["dur"] >= 0 for e in replays)
    # The recorded kernels are not reported one by one.
    assert not {"aten::mul", "aten::add", "aten::sigmoid"} & {e["name"] for e in kernels}
    assert torch.equal(out.cpu(), torch.sigmoid(x.cpu() * 2 + 1))


def test_neuron_top_counts_replays():
    import os

    from neuron_tools import _registry, neuron_top

    def replays():
        (me,) = [p for p in _registry.processes() if p.pid == os.getpid()]
        return me.devices[0].graph_replays

    x = torch.ones(4, device="neuron")
    g, out = _capture(lambda t: t + 1, x)
    torch.neuron.synchronize()
    before = replays()
    for _ in range(7):
        g.replay()
    torch.neuron.synchronize()
    assert replays() == before + 7
    rows = [r for r in neuron_top.Sampler().sample()["processes"] if r["pid"] == os.getpid()]
    assert rows and rows[0]["graph_replays"] == before + 7
    assert "REPLAYS" in "\n".join(neuron_top.render({"cores": [], "processes": rows}))
    assert torch.equal(out.cpu(), torch.full((4,), 2.0))
