"""Runs the device-generic modules (tests/device_generic/, PyTorch's
common_device_type framework, neuron variant) each in a child pytest, so a
backend segfault or hang cannot take this session down or hide the other
tests: when a child dies, the test it was running (known from the progress
file written by hooks in tests/conftest.py) is recorded as crashed and
the child is restarted on the tests that have not run yet, until all have.
One pytest test per module; it fails on any failed, erroring or crashed test
and names them.
"""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DG_DIR = ROOT / "tests" / "device_generic"
MODULES = sorted(p.name for p in DG_DIR.glob("test_*.py"))
CHILD_TIMEOUT = 900        # seconds for one child run (a hang counts as a crash)
SUMMARY_RE = re.compile(r"^(FAILED|ERROR) (\S+)(?: - (.*))?$")


def _child(args, progress, timeout=CHILD_TIMEOUT):
    """One child pytest on ``args``. Returns (returncode or 'timeout', output)."""
    env = dict(os.environ, TORCH_NEURONX_DG_CHILD="1", TORCH_NEURONX_DG_PROGRESS=str(progress),
               PYTHONUNBUFFERED="1")
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rfE",
           "--tb=line", *args]
    try:
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True,
                              timeout=timeout)
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
        return "timeout", out
    return proc.returncode, proc.stdout + proc.stderr


def _collect(module, tmp_path):
    rc, out = _child(["--collect-only", "tests/device_generic/" + module],
                     tmp_path / "collect.progress", timeout=300)
    ids = [ln.strip() for ln in out.splitlines() if "::" in ln and not ln.startswith(" ")]
    assert rc == 0 and ids, "collecting %s failed (rc %s):\n%s" % (module, rc, out[-3000:])
    return ids


def _read_progress(path):
    """(finished: nodeid -> outcome, started: nodeids in order)."""
    finished, started = {}, []
    if path.exists():
        for line in path.read_text().splitlines():
            parts = line.split(" ")
            if parts[0] == "start":
                started.append(parts[1])
            elif len(parts) == 3:
                when, outcome, nodeid = parts
                # a failed setup/teardown is an error even if the call passed
                if outcome != "passed" or nodeid not in finished:
                    finished[nodeid] = outcome if when == "call" or outcome == "skipped" else "error"
    return finished, started


def run_module(module, tmp_path):
    """Runs every test of ``module`` despite crashes. Returns (ids, finished,
    crashed: nodeid -> why, messages: nodeid -> failure line, notes)."""
    ids = _collect(module, tmp_path)
    finished, crashed, messages, notes = {}, {}, {}, []
    outputs = []
    pending = ["tests/device_generic/" + module]
    for attempt in range(len(ids) + 1):
        progress = tmp_path / ("run%d.progress" % attempt)
        rc, out = _child(pending, progress)
        done, started = _read_progress(progress)
        finished.update(done)
        outputs.append(out)
        for line in out.splitlines():
            m = SUMMARY_RE.match(line.strip())
            if m:
                messages[m.group(2)] = (m.group(3) or "")[:300]
        if rc in (0, 1):
            break
        inflight = [t for t in started if t not in done]
        why = "hung (> %ds)" % CHILD_TIMEOUT if rc == "timeout" else (
            "killed by signal %d" % -rc if isinstance(rc, int) and rc < 0 else "child exit code %s" % rc)
        if inflight:
            crashed[inflight[-1]] = why
        left = [t for t in ids if t not in finished and t not in crashed]
        if not inflight:
            # died outside any test (collection, import, interpreter exit)
            notes.append("child %s outside a test; output tail:\n%s" % (why, out[-1500:]))
            if not left:
                break
            if pending == left:      # no progress at all: give up rather than loop
                crashed.update({t: "not run: " + why for t in left})
                break
        if not left:
            break
        pending = left
    return ids, finished, crashed, messages, notes, outputs


@pytest.mark.parametrize("module", MODULES)
def test_device_generic_module(module, tmp_path):
    ids, finished, crashed, messages, notes, outputs = run_module(module, tmp_path)
    bad = {t: o for t, o in finished.items() if o in ("failed", "error")}
    missing = [t for t in ids if t not in finished and t not in crashed]
    lines = ["%s: %d tests, %d passed, %d skipped, %d failed, %d crashed"
             % (module, len(ids), sum(o == "passed" for o in finished.values()),
                sum(o == "skipped" for o in finished.values()), len(bad), len(crashed))]
    lines += ["  CRASH %s (%s)" % (t, why) for t, why in crashed.items()]
    lines += ["  %s %s %s" % (o.upper(), t, messages.get(t, "")) for t, o in bad.items()]
    lines += ["  NOT RUN %s" % t for t in missing]
    lines += ["  " + n for n in notes]
    if bad:  # the failure lines (--tb=line) of the child runs
        lines += ["", "child output (tails):"] + [o[-4000:] for o in outputs if "FAILED" in o]
    assert not (bad or crashed or missing or notes), "\n".join(lines)
