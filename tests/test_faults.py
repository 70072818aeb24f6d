"""Process-level faults, each provoked in child processes with a timeout so a
crash or a hang fails the test instead of taking pytest down:

* exit after backward: the interpreter must exit cleanly (rc 0) every time,
  not abort in the autograd device threads at shutdown;
* fork while another thread runs neuron ops: the child must not deadlock; its
  first neuron use either works or raises a RuntimeError about fork;
* DataLoader workers that create neuron tensors: the main process gets a
  clear error within seconds, never a hang;
* malformed NEURON_RT_* variables: a clear error naming the variable, never
  a silently different device configuration.

TORCH_NEURONX_FAULT_REPEATS scales the repetition counts (default 1 = 50 exit
runs, 10 fork runs, 3 DataLoader runs per variant).
"""
import json
import os
from concurrent.futures import ThreadPoolExecutor

import pytest

from conftest import run_python_timeout

SCALE = float(os.environ.get("TORCH_NEURONX_FAULT_REPEATS", "1"))
PARALLEL = 2


def _repeat(n):
    return max(1, int(round(n * SCALE)))


def _run_many(code, times, timeout, env=None):
    """Runs ``code`` ``times`` times, PARALLEL at a time; returns the list of
    CompletedProcess (None for a hung run)."""
    with ThreadPoolExecutor(PARALLEL) as pool:
        return list(pool.map(lambda _: run_python_timeout(code, timeout, env), range(times)))


def _describe(i, proc):
    if proc is None:
        return "run %d: hung (killed after the timeout)" % i
    return "run %d: rc %d\n%s" % (i, proc.returncode, (proc.stdout[-600:] + proc.stderr[-1200:]).strip())


# -- exit after backward ----------------------------------------------------

EXIT_AFTER_BACKWARD = (
    "import torch; x=torch.randn(4,4,device='neuron',requires_grad=True); x.sum().backward()")


def test_exit_after_backward_is_clean():
    runs = _run_many(EXIT_AFTER_BACKWARD, _repeat(50), timeout=120)
    bad = [_describe(i, p) for i, p in enumerate(runs) if p is None or p.returncode != 0]
    assert not bad, "%d of %d runs did not exit cleanly:\n%s" % (len(bad), len(runs), "\n".join(bad[:5]))


# -- fork while a thread runs neuron ops ------------------------------------

FORK_WITH_THREADS = r"""
import json, os, signal, threading, time
import torch

FORKS = 20
BUSY_THREADS = 3
stop = threading.Event()
inherited = torch.arange(3.0, device="neuron")

def busy():
    x = torch.randn(32, 32, device="neuron")
    while not stop.is_set():
        # mostly allocator traffic (its lock is what a fork may inherit held),
        # some kernels and device->host copies
        for n in range(1, 40):
            torch.empty(n * 64, device="neuron")
        x = (x @ x).tanh()
        x.sum().item()

def child(w):
    def step(name, fn):             # report each step as soon as it is done
        try:
            value = fn()
        except BaseException as e:  # noqa: BLE001
            value = "ERR %s: %s" % (type(e).__name__, str(e)[:300])
        os.write(w, (json.dumps([name, value]) + "\n").encode())
    step("cpu", lambda: (torch.ones(3) * 2).tolist())
    step("inherited_tensor", lambda: (inherited * 2).cpu().tolist())
    step("new_tensor", lambda: (torch.arange(3.0, device="neuron") * 2).cpu().tolist())
    step("exiting", lambda: True)
    os._exit(0)                     # as multiprocessing's fork children do

def fork_once():
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        child(w)
    os.close(w)
    deadline = time.time() + 15
    while time.time() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        time.sleep(0.05)
    else:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        status = None
    chunks = []
    while True:
        b = os.read(r, 65536)
        if not b:
            break
        chunks.append(b)
    os.close(r)
    steps = dict(json.loads(line) for line in b"".join(chunks).decode().splitlines())
    return {"status": status, "steps": steps}

threads = [threading.Thread(target=busy, daemon=True) for _ in range(BUSY_THREADS)]
for t in threads:
    t.start()
forks = []
for _ in range(FORKS):
    time.sleep(0.02)
    forks.append(fork_once())
stop.set()
for t in threads:
    t.join(10)
print(json.dumps({"forks": forks,
                  "parent_ok": (torch.ones(2, device="neuron") + 1).cpu().tolist() == [2.0, 2.0]}))
"""


def _check_fork_steps(steps):
    """Problems with one forked child's steps (empty if fine)."""
    expected = {"cpu": [2.0, 2.0, 2.0], "inherited_tensor": [0.0, 2.0, 4.0],
                "new_tensor": [0.0, 2.0, 4.0], "exiting": True}
    problems = []
    for name, want in expected.items():
        value = steps.get(name, "<never finished>")
        if value == want:
            continue
        # a clear refusal is fine: "Cannot re-initialize neuron in forked subprocess"
        if name in ("inherited_tensor", "new_tensor") and isinstance(value, str) \
                and value.startswith("ERR RuntimeError") and "fork" in value.lower():
            continue
        problems.append("step %s: %s" % (name, value))
    return problems


def test_fork_while_thread_runs_neuron_ops():
    runs = _run_many(FORK_WITH_THREADS, _repeat(10), timeout=240)
    problems = []
    for i, p in enumerate(runs):
        if p is None or p.returncode != 0:
            problems.append(_describe(i, p))
            continue
        res = json.loads(p.stdout.strip().splitlines()[-1])
        for j, f in enumerate(res["forks"]):
            where = "run %d fork %d" % (i, j)
            problems += ["%s: %s" % (where, x) for x in _check_fork_steps(f["steps"])]
            if f["status"] is None:
                problems.append("%s: child hung (killed after 15 s)" % where)
            elif f["status"] != 0:
                problems.append("%s: child ended with wait status %s" % (where, f["status"]))
        if not res["parent_ok"]:
            problems.append("run %d: parent's device broken after forking" % i)
    assert not problems, "%d problems:\n%s" % (len(problems), "\n".join(problems[:10]))


# -- DataLoader workers returning neuron tensors ------------------------------

DATALOADER = r"""
import json, sys, time
import torch
from torch.utils.data import DataLoader, Dataset

class NeuronItems(Dataset):
    def __len__(self):
        return 8
    def __getitem__(self, i):
        return torch.full((2,), float(i), device="neuron")

if sys.argv[1] == "parent_initialized":
    torch.ones(1, device="neuron").cpu()
t0 = time.time()
try:
    batches = [b.cpu().tolist() for b in DataLoader(NeuronItems(), batch_size=4, num_workers=2)]
    res = {"ok": batches}
except BaseException as e:  # noqa: BLE001
    res = {"error": "%s: %s" % (type(e).__name__, e)}
res["seconds"] = time.time() - t0
print(json.dumps(res))
"""


@pytest.mark.parametrize("variant", ["parent_initialized", "parent_fresh"])
def test_dataloader_workers_with_neuron_tensors(variant):
    code = DATALOADER.replace("sys.argv[1]", repr(variant))
    runs = _run_many(code, _repeat(3), timeout=60)
    problems = []
    for i, p in enumerate(runs):
        if p is None or p.returncode != 0:
            problems.append(_describe(i, p))
            continue
        res = json.loads(p.stdout.strip().splitlines()[-1])
        if "ok" in res:
            problems.append("run %d: neuron tensors from fork()ed workers were accepted: %s"
                            % (i, res["ok"]))
        elif not ("RuntimeError" in res["error"] and "neuron" in res["error"].lower()):
            problems.append("run %d: unclear error: %s" % (i, res["error"][:500]))
        if res["seconds"] > 20:
            problems.append("run %d: took %.0f s to fail" % (i, res["seconds"]))
    assert not problems, "\n".join(problems)


# -- malformed environment variables -----------------------------------------

MALFORMED = [
    ("NEURON_RT_NUM_CORES", "abc"),
    ("NEURON_RT_VISIBLE_CORES", "3-1"),
    ("NEURON_RT_VISIBLE_CORES", "-5"),
    ("NEURON_RT_VISIBLE_CORES", "0,1,0"),
    ("NEURON_RT_HBM_BYTES", "lots"),
    ("NEURON_RT_HBM_BYTES", "-1"),
    ("NEURON_RT_HBM_BYTES", "10P"),
]
ENTRY_POINTS = {
    "device_count": "torch.neuron.device_count()",
    "is_available": "torch.neuron.is_available()",
    "first_tensor": "torch.ones(2, device='neuron').cpu()",
}
ENV_PROBE = r"""
import json
import torch
try:
    value = {call}
    res = {{"returned": repr(value)}}
except BaseException as e:  # noqa: BLE001
    res = {{"error": "%s: %s" % (type(e).__name__, e)}}
print(json.dumps(res))
"""


@pytest.mark.parametrize("entry", list(ENTRY_POINTS))
@pytest.mark.parametrize("var,value", MALFORMED, ids=["%s=%s" % vv for vv in MALFORMED])
def test_malformed_env_var_raises_naming_it(var, value, entry):
    p = run_python_timeout(ENV_PROBE.format(call=ENTRY_POINTS[entry]), timeout=60, env={var: value})
    assert p is not None, "hung with %s=%s" % (var, value)
    assert p.returncode == 0 and p.stdout.strip(), "crashed (rc %d) with %s=%s:\n%s" % (
        p.returncode, var, value, p.stderr[-2000:])
    res = json.loads(p.stdout.strip().splitlines()[-1])
    assert "error" in res, "%s=%s silently accepted: %s returned %s" % (
        var, value, ENTRY_POINTS[entry], res["returned"])
    assert var in res["error"], "error does not name %s: %s" % (var, res["error"][:500])
