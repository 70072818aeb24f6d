"""Fork/join capture: streams that wait for an event of a capture join it
(docs/graphs.md, "Capture rules")."""

import pytest
import torch

import torch_neuronx  # noqa: F401


def assert_same(actual, expected):
    assert actual.device.type == "neuron"
    torch.testing.assert_close(actual.cpu(), expected, rtol=0, atol=0)


def _branch(x):
    """s0: a = x * 2; fork to s1: b = x.exp() + 1; s0: c = a - 3; join: out = b * c."""
    s0 = torch.neuron.current_stream()
    s1 = torch.neuron.Stream()
    a = x * 2
    s1.wait_stream(s0)
    with torch.neuron.stream(s1):
        b = x.exp() + 1
    c = a - 3
    s0.wait_stream(s1)
    return b * c


def test_side_branch_joined_back_equals_eager_on_one_stream():
    x = torch.randn(64, 33, device="neuron")
    ref_in = torch.randn(64, 33)
    # Eager on one stream, from the same static input.
    x.copy_(ref_in)
    eager = (x.exp() + 1) * (x * 2 - 3)
    g = torch.neuron.NeuronGraph()
    with torch.neuron.graph(g):
        out = _branch(x)
    assert not torch.neuron.is_current_stream_capturing()
    for _ in range(3):  # replays repeat
        x.copy_(ref_in)
        g.replay()
        assert_same(out, eager.cpu())
    # New inputs: the replay follows them as eager does.
    other = torch.randn(64, 33)
    x.copy_(other)
    g.replay()
    x2 = other.to("neuron")
    assert_same(out, ((x2.exp() + 1) * (x2 * 2 - 3)).cpu())


def test_two_branch_diamond():
    x = torch.arange(1, 97, dtype=torch.int64, device="neuron").reshape(8, 12)
    s0 = torch.neuron.Stream()
    left, right = torch.neuron.Stream(), torch.neuron.Stream()

    def diamond(t):
        base = t * 3
        fork = torch.neuron.Event()
        fork.record()
        for s in (left, right):
            s.wait_event(fork)
        with torch.neuron.stream(left):
            lhs = base + 7
        with torch.neuron.stream(right):
            rhs = base.remainder(5) * 2
        torch.neuron.current_stream().wait_stream(left)
        torch.neuron.current_stream().wait_stream(right)
        return lhs * rhs - base

    g = torch.neuron.NeuronGraph()
    with torch.neuron.graph(g, stream=s0):
        out = diamond(x)
    cpu = torch.arange(1, 97, dtype=torch.int64).reshape(8, 12)
    for k in range(3):
        x.copy_(cpu + k)
        g.replay()
        t = cpu + k
        assert_same(out, (t * 3 + 7) * ((t * 3).remainder(5) * 2) - t * 3)
    assert not torch.neuron.is_current_stream_capturing()


def test_unjoined_stream_raises_and_the_device_keeps_working():
    x = torch.randn(32, device="neuron")
    side = torch.neuron.Stream()
    g = torch.neuron.NeuronGraph()
    with pytest.raises(RuntimeError, match="unjoined"):
        with torch.neuron.graph(g):
            side.wait_stream(torch.neuron.current_stream())
            with torch.neuron.stream(side):
                x * 5  # never joined back
    assert not torch.neuron.is_current_stream_capturing()
    with torch.neuron.stream(side):
        assert not torch.neuron.is_current_stream_capturing()
        y = x + 1
    torch.neuron.current_stream().wait_stream(side)
    assert_same(y, x.cpu() + 1)
    with pytest.raises(RuntimeError, match="holds no capture"):
        g.replay()
    with torch.neuron.graph(g):
        z = x * 4
    g.replay()
    assert_same(z, x.cpu() * 4)


def test_waiting_in_capture_for_an_event_from_before_is_an_error():
    x = torch.randn(8, device="neuron")
    other = torch.neuron.Stream()
    with torch.neuron.stream(other):
        ev = torch.neuron.Event()
        ev.record()
    torch.neuron.synchronize()
    g = torch.neuron.NeuronGraph()
    with pytest.raises(RuntimeError, match="recorded outside the capture"):
        with torch.neuron.graph(g):
            y = x * 2
            torch.neuron.current_stream().wait_event(ev)
    assert not torch.neuron.is_current_stream_capturing()
    assert_same(x * 2, x.cpu() * 2)


def test_waiting_after_the_capture_for_an_event_recorded_in_it_is_an_error():
    x = torch.randn(8, device="neuron")
    g = torch.neuron.NeuronGraph()
    with torch.neuron.graph(g):
        y = x * 2
        ev = torch.neuron.current_stream().record_event()
    other = torch.neuron.Stream()
    with pytest.raises(RuntimeError, match="capture that has ended"):
        other.wait_event(ev)
    with torch.neuron.stream(other):
        assert not torch.neuron.is_current_stream_capturing()
    g.replay()
    assert_same(y, x.cpu() * 2)


def test_side_stream_violation_invalidates_the_whole_capture():
    x = torch.randn(8, device="neuron")
    side = torch.neuron.Stream()
    g = torch.neuron.NeuronGraph()
    with pytest.raises(RuntimeError, match="is capturing a graph"):
        with torch.neuron.graph(g):
            side.wait_stream(torch.neuron.current_stream())
            with torch.neuron.stream(side):
                (x + 1).cpu()
    assert not torch.neuron.is_current_stream_capturing()
    with torch.neuron.stream(side):
        assert_same(x + 1, x.cpu() + 1)
