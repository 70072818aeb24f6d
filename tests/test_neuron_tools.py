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


def _tool(*args, env=None, check=True):
    out = subprocess.run([sys.executable, "-m", f"neuron_tools.{args[0]}", *args[1:]], capture_output=True,
                         text=True, timeout=60, check=check, env=env)
    return out.stdout if check else out


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


def test_a_stale_record_whose_pid_was_reused_is_ignored(workers, tmp_path):
    """A killed process's record stays in /dev/shm; when a later process gets its pid,
    the record is still not that process's (it was written before that process started)."""
    from neuron_tools import _registry
    (_, pid0, _), _ = workers
    with open(f"/dev/shm/neuron-rt.{pid0}", "rb") as f:
        record = bytearray(f.read(_registry.LAYOUT["record_size"]))
    offset, size = _registry.LAYOUT["header"]["start_unix_ns"]
    prefix = str(tmp_path / "neuron-rt.")
    assert _registry.processes(prefix) == []
    (tmp_path / f"neuron-rt.{pid0}").write_bytes(record)  # the live worker's own record
    assert [p.pid for p in _registry.processes(prefix)] == [pid0]
    # The same record as if written by an earlier process of that pid, 10 minutes before.
    start = int.from_bytes(record[offset:offset + size], "little")
    record[offset:offset + size] = (start - 600 * 10**9).to_bytes(size, "little")
    (tmp_path / f"neuron-rt.{pid0}").write_bytes(record)
    assert _registry.processes(prefix) == []


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


PROPERTIES = textwrap.dedent("""
    import json, torch
    props = [torch.neuron.get_device_properties(i) for i in range(torch.neuron.device_count())]
    print(json.dumps([(p.name, p.total_memory) for p in props]))
""")


@pytest.mark.parametrize("config", [{"NEURON_RT_TARGET": "trn3"}, {"NEURON_RT_TARGET": "trn2"},
                                    {"NEURON_RT_VISIBLE_CORES": "1,3-4", "NEURON_RT_HBM_BYTES": "3G"}])
def test_idle_cores_are_what_the_runtime_resolves(config):
    """With no process running, neuron-ls shows the cores a process started in
    the same environment gets: the runtime's resolution, not a re-parse."""
    env = {**os.environ, **config}
    runtime = json.loads(subprocess.run([sys.executable, "-c", PROPERTIES], env=env, capture_output=True, text=True,
                                        timeout=120, check=True).stdout)
    # Processes of other jobs on this host may add their cores: compare this environment's.
    cores = [c for c in json.loads(_tool("neuron_ls", "--json", env=env))["cores"] if c["configured"]]
    assert [(c["name"], c["hbm_total"]) for c in cores] == [tuple(r) for r in runtime]
    if "NEURON_RT_VISIBLE_CORES" in config:
        assert [c["core"] for c in cores] == [1, 3, 4]


def test_a_process_shows_its_own_configuration(tmp_path):
    """A process started with NEURON_RT_TARGET shows its target's cores even
    to tools running in a default environment (from its registry record)."""
    stop = tmp_path / "stop"
    env = {**os.environ, "NEURON_RT_TARGET": "trn3", "NEURON_RT_VISIBLE_CORES": "5"}
    p = subprocess.Popen([sys.executable, "-c", WORKER, "neuron:0", str(1 << 16), str(stop)], stdout=subprocess.PIPE,
                         text=True, env=env)
    try:
        pid, reserved = map(int, p.stdout.readline().split())
        default_env = {k: v for k, v in os.environ.items() if not k.startswith("NEURON_RT_")}
        snap = json.loads(_tool("neuron_ls", "--json", env=default_env))
        core5 = [c for c in snap["cores"] if c["core"] == 5]
        assert len(core5) == 1 and core5[0]["name"].startswith("NeuronCore-v4 (trn3") and not core5[0]["configured"]
        assert core5[0]["hbm_total"] == 18 << 30 and pid in core5[0]["pids"]
        assert [(r["core"], r["hbm_used"]) for r in _rows(snap, pid)] == [(5, reserved)]
    finally:
        stop.touch()
        p.wait(timeout=60)


@pytest.mark.parametrize("variable,value", [("NEURON_RT_TARGET", "trn9"), ("NEURON_RT_NUM_CORES", "abc"),
                                            ("NEURON_RT_HBM_BYTES", "lots")])
def test_malformed_configuration_is_named(variable, value):
    out = _tool("neuron_ls", env={**os.environ, variable: value}, check=False)
    assert out.returncode != 0 and variable in out.stderr, out.stderr


def test_registry_layout_is_the_runtimes():
    from neuron_tools import _rtinfo
    layout = _rtinfo.registry_layout()
    spans = sorted(layout["header"].values())
    assert all(a + n <= b for (a, n), (b, _) in zip(spans, spans[1:])), "header fields overlap"
    assert spans[-1][0] + spans[-1][1] <= layout["devices_offset"]
    assert layout["record_size"] == layout["devices_offset"] + layout["max_devices"] * layout["device_size"]


def test_one_byte_formatter():
    from neuron_tools._units import format_bytes
    assert [format_bytes(n) for n in (0, 1023, 1536, 5 << 20, 3 << 40, 5000 << 40)] == [
        "0 B", "1023 B", "1.5 KiB", "5.0 MiB", "3.0 TiB", "5000.0 TiB"]
    assert format_bytes(16 << 30, digits=2) == "16.00 GiB"
