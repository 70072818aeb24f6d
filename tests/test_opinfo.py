"""OpInfo differential tests: CPU reference vs. the ``neuron`` device.

The heavy lifting is done by ``tests/opinfo/runner.py`` (see docs/opinfo.md),
which is run in a subprocess (it spawns its own crash-isolated workers), so a
segfault in the backend cannot take pytest down with it.

* ``test_device_sanity``      the device works at all (fails, never skips,
                              once ``torch_neuronx`` imports).
* ``test_opinfo_fast_subset`` curated ops (runner ``@fast`` list: transformer
                              ops, complex / FFT ops, a few out= ops), the five
                              dtypes (complex64 included), the three call
                              variants (function, out_cpu, conjneg), at most 2
                              samples per group: zero crashes, every out_cpu
                              and conjneg sample passes, pass rate >= 0.98.
* ``test_opinfo_full``        every OpInfo; only with TORCH_NEURONX_FULL_OPINFO=1.

The module is skipped only if ``torch_neuronx`` cannot be imported (set
TORCH_NEURONX_REQUIRE=1 to turn that into an error in CI).

Environment knobs:
  TORCH_NEURONX_FULL_OPINFO=1              enable the full run
  TORCH_NEURONX_FULL_OPINFO_MIN_PASS_RATE  threshold for the full run (0.90)
  TORCH_NEURONX_OPINFO_JOBS                worker processes (default: cpu count)
                                           for both runs
  TORCH_NEURONX_OPINFO_REPORT_DIR          keep JSON/markdown reports here
  TORCH_NEURONX_OPINFO_DEVICE              device under test (default "neuron";
                                           "cpu" is only for testing this file)
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

try:
    import torch_neuronx  # noqa: F401  (registers the `neuron` device)
except ImportError as _e:  # only a missing/unimportable package skips
    if os.environ.get("TORCH_NEURONX_REQUIRE") == "1":
        raise
    pytest.skip("torch_neuronx cannot be imported: %s" % _e, allow_module_level=True)

DEVICE = os.environ.get("TORCH_NEURONX_OPINFO_DEVICE", "neuron")
RUNNER = Path(__file__).resolve().parent / "opinfo" / "runner.py"

FAST_MIN_PASS_RATE = 0.98
FAST_MAX_SAMPLES = 2
# Contract checks without numerical slack: every sample must pass.
STRICT_CALLS = ("out_cpu", "conjneg")
JOBS = os.environ.get("TORCH_NEURONX_OPINFO_JOBS", str(os.cpu_count() or 1))
FULL_MIN_PASS_RATE = float(os.environ.get("TORCH_NEURONX_FULL_OPINFO_MIN_PASS_RATE", "0.90"))


def _report_dir(tmp_path):
    d = os.environ.get("TORCH_NEURONX_OPINFO_REPORT_DIR")
    if d:
        os.makedirs(d, exist_ok=True)
        return Path(d)
    return tmp_path


def _subprocess_env():
    env = dict(os.environ)
    # Make the subprocess import the very same torch_neuronx as this process.
    roots = []
    f = getattr(torch_neuronx, "__file__", None)
    if f:
        f = Path(f).resolve()
        roots.append(str(f.parent.parent if f.name == "__init__.py" else f.parent))
    else:  # namespace package
        roots += [str(Path(p).resolve().parent) for p in getattr(torch_neuronx, "__path__", [])]
    if env.get("PYTHONPATH"):
        roots.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(roots)
    return env


def _run_runner(tmp_path, name, extra_args, timeout):
    out = _report_dir(tmp_path)
    js, md = out / ("opinfo_%s.json" % name), out / ("opinfo_%s.md" % name)
    cmd = [sys.executable, str(RUNNER), "--device", DEVICE,
           "--json", str(js), "--md", str(md)] + list(extra_args)
    proc = subprocess.run(cmd, env=_subprocess_env(), capture_output=True, text=True,
                          timeout=timeout)
    tail = (proc.stdout[-3000:] + "\n" + proc.stderr[-6000:]).strip()
    assert js.exists(), "runner produced no report (exit %d):\n%s" % (proc.returncode, tail)
    report = json.loads(js.read_text())
    assert not report["meta"]["fatal"], "runner could not use device %r: %s\n%s" % (
        DEVICE, report["meta"]["fatal"], tail)
    assert proc.returncode == 0, "runner exited with %d:\n%s" % (proc.returncode, tail)
    return report, md


def _failure_summary(report, limit=40):
    rows = []
    for key, v in sorted(report["per_op"].items()):
        if v["fail"] or v["error"] or v["crash"]:
            rows.append("  %s: fail=%d error=%d crash=%d  %s" % (
                key, v["fail"], v["error"], v["crash"], (v["messages"] or [""])[0][:200]))
    more = "" if len(rows) <= limit else "\n  ... %d more" % (len(rows) - limit)
    return "\n".join(rows[:limit]) + more


def _check(report, md, min_pass_rate, min_evaluated):
    t = report["totals"]
    evaluated = t["pass"] + t["fail"] + t["error"] + t["crash"]
    head = ("samples=%(samples)d pass=%(pass)d fail=%(fail)d error=%(error)d crash=%(crash)d "
            "reference_error=%(reference_error)d skipped=%(skipped)d" % t)
    assert evaluated >= min_evaluated, "too few samples evaluated (%d): %s" % (evaluated, head)
    assert t["crash"] == 0, "crashes on %s (%s; see %s):\n%s" % (
        DEVICE, head, md, _failure_summary(report))
    assert t["pass_rate"] >= min_pass_rate, "pass rate %.4f < %.2f (%s; see %s):\n%s" % (
        t["pass_rate"], min_pass_rate, head, md, _failure_summary(report))


def test_device_sanity():
    """Import worked, so the device must work: this fails rather than skips."""
    dev = torch.device(DEVICE)
    if dev.type == "neuron":
        assert hasattr(torch, "neuron"), "torch.neuron module not registered"
    x = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    y = x.to(dev)
    assert y.device.type == dev.type
    z = y + y
    assert z.device.type == dev.type, "y + y landed on %s" % z.device
    torch.testing.assert_close(z.cpu(), x + x, rtol=0, atol=0)
    assert y.cpu().tolist() == x.tolist()


def _evaluated_by(report, key):
    counts = {}
    for r in report["results"]:
        if r["status"] in ("pass", "fail", "error", "crash"):
            counts[r[key]] = counts.get(r[key], 0) + 1
    return counts


def test_opinfo_fast_subset(tmp_path):
    report, md = _run_runner(
        tmp_path, "fast",
        ["--ops", "@fast", "--max-samples-per-op", str(FAST_MAX_SAMPLES), "--jobs", JOBS],
        timeout=1800)
    # Each class of check must really have run (not skipped away).
    calls, dtypes = _evaluated_by(report, "call"), _evaluated_by(report, "dtype")
    for call in ("function",) + STRICT_CALLS:
        if call == "out_cpu" and torch.device(DEVICE).type == "cpu":
            continue                   # a CPU out= is right for a CPU self-check
        assert calls.get(call, 0) >= 100, "too few %s samples evaluated: %s" % (call, calls)
    assert dtypes.get("complex64", 0) >= 100, "too few complex64 samples evaluated: %s" % dtypes
    fft = sum(1 for r in report["results"] if r["op"].startswith("fft.") and r["status"] != "skipped")
    assert fft >= 40, "too few FFT samples evaluated (%d)" % fft
    _check(report, md, FAST_MIN_PASS_RATE, min_evaluated=1000)
    strict = [r for r in report["results"]
              if r["call"] in STRICT_CALLS and r["status"] in ("fail", "error")]
    assert not strict, "%d out_cpu/conjneg samples failed (see %s):\n%s" % (
        len(strict), md, "\n".join("  %s(%s) %s #%d: %s" % (r["op"], r["call"], r["dtype"],
                                                            r["sample_idx"], r.get("msg", "")[:200])
                                   for r in strict[:20]))


@pytest.mark.skipif(os.environ.get("TORCH_NEURONX_FULL_OPINFO") != "1",
                    reason="full OpInfo run: set TORCH_NEURONX_FULL_OPINFO=1")
def test_opinfo_full(tmp_path):
    report, md = _run_runner(tmp_path, "full", ["--jobs", JOBS], timeout=8 * 3600)
    _check(report, md, FULL_MIN_PASS_RATE, min_evaluated=10000)
