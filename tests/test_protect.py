"""Protect mode (NEURON_RT_PROTECT=1): device memory is reachable only
through the runtime API (kernel launches and runtime copies). It proves the
seam: a host access that bypasses the runtime faults, while everything that
goes through it (eager ops, copies, .item(), compiled graphs) still works."""
import signal

from conftest import run_json, run_python

PROTECT = {"NEURON_RT_PROTECT": "1"}


def test_operations_through_the_runtime_work():
    out = run_json("""
        import json, torch
        x = torch.randn(8, 8)
        n = x.to("neuron")
        y = (n @ n).relu().sum(0)
        grown = torch.arange(4.0, device="neuron")
        grown.resize_(16)
        f = torch.compile(lambda a: (a * 2).sin() + a.cpu().sum().to(a.device), backend="neuron")
        print(json.dumps({
            "matmul": torch.allclose(y.cpu(), (x @ x).relu().sum(0), atol=1e-5),
            "item": n[2, 3].item() == x[2, 3].item(),
            "resize_keeps_prefix": grown[:4].cpu().tolist() == [0.0, 1.0, 2.0, 3.0],
            "compiled": torch.allclose(f(n).cpu(), (x * 2).sin() + x.sum(), atol=1e-4),
            "printed": "device='neuron:0'" in repr(n),
        }))
    """, env=PROTECT)
    assert out == {"matmul": True, "item": True, "resize_keeps_prefix": True, "compiled": True, "printed": True}


def test_host_access_that_bypasses_the_runtime_faults():
    code = """
        import ctypes, torch
        t = torch.ones(4, device="neuron")
        torch.neuron.synchronize()  # the fill is queued; the read is not a runtime call
        print(ctypes.c_float.from_address(t.data_ptr()).value)
    """
    assert run_python(code, env={"NEURON_RT_PROTECT": None}).stdout.strip() == "1.0"  # host memory after all ...
    proc = run_python(code, env=PROTECT, check=False)
    assert proc.returncode == -signal.SIGSEGV, (proc.returncode, proc.stderr[-2000:])  # ... but not the seam


def test_a_cached_block_is_protected_too():
    # A freed tensor's block stays in the allocator's cache, mapped; reading it
    # is a use after free that protect mode must catch like any bypass.
    code = """
        import ctypes, torch
        t = torch.full((1024,), 3.0, device="neuron")
        torch.neuron.synchronize()
        ptr = t.data_ptr()
        del t
        torch.neuron.synchronize()
        assert torch.neuron.memory_reserved() > 0  # cached, not returned
        for _ in range(3):  # launches in between do not open the cached block
            torch.ones(8, device="neuron").add_(1).sum().item()
        print(ctypes.c_float.from_address(ptr).value)
    """
    assert run_python(code, env={"NEURON_RT_PROTECT": None}).stdout.strip() == "3.0"
    proc = run_python(code, env=PROTECT, check=False)
    assert proc.returncode == -signal.SIGSEGV, (proc.returncode, proc.stderr[-2000:])
