"""Memory debugging: allocator history and snapshots in the format of CUDA's,
rendered by PyTorch's own torch.cuda._memory_viz; per-process memory
fraction; raw caching-allocator memory."""
import base64
import json
import pickle
import re
import subprocess
import sys

import pytest
import torch
from torch.cuda import _memory_viz


def _allocate_weights():
    return torch.randn(512, 512, device="neuron")


@pytest.fixture
def history():
    torch.neuron.memory._record_memory_history(max_entries=10000)
    yield
    torch.neuron.memory._record_memory_history(enabled=None)


def _embedded_snapshot(html):
    payload = json.loads(re.search(r"(\[\{\"name\": \"snapshot.pickle\".*?\}\])", html).group(1))
    return pickle.loads(base64.b64decode(payload[0]["base64"]).rstrip(b"\x00"))


def test_snapshot_has_live_blocks_with_python_stacks(history):
    weights = _allocate_weights()
    scratch = torch.ones(100, device="neuron") * 2
    del scratch
    # Queued kernels hold their operands until they have run (docs/runtime.md).
    torch.neuron.synchronize()
    snap = torch.neuron.memory._snapshot()
    ours = [s for s in snap["segments"] if s["address"] == weights.untyped_storage().data_ptr()]
    assert len(ours) == 1
    seg = ours[0]
    assert seg["device"] == 0 and seg["total_size"] >= weights.nbytes
    block = seg["blocks"][0]
    assert block["state"] == "active_allocated" and block["requested_size"] == weights.nbytes
    assert [f["name"] for f in block["frames"]][:1] == ["_allocate_weights"]
    assert block["frames"][0]["filename"] == __file__
    # Segment totals agree with the allocator's statistics.
    active = sum(s["active_size"] for s in snap["segments"] if s["device"] == 0)
    assert active == torch.neuron.memory_allocated(0)
    actions = [e["action"] for e in snap["device_traces"][0]]
    assert {"alloc", "free_requested", "free_completed"} <= set(actions)


def test_pytorch_memory_viz_renders_our_snapshot(history, tmp_path):
    weights = _allocate_weights()
    path = tmp_path / "snap.pickle"
    torch.neuron.memory._dump_snapshot(str(path))
    with open(path, "rb") as f:
        data = pickle.load(f)
    # The HTML tools embed the snapshot they were given; the text tools parse it.
    for plot in (_memory_viz.trace_plot, _memory_viz.segment_plot):
        embedded = _embedded_snapshot(plot(data))
        assert [s["address"] for s in embedded["segments"]] == [s["address"] for s in data["segments"]]
    summary = _memory_viz.segsum(data)
    assert f"segments: {len(data['segments'])}" in summary
    # The command-line entry point, as a user runs it.
    out = tmp_path / "trace.html"
    subprocess.run([sys.executable, "-m", "torch.cuda._memory_viz", "trace_plot", str(path), "-o", str(out)],
                   check=True, timeout=120)
    assert weights.untyped_storage().data_ptr() in [s["address"] for s in _embedded_snapshot(out.read_text())["segments"]]
    assert torch.neuron.memory_snapshot() == torch.neuron.memory._snapshot()["segments"]


def test_oom_message_names_the_snapshot_api():
    torch.neuron.set_per_process_memory_fraction(0.0001, 1)
    try:
        with pytest.raises(torch.OutOfMemoryError, match=r"_record_memory_history\(\).*_dump_snapshot"):
            torch.empty(1 << 24, device="neuron:1")
        torch.ones(16, device="neuron:1")  # small allocations still fit
    finally:
        torch.neuron.set_per_process_memory_fraction(1.0, 1)
    torch.empty(1 << 24, device="neuron:1")
    with pytest.raises(RuntimeError, match=r"memory fraction must be in \[0, 1\]"):
        torch.neuron.set_per_process_memory_fraction(1.5, 0)


def test_raw_caching_allocator_memory():
    before = torch.neuron.memory_allocated(0)
    ptr = torch.neuron.caching_allocator_alloc(4096, 0)
    assert torch.neuron.memory_allocated(0) == before + 4096
    torch.neuron.caching_allocator_delete(ptr)
    assert torch.neuron.memory_allocated(0) == before
    with pytest.raises(RuntimeError, match="was not allocated by the neuron caching allocator"):
        torch.neuron.caching_allocator_delete(12345)


def test_arch_list():
    assert torch.neuron.get_arch_list() == [f"neuroncore-v{torch.neuron.get_device_capability()[0]}"]


GC_DURING_SNAPSHOT = r"""
import gc, torch
torch.neuron.memory._record_memory_history(enabled="all", context="all")
gc.set_threshold(1)  # a collection at (almost) every allocation of a Python object
for _ in range(20):
    cycle = [torch.ones(256, device="neuron")]
    cycle.append(cycle)  # freed only by the collector, possibly inside _snapshot()
    del cycle
    snap = torch.neuron.memory._snapshot()
    assert snap["segments"] and snap["device_traces"]
print("ok")
"""


def test_snapshot_while_the_collector_frees_neuron_tensors():
    """Building the snapshot's Python objects can run the garbage collector,
    whose frees of neuron tensors are recorded into the history: the snapshot
    must not hold the history's lock then (it deadlocked)."""
    out = subprocess.run([sys.executable, "-c", GC_DURING_SNAPSHOT], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr
