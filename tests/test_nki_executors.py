"""nki without a dependency cycle (nki/_device.py): `import nki` loads no
device extension, NumPy/CPU kernels run on the interpreter alone, and a
device's executor is found through the ``nki.executors`` entry point."""
import ast
import pathlib
import subprocess
import sys
import textwrap

import pytest
import torch

import nki
from nki import _device

ROOT = pathlib.Path(__file__).resolve().parent.parent


def test_nki_imports_no_torch_neuronx():
    """No module of the nki package imports torch_neuronx (at any level)."""
    offenders = []
    for path in sorted((ROOT / "nki").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            offenders += [f"{path.name}:{node.lineno} {n}" for n in names if n.split(".")[0] == "torch_neuronx"]
    assert not offenders, offenders


SIMULATE = textwrap.dedent("""
    import sys
    import numpy as np
    sys.path.insert(0, sys.argv[1])
    import nki
    from nki_kernels import tensor_add
    a = np.arange(128 * 512, dtype=np.float32).reshape(128, 512)
    b = np.ones_like(a)
    np.testing.assert_array_equal(nki.simulate(tensor_add)(a, b), a + b)
    np.testing.assert_array_equal(tensor_add(a, b), a + b)
    import torch
    ta, tb = torch.from_numpy(a), torch.from_numpy(b)
    assert torch.equal(tensor_add(ta, tb), ta + tb)
    loaded = sorted(m for m in sys.modules if m.startswith("torch_neuronx"))
    assert not loaded, loaded
    # A device tensor loads its backend's executor (the entry point).
    import torch_neuronx
    x = ta.to("neuron")
    assert torch.equal(tensor_add(x, tb.to("neuron")).cpu(), ta + tb)
    print("ok")
""")


def test_simulate_and_cpu_kernels_without_the_extension():
    env = {"TORCH_DEVICE_BACKEND_AUTOLOAD": "0", "PATH": "/usr/bin:/bin"}
    env.update({k: v for k, v in __import__("os").environ.items() if k in ("PYTHONPATH", "HOME")})
    out = subprocess.run([sys.executable, "-c", SIMULATE, str(ROOT / "tests")], capture_output=True, text=True,
                         timeout=300, env=env)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


def test_neuron_executor_comes_from_the_entry_point():
    from torch_neuronx._nki.executor import NeuronExecutor
    ex = _device.executor("neuron")
    assert isinstance(ex, NeuronExecutor) and _device.native_executor() is ex


def test_device_without_executor_is_an_nki_error():
    with pytest.raises(nki.NKIError, match="no NKI executor is registered for device 'meta-like'"):
        _device.executor("meta-like")


def test_registered_executor_runs_the_interpreter(monkeypatch):
    """A backend without native programs gets the interpreter inside its own
    launch: the executor interface is all nki needs of a device."""
    from nki_kernels import tensor_add
    from torch_neuronx._nki.executor import NeuronExecutor

    class Interpreting:  # neuron's launch and aliases, no native programs
        def __init__(self):
            self.inner, self.launches = NeuronExecutor(), 0

        def current_device(self):
            return self.inner.current_device()

        def host_alias(self, t):
            return self.inner.host_alias(t)

        def launch(self, index, fn, name):
            self.launches += 1
            return self.inner.launch(index, fn, name)

    ex = Interpreting()
    monkeypatch.setitem(_device._executors, "neuron", ex)
    a = torch.randn(128, 512)
    b = torch.randn(128, 512)
    got = tensor_add(a.to("neuron"), b.to("neuron"))
    assert ex.launches == 1 and torch.equal(got.cpu(), a + b)
