"""neuron-ls and neuron-top: the per-host registry of processes using the
runtime, read by the console scripts, with live processes, a killed one
(stale record) and a terminal session."""
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time

import pytest

WORKER = textwrap.dedent("""
    import os, sys, time, torch
    device, numel, stop = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    x = torch.ones(numel, device=device)
    index = torch.device(device).index
    x.mul_(1.0)  # steady state: the loop below allocates nothing more
    print(os.getpid(), torch.neuron.memory_reserved(index), flush=True)
    while not os.path.exists(stop):
        x.mul_(1.0)  # keeps the core busy without allocating
""")


def _tool(*args):
    out = subprocess.run([sys.executable, "-m", f"neuron_tools.{args[0]}", *args[1:]], capture_output=True,
                         text=True, timeout=60, check=True)
    return out.stdout


@pytest.fixture
def workers(tmp_path):
    stop = tmp_path / "stop"
    procs = [subprocess.Popen([sys.executable, "-c", WORKER, dev, str(n), str(stop)], stdout=subprocess.PIPE,
                              text=True) for dev, n in (("neuron:0", 1 << 20), ("neuron:1", 1 << 16))]
    info = []
    for p in procs:
        pid, reserved = p.stdout.readline().split()
        info.append((p, int(pid), int(reserved)))
    yield info
    stop.touch()
    for p in procs:
        if p.poll() is None:
            p.wait(timeout=60)


def _rows(snap, pid):
    return [r for r in snap["processes"] if r["pid"] == pid]


def test_neuron_ls_lists_each_process_with_its_hbm(workers):
    snap = json.loads(_tool("neuron_ls", "--json"))
    (p0, pid0, res0), (p1, pid1, res1) = workers
    assert [(r["core"], r["device"]) for r in _rows(snap, pid0)] == [(0, "neuron:0")]
    assert [(r["core"], r["device"]) for r in _rows(snap, pid1)] == [(1, "neuron:1")]
    assert _rows(snap, pid0)[0]["hbm_used"] == res0 and _rows(snap, pid1)[0]["hbm_used"] == res1
    cores = {c["core"]: c for c in snap["cores"]}
    assert pid0 in cores[0]["pids"] and pid1 in cores[1]["pids"]
    assert cores[0]["hbm_used"] >= res0 and cores[0]["hbm_total"] == 16 << 30
    table = _tool("neuron_ls")
    assert str(pid0) in table and str(pid1) in table and "HBM USED" in table

    # A killed process leaves its record behind; the tools ignore it.
    p1.send_signal(signal.SIGKILL)
    p1.wait(timeout=30)
    assert os.path.exists(f"/dev/shm/neuron-rt.{pid1}")
    snap = json.loads(_tool("neuron_ls", "--json"))
    assert not _rows(snap, pid1) and _rows(snap, pid0)
    os.unlink(f"/dev/shm/neuron-rt.{pid1}")


def test_record_is_removed_at_exit(workers, tmp_path):
    (p0, pid0, _), _ = workers
    (tmp_path / "stop").touch()
    p0.wait(timeout=60)
    assert p0.returncode == 0
    assert not os.path.exists(f"/dev/shm/neuron-rt.{pid0}")


def test_neuron_top_once_reports_busy_cores(workers):
    snap = json.loads(_tool("neuron_top", "--once", "--json", "--interval", "1"))
    (_, pid0, _), (_, pid1, _) = workers
    busy = {r["pid"]: r["busy_percent"] for r in snap["processes"]}
    assert busy[pid0] > 0 and busy[pid1] > 0
    assert all(0 <= c["busy_percent"] <= 100 for c in snap["cores"])


@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed (scripts/install.sh installs it)")
def test_neuron_top_in_a_terminal(workers):
    (_, pid0, _), _ = workers
    session = f"neuron-top-{os.getpid()}"
    subprocess.run(["tmux", "new-session", "-d", "-s", session, "-x", "120", "-y", "30",
                    f"{sys.executable} -m neuron_tools.neuron_top"], check=True)
    try:
        screen = ""
        deadline = time.time() + 30
        while time.time() < deadline and str(pid0) not in screen:
            time.sleep(0.5)
            screen = subprocess.run(["tmux", "capture-pane", "-p", "-t", session], capture_output=True,
                                    text=True).stdout
        assert "neuron-top" in screen and "HBM USED" in screen and str(pid0) in screen, screen
        subprocess.run(["tmux", "send-keys", "-t", session, "q"], check=True)
        deadline = time.time() + 10
        while time.time() < deadline and subprocess.run(["tmux", "has-session", "-t", session],
                                                         capture_output=True).returncode == 0:
            time.sleep(0.2)
        assert subprocess.run(["tmux", "has-session", "-t", session], capture_output=True).returncode != 0
    finally:
        subprocess.run(["tmux", "kill-session", "-t", session], capture_output=True)
