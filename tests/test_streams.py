"""Streams and events: torch.neuron.Stream/Event, torch.Stream/torch.Event, torch.accelerator streams."""
import pytest
import torch

from conftest import assert_same


def _work(n=128, reps=4, device="neuron"):
    a = torch.randn(n, n, device=device)
    for _ in range(reps):
        a = torch.tanh(a @ a / n)
    return a


def test_stream_priority():
    high = torch.neuron.Stream(priority=-1)
    normal = torch.neuron.Stream()
    assert isinstance(high, torch.Stream) and isinstance(high, torch.neuron.Stream)
    assert high.priority == -1
    assert normal.priority == 0
    assert torch.neuron.default_stream().priority == 0
    assert high.device == normal.device == torch.device("neuron", 0)
    assert high != normal and high != torch.neuron.default_stream()
    wrapped = torch.neuron.Stream._wrap(torch.Stream(device="neuron:0", priority=-1))
    assert wrapped.priority == -1


def test_stream_on_explicit_device():
    s = torch.neuron.Stream(device=1)
    assert s.device == torch.device("neuron", 1) and s.device_index == 1
    assert torch.neuron.Stream(device="neuron:1").device_index == 1


def test_current_and_default_stream():
    default = torch.neuron.default_stream()
    assert torch.neuron.current_stream() == default
    assert default.stream_id == 0 and default.device == torch.device("neuron", 0)
    assert torch.neuron.default_stream(1).device == torch.device("neuron", 1)
    assert torch.accelerator.current_stream() == default
    assert isinstance(torch.neuron.current_stream(), torch.neuron.Stream)


def test_set_stream():
    s = torch.neuron.Stream()
    torch.neuron.set_stream(s)
    assert torch.neuron.current_stream() == s
    assert torch.accelerator.current_stream("neuron:0") == s
    torch.neuron.set_stream(None)  # no-op
    assert torch.neuron.current_stream() == s
    torch.neuron.set_stream(torch.neuron.default_stream())
    assert torch.neuron.current_stream() == torch.neuron.default_stream()


def test_stream_context_runs_work_and_restores():
    s = torch.neuron.Stream()
    x = torch.arange(6.0)
    with torch.neuron.stream(s) as entered:
        assert entered is s
        assert torch.neuron.current_stream() == s
        y = x.neuron() * 3
        with torch.neuron.stream(None):  # no-op
            assert torch.neuron.current_stream() == s
    assert torch.neuron.current_stream() == torch.neuron.default_stream()
    s.synchronize()
    assert_same(y, x * 3)


def test_stream_context_on_other_device_restores_current_device():
    s1 = torch.neuron.Stream(device=1)
    assert torch.neuron.current_device() == 0
    with torch.neuron.stream(s1):
        assert torch.neuron.current_stream(1) == s1
        z = torch.ones(2, device="neuron:1") + 1
    s1.synchronize()  # z was computed on s1: order it before the default stream's read
    assert torch.neuron.current_device() == 0
    assert torch.neuron.current_stream(1) == torch.neuron.default_stream(1)
    assert torch.neuron.current_stream(0) == torch.neuron.default_stream(0)
    assert_same(z, torch.full((2,), 2.0))


def test_torch_stream_as_context_manager():
    s = torch.Stream(device="neuron:0")
    with s:
        assert torch.accelerator.current_stream() == s
        out = torch.arange(4, device="neuron") * 2
    assert torch.accelerator.current_stream() == torch.neuron.default_stream()
    torch.neuron.default_stream().wait_stream(s)  # as on CUDA: order the read after s
    assert_same(out, torch.arange(4) * 2)


def test_torch_stream_without_index_uses_current_device():
    s = torch.Stream(device="neuron")
    assert s.device == torch.device("neuron", 0)
    with torch.neuron.device(1):
        assert torch.Stream(device="neuron").device_index == 1


def test_torch_stream_and_event_record_query_synchronize():
    s = torch.Stream(device="neuron:0")
    e = torch.Event(device="neuron")
    assert e.query() is True  # never recorded
    with s:
        out = _work()
    e.record(s)
    assert e.device == torch.device("neuron", 0)
    e.synchronize()
    assert e.query() is True
    assert s.query() is True
    s.synchronize()
    assert torch.isfinite(out).all().item()


def test_record_event_and_wait_event():
    producer = torch.neuron.Stream()
    consumer = torch.neuron.Stream()
    x = torch.arange(8.0)
    with torch.neuron.stream(producer):
        y = x.neuron() + 1
    ev = producer.record_event()
    assert isinstance(ev, torch.Event)
    ev.synchronize()
    assert ev.query()
    consumer.wait_event(ev)
    with torch.neuron.stream(consumer):
        z = y * 2
    own = torch.neuron.Event()
    assert isinstance(own, torch.neuron.Event)
    assert producer.record_event(own) is own
    own.wait(consumer)
    consumer.synchronize()
    assert_same(z, (x + 1) * 2)


def test_wait_stream():
    a = torch.neuron.Stream()
    b = torch.neuron.Stream(priority=-1)
    with torch.neuron.stream(a):
        t = torch.arange(5, device="neuron") * 7
    b.wait_stream(a)
    with torch.neuron.stream(b):
        u = t + 1
    torch.neuron.synchronize()
    assert_same(u, torch.arange(5) * 7 + 1)


def test_event_elapsed_time_neuron_event():
    start = torch.neuron.Event(enable_timing=True)
    end = torch.neuron.Event(enable_timing=True)
    start.record()
    out = _work(256, 6)
    end.record()
    end.synchronize()
    ms = start.elapsed_time(end)
    assert isinstance(ms, float) and ms > 0
    assert torch.isfinite(out).all().item()


def test_event_elapsed_time_torch_event_on_stream():
    s = torch.Stream(device="neuron:0")
    start = torch.Event(device="neuron", enable_timing=True)
    end = torch.Event(device="neuron", enable_timing=True)
    start.record(s)
    with s:
        _work(256, 6)
    end.record(s)
    end.synchronize()
    assert start.elapsed_time(end) > 0
    assert end.elapsed_time(start) < 0


def test_elapsed_time_without_timing_raises():
    a = torch.neuron.Event()
    b = torch.neuron.Event()
    a.record()
    _work(32, 1)
    b.record()
    with pytest.raises((RuntimeError, ValueError), match="enable_timing"):
        a.elapsed_time(b)
    timed = torch.neuron.Event(enable_timing=True)
    timed.record()
    with pytest.raises((RuntimeError, ValueError), match="enable_timing"):
        timed.elapsed_time(b)


def test_elapsed_time_before_record_raises():
    a = torch.neuron.Event(enable_timing=True)
    b = torch.neuron.Event(enable_timing=True)
    a.record()
    with pytest.raises((RuntimeError, ValueError), match="recorded"):
        a.elapsed_time(b)


def test_events_on_second_device():
    s = torch.neuron.Stream(device=1)
    start = torch.neuron.Event(enable_timing=True, device=1)
    end = torch.neuron.Event(enable_timing=True, device=1)
    start.record(s)
    with torch.neuron.stream(s):
        out = _work(128, 4, device="neuron:1")
    end.record(s)
    torch.neuron.synchronize(1)
    assert start.elapsed_time(end) > 0
    assert end.device == torch.device("neuron", 1)
    assert out.device == torch.device("neuron", 1)
