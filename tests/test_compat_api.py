"""The vendor TorchNeuron's public Python API and environment variables, as
code written for it uses them (docs/compat.md)."""
import os

import pytest
import torch
import torch.nn.functional as F

import torch_neuronx
from torch_neuronx import _op_support

from conftest import assert_same, run_json, run_python

MIRRORED = [
    "device_count", "current_device", "set_device", "synchronize", "Stream", "Event", "StreamContext", "stream",
    "current_stream", "default_stream", "set_stream", "device", "get_device_properties", "empty_cache",
    "memory_stats", "memory_summary", "memory_allocated", "memory_reserved", "max_memory_allocated",
    "max_memory_reserved", "reset_peak_memory_stats", "reset_accumulated_memory_stats",
]


@pytest.mark.parametrize("name", MIRRORED)
def test_module_level_api_is_torch_neuron(name):
    assert getattr(torch_neuronx, name) is getattr(torch.neuron, name)


def test_module_level_device_calls():
    assert torch_neuronx.device_count() == torch.neuron.device_count() == 2
    torch_neuronx.set_device(1)
    assert torch_neuronx.current_device() == 1
    x = torch.arange(6, device="neuron").reshape(2, 3)
    assert x.device == torch.device("neuron", 1)
    with torch_neuronx.stream(torch_neuronx.Stream()):
        y = x * 3
    torch_neuronx.synchronize()
    assert_same(y, torch.arange(6).reshape(2, 3) * 3)
    assert torch_neuronx.current_stream() == torch_neuronx.default_stream()
    props = torch_neuronx.get_device_properties(0)
    assert props.name and props.total_memory == torch.neuron.mem_get_info(0)[1]
    assert torch_neuronx.is_neuron_runtime_initialized()
    with pytest.raises(RuntimeError, match="Device index 2 is out of range. Valid range is 0 to 1 for this process"):
        torch_neuronx.set_device(2)


def test_memory_stats_carry_both_key_sets():
    torch.neuron.synchronize()
    torch_neuronx.reset_peak_memory_stats()
    before = torch_neuronx.memory_stats()
    block = torch.empty(1 << 20, dtype=torch.uint8, device="neuron")
    stats = torch_neuronx.memory_stats()
    for kind in ("allocated_bytes", "reserved_bytes", "active_bytes"):
        assert stats[kind] == {f: stats[f"{kind}.all.{f}"] for f in ("current", "peak", "allocated", "freed")}
    assert stats["allocated_bytes"]["current"] == before["allocated_bytes"]["current"] + (1 << 20)
    assert stats["allocated_bytes"]["current"] == torch_neuronx.memory_allocated()
    assert stats["reserved_bytes"]["current"] == torch_neuronx.memory_reserved()
    assert stats["allocation_requests"] == before["allocation_requests"] + 1
    del block
    after = torch_neuronx.memory_stats()
    assert after["num_tensor_frees"] == stats["num_tensor_frees"] + 1
    assert after["num_ooms"] == stats["num_ooms"]
    # torch.accelerator keeps PyTorch's keys only.
    assert "allocation_requests" not in torch.accelerator.memory_stats(0)


# ---- the op record -------------------------------------------------------------------------------------------------

def test_executed_and_fallback_ops():
    torch_neuronx.clear_op_tracking()
    assert torch_neuronx.get_executed_ops() == [] and torch_neuronx.get_fallback_ops() == []
    x = torch.randn(4, 6)
    w = torch.randn(5, 6)
    out = F.linear(x.neuron(), w.neuron()).relu() + 1
    assert_same(out, F.linear(x, w).relu() + 1)
    executed = torch_neuronx.get_executed_ops()
    assert executed == sorted(set(executed))
    assert "aten::relu" in executed and "aten::add" in executed and "aten::_copy_from" in executed
    assert {"aten::mm", "aten::addmm"} & set(executed)
    assert torch_neuronx.get_fallback_ops() == []

    shuffled = F.channel_shuffle(torch.arange(8.0).view(1, 4, 1, 2).neuron(), 2)
    assert_same(shuffled, F.channel_shuffle(torch.arange(8.0).view(1, 4, 1, 2), 2))
    assert torch_neuronx.get_fallback_ops() == ["aten::channel_shuffle"]
    assert "aten::channel_shuffle" not in torch_neuronx.get_executed_ops()
    # fallback_report() is a view of the same record, with counts.
    F.channel_shuffle(torch.ones(1, 4, 1, 1, device="neuron"), 2)
    assert torch_neuronx.fallback_report() == {"channel_shuffle": 2}

    torch_neuronx.clear_op_tracking()
    assert torch_neuronx.get_executed_ops() == [] and torch_neuronx.get_fallback_ops() == []
    assert torch_neuronx.fallback_report() == {}
    # A thread's cache of noted ops is dropped by the clear: the op is noted again.
    (torch.ones(3, device="neuron") * 2).relu()
    assert "aten::relu" in torch_neuronx.get_executed_ops()


def test_dedicated_kernels_are_noted():
    torch_neuronx.clear_op_tracking()
    conv = torch.nn.Conv2d(2, 3, 3)
    x = torch.randn(1, 2, 5, 5)
    assert_same(conv.to("neuron")(x.neuron()), conv.cpu()(x), atol=1e-5, rtol=1e-5)
    assert "aten::convolution_overrideable" in torch_neuronx.get_executed_ops()
    assert torch_neuronx.get_fallback_ops() == []


def test_executed_ops_from_other_threads():
    import threading

    torch_neuronx.clear_op_tracking()
    t = threading.Thread(target=lambda: torch.ones(2, device="neuron").exp_())
    t.start()
    t.join()
    assert "aten::exp_" in torch_neuronx.get_executed_ops()


def test_utils_log_ops_add_to_the_record():
    torch_neuronx.clear_op_tracking()
    torch_neuronx.utils.log_executed_op("nki_my_kernel")
    torch_neuronx.utils.log_offloaded_op("aten::foo")
    torch_neuronx.utils.log_offloaded_op("aten::foo")
    assert torch_neuronx.get_executed_ops() == ["nki_my_kernel"]
    assert torch_neuronx.get_fallback_ops() == ["aten::foo"]
    assert torch_neuronx.fallback_report() == {"foo": 2}
    torch_neuronx.clear_op_tracking()


# ---- torch_neuronx.utils -------------------------------------------------------------------------------------------

def test_utils_queries():
    u = torch_neuronx.utils
    assert u.use_mlir_aten_ops() is False and u.is_stablehlo_enabled() is False
    assert u.is_sync_mode_enabled() == (os.environ.get("NEURON_RT_LAUNCH_BLOCKING") == "1")
    assert u.get_platform_target() == "trn2"  # NeuronCore-v3, the default device model
    assert u.get_logical_neuron_cores() == "1"
    ops = u.get_neuron_registered_ops()
    assert {"add", "mm", "relu", "convolution_overrideable"} <= ops and "channel_shuffle" not in ops
    variants = u.get_neuron_registered_ops(as_sorted=True, keep_variant=True)
    assert variants == sorted(variants) and "add.Tensor" in variants
    for name in variants:
        assert torch._C._dispatch_has_kernel_for_dispatch_key(f"aten::{name}", "PrivateUse1"), name


def test_utils_pytree_helpers():
    u = torch_neuronx.utils
    tree = {"a": torch.ones(2), "b": [torch.zeros(1, dtype=torch.int64), 3], "c": (torch.arange(3),)}
    on_device = u.move_pytree_to_neuron(tree)
    assert on_device["b"][1] == 3
    assert u.get_device_from_tensors(on_device) == torch.device("neuron", 0)
    assert [t.device.type for t in u.flatten_tensors(on_device)] == ["neuron"] * 3
    back = u.move_pytree_to_cpu(on_device)
    for got, want in zip(u.flatten_tensors(back), u.flatten_tensors(tree)):
        assert torch.equal(got, want)
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with u.suppress_specific_warnings([r"noisy \d+"]):
            warnings.warn("noisy 42")
            warnings.warn("kept")
    assert [str(w.message) for w in caught] == ["kept"]


# ---- environment variables ----------------------------------------------------------------------------------------

_BLOCKING_PROBE = """
import json, torch, torch_neuronx
x = torch.arange(4.0, device="neuron") * 2
print(json.dumps({"sync": torch_neuronx.utils.is_sync_mode_enabled(), "x": x.cpu().tolist()}))
"""


@pytest.mark.parametrize("env,sync", [
    ({"NEURON_LAUNCH_BLOCKING": "1"}, True),
    ({"NEURON_LAUNCH_BLOCKING": "0"}, False),
    ({"NEURON_RT_LAUNCH_BLOCKING": "0", "NEURON_LAUNCH_BLOCKING": "1"}, False),  # ours wins
    ({"NEURON_RT_LAUNCH_BLOCKING": "1", "NEURON_LAUNCH_BLOCKING": "0"}, True),
])
def test_product_launch_blocking_alias(env, sync):
    out = run_json(_BLOCKING_PROBE, env={"NEURON_RT_LAUNCH_BLOCKING": None, **env})
    assert out == {"sync": sync, "x": [0.0, 2.0, 4.0, 6.0]}


@pytest.mark.parametrize("name,value", [
    ("NEURON_LAUNCH_BLOCKING", "yes"),
    ("TORCH_NEURONX_DISABLE_FALLBACK_EXECUTION", "maybe"),
    ("TORCH_NEURONX_FALLBACK_ONLY_FOR_UNIMPLEMENTED_OPS", "2"),
    ("TORCH_NEURONX_DISABLE_NEFF_CACHE", "sometimes"),
])
def test_malformed_product_variables_raise_value_error(name, value):
    out = run_json("""
        import json, torch
        cpu = torch.ones(2).sum().item()  # import and CPU work are unaffected
        errors = []
        for probe in (torch.neuron.is_available, lambda: torch.ones(1, device="neuron")):
            try:
                probe()
                errors.append(None)
            except ValueError as e:
                errors.append(str(e))
        print(json.dumps({"cpu": cpu, "errors": errors}))
    """, env={name: value, "NEURON_RT_LAUNCH_BLOCKING": None})
    assert out["cpu"] == 2.0
    for err in out["errors"]:
        assert err and name in err and repr(value) in err, out


def test_fallback_only_for_unimplemented_ops_keeps_kernels_and_fallback():
    # Both values: kernels run, ops without one still take the counted fallback.
    for value in ("0", "1"):
        out = run_json("""
            import json, torch, torch_neuronx
            import torch.nn.functional as F
            y = F.channel_shuffle(torch.arange(8.0, device="neuron").view(1, 4, 1, 2), 2)
            print(json.dumps({"y": y.cpu().flatten().tolist(), "fallback": torch_neuronx.get_fallback_ops()}))
        """, env={"TORCH_NEURONX_FALLBACK_ONLY_FOR_UNIMPLEMENTED_OPS": value})
        expected = F.channel_shuffle(torch.arange(8.0).view(1, 4, 1, 2), 2).flatten().tolist()
        assert out == {"y": expected, "fallback": ["aten::channel_shuffle"]}


_FAILING_COMPILE = """
import json, os, torch, torch_neuronx

def f(x):
    return torch.sin(x) * 2 + 1

x = torch.linspace(-1, 1, 8, device="neuron")
# An Inductor option that does not exist makes the neuron graph fail to compile.
compiled = torch.compile(f, backend="neuron", options={OPTIONS})
try:
    y = compiled(x)
    result = {"y": y.cpu().tolist(), "eager": f(x).cpu().tolist()}
except Exception as e:
    result = {"error": type(e).__name__ + ": " + str(e)}
print(json.dumps(result))
"""


@pytest.mark.parametrize("env,options,falls_back", [
    ({}, '"no_such_inductor_option": 1', False),
    ({"TORCH_NEURONX_DISABLE_FALLBACK_EXECUTION": "1"}, '"no_such_inductor_option": 1', False),
    ({"TORCH_NEURONX_DISABLE_FALLBACK_EXECUTION": "0"}, '"no_such_inductor_option": 1', True),
    # The compile option overrides the variable, both ways.
    ({"TORCH_NEURONX_DISABLE_FALLBACK_EXECUTION": "0"}, '"no_such_inductor_option": 1, "fallback_execution": False',
     False),
    ({}, '"no_such_inductor_option": 1, "fallback_execution": True', True),
])
def test_disable_fallback_execution(env, options, falls_back):
    out = run_json(_FAILING_COMPILE.replace("{OPTIONS}", "{" + options + "}"), env=env)
    if falls_back:
        assert out["y"] == out["eager"], out
    else:
        assert "no_such_inductor_option" in out["error"], out


@pytest.mark.parametrize("target", ["trn1", "trn2", "trn3"])
def test_platform_target_follows_the_runtime(target):
    out = run_json("""
        import json, torch, torch_neuronx
        print(json.dumps([torch_neuronx.utils.get_platform_target(), torch.neuron.get_device_name(0)]))
    """, env={"NEURON_RT_TARGET": target})
    generation = {"trn1": "NeuronCore-v2", "trn2": "NeuronCore-v3", "trn3": "NeuronCore-v4"}[target]
    assert out[0] == target and out[1].startswith(generation), out


def test_debug_dir_and_neff_cache_dir(tmp_path):
    debug, cache = tmp_path / "debug", tmp_path / "cache"
    out = run_json("""
        import json, os, torch, torch_neuronx
        f = torch.compile(lambda x: torch.cos(x) + x, backend="neuron")
        x = torch.linspace(0, 1, 16, device="neuron")
        y = f(x)
        print(json.dumps({"ok": torch.allclose(y.cpu(), torch.cos(x.cpu()) + x.cpu()),
                          "cache": os.environ.get("TORCHINDUCTOR_CACHE_DIR")}))
    """, env={"TORCH_NEURONX_DEBUG_DIR": str(debug), "TORCH_NEURONX_NEFF_CACHE_DIR": str(cache),
              "TORCHINDUCTOR_CACHE_DIR": None})
    assert out["ok"]
    assert out["cache"] == str(cache) and any(cache.iterdir())
    written = {p.name for p in debug.rglob("*") if p.is_file()}
    assert "output_code.py" in written and any(name.startswith("fx_graph") for name in written), written


def test_reset_dynamo_metrics():
    assert torch.neuron.reset_dynamo_metrics is torch_neuronx.reset_dynamo_metrics
    torch._dynamo.reset()
    torch_neuronx.reset_dynamo_metrics()
    f = torch.compile(lambda x: x * 3 - 1, backend="neuron")
    x = torch.arange(5.0, device="neuron")
    assert_same(f(x), torch.arange(5.0) * 3 - 1)
    assert torch_neuronx.get_dynamo_metrics()["frames_total"] == 1
    torch_neuronx.reset_dynamo_metrics()
    assert torch_neuronx.get_dynamo_metrics() == {"frames_total": 0, "frames_ok": 0, "recompiles": 0,
                                                 "graph_breaks": 0, "unique_graphs": 0}


# ---- the op compatibility table -------------------------------------------------------------------------------------

def test_compatibility_table_follows_the_registrations():
    rows = {op: (status, note) for op, status, note in _op_support.compatibility()}
    assert rows["aten::add"][0] == "Y" and "neuron kernel" in rows["aten::add"][1]
    assert rows["aten::matmul"] == ("Y", "composite")
    assert rows["aten::channel_shuffle"] == ("CPU_FALLBACK", "`channel_shuffle`")
    assert rows["aten::cudnn_convolution"][0] == "N"
    assert rows["aten::quantize_per_tensor"][0] == "N" and rows["aten::quantize_per_tensor"][1].startswith("quantized")
    # Every CPU_FALLBACK row names overloads that really take the fallback.
    torch_neuronx.clear_op_tracking()
    for op, (status, note) in rows.items():
        if status == "CPU_FALLBACK":
            for overload in note.replace("`", "").split(", "):
                assert _op_support.route(f"aten::{overload}") == _op_support.FALLBACK
                assert not torch._C._dispatch_has_kernel_for_dispatch_key(f"aten::{overload}", "PrivateUse1")
