"""Device graphs: torch.accelerator.Graph and torch.neuron.NeuronGraph/graph
(capture, replay, pools, capture rules), against eager on the same inputs."""
import pytest
import torch

from conftest import assert_same, run_json


# Ops of the queued routes (csrc/aten/Routes.cpp): ops that run synchronously
# cannot be captured (test_capture_rule_errors_leave_the_device_usable).
def _chain(x):
    return torch.sigmoid(torch.sin(x * 2.0 + 1.0) * x) - x.exp() / 4 + torch.clamp(x, min=0).sqrt()


def _capture(fn, *args, **graph_kwargs):
    g = torch.neuron.NeuronGraph()
    with torch.neuron.graph(g, **graph_kwargs):
        out = fn(*args)
    return g, out


def test_accelerator_graph_is_registered_for_neuron():
    x = torch.arange(6, dtype=torch.float32, device="neuron")
    s = torch.neuron.Stream()
    g = torch.accelerator.Graph()
    with s, g:
        y = x * 3 + 1
    for k in range(3):
        x.copy_(torch.arange(6, dtype=torch.float32) + k)
        g.replay()
        assert_same(y, (torch.arange(6, dtype=torch.float32) + k) * 3 + 1)
    assert g.pool() != (0, 0)


def test_elementwise_chain_replays_follow_the_static_input():
    torch.manual_seed(0)
    x = torch.randn(64, 33, device="neuron")
    g, y = _capture(_chain, x)
    for _ in range(3):
        ref = torch.randn(64, 33)
        x.copy_(ref)  # the static input, changed in place between replays
        g.replay()
        assert_same(y, _chain(ref))


def test_capture_records_without_running():
    x = torch.ones(8, device="neuron")
    g, y = _capture(lambda t: t.add_(1), x)
    assert_same(x, torch.ones(8))  # recorded, not run
    g.replay()
    g.replay()
    assert_same(x, torch.full((8,), 3.0))
    assert y is x


def test_integer_chain_is_exact():
    x = torch.arange(-50, 50, dtype=torch.int32, device="neuron")
    fn = lambda t: (torch.bitwise_xor(t * 3 + 7, t - 2) * (t > 0)).cumsum(0)  # noqa: E731
    g, y = _capture(fn, x)
    ref = torch.randint(-1000, 1000, (100,), dtype=torch.int32)
    x.copy_(ref)
    g.replay()
    assert_same(y, fn(ref))


def test_matmul_bias_gelu():
    torch.manual_seed(1)
    a = torch.randn(32, 48, device="neuron")
    w = torch.randn(48, 24, device="neuron")
    b = torch.randn(24, device="neuron")
    fn = lambda a, w, b: torch.nn.functional.gelu(a @ w + b)  # noqa: E731
    g, y = _capture(fn, a, w, b)
    for _ in range(2):
        ra, rw, rb = torch.randn(32, 48), torch.randn(48, 24), torch.randn(24)
        a.copy_(ra), w.copy_(rw), b.copy_(rb)
        g.replay()
        assert_same(y, fn(ra, rw, rb), rtol=1e-4, atol=1e-4)


def test_attention_block():
    torch.manual_seed(2)
    q, k, v = (torch.randn(2, 16, 32, device="neuron") for _ in range(3))

    def attn(q, k, v):
        return torch.softmax(torch.bmm(q, k.transpose(1, 2)) / 32 ** 0.5, dim=-1) @ v

    g, y = _capture(attn, q, k, v)
    refs = [torch.randn(2, 16, 32) for _ in range(3)]
    for t, r in zip((q, k, v), refs):
        t.copy_(r)
    g.replay()
    assert_same(y, attn(*refs), rtol=1e-4, atol=1e-4)


def test_copies_fills_and_in_place_ops_in_capture():
    x = torch.randn(40, device="neuron")
    acc = torch.zeros(40, device="neuron")

    def step(x):
        buf = torch.zeros(40, device="neuron")  # made in capture: zeroed at each replay
        buf.copy_(x)
        buf.mul_(2)
        acc.add_(buf)  # state carried across replays
        return buf.clone(), buf

    g, (copy, buf) = _capture(step, x)
    assert_same(acc, torch.zeros(40))  # not run at capture
    ref = torch.randn(40)
    x.copy_(ref)
    for _ in range(3):
        g.replay()
    assert_same(copy, ref * 2)
    assert_same(buf, ref * 2)
    assert_same(acc, ref * 6)


def test_compiled_function_in_capture():
    # A torch.compile'd function's kernels (compiled and extern) are queued
    # launches: captured like eager ops.
    def f(x, w):
        return torch.tanh(x @ w) * 2 + x.sum()

    compiled = torch.compile(f, backend="neuron")
    x, w = torch.randn(8, 8, device="neuron"), torch.randn(8, 8, device="neuron")
    compiled(x, w)  # compiles outside the capture
    g, y = _capture(compiled, x, w)
    for _ in range(2):
        rx, rw = torch.randn(8, 8), torch.randn(8, 8)
        x.copy_(rx), w.copy_(rw)
        g.replay()
        assert_same(y, f(rx, rw), rtol=1e-4, atol=1e-4)


def test_replays_allocate_nothing():
    x = torch.randn(256, 256, device="neuron")
    g, y = _capture(lambda t: torch.tanh(t @ t) + t, x)
    g.replay()
    torch.neuron.synchronize()
    allocated = torch.neuron.memory_allocated()
    reserved = torch.neuron.memory_reserved()
    for _ in range(10):
        g.replay()
    torch.neuron.synchronize()
    assert torch.neuron.memory_allocated() == allocated
    assert torch.neuron.memory_reserved() == reserved
    ref = x.cpu()
    assert_same(y, torch.tanh(ref @ ref) + ref, rtol=1e-4, atol=1e-4)


def test_deleting_the_graph_returns_its_pool_memory():
    x = torch.randn(128, 128, device="neuron")
    torch.neuron.synchronize()
    base = torch.neuron.memory_allocated()
    g, y = _capture(lambda t: (t * 2).sin() @ t, x)
    g.replay()
    torch.neuron.synchronize()
    assert torch.neuron.memory_allocated() > base  # the graph's tensors
    del g, y
    torch.neuron.synchronize()
    assert torch.neuron.memory_allocated() == base
    # The pool's blocks serve eager work again.
    z = torch.randn(128, 128, device="neuron")
    assert_same(z * 2, z.cpu() * 2)


def test_reset_then_capture_again():
    x = torch.ones(4, device="neuron")
    g, y = _capture(lambda t: t + 1, x)
    g.replay()
    assert_same(y, torch.full((4,), 2.0))
    g.reset()
    with pytest.raises(RuntimeError, match="holds no capture"):
        g.replay()
    with torch.neuron.graph(g):
        y2 = x * 5
    g.replay()
    assert_same(y2, torch.full((4,), 5.0))


@pytest.mark.parametrize("handle", [False, True])
def test_two_graphs_share_a_pool(handle):
    x = torch.randn(64, device="neuron")
    g1 = torch.neuron.NeuronGraph()
    pool = torch.neuron.graph_pool_handle() if handle else None
    with torch.neuron.graph(g1, pool=pool):
        y1 = x.exp() + 1
    g2 = torch.neuron.NeuronGraph()
    with torch.neuron.graph(g2, pool=g1.pool()):
        y2 = y1 * y1 - x
    assert g1.pool() == g2.pool()
    if handle:
        assert g1.pool() == pool
    ref = torch.randn(64)
    x.copy_(ref)
    g1.replay()
    g2.replay()
    assert_same(y1, ref.exp() + 1)
    assert_same(y2, (ref.exp() + 1) ** 2 - ref)
    # The pool lives while either graph does.
    del g1
    x.copy_(ref * 2)
    g2.replay()  # y1 keeps the first replay's value
    assert_same(y2, (ref.exp() + 1) ** 2 - ref * 2)


def _is_capturing_inside():
    seen = []

    def fn(t):
        seen.append(torch.neuron.is_current_stream_capturing())
        return t + 1

    _capture(fn, torch.zeros(2, device="neuron"))
    return seen


def test_is_current_stream_capturing():
    assert not torch.neuron.is_current_stream_capturing()
    assert _is_capturing_inside() == [True]
    assert not torch.neuron.is_current_stream_capturing()


# Recorded on another stream before any capture (fork/join rules: test_graphs_join.py).
_EVENT_BEFORE_CAPTURE = torch.neuron.Stream().record_event()

_VIOLATIONS = {
    "item": lambda x: x.sum().item(),
    "cpu": lambda x: x.cpu(),
    "synchronize": lambda x: torch.neuron.synchronize(),
    "stream_synchronize": lambda x: torch.neuron.current_stream().synchronize(),
    "event_synchronize": lambda x: torch.neuron.current_stream().record_event().synchronize(),
    "wait_event_from_before": lambda x: torch.neuron.current_stream().wait_event(_EVENT_BEFORE_CAPTURE),
    "nonzero": lambda x: torch.nonzero(x),
    "boolean_mask": lambda x: x[x > 0],
    "rng": lambda x: torch.rand(4, device="neuron"),
    "dropout": lambda x: torch.nn.functional.dropout(x, 0.5),
}


@pytest.mark.parametrize("what", list(_VIOLATIONS))
def test_capture_rule_errors_leave_the_device_usable(what):
    x = torch.randn(16, device="neuron")
    g = torch.neuron.NeuronGraph()
    with pytest.raises(RuntimeError, match="is capturing a graph") as info:
        with torch.neuron.graph(g):
            y = x * 2
            _VIOLATIONS[what](y)
    if what in ("rng", "dropout"):
        assert 'random ops can be captured in the "philox" rng mode only' in str(info.value)
    if what == "wait_event_from_before":
        assert "recorded outside the capture" in str(info.value)
    assert not torch.neuron.is_current_stream_capturing()
    with pytest.raises(RuntimeError, match="holds no capture"):
        g.replay()
    # The device, the stream and the graph object work afterwards.
    ref = x.cpu()
    assert_same(x * 2 + 1, ref * 2 + 1)
    torch.neuron.synchronize()
    with torch.neuron.graph(g):
        z = x - 1
    g.replay()
    assert_same(z, ref - 1)


def test_violation_caught_inside_the_body_still_discards_the_capture():
    x = torch.randn(4, device="neuron")
    g = torch.neuron.NeuronGraph()
    with pytest.raises(RuntimeError, match="invalidated"):
        with torch.neuron.graph(g):
            with pytest.raises(RuntimeError, match="is capturing a graph"):
                x.cpu()
    assert not torch.neuron.is_current_stream_capturing()
    assert_same(x + 1, x.cpu() + 1)


def test_default_stream_capture_is_refused():
    g = torch.accelerator.Graph()
    with pytest.raises(RuntimeError, match="default stream"):
        with g:
            pass
    assert not torch.neuron.is_current_stream_capturing()


def test_side_stream_capture_replays_on_the_current_stream():
    s = torch.neuron.Stream()
    x = torch.randn(300, 300, device="neuron")
    g, y = _capture(lambda t: torch.tanh(t @ t), x, stream=s)
    assert torch.neuron.current_stream() == torch.neuron.default_stream()
    ref = torch.randn(300, 300)
    x.copy_(ref)  # queued on the default stream, before the replay there
    g.replay()
    w = y + 1  # after the replay, in stream order
    assert_same(w, torch.tanh(ref @ ref) + 1, rtol=1e-4, atol=1e-3)
    # Replaying on another stream: ordered by events like any launch.
    other = torch.neuron.Stream()
    other.wait_stream(torch.neuron.current_stream())
    with torch.neuron.stream(other):
        g.replay()
    torch.neuron.current_stream().wait_stream(other)
    assert_same(y, torch.tanh(ref @ ref), rtol=1e-4, atol=1e-3)


def test_keep_graph_instantiates_at_first_replay():
    x = torch.ones(3, device="neuron")
    g = torch.neuron.NeuronGraph(keep_graph=True)
    with torch.neuron.graph(g):
        y = x * 7
    g.replay()
    assert_same(y, torch.full((3,), 7.0))
    g.instantiate()
    g.replay()
    assert_same(y, torch.full((3,), 7.0))


def test_debug_dump_lists_the_kernels(tmp_path):
    x = torch.ones(5, device="neuron")
    g = torch.neuron.NeuronGraph()
    g.enable_debug_mode()
    with torch.neuron.graph(g):
        y = (x + 1).mul(3)
    path = tmp_path / "graph.txt"
    g.debug_dump(str(path))
    lines = path.read_text().splitlines()
    assert lines[0].startswith("neuron graph: neuron:0, 2 kernels")
    assert [line.split("\t")[1] for line in lines[1:]] == ["aten::add", "aten::mul"]
    undebugged = torch.neuron.NeuronGraph()
    with torch.neuron.graph(undebugged):
        x + 1
    with pytest.raises(RuntimeError, match="enable_debug_mode"):
        undebugged.debug_dump(str(path))


def test_bad_arguments():
    with pytest.raises(ValueError, match="capture_error_mode"):
        torch.neuron.graph(torch.neuron.NeuronGraph(), capture_error_mode="loose")
    with pytest.raises(TypeError, match="NeuronGraph"):
        torch.neuron.graph(object())
    with pytest.raises(RuntimeError, match="without a capture"):
        torch.neuron.NeuronGraph().pool()


def test_blocking_launches_capture_and_replay_synchronously():
    # NEURON_RT_LAUNCH_BLOCKING=1: capture still records; a replay runs on
    # the caller before returning, and leaves the caller's autograd state.
    out = run_json("""
        import json, torch, torch_neuronx
        x = torch.arange(4.0, device="neuron")
        g = torch.neuron.NeuronGraph()
        with torch.neuron.graph(g):
            y = x * 2 + 1
        x.copy_(torch.tensor([10.0, 20.0, 30.0, 40.0]))
        g.replay()
        a = torch.ones(3, device="neuron", requires_grad=True)
        (a * 3).sum().backward()
        print(json.dumps({"y": y.cpu().tolist(), "grad": a.grad.cpu().tolist(),
                          "blocking": torch_neuronx._C._launch_blocking()}))
    """, env={"NEURON_RT_LAUNCH_BLOCKING": "1"})
    assert out == {"y": [21.0, 41.0, 61.0, 81.0], "grad": [3.0, 3.0, 3.0], "blocking": True}


def test_neuron_graph_as_a_context_manager_uses_its_graph_pool():
    x = torch.ones(3, device="neuron")
    s = torch.neuron.Stream()
    g1 = torch.neuron.NeuronGraph()
    with s, g1:
        y = x + 1
    g2 = torch.neuron.NeuronGraph()
    g2.graph_pool = g1.pool()
    with s, g2:
        z = y * 2
    assert g2.pool() == g1.pool()
    x.copy_(torch.tensor([1.0, 2.0, 3.0]))
    g1.replay()
    g2.replay()
    assert_same(z, torch.tensor([4.0, 6.0, 8.0]))


def test_nki_kernel_replays():
    # An NKI kernel is a queued launch: captured and replayed over the static
    # tensors like an ATen op, between ATen ops that feed it and read it.
    import nki_kernels as K

    x = torch.randn(256, 512, device="neuron")
    y = torch.randn(256, 512, device="neuron")
    K.tensor_add(x, y)  # traced and lowered before the capture
    g, out = _capture(lambda a, b: K.tensor_add(a.sin(), b) * 2, x, y)
    for _ in range(3):
        xs, ys = torch.randn(256, 512), torch.randn(256, 512)
        x.copy_(xs)
        y.copy_(ys)
        g.replay()
        assert_same(out, (xs.sin() + ys) * 2)
