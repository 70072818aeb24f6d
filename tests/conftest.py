"""Shared helpers for the neuron device tests."""
import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch


def assert_same(neuron_out, cpu_out, **tol):
    """``neuron_out`` lives on a neuron device and equals the CPU reference:
    exactly for integer and bool dtypes, within ``tol`` (assert_close's
    defaults unless given) for floating point."""
    assert neuron_out.device.type == "neuron", neuron_out.device
    assert cpu_out.device.type == "cpu", cpu_out.device
    torch.testing.assert_close(neuron_out.cpu(), cpu_out, **tol)


def assert_cache_released(device=None):
    """What ``empty_cache`` leaves: no segment without a live block. Reserved
    bytes beyond the allocated ones are then only the free blocks of slabs
    that still hold a live one (docs/runtime.md, "Device memory")."""
    index = torch.neuron.current_device() if device is None else torch.device("neuron", device).index
    segments = [s for s in torch.neuron.memory_snapshot() if s["device"] == index]
    assert all(s["allocated_size"] > 0 for s in segments), [s for s in segments if not s["allocated_size"]]
    assert torch.neuron.memory_reserved(index) == sum(s["total_size"] for s in segments)
    assert torch.neuron.memory_allocated(index) == sum(s["allocated_size"] for s in segments)


def tiny_llama(**config):
    """A 2-layer Llama with grouped key/value heads (4 query, 2 key/value), seeded, in
    eval mode, on the CPU: the tests' small Transformers decoder."""
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(**{
        "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "vocab_size": 128, "max_position_embeddings": 256, **config})
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(cfg).eval()


def _child_env(env):
    """This process's environment without the device configuration (children
    read their own), plus ``env`` (a value of None removes the variable)."""
    full_env = dict(os.environ)
    for key in ("NEURON_RT_NUM_CORES", "NEURON_RT_VISIBLE_CORES", "NEURON_RT_HBM_BYTES",
                "TORCH_NEURONX_DISABLE_FALLBACK", "TORCH_DEVICE_BACKEND_AUTOLOAD", "TORCH_NEURONX_RNG"):
        full_env.pop(key, None)
    for key, value in (env or {}).items():
        if value is None:
            full_env.pop(key, None)
        else:
            full_env[key] = value
    return full_env


def run_python(code, env=None, check=True):
    """Runs ``code`` in a fresh interpreter (device configuration is read once
    per process). ``env`` entries are added to the environment; a value of
    None removes the variable. Returns the CompletedProcess."""
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=_child_env(env), capture_output=True,
                          text=True, timeout=300)
    if check:
        assert proc.returncode == 0, f"subprocess failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
    return proc


def run_json(code, env=None):
    """Runs ``code``, which must print one JSON document as its last stdout line, and returns it decoded."""
    proc = run_python(code, env=env)
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(autouse=True)
def _restore_device_state():
    """Tests may switch the current device or stream; put both back."""
    yield
    torch.neuron.set_device(0)
    for i in range(torch.neuron.device_count()):
        torch.accelerator.set_stream(torch.neuron.default_stream(i))
    torch.neuron.set_device(0)


@pytest.fixture
def philox_rng():
    """Neuron random ops draw from the Philox stream (rng mode "philox") during the test."""
    previous = torch.neuron.get_rng_mode()
    torch.neuron.set_rng_mode("philox")
    yield
    torch.neuron.set_rng_mode(previous)


def run_python_timeout(code, timeout, env=None):
    """Runs ``code`` like ``run_python(check=False)`` (same environment
    clean-up) but with its own ``timeout`` in seconds. Returns the
    CompletedProcess, or None if the child hung and was killed."""
    try:
        return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=_child_env(env),
                              capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return None


# -- device-generic modules (tests/device_generic/) ---------------------------
# ``pytest tests/`` does not collect those modules in-process: one segfault in
# the backend would end the whole session. tests/test_device_generic.py runs
# each of them in a child pytest instead (and works around crashes). Naming a
# module or the directory on the command line runs it here. In such a child,
# TORCH_NEURONX_DG_PROGRESS names a file that gets one flushed line per test
# start / finish, so the parent knows which test was running when it died.
# (These hooks live here, not in a tests/device_generic/conftest.py: a second
# module named ``conftest`` would shadow this one for ``from conftest import``.)
_DG_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "device_generic")


def _dg_named_explicitly(config):
    root = str(config.invocation_params.dir)
    for arg in config.args:
        p = os.path.realpath(os.path.join(root, arg.split("::")[0]))
        if p == _DG_DIR or p.startswith(_DG_DIR + os.sep):
            return True
    return False


def pytest_ignore_collect(collection_path, config):
    if os.path.dirname(str(collection_path)) != _DG_DIR:
        return None
    if os.environ.get("TORCH_NEURONX_DG_CHILD") == "1" or _dg_named_explicitly(config):
        return None
    if collection_path.suffix == ".py" and collection_path.name.startswith("test_"):
        return True
    return None


def _dg_progress(line):
    path = os.environ.get("TORCH_NEURONX_DG_PROGRESS")
    if path:
        with open(path, "a") as f:
            f.write(line + "\n")
            f.flush()


def pytest_runtest_logstart(nodeid, location):
    _dg_progress("start " + nodeid)


def pytest_runtest_logreport(report):
    if report.when == "call" or report.outcome != "passed":
        _dg_progress("%s %s %s" % (report.when, report.outcome, report.nodeid))
