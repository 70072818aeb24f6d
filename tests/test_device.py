"""torch.neuron device API, torch.accelerator integration, autoload and multi-device basics."""
import pytest
import torch
from conftest import assert_same, run_json, run_python


# ---- availability, device selection -----------------------------------------------------------------------------

def test_is_available_and_device_count():
    assert torch.neuron.is_available() is True
    assert torch.neuron.device_count() == 2
    assert torch.accelerator.device_count() == 2
    assert torch.accelerator.is_available() is True


def test_current_and_set_device():
    assert torch.neuron.current_device() == 0
    torch.neuron.set_device(1)
    assert torch.neuron.current_device() == 1
    assert torch.accelerator.current_device_index() == 1
    assert torch.empty(2, device="neuron").device == torch.device("neuron", 1)
    torch.neuron.set_device("neuron:0")
    assert torch.neuron.current_device() == 0
    torch.neuron.set_device(torch.device("neuron", 1))
    assert torch.neuron.current_device() == 1
    torch.neuron.set_device(0)
    assert torch.empty(2, device="neuron").device == torch.device("neuron", 0)


def test_set_device_rejects_other_device_types():
    with pytest.raises(ValueError, match="neuron device"):
        torch.neuron.set_device("cpu")
    assert torch.neuron.current_device() == 0


def test_device_context_manager_nests_and_restores():
    assert torch.neuron.current_device() == 0
    with torch.neuron.device(1):
        assert torch.neuron.current_device() == 1
        with torch.neuron.device("neuron:0"):
            assert torch.neuron.current_device() == 0
        assert torch.neuron.current_device() == 1
        with torch.neuron.device(None):  # no-op
            assert torch.neuron.current_device() == 1
    assert torch.neuron.current_device() == 0


def test_device_guard_places_new_tensors():
    with torch.neuron.device(1):
        t = torch.empty(1, device="neuron")
        u = torch.ones(3, device="neuron") * 2
    assert t.device == torch.device("neuron", 1)
    assert u.device == torch.device("neuron", 1)
    assert_same(u, torch.full((3,), 2.0))
    # The guard does not override an explicit index.
    with torch.neuron.device(1):
        assert torch.zeros(1, device="neuron:0").device == torch.device("neuron", 0)


def test_device_of():
    x = torch.ones(2, device="neuron:1")
    with torch.neuron.device_of(x):
        assert torch.neuron.current_device() == 1
        assert torch.empty(1, device="neuron").device.index == 1
    assert torch.neuron.current_device() == 0
    with torch.neuron.device_of(torch.ones(2)):  # a CPU tensor changes nothing
        assert torch.neuron.current_device() == 0


def test_torch_device_context_places_factories():
    with torch.device("neuron:1"):
        t = torch.arange(4)
    assert t.device == torch.device("neuron", 1)
    assert_same(t, torch.arange(4))


def test_synchronize_after_work():
    a = torch.arange(12.0, device="neuron").reshape(3, 4)
    b = a @ a.T
    torch.neuron.synchronize()
    torch.neuron.synchronize(1)
    torch.neuron.synchronize("neuron:1")
    torch.accelerator.synchronize()
    ref = torch.arange(12.0).reshape(3, 4)
    assert_same(b, ref @ ref.T)


# ---- properties ----------------------------------------------------------------------------------------------------

def test_device_name_properties_capability():
    props = torch.neuron.get_device_properties(0)
    assert props.name == torch.neuron.get_device_name() == torch.neuron.get_device_name("neuron:1")
    assert "NeuronCore" in props.name
    assert props.total_memory == 16 * 2**30
    assert props.multi_processor_count == 4
    assert torch.neuron.get_device_capability() == (props.major, props.minor) == (3, 0)
    assert torch.neuron.get_device_properties(torch.device("neuron", 1)).physical_core == 1
    assert torch.neuron.get_device_properties(None).physical_core == 0
    assert torch.neuron.mem_get_info(0)[1] == props.total_memory


_DENSE_DTYPES = {
    torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.uint16, torch.uint32,
    torch.uint64, torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.complex32, torch.complex64,
    torch.complex128, torch.float8_e5m2, torch.float8_e4m3fn, torch.float8_e5m2fnuz, torch.float8_e4m3fnuz,
    torch.float8_e8m0fnu,
}


def test_accelerator_device_capability():
    caps = [torch.accelerator.get_device_capability(d) for d in ("neuron:0", "neuron:1", 0, None)]
    assert all(c == caps[0] for c in caps)
    supported = caps[0]["supported_dtypes"]
    assert supported == _DENSE_DTYPES
    # Every supported dtype allocates on the device and converts exactly to
    # every other one, as on the CPU.
    src = torch.tensor([1.0, 2.0, 4.0, 8.0])
    for a in supported:
        x = src.to(a)
        on_dev = x.to("neuron:1")
        assert on_dev.dtype == a
        for b in supported:
            got, want = on_dev.to(b).cpu(), x.to(b)
            assert got.dtype == b and torch.equal(got.view(torch.uint8), want.view(torch.uint8)), (a, b)
    # Dtypes left out really lack neuron storage (quantized) or conversions (bits).
    with pytest.raises((RuntimeError, NotImplementedError)):
        torch.quantize_per_tensor(src, 0.1, 0, torch.qint8).to("neuron")
    with pytest.raises((RuntimeError, NotImplementedError)):
        torch.zeros(4, dtype=torch.uint8).view(torch.bits8).to("neuron").to(torch.float32)


def test_device_capability_rejects_bad_devices_like_torch_neuron():
    for bad in ("neuron:9", 9):
        with pytest.raises(RuntimeError, match="Device index 9 is out of range") as acc:
            torch.accelerator.get_device_capability(bad)
        with pytest.raises(RuntimeError) as mod:
            torch.neuron.get_device_capability(bad)
        assert str(acc.value).splitlines()[0] == str(mod.value).splitlines()[0]


def test_amp_dtypes_and_bf16():
    assert torch.neuron.get_amp_supported_dtype() == [torch.bfloat16, torch.float16]
    assert torch.neuron.is_bf16_supported() is True
    a = torch.randn(4, 8)
    b = torch.randn(8, 3)
    with torch.autocast("neuron", dtype=torch.bfloat16):
        out = a.neuron() @ b.neuron()
    assert out.dtype == torch.bfloat16
    assert_same(out, (a.bfloat16() @ b.bfloat16()), atol=5e-2, rtol=2e-2)


def test_init_and_is_initialized():
    torch.neuron.init()
    assert torch.neuron.is_initialized() is True
    assert torch.neuron._is_in_bad_fork() is False


# ---- torch.accelerator ---------------------------------------------------------------------------------------------

def test_accelerator_reports_neuron():
    assert torch.accelerator.current_accelerator() == torch.device("neuron")
    assert torch._C._get_accelerator() == torch.device("neuron")
    assert torch._C._get_privateuse1_backend_name() == "neuron"
    assert torch.get_device_module("neuron") is torch.neuron
    assert torch.get_device_module() is torch.neuron


def test_accelerator_device_index():
    torch.accelerator.set_device_index(1)
    assert torch.accelerator.current_device_index() == 1
    assert torch.neuron.current_device() == 1
    torch.accelerator.set_device_index(0)
    assert torch.neuron.current_device() == 0
    with torch.accelerator.device_index(1):
        assert torch.neuron.current_device() == 1
        assert torch.empty(1, device="neuron").device.index == 1
    assert torch.accelerator.current_device_index() == 0


# ---- environment variables (read once per process) -----------------------------------------------------------------

def test_num_cores_env():
    out = run_json("""
        import json, torch
        t = torch.arange(3, device="neuron:2") + 1
        print(json.dumps({"count": torch.neuron.device_count(), "acc": torch.accelerator.device_count(),
                          "vals": t.cpu().tolist(), "dev": str(t.device),
                          "phys": [torch.neuron.get_device_properties(i).physical_core for i in range(3)]}))
    """, env={"NEURON_RT_NUM_CORES": "3"})
    assert out == {"count": 3, "acc": 3, "vals": [1, 2, 3], "dev": "neuron:2", "phys": [0, 1, 2]}


def test_visible_cores_env_takes_precedence():
    out = run_json("""
        import json, torch
        try:
            torch.ones(1, device="neuron:3")
            err = None
        except RuntimeError as e:
            err = str(e)
        print(json.dumps({"count": torch.neuron.device_count(),
                          "phys": [torch.neuron.get_device_properties(i).physical_core for i in range(3)],
                          "last": torch.full((2,), 7, device="neuron:2").cpu().tolist(), "err": err}))
    """, env={"NEURON_RT_VISIBLE_CORES": "0,2-3", "NEURON_RT_NUM_CORES": "1"})
    assert out["count"] == 3
    assert out["phys"] == [0, 2, 3]
    assert out["last"] == [7, 7]
    assert "Device index 3 is out of range" in out["err"]


# A malformed variable must not break `import torch`, but every checked entry
# point (is_available, device_count, first device use, Accelerate's device
# discovery) raises a ValueError naming it instead of reporting 0 devices.
_BAD_CONFIG_PROBE = """
    import json, torch
    out = {"imported": True}
    torch.manual_seed(0)  # seeds every device module: must not trip over the bad configuration
    out["cpu"] = torch.arange(4).sum().item()
    def probe(fn):
        try:
            fn()
            return None
        except Exception as e:
            return [type(e).__name__, str(e)]
    out["is_available"] = probe(torch.neuron.is_available)
    out["device_count"] = probe(torch.neuron.device_count)
    out["init"] = probe(torch.neuron.init)
    out["accelerator"] = probe(torch.accelerator.is_available)
    out["first_use"] = probe(lambda: torch.ones(2, device="neuron"))
    out["set_device"] = probe(lambda: torch.neuron.set_device(0))
    print(json.dumps(out))
"""


@pytest.mark.parametrize("var,value", [
    ("NEURON_RT_NUM_CORES", "abc"), ("NEURON_RT_NUM_CORES", "-5"), ("NEURON_RT_NUM_CORES", "0"),
    ("NEURON_RT_NUM_CORES", "3-1"),
    ("NEURON_RT_VISIBLE_CORES", "abc"), ("NEURON_RT_VISIBLE_CORES", "3-1"), ("NEURON_RT_VISIBLE_CORES", "-5"),
    ("NEURON_RT_VISIBLE_CORES", "0,1,1"), ("NEURON_RT_VISIBLE_CORES", "0-2,1"),
    ("NEURON_RT_HBM_BYTES", "lots"), ("NEURON_RT_HBM_BYTES", "-1"), ("NEURON_RT_HBM_BYTES", "10P"),
])
def test_malformed_device_config_raises_naming_the_variable(var, value):
    out = run_json(_BAD_CONFIG_PROBE, env={var: value})
    assert out["imported"] and out["cpu"] == 6  # CPU-only work is unaffected
    for entry in ("is_available", "device_count", "init", "accelerator", "first_use", "set_device"):
        assert out[entry] is not None, f"{entry} accepted {var}={value!r}"
        kind, message = out[entry]
        assert kind == "ValueError", (entry, kind, message)
        assert f"{var}='{value}'" in message and "Accepted:" in message, message


def test_malformed_device_config_stops_accelerate_device_discovery():
    # HF's `check_device=True` probes swallow RuntimeError into "no neuron":
    # the ValueError must reach the user instead of a silent CPU fallback.
    proc = run_python("""
        from accelerate import PartialState
        print(PartialState().device)
    """, env={"NEURON_RT_HBM_BYTES": "lots"}, check=False)
    assert proc.returncode != 0, proc.stdout
    assert "ValueError" in proc.stderr and "NEURON_RT_HBM_BYTES='lots'" in proc.stderr, proc.stderr[-2000:]


@pytest.mark.parametrize("value,expected", [("16GiB", 16 << 30), ("16G", 16 << 30), ("1.5G", 3 << 29),
                                            ("512MiB", 512 << 20), ("1048576", 1 << 20)])
def test_hbm_bytes_accepted_forms(value, expected):
    out = run_json("""
        import json, torch
        print(json.dumps([torch.neuron.get_device_properties(0).total_memory, torch.neuron.mem_get_info(0)[1]]))
    """, env={"NEURON_RT_HBM_BYTES": value})
    assert out == [expected, expected]


# ---- autoload ------------------------------------------------------------------------------------------------------

_MODULES_PROBE = """
    import json, sys, torch
    result = {"modules": sorted(sys.modules)}
    if hasattr(torch, "neuron"):
        result["init_before"] = torch.neuron.is_initialized()
    try:
        result["value"] = (torch.ones(2, device="neuron") * 3).cpu().tolist()
        result["init_after"] = torch.neuron.is_initialized()
    except RuntimeError as e:
        result["error"] = str(e)
    import torch_neuronx
    result["after_import"] = (torch.ones(2, device="neuron") + 1).cpu().tolist()
    print(json.dumps(result))
"""


def test_import_torch_neuronx_before_torch():
    # torch's autoload then meets the partially initialized package.
    out = run_json("""
        import torch_neuronx
        import json, torch
        print(json.dumps({"value": (torch.arange(3, device="neuron") * 2).cpu().tolist(),
                          "ops": len(torch_neuronx.supported_ops())}))
    """)
    assert out["value"] == [0, 2, 4]
    assert out["ops"] > 0


def test_autoload_on_import_torch_and_stays_light():
    on = run_json(_MODULES_PROBE)
    off = run_json(_MODULES_PROBE, env={"TORCH_DEVICE_BACKEND_AUTOLOAD": "0"})
    # `import torch` alone made neuron usable.
    assert on["value"] == [3.0, 3.0]
    assert "torch_neuronx" in on["modules"] and "torch.neuron" in on["modules"]
    # Loading creates no device context; the first device tensor does.
    assert on["init_before"] is False and on["init_after"] is True
    # With autoload disabled the device does not exist until torch_neuronx is imported.
    assert "value" not in off
    assert "neuron" in off["error"]
    assert off["after_import"] == [2.0, 2.0]
    assert "torch_neuronx" not in off["modules"]
    # Autoload adds only torch-neuronx's own modules, none of the heavy torch subsystems.
    # The FlexAttention compatibility step (torch_neuronx/_compile/flex_device_check.py)
    # must be in place before user code imports flex_attention: it imports that
    # module (two modules, ~5 ms, no Dynamo).
    flex = {"torch.nn.attention._utils", "torch.nn.attention.flex_attention"}
    added = set(on["modules"]) - set(off["modules"]) - flex
    # (neuron_tools._units: the one byte formatter, shared with neuron-ls; no imports.)
    ours = ("torch_neuronx", "neuron_tools")
    assert added and all(m == "torch.neuron" or m.split(".")[0] in ours for m in added), added
    assert not {m for m in added if m.startswith("neuron_tools.")} - {"neuron_tools._units"}, added
    for heavy in ("torch._dynamo", "torch._inductor", "torch.distributed.fsdp"):
        assert heavy not in on["modules"]


# ---- generated methods, modules, parameters ------------------------------------------------------------------------

def test_generated_tensor_methods():
    t = torch.arange(5)
    n = t.neuron()
    assert n.is_neuron and not t.is_neuron
    assert n.device == torch.device("neuron", 0)
    assert t.neuron(1).device == torch.device("neuron", 1)
    assert t.neuron("neuron:1").device == torch.device("neuron", 1)
    assert_same(n, t)


def test_generated_module_and_storage_methods():
    m = torch.nn.Linear(3, 2)
    ref = m(torch.ones(1, 3))
    assert m.neuron() is m
    assert m.weight.device.type == "neuron" and m.bias.device.type == "neuron"
    assert_same(m(torch.ones(1, 3, device="neuron")).detach(), ref.detach())
    s = torch.tensor([1.5, -2.0, 3.25]).untyped_storage()
    ns = s.neuron()
    assert ns.is_neuron and not s.is_neuron
    assert ns.device == torch.device("neuron", 0)
    assert bytes(ns.cpu()) == bytes(s)


def test_param_data_assignment():
    p = torch.nn.Parameter(torch.randn(3, 2))
    before = p.detach().clone()
    p.data = p.data.to("neuron")
    assert p.device.type == "neuron" and isinstance(p, torch.nn.Parameter) and p.requires_grad
    assert_same(p.detach(), before)
    (p * 2).sum().backward()
    assert_same(p.grad, torch.full((3, 2), 2.0))


def test_model_to_neuron_forward_backward_matches_cpu():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.GELU(), torch.nn.LayerNorm(5), torch.nn.Linear(5, 2))
    x = torch.randn(4, 6)
    ref = model(x)
    ref.square().sum().backward()
    ref_grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    assert model.to("neuron") is model
    assert all(p.device.type == "neuron" for p in model.parameters())
    out = model(x.to("neuron"))
    out.square().sum().backward()
    assert_same(out.detach(), ref.detach(), atol=1e-5, rtol=1e-5)
    for p, g in zip(model.parameters(), ref_grads):
        assert p.grad.device.type == "neuron"
        assert_same(p.grad, g, atol=1e-5, rtol=1e-5)


# ---- multi-device --------------------------------------------------------------------------------------------------

def test_tensors_on_second_device_compute():
    a = torch.randn(5, 4)
    b = torch.randn(4, 3)
    out = a.to("neuron:1") @ b.to("neuron:1")
    assert out.device == torch.device("neuron", 1)
    assert_same(out, a @ b)
    assert_same(torch.arange(10, device="neuron:1").sum(), torch.tensor(45))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.int64, torch.int8, torch.bool])
def test_copy_between_devices_preserves_values(dtype):
    src_cpu = (torch.arange(24).reshape(4, 6) % 5).to(dtype)
    on0 = src_cpu.to("neuron:0")
    on1 = on0.to("neuron:1")
    assert on1.device == torch.device("neuron", 1) and on1.dtype == dtype
    assert on1.untyped_storage().data_ptr() != on0.untyped_storage().data_ptr()
    assert_same(on1, src_cpu)
    back = on1.to("neuron:0")
    assert back.device.index == 0
    assert_same(back, src_cpu)


def test_noncontiguous_copy_between_devices():
    src = torch.arange(30.0).reshape(5, 6)
    view = src.neuron()[1:, ::2].t()
    assert not view.is_contiguous()
    moved = view.to("neuron:1")
    assert_same(moved, src[1:, ::2].t())
    dst = torch.zeros(3, 4, device="neuron:1")
    dst.copy_(view)
    assert_same(dst, src[1:, ::2].t())
