"""The device kernel table and the counted host fallback for ops outside it."""
import warnings

import pytest
import torch
import torch.nn.functional as F
import torch_neuronx

from conftest import assert_same, run_json

# aten::channel_shuffle and aten::_compute_linear_combination have CPU kernels but are outside the
# route table (csrc/aten/Routes.cpp), so on neuron they run through the fallback.
FALLBACK_OP = "channel_shuffle"


def _fallback_warnings(fn):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = fn()
    return result, [w for w in caught if "has no neuron kernel" in str(w.message)]


def test_supported_ops_table():
    ops = torch_neuronx.supported_ops()
    assert isinstance(ops, tuple) and len(ops) > 500
    assert list(ops) == sorted(ops) and len(set(ops)) == len(ops)
    for op in ("add.Tensor", "add_.Tensor", "add.out", "mm", "mm.out", "_fused_adamw_", "native_dropout",
               "bernoulli_.float", "index.Tensor"):
        assert op in ops, op
    assert not any(op.startswith("aten::") for op in ops)
    for outside in ("channel_shuffle", "_compute_linear_combination", "empty.memory_format", "view"):
        assert outside not in ops, outside


def test_table_ops_do_not_use_fallback():
    torch_neuronx.reset_fallback_report()
    a = torch.randn(4, 5)
    b = torch.randn(5, 3)
    out, warned = _fallback_warnings(lambda: (a.neuron() @ b.neuron()).relu().sum(0))
    assert_same(out, (a @ b).relu().sum(0))
    assert warned == []
    assert torch_neuronx.fallback_report() == {}


def test_fallback_counts_warns_once_and_matches_cpu():
    x = torch.randn(2, 6, 3, 3)
    torch_neuronx.reset_fallback_report()
    assert torch_neuronx.fallback_report() == {}
    first, warned = _fallback_warnings(lambda: F.channel_shuffle(x.neuron(), 3))
    assert len(warned) == 1
    assert FALLBACK_OP in str(warned[0].message) and "fallback_report" in str(warned[0].message)
    assert torch_neuronx.fallback_report() == {FALLBACK_OP: 1}
    assert first.device == torch.device("neuron", 0)
    assert_same(first, F.channel_shuffle(x, 3), rtol=0, atol=0)
    second, warned = _fallback_warnings(lambda: torch.channel_shuffle(x.neuron(), 2))
    assert warned == []  # warns once per op
    assert torch_neuronx.fallback_report() == {FALLBACK_OP: 2}
    assert_same(second, torch.channel_shuffle(x, 2), rtol=0, atol=0)
    # The report is a copy.
    report = torch_neuronx.fallback_report()
    report.clear()
    assert torch_neuronx.fallback_report() == {FALLBACK_OP: 2}
    # Resetting clears the counts, and the next use warns again.
    torch_neuronx.reset_fallback_report()
    assert torch_neuronx.fallback_report() == {}
    _, warned = _fallback_warnings(lambda: F.channel_shuffle(x.neuron(), 3))
    assert len(warned) == 1


def test_fallback_on_second_device_and_integers():
    x = torch.arange(2 * 4 * 2 * 2).reshape(2, 4, 2, 2)
    torch_neuronx.reset_fallback_report()
    out, _ = _fallback_warnings(lambda: F.channel_shuffle(x.to("neuron:1"), 2))
    assert out.device == torch.device("neuron", 1)
    assert_same(out, F.channel_shuffle(x, 2))
    assert torch_neuronx.fallback_report() == {FALLBACK_OP: 1}


def test_second_fallback_op_matches_cpu():
    coeffs = torch.randn(2, 3)
    xs = torch.randn(3, 4)
    torch_neuronx.reset_fallback_report()
    out, warned = _fallback_warnings(lambda: torch._compute_linear_combination(xs.neuron(), coeffs.neuron()))
    assert len(warned) == 1
    assert torch_neuronx.fallback_report() == {"_compute_linear_combination": 1}
    assert_same(out, torch._compute_linear_combination(xs, coeffs))


def test_fallback_op_in_autograd():
    x = torch.randn(2, 6, 2, 2)
    w = torch.arange(6.0).view(1, 6, 1, 1)
    xc = x.clone().requires_grad_()
    (F.channel_shuffle(xc, 3) * w).sum().backward()
    xn = x.neuron().requires_grad_()
    torch_neuronx.reset_fallback_report()
    _, _ = _fallback_warnings(lambda: (F.channel_shuffle(xn, 3) * w.neuron()).sum().backward())
    assert xn.grad.device.type == "neuron"
    assert_same(xn.grad, xc.grad, rtol=0, atol=0)
    assert torch_neuronx.fallback_report()[FALLBACK_OP] >= 2  # forward and backward


def test_fallback_mixing_devices_still_raises():
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        _fallback_warnings(lambda: torch._compute_linear_combination(torch.ones(3, 4, device="neuron"),
                                                                     torch.ones(2, 3)))


def test_disable_fallback_env():
    out = run_json("""
        import json, torch, torch_neuronx
        import torch.nn.functional as F
        res = {}
        try:
            F.channel_shuffle(torch.ones(1, 4, 2, 2, device="neuron"), 2)
        except NotImplementedError as e:
            res["error"] = str(e)
        res["report"] = torch_neuronx.fallback_report()
        # Ops in the kernel table still run.
        res["table_op"] = (torch.arange(4, device="neuron") * 3).cpu().tolist()
        # The CPU op is unaffected.
        res["cpu_op"] = F.channel_shuffle(torch.arange(4.0).view(1, 4, 1, 1), 2).flatten().tolist()
        print(json.dumps(res))
    """, env={"TORCH_NEURONX_DISABLE_FALLBACK": "1"})
    assert "channel_shuffle" in out["error"]
    assert "TORCH_NEURONX_DISABLE_FALLBACK=1" in out["error"]
    assert out["report"] == {}
    assert out["table_op"] == [0, 3, 6, 9]
    assert out["cpu_op"] == [0.0, 2.0, 1.0, 3.0]


def test_ops_doc_is_generated_from_the_live_registry():
    # docs/ops.md must match tools/gen_op_table.py's output for this build.
    import pathlib
    import subprocess
    import sys

    tool = pathlib.Path(__file__).resolve().parents[1] / "tools" / "gen_op_table.py"
    proc = subprocess.run([sys.executable, str(tool), "--check"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def _route_rows():
    return {row[0]: tuple(row[1:]) for row in torch_neuronx._C._route_table()}


def test_route_table_is_what_the_dispatcher_runs():
    # The route table (csrc/aten/Routes.cpp) registers every overload it lists;
    # overloads of its ops that it does not list have a dedicated kernel.
    from torch_neuronx import _op_support

    rows = _route_rows()
    supported = set(torch_neuronx.supported_ops())
    sources = _op_support.kernel_sources()
    assert set(rows) <= supported and len(rows) > 500
    assert {n for n in rows if sources[n] != "csrc/aten/Routes.cpp"} == set()
    assert {n for n in supported - set(rows) if sources[n] == "csrc/aten/Routes.cpp"} == set()
    assert "histc" in supported and "histc" not in rows  # AcceleratorSemantics.cpp's kernel
    # (direct, queued, checks_data, random)
    assert rows["add.Tensor"] == (True, True, False, False)
    assert rows["add.out"] == (False, True, False, False)  # queued as the out= overload itself
    assert rows["index.Tensor"] == (True, False, False, False)
    assert rows["index_select"] == (False, True, True, False)
    assert rows["bernoulli_.float"] == (False, False, False, True)
    assert rows["native_dropout"][3] is True and rows["native_dropout"][1] is False
    assert rows["mm"] == (False, True, False, False) and rows["nonzero"] == (False, False, False, False)


@pytest.mark.skipif(__import__("os").environ.get("NEURON_RT_LAUNCH_BLOCKING") == "1",
                    reason="launches are synchronous in this mode")
def test_queued_flag_is_what_the_async_path_does():
    # Behind queued work, an overload the table marks queued is queued (the
    # call does not wait for the stream); any other waits for it (a stall).
    rows = _route_rows()
    a = torch.randn(512, 512, device="neuron") / 512
    index = torch.arange(4, device="neuron")
    cases = {
        "mm": lambda: torch.mm(a, a),
        "add.Tensor": lambda: a + a,
        "index_select": lambda: a.index_select(0, index),
        "cumprod": lambda: torch.cumprod(a, 0),
        "sort.stable": lambda: torch.sort(a, dim=0, stable=True),
    }
    for name, call in cases.items():
        torch.neuron.synchronize()
        busy = a
        for _ in range(6):
            busy = torch.mm(busy, busy)
        stalls = torch_neuronx._C._launch_counts(0)[1]
        call()
        waited = torch_neuronx._C._launch_counts(0)[1] - stalls
        assert (waited == 0) == rows[name][1], (name, waited)
    torch.neuron.synchronize()


def test_ops_doc_route_table_equals_the_table():
    # docs/ops.md's route table lists exactly the live table, op by op.
    import pathlib
    import re

    text = (pathlib.Path(__file__).resolve().parents[1] / "docs" / "ops.md").read_text()
    section = text.split("\n## Route table\n", 1)[1].split("\n## ", 1)[0]
    doc = {}
    for line in section.splitlines():
        if not line.startswith("| `"):
            continue
        op, overloads, direct, queued, random = (c.strip() for c in line.strip().strip("|").split("|"))
        names = lambda cell: set(re.findall(r"`([^`]+)`", cell))
        doc[op.strip("`")] = (names(overloads), names(direct), names(queued), random == "yes")
    want = {}
    for name, (direct, queued, _, random) in _route_rows().items():
        base = name.split(".")[0]
        if base.endswith("_") and not base.endswith("__"):
            base = base[:-1]
        entry = want.setdefault(base, (set(), set(), set(), False))
        entry[0].add(name)
        if direct:
            entry[1].add(name)
        if queued:
            entry[2].add(name)
        want[base] = entry[:3] + (entry[3] or random,)
    assert doc == want
