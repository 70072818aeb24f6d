"""The profiler sees the device: torch.profiler (Kineto) records each neuron
kernel and copy on its stream with its device time, linked to the CPU op that
launched it; the chrome trace has one row per stream; memory events cover
device memory; the legacy profiler accepts use_device="neuron"."""
import json
import warnings

import torch
from torch.profiler import ProfilerActivity, profile


def _work(x):
    y = (x @ x).relu()
    return y.sum().cpu()


def test_key_averages_have_device_time():
    x = torch.randn(64, 64, device="neuron")
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]) as prof:
        _work(x)
    # The CPU op's row (its kernel, named after it, has a row of its own).
    events = {e.key: e for e in prof.key_averages() if e.cpu_time_total > 0}
    for op in ("aten::mm", "aten::relu", "aten::sum"):
        assert events[op].device_time_total > 0, op
        assert events[op].self_device_time_total > 0, op
    assert events["aten::mm"].count == 1
    table = prof.key_averages().table(sort_by="device_time_total")
    assert "NEURON total" in table and "aten::mm" in table


def test_chrome_trace_has_kernel_spans_per_stream(tmp_path):
    x = torch.randn(32, 32, device="neuron")
    side = torch.neuron.Stream()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]) as prof:
        _work(x)
        with torch.neuron.stream(side):
            torch.mm(x, x)
        f = torch.compile(lambda a: (a * 2).sin(), backend="neuron")
        f(x)
    path = tmp_path / "trace.json"
    prof.export_chrome_trace(str(path))
    events = json.loads(path.read_text())["traceEvents"]
    kernels = [e for e in events if e.get("cat") == "kernel"]
    copies = [e for e in events if e.get("cat") == "gpu_memcpy"]
    names = {e["name"] for e in kernels}
    assert {"aten::mm", "aten::relu", "aten::sum"} <= names
    assert any(n.startswith("cpp_fused") for n in names)  # compiled kernels launch under their Inductor names
    assert [c["name"] for c in copies] == ["Memcpy DtoH"]
    assert all(e["dur"] > 0 for e in kernels)
    # One row (tid) per stream, on the device's row group (pid = device index).
    assert {(e["pid"], e["tid"]) for e in kernels if e["name"] == "aten::mm"} == {(0, 0), (0, side.stream_id)}
    # Each span links to the CPU op that launched it (a flow arrow with the same correlation).
    cpu_ids = {e["args"]["External id"] for e in events if e.get("cat") == "cpu_op" and "External id" in e.get("args", {})}
    assert all(e["args"]["External id"] in cpu_ids for e in kernels if not e["name"].startswith("compiled"))
    flows = [e for e in events if e.get("cat") == "ac2g"]
    assert len(flows) >= len(kernels)
    # Spans lie within the profiled window of the CPU ops.
    cpu = [e for e in events if e.get("cat") == "cpu_op"]
    assert min(e["ts"] for e in cpu) <= min(e["ts"] for e in kernels)
    assert max(e["ts"] + e["dur"] for e in kernels) <= max(e["ts"] + e["dur"] for e in cpu) + 1000


def test_profile_memory_sees_device_memory():
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1], profile_memory=True) as prof:
        x = torch.ones(1 << 16, device="neuron")
        del x
    rows = {e.key: e for e in prof.key_averages()}
    assert rows["aten::empty"].device_memory_usage == (1 << 16) * 4  # the allocation, on the device
    assert rows["aten::empty"].cpu_memory_usage == 0
    assert rows["[memory]"].device_memory_usage == -(1 << 16) * 4  # and its free


def test_legacy_profiler_use_device_neuron():
    x = torch.randn(32, 32, device="neuron")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "PrivateUse1 used in profiler but not enabled"
        with torch.autograd.profiler.profile(use_device="neuron") as prof:
            _work(x)
    mm = [e for e in prof.function_events if e.name == "aten::mm"]
    assert mm and all(e.cpu_time_total >= 0 for e in prof.function_events)
    assert mm[0].device_time_total >= 0
