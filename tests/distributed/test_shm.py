"""The intra-node shared-memory path of the neuron backend (world 2, torchrun).

- on/off equality: every collective the fast path serves, per dtype and
  ReduceOp, gives the same bits as the same group with
  ``TORCH_NEURONX_SHM=0`` (Gloo on host views), across step boundaries
  (sizes above one slot half), non-contiguous and in-place forms;
- faults: a peer that exits or hangs during a shared-memory collective ends
  it with DistBackendError within timeout + 1 s, naming the collective;
- protect mode: with ``NEURON_RT_PROTECT=1`` the fast path reads and writes
  device memory only inside runtime launches (a bypass would fault);
- the single-copy path (messages >= 256 KiB in shareable device memory):
  results against a CPU reference, the peer's segments really mapped (and
  dropped once the peer released them), the fallback when one rank's buffer
  is not shareable, and ``TORCH_NEURONX_SHM_DIRECT=0``.
"""

import pytest

from _common import ATTEMPT, read_attempts, torchrun

pytestmark = pytest.mark.distributed

TIMEOUT_S = 3

PRELUDE = """
import json, os, sys, time, datetime
import torch, torch.distributed as dist
dist.init_process_group("neuron", timeout=datetime.timedelta(seconds=TIMEOUT))
rank, world = dist.get_rank(), dist.get_world_size()
dev = torch.device("neuron", rank)
torch.neuron.set_device(rank)
def backend(group=None):
    return (group or dist.group.WORLD)._get_backend(dev)
"""


def run(script, env=None, timeout=180, timeout_s=60):
    proc, elapsed = torchrun(f"TIMEOUT = {timeout_s}\n" + PRELUDE + script, timeout=timeout, env=env)
    return proc, elapsed


def test_shm_is_used_on_one_host_and_off_with_env():
    proc, _ = run("""
# One write per line: the ranks share stdout, and print's pieces interleave.
os.write(1, f"USES {rank} {backend().uses_shm}\\n".encode())
os.environ["TORCH_NEURONX_SHM"] = "0"
off = dist.new_group(backend="neuron")
os.write(1, f"OFF {rank} {backend(off).uses_shm}\\n".encode())
dist.destroy_process_group()
""")
    assert proc.returncode == 0, proc.stderr[-4000:]
    for rank in (0, 1):
        assert f"USES {rank} True" in proc.stdout, proc.stdout
        assert f"OFF {rank} False" in proc.stdout, proc.stdout


def test_shm_equals_gloo_path_bit_for_bit():
    # 2 MiB slots: fp32 steps carry 256 Ki elements (all_reduce), so 300001
    # elements take two steps, the second partial and odd.
    proc, _ = run("""
os.environ["TORCH_NEURONX_SHM"] = "0"
off = dist.new_group(backend="neuron")
assert backend().uses_shm and not backend(off).uses_shm
R = dist.ReduceOp
FLOATS = [torch.float32, torch.bfloat16, torch.float16, torch.float64]
INTS = [torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64]
def data(dtype, n, seed):
    g = torch.Generator().manual_seed(seed * 7 + rank)
    if dtype.is_floating_point:
        return (torch.randn(n, generator=g) * 3).to(dtype)
    return torch.randint(0 if dtype == torch.uint8 else -4, 5, (n,), generator=g).to(dtype)
def bits(t):
    return t.cpu().view(torch.uint8) if t.element_size() == 1 else t.cpu()
bad = []
def same(what, a, b):
    if a.dtype != b.dtype or not torch.equal(bits(a), bits(b)):
        bad.append(what)
cases = 0
for dtype in FLOATS + INTS:
    ops = [R.SUM, R.MIN, R.MAX, R.PRODUCT] + ([R.AVG, dist._make_nccl_premul_sum(0.5)] if dtype.is_floating_point else [])
    for n in (1, 300001):
        for op in ops:
            x = data(dtype, n, cases)
            a, b = x.to(dev), x.to(dev)
            dist.all_reduce(a, op=op)
            dist.all_reduce(b, op=op, group=off)
            same(f"all_reduce {dtype} {op} {n}", a, b)
            inp = data(dtype, 2 * n, cases + 1).to(dev)
            a, b = torch.empty(n, dtype=dtype, device=dev), torch.empty(n, dtype=dtype, device=dev)
            dist.reduce_scatter_tensor(a, inp, op=op)
            dist.reduce_scatter_tensor(b, inp, op=op, group=off)
            same(f"reduce_scatter_tensor {dtype} {op} {n}", a, b)
            cases += 2
        inp = data(dtype, n, cases).to(dev)
        a, b = torch.empty(2 * n, dtype=dtype, device=dev), torch.empty(2 * n, dtype=dtype, device=dev)
        dist.all_gather_into_tensor(a, inp)
        dist.all_gather_into_tensor(b, inp, group=off)
        same(f"all_gather_into_tensor {dtype} {n}", a, b)
# Non-contiguous inputs and outputs, list forms, in-place all_gather, fp8 moved as bytes.
x = data(torch.float32, 2 * 1000, 1).view(1000, 2).to(dev)
a, b = x.clone().t(), x.clone().t()
dist.all_reduce(a); dist.all_reduce(b, group=off); same("all_reduce non-contiguous", a, b)
rows = data(torch.float32, 2 * 3000, 2).view(3000, 2).to(dev)
a, b = torch.empty(2, 3000, device=dev).t(), torch.empty(2, 3000, device=dev).t()
dist.reduce_scatter_tensor(a, rows.repeat(2, 1)); dist.reduce_scatter_tensor(b, rows.repeat(2, 1), group=off)
same("reduce_scatter_tensor non-contiguous output", a, b)
outs_a = [torch.empty(5000, device=dev) for _ in range(world)]
outs_b = [torch.empty(5000, device=dev) for _ in range(world)]
piece = data(torch.float32, 5000, 3).to(dev)
dist.all_gather(outs_a, piece); dist.all_gather(outs_b, piece, group=off)
same("all_gather list", torch.cat(outs_a), torch.cat(outs_b))
out_a, out_b = torch.empty(world * 5000, device=dev), torch.empty(world * 5000, device=dev)
dist.reduce_scatter(out_a[:5000], list(data(torch.float32, world * 5000, 4).to(dev).chunk(world)))
dist.reduce_scatter(out_b[:5000], list(data(torch.float32, world * 5000, 4).to(dev).chunk(world)), group=off)
same("reduce_scatter list", out_a[:5000], out_b[:5000])
buf = torch.zeros(world * 4096, device=dev)
buf[rank * 4096:(rank + 1) * 4096] = rank + 1
dist.all_gather_into_tensor(buf, buf[rank * 4096:(rank + 1) * 4096])
same("all_gather in place", buf, torch.arange(1, world + 1, dtype=torch.float32).repeat_interleave(4096))
f8 = data(torch.float32, 777, 5).to(torch.float8_e4m3fn).to(dev)
a, b = torch.empty(world * 777, dtype=f8.dtype, device=dev), torch.empty(world * 777, dtype=f8.dtype, device=dev)
dist.all_gather_into_tensor(a, f8); dist.all_gather_into_tensor(b, f8, group=off)
same("all_gather fp8", a, b)
# A collective the fast path does not serve (bool) still goes through Gloo.
t = torch.tensor([rank == 0, False, True], device=dev)
dist.all_reduce(t, op=R.MAX)
same("bool MAX via Gloo", t, torch.tensor([True, False, True]))
sys.stdout.write(f"CASES {rank} {cases} BAD {json.dumps(bad)}\\n"); sys.stdout.flush()
dist.destroy_process_group()
""", timeout=400)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    for rank in (0, 1):
        line = next(ln for ln in proc.stdout.splitlines() if ln.startswith(f"CASES {rank} "))
        assert int(line.split()[2]) > 100, line
        assert line.endswith("BAD []"), line


FAULT = ATTEMPT + """
assert backend().uses_shm
big = torch.ones(3 * 2**20, device=dev)  # 12 MiB: many steps
dist.all_reduce(big)  # both are up
"""


def fault_job(script, tmp_path, env):
    base = str(tmp_path / "results")
    proc, _ = run(FAULT + script, timeout=90, timeout_s=TIMEOUT_S,
                  env={"FAULT_RESULTS": base, "TORCH_NEURONX_ASYNC_ERROR_HANDLING": "0", **env})
    rs = read_attempts(base, (0,))
    assert rs, proc.stdout[-2000:] + proc.stderr[-4000:]
    return proc, rs


@pytest.mark.parametrize("check", ["1", "0"], ids=["checked", "unchecked"])
def test_dead_peer_during_shm_collective(check, tmp_path):
    # Rank 1 joins the collective's first steps' worth of time, then dies:
    # rank 0 is inside the shared-memory collective (or its argument check)
    # when the peer goes away.
    proc, rs = fault_job("""
if rank == 1:
    time.sleep(0.5)
    os._exit(0)
attempt("all_reduce", lambda: dist.all_reduce(big))
attempt("all_gather", lambda: dist.all_gather_into_tensor(torch.empty(2 * big.numel(), device=dev), big))
os._exit(0)
""", tmp_path, {"TORCH_NEURONX_COLLECTIVE_CHECK": check})
    assert proc.returncode == 0, proc.stderr[-4000:]
    first, second = rs
    assert first["error"] == "DistBackendError", first
    assert first["elapsed"] <= TIMEOUT_S + 1, first
    for needle in ("ALLREDUCE", "sequence number", "ranks [0..1]", f"timeout {TIMEOUT_S * 1000} ms"):
        assert needle in first["msg"], (needle, first)
    assert "exited" in first["msg"] or "timed out" in first["msg"], first
    # The group is broken now: later collectives fail at once, never hang.
    assert second["error"] == "DistBackendError" and second["elapsed"] < 1, second


def test_hung_peer_during_shm_collective_times_out(tmp_path):
    proc, rs = fault_job("""
if rank == 1:
    time.sleep(TIMEOUT + 4)  # hangs, then exits cleanly
    os._exit(0)
attempt("all_reduce", lambda: dist.all_reduce(big))
os._exit(0)
""", tmp_path, {"TORCH_NEURONX_COLLECTIVE_CHECK": "0"})
    assert proc.returncode == 0, proc.stderr[-4000:]
    (r,) = rs
    assert r["error"] == "DistBackendError", r
    assert TIMEOUT_S - 0.5 <= r["elapsed"] <= TIMEOUT_S + 1, r
    assert "timed out" in r["msg"] and "ALLREDUCE" in r["msg"], r


def test_shm_collectives_under_protect_mode():
    proc, _ = run("""
assert backend().uses_shm
x = torch.arange(100000, dtype=torch.float32, device=dev) * (rank + 1)
dist.all_reduce(x)
ok = torch.equal(x.cpu(), torch.arange(100000, dtype=torch.float32) * 3)
out = torch.empty(200000, device=dev)
dist.all_gather_into_tensor(out, x)
ok = ok and torch.equal(out.cpu(), torch.cat([x.cpu(), x.cpu()]))
half = torch.empty(100000, device=dev)
dist.reduce_scatter_tensor(half, out, op=dist.ReduceOp.MAX)
ok = ok and torch.equal(half.cpu(), x.cpu())
sys.stdout.write(f"PROTECT {rank} {ok}\\n"); sys.stdout.flush()
dist.destroy_process_group()
""", env={"NEURON_RT_PROTECT": "1"})
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-5000:]
    assert "PROTECT 0 True" in proc.stdout and "PROTECT 1 True" in proc.stdout, proc.stdout


DIRECT = """
def peer_mappings():
    # Mappings of device-memory memfds that are not ours (our segments' fds are open here).
    own = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            if "neuron-device-memory" in os.readlink(f"/proc/self/fd/{fd}"):
                own.add(os.stat(f"/proc/self/fd/{fd}").st_ino)
        except OSError:
            pass
    with open("/proc/self/maps") as f:
        return sum(1 for ln in f if "neuron-device-memory" in ln and int(ln.split()[4]) not in own)
def inputs(dtype, n, seed):
    # Every rank's data, made on every rank: the reference needs no communication.
    out = []
    for r in range(world):
        g = torch.Generator().manual_seed(seed * 10 + r)
        x = torch.randn(n, generator=g) * 3 if dtype.is_floating_point else torch.randint(-50, 50, (n,), generator=g)
        out.append(x.to(dtype))
    return out
bad = []
def same(what, got, want):
    if got.dtype != want.dtype or not torch.equal(got.cpu(), want):
        bad.append(what)
"""


def test_single_copy_path_matches_a_cpu_reference():
    # 300001 elements (odd, ~1.2 MB fp32) and 2**22 + 5 (> 16 MiB fp32: both ranks'
    # buffers exceed 32 MiB, so the results leave with streaming stores).
    proc, _ = run(DIRECT + """
R = dist.ReduceOp
assert peer_mappings() == 0
seed = 0
for n in (300001, 2**22 + 5):
    for dtype, op, ref in [(torch.float32, R.SUM, lambda a, b: a + b), (torch.bfloat16, R.AVG, lambda a, b: (a + b) / 2),
                           (torch.int64, R.MAX, torch.maximum), (torch.float16, R.MIN, torch.minimum)]:
        seed += 1
        xs = inputs(dtype, n, seed)
        t = xs[rank].to(dev)
        dist.all_reduce(t, op=op)
        same(f"all_reduce {dtype} {op} {n}", t, ref(xs[0], xs[1]))
        ins = inputs(dtype, 2 * n, seed + 100)
        out = torch.empty(n, dtype=dtype, device=dev)
        dist.reduce_scatter_tensor(out, ins[rank].to(dev), op=op)
        same(f"reduce_scatter_tensor {dtype} {op} {n}", out, ref(ins[0], ins[1])[rank * n:(rank + 1) * n])
    xs = inputs(torch.float32, n, seed + 200)
    full = torch.cat(xs)
    out = torch.empty(2 * n, device=dev)
    dist.all_gather_into_tensor(out, xs[rank].to(dev))
    same(f"all_gather_into_tensor {n}", out, full)
    buf = torch.zeros(2 * n, device=dev)
    buf[rank * n:(rank + 1) * n] = xs[rank].to(dev)
    dist.all_gather_into_tensor(buf, buf[rank * n:(rank + 1) * n])  # in place, as FSDP2 calls it
    same(f"all_gather in place {n}", buf, full)
    outs = [torch.empty(n, device=dev) for _ in range(world)]
    dist.all_gather(outs, xs[rank].to(dev))
    same(f"all_gather list {n}", torch.cat(outs), full)
maps = peer_mappings()
sys.stdout.write(f"DIRECT {rank} maps={maps} BAD {json.dumps(bad)}\\n"); sys.stdout.flush()
dist.destroy_process_group()
""", timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    for rank in (0, 1):
        line = next(ln for ln in proc.stdout.splitlines() if ln.startswith(f"DIRECT {rank} "))
        assert line.endswith("BAD []"), line
        assert int(line.split()[2].split("=")[1]) > 0, line  # the peer's memory was mapped


def test_single_copy_path_drops_released_peer_memory_and_falls_back():
    proc, _ = run(DIRECT + """
spare = torch.empty(2**20, device=dev)  # a segment no collective uses
x = torch.full((2**20,), float(rank + 1), device=dev)  # 4 MiB
dist.all_reduce(x)
same("first", x, torch.full((2**20,), 3.0))
first = peer_mappings()
# Rank 1 releases a segment: at the next collective rank 0 drops what it
# mapped of rank 1 (it cannot tell which segment went, and must not keep the
# peer's freed memory resident), then maps only what that collective needs.
if rank == 1:
    del spare
    torch.neuron.empty_cache()
y = torch.full((2**19,), float(rank + 1), device=dev)
dist.all_reduce(y)
same("after release", y, torch.full((2**19,), 3.0))
after = peer_mappings()
# A buffer one rank holds outside shareable memory (a CPU tensor): every rank
# takes the slots for that collective, with the same result.
z = torch.full((2**19,), float(rank + 1), device=dev if rank == 0 else "cpu")
dist.all_reduce(z)
same("mixed", z, torch.full((2**19,), 3.0))
# TORCH_NEURONX_SHM_DIRECT=0 (read when a group is made): slots only.
os.environ["TORCH_NEURONX_SHM_DIRECT"] = "0"
slots = dist.new_group(backend="neuron")
before = peer_mappings()
w = torch.full((2**19,), float(rank + 1), device=dev)
dist.all_reduce(w, group=slots)
same("direct off", w, torch.full((2**19,), 3.0))
off = peer_mappings() - before
sys.stdout.write(f"RELEASE {rank} first={first} after={after} off={off} BAD {json.dumps(bad)}\\n"); sys.stdout.flush()
dist.destroy_process_group()
""")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    lines = {r: next(ln for ln in proc.stdout.splitlines() if ln.startswith(f"RELEASE {r} ")) for r in (0, 1)}
    for line in lines.values():
        assert line.endswith("BAD []"), line
        assert "off=0" in line, line
    fields = dict(kv.split("=") for kv in lines[0].split()[2:5])
    assert int(fields["first"]) >= 1 and int(fields["after"]) == 1, lines[0]


@pytest.mark.parametrize("var,value", [("TORCH_NEURONX_SHM", "off"), ("TORCH_NEURONX_SHM_DIRECT", "no"),
                                       ("TORCH_NEURONX_ASYNC_ERROR_HANDLING", "5")])
def test_malformed_backend_switches_raise(var, value):
    from conftest import run_json

    out = run_json("""
        import json, tempfile, torch.distributed as dist
        try:
            dist.init_process_group("neuron", store=dist.FileStore(tempfile.mktemp(), 1), rank=0, world_size=1)
            print(json.dumps(None))
        except ValueError as e:
            print(json.dumps(str(e)))
    """, env={var: value})
    assert out is not None and var in out and repr(value) in out, out

