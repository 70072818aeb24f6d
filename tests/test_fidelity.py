"""Trainium fidelity mode: NEURON_RT_TARGET selects a device model,
NEURON_RT_STRICT=1 refuses what the target cannot run. Each case runs in a
fresh interpreter (the runtime reads its configuration once)."""
import pytest

from conftest import run_json, run_python

GiB = 1 << 30


@pytest.mark.parametrize("target, cores, hbm, major", [("trn1", 2, 16, 2), ("trn2", 4, 24, 3), ("trn3", 8, 18, 4)])
def test_target_selects_the_device_model(target, cores, hbm, major):
    out = run_json("""
        import json, torch
        p = torch.neuron.get_device_properties(0)
        big = True
        try:
            torch.empty(p.total_memory // 4 + 1, device="neuron")  # one element past the budget
        except torch.OutOfMemoryError:
            big = False
        print(json.dumps({"count": torch.neuron.device_count(), "name": p.name, "total": p.total_memory,
                          "cap": list(torch.neuron.get_device_capability(0)), "fits": big,
                          "double": torch.ones(1, device="neuron").double().dtype == torch.float64}))
    """, env={"NEURON_RT_TARGET": target})
    assert out["count"] == cores and out["total"] == hbm * GiB
    assert out["name"].startswith(f"NeuronCore-v{major} ({target}")
    assert out["cap"] == [major, 0] and not out["fits"]
    assert out["double"]  # not strict: float64 still runs on the host runtime


def test_explicit_variables_win_over_the_target():
    out = run_json("""
        import json, torch
        print(json.dumps([torch.neuron.device_count(), torch.neuron.get_device_properties(0).total_memory]))
    """, env={"NEURON_RT_TARGET": "trn2", "NEURON_RT_NUM_CORES": "2", "NEURON_RT_HBM_BYTES": "1G"})
    assert out == [2, GiB]


def test_strict_refuses_what_trainium_lacks():
    out = run_json("""
        import json, torch
        def err(f):
            try:
                f()
                return None
            except Exception as e:
                return [type(e).__name__, str(e)]
        x = torch.ones(4, device="neuron")
        i = torch.arange(4, device="neuron")
        print(json.dumps({
            "factory_f64": err(lambda: torch.zeros(2, dtype=torch.float64, device="neuron")),
            "to_f64": err(lambda: torch.ones(2, dtype=torch.float64).to("neuron")),
            "complex": err(lambda: torch.randn(2, dtype=torch.complex64).to("neuron")),
            "op_result_f64": err(lambda: x.sum(dtype=torch.float64)),
            "int64_wraps": err(lambda: i * (2 ** 40)),
            "int64_ok": err(lambda: (i * 3 + 1).cpu().tolist()),
            "f32_ok": err(lambda: (x @ x).item()),
            "bf16_ok": err(lambda: x.bfloat16().sum().item()),
            "cap_f64": torch.float64 in torch.accelerator.get_device_capability("neuron:0")["supported_dtypes"],
            "cap_i64": torch.int64 in torch.accelerator.get_device_capability("neuron:0")["supported_dtypes"],
        }))
    """, env={"NEURON_RT_STRICT": "1"})
    for key in ("factory_f64", "to_f64", "complex", "op_result_f64"):
        assert out[key][0] == "TypeError" and "NEURON_RT_STRICT=1, target trn2" in out[key][1], key
        assert "Trainium does not have" in out[key][1]
    assert "aten::sum" in out["op_result_f64"][1] and "Double" in out["op_result_f64"][1]
    assert out["int64_wraps"][0] == "RuntimeError" and "aten::mul" in out["int64_wraps"][1]
    assert "int32 range" in out["int64_wraps"][1]
    assert out["int64_ok"] is None and out["f32_ok"] is None and out["bf16_ok"] is None
    assert out["cap_f64"] is False and out["cap_i64"] is True


@pytest.mark.parametrize("name, value", [("NEURON_RT_TARGET", "trn9"), ("NEURON_RT_STRICT", "yes")])
def test_malformed_fidelity_variables_are_reported(name, value):
    proc = run_python("import torch; torch.neuron.device_count()", env={name: value}, check=False)
    assert proc.returncode != 0
    assert f"{name}='{value}' is invalid" in proc.stderr and "ValueError" in proc.stderr


def test_strict_accepts_what_models_do_with_integers():
    # MoE routing counts expert ids with an integer histc (widened to double
    # inside the kernel, never as a device tensor); repeat() builds its
    # result through an unfold view of memory it has yet to fill.
    out = run_json("""
        import json, torch
        ids = torch.tensor([0, 1, 1, 3, 3, 3, 7], device="neuron")
        counts = torch.histc(ids, bins=8, min=0, max=7)
        pos = torch.arange(6, device="neuron").unsqueeze(-1).repeat(1, 1, 4)
        print(json.dumps({"counts": counts.cpu().tolist(), "dtype": str(counts.dtype),
                          "repeat": pos.cpu().tolist() == torch.arange(6).unsqueeze(-1).repeat(1, 1, 4).tolist()}))
    """, env={"NEURON_RT_STRICT": "1"})
    assert out == {"counts": [1, 2, 0, 3, 0, 0, 0, 1], "dtype": "torch.int64", "repeat": True}
