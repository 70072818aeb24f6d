"""Faults: every blocking op of the neuron backend returns or raises
DistBackendError within its timeout + 1 s, naming op, sequence number, ranks
and timeout; abort() releases waiters at once; mismatched collectives raise
on every rank (Gloo alone aborts the process or moves garbage).

Each case is a torchrun job (world 2) with a 3 s group timeout; rank 0
write JSON lines that the test checks, plus exit codes and elapsed times.
"""

import pytest

from _common import ATTEMPT, read_attempts, torchrun

pytestmark = pytest.mark.distributed

TIMEOUT_S = 3

PRELUDE = f"""
import json, os, sys, threading, time, datetime
import torch, torch.distributed as dist
TIMEOUT = {TIMEOUT_S}
dist.init_process_group("neuron", timeout=datetime.timedelta(seconds=TIMEOUT))
rank = dist.get_rank()
dev = torch.device("neuron", rank)
""" + ATTEMPT


def job(script, tmp_path, timeout, env=None):
    """Runs the PRELUDE + script job; returns (proc, results of rank 0 then rank 1)."""
    base = str(tmp_path / "results")
    proc, _ = torchrun(PRELUDE + script, timeout=timeout, env={"FAULT_RESULTS": base, **(env or {})})
    out = read_attempts(base, (0, 1))
    assert out, proc.stdout[-2000:] + proc.stderr[-4000:]
    return proc, out


def assert_names_the_failure(r, op_name):
    msg = r["msg"]
    for needle in (op_name, "sequence number", "ranks [0..1]", f"timeout {TIMEOUT_S * 1000} ms"):
        assert needle in msg, (needle, msg)


def test_peer_hangs(tmp_path):
    proc, rs = job("""
dist.all_reduce(torch.ones(2, device=dev))  # both ranks are up
if rank == 1:
    time.sleep(4 * (TIMEOUT + 1) + 2)  # hung peer; exits cleanly later
    os._exit(0)
attempt("all_reduce", lambda: dist.all_reduce(torch.ones(4, device=dev)))
attempt("broadcast", lambda: dist.broadcast(torch.ones(4, device=dev), src=1))
attempt("barrier", lambda: dist.barrier())
attempt("all_reduce_async_wait", lambda: dist.all_reduce(torch.ones(4, device=dev), async_op=True).wait())
print("ERROR_TYPE", dist.group.WORLD._get_backend(dev).get_error(), flush=True)
os._exit(0)
""", tmp_path, timeout=90, env={"TORCH_NEURONX_ASYNC_ERROR_HANDLING": "0"})  # raise, do not exit
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert [r["op"] for r in rs] == ["all_reduce", "broadcast", "barrier", "all_reduce_async_wait"]
    for r, op in zip(rs, ["ALLREDUCE", "BROADCAST", "BARRIER", "ALLREDUCE"]):
        assert r["error"] == "DistBackendError", r
        assert r["elapsed"] <= TIMEOUT_S + 1, r
        assert_names_the_failure(r, op)
    # The first failure was a timeout: getError() says so (c10d::ErrorType::TIMEOUT).
    assert "ERROR_TYPE 1" in proc.stdout


def test_peer_exits(tmp_path):
    proc, rs = job("""
dist.all_reduce(torch.ones(2, device=dev))
if rank == 1:
    os._exit(0)
time.sleep(0.5)
attempt("all_reduce", lambda: dist.all_reduce(torch.ones(4, device=dev)))
attempt("all_gather", lambda: dist.all_gather_into_tensor(torch.empty(8, device=dev), torch.ones(4, device=dev)))
os._exit(0)
""", tmp_path, timeout=60)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert len(rs) == 2
    for r in rs:
        assert r["error"] == "DistBackendError", r
        assert r["elapsed"] <= TIMEOUT_S + 1, r
    assert_names_the_failure(rs[0], "ALLREDUCE")


@pytest.mark.parametrize("check", ["1", "0"], ids=["blocked_in_launch", "pending_work"])
def test_abort_releases_waiters(check, tmp_path):
    # check=1: the caller waits in the pre-collective argument check;
    # check=0: the collective is queued and the caller waits on its Work.
    proc, rs = job("""
dist.all_reduce(torch.ones(2, device=dev))
if rank == 1:
    time.sleep(TIMEOUT + 4)
    os._exit(0)
threading.Timer(0.5, dist.distributed_c10d._abort_process_group).start()
attempt("all_reduce", lambda: dist.all_reduce(torch.ones(4, device=dev), async_op=True).wait())
attempt("after_abort", lambda: dist.all_reduce(torch.ones(4, device=dev)))
os._exit(0)
""", tmp_path, timeout=60, env={"TORCH_NEURONX_COLLECTIVE_CHECK": check})
    assert proc.returncode == 0, proc.stderr[-4000:]
    first, after = rs
    assert first["error"] == "DistBackendError", first
    assert first["elapsed"] < 1.5, first  # released by abort, not by the 3 s timeout
    assert "abort" in first["msg"], first
    assert after["error"] is not None and after["elapsed"] < 1, after


def test_mismatched_collectives_raise_on_every_rank(tmp_path):
    proc, rs = job("""
attempt("shape", lambda: dist.all_reduce(torch.ones(4 if rank == 0 else 8, device=dev)))
attempt("dtype", lambda: dist.all_reduce(torch.ones(4, device=dev, dtype=torch.float32 if rank == 0 else torch.int32)))
attempt("broadcast_shape", lambda: dist.broadcast(torch.ones(4 if rank == 0 else 5, device=dev), src=0))
attempt("op", lambda: dist.all_reduce(torch.ones(4, device=dev)) if rank == 0 else
        dist.broadcast(torch.ones(4, device=dev), src=0))
attempt("all_to_all_splits", lambda: dist.all_to_all_single(
    torch.empty(4, device=dev), torch.ones(4, device=dev),
    output_split_sizes=[2, 2], input_split_sizes=[1, 3] if rank == 0 else [2, 2]))
# Nothing was sent: the group still works.
t = torch.full((4,), float(rank + 1), device=dev)
attempt("after", lambda: dist.all_reduce(t))
sys.stdout.write(f"SUM {t.cpu().tolist()}\\n"); sys.stdout.flush()  # one write: the ranks share stdout
dist.destroy_process_group()
""", tmp_path, timeout=60)
    assert proc.returncode == 0, proc.stderr[-4000:]
    for rank in (0, 1):
        mine = {r["op"]: r for r in rs if r["rank"] == rank}
        for op in ("shape", "dtype", "broadcast_shape", "op", "all_to_all_splits"):
            assert mine[op]["error"] == "DistBackendError", mine[op]
            assert "mismatched collectives" in mine[op]["msg"], mine[op]
            assert mine[op]["elapsed"] < 2, mine[op]
        assert mine["after"]["error"] is None, mine["after"]
    assert "float32 x" not in proc.stdout and proc.stdout.count("SUM [3.0, 3.0, 3.0, 3.0]") == 2


def test_mismatched_p2p_raises_on_the_receiver(tmp_path):
    # Gloo alone: a larger or other-dtype receive buffer silently gets
    # garbage. (A smaller one still aborts the receiving process: Gloo checks
    # that in its transport thread, before the backend sees the message.)
    proc, rs = job("""
def p2p(send, recv):
    if rank == 0:
        dist.send(send, 1)
    else:
        dist.recv(recv, 0)
attempt("bigger", lambda: p2p(torch.ones(4, device=dev), torch.zeros(8, device=dev)))
attempt("dtype", lambda: p2p(torch.ones(4, device=dev), torch.zeros(4, device=dev, dtype=torch.int32)))
def any_source():
    if rank == 0:
        dist.isend(torch.ones(3, device=dev), 1).wait()
    else:
        dist.irecv(torch.zeros(2, 3, device=dev)).wait()
attempt("any_source", any_source)
# Every mismatched message was consumed: the pair still works, in both directions.
t = torch.full((4,), float(rank + 1), device=dev)
attempt("after", lambda: p2p(t, t))
ops = [dist.P2POp(dist.isend, torch.full((2,), float(rank), device=dev), 1 - rank),
       dist.P2POp(dist.isend, torch.full((3,), 10.0 + rank, device=dev), 1 - rank),
       dist.P2POp(dist.irecv, torch.zeros(2, device=dev), 1 - rank),
       dist.P2POp(dist.irecv, torch.zeros(3, device=dev), 1 - rank)]
attempt("batch", lambda: [w.wait() for w in dist.batch_isend_irecv(ops)])
sys.stdout.write(f"GOT {rank} {t.cpu().tolist()} {ops[2].tensor.cpu().tolist()} {ops[3].tensor.cpu().tolist()}\\n")
sys.stdout.flush()
dist.destroy_process_group()
""", tmp_path, timeout=60)
    assert proc.returncode == 0, proc.stderr[-4000:]
    mine = {r["op"]: r for r in rs if r["rank"] == 1}
    for op, sent, into in (("bigger", "Float[4]", "Float[8]"), ("dtype", "Float[4]", "Int[4]"),
                           ("any_source", "Float[3]", "Float[2, 3]")):
        r = mine[op]
        assert r["error"] == "DistBackendError", r
        assert f"rank 0 sent {sent}" in r["msg"] and f"rank 1 receives into {into}" in r["msg"], r
        assert r["elapsed"] < 2, r
    for r in rs:
        if r["rank"] == 0 or r["op"] in ("after", "batch"):
            assert r["error"] is None, r
    assert "GOT 1 [1.0, 1.0, 1.0, 1.0] [0.0, 0.0] [10.0, 10.0, 10.0]" in proc.stdout, proc.stdout
    assert "GOT 0 [1.0, 1.0, 1.0, 1.0] [1.0, 1.0] [11.0, 11.0, 11.0]" in proc.stdout, proc.stdout


@pytest.mark.parametrize("check", ["1", "0"], ids=["blocked_in_launch", "unwaited_work"])
def test_timeout_exits_process_by_default(check, tmp_path):
    """TORCH_NEURONX_ASYNC_ERROR_HANDLING defaults to 3 (as NCCL's): a
    collective that times out, even one nobody waits on, ends the process
    with exit code 1 shortly after its timeout, so a launcher can restart
    the job instead of hanging."""
    import time

    stamp = tmp_path / "launched"
    proc, _ = torchrun(PRELUDE + f"""
dist.all_reduce(torch.ones(2, device=dev))
if rank == 1:
    time.sleep(TIMEOUT + 8)
    os._exit(0)
open({str(stamp)!r}, "w").write(str(time.time()))
work = dist.all_reduce(torch.ones(4, device=dev), async_op=True)
time.sleep(TIMEOUT + 6)  # never waits; the watchdog must act
print("STILL ALIVE", flush=True)
os._exit(0)
""", timeout=90, env={"FAULT_RESULTS": str(tmp_path / "r"), "TORCH_NEURONX_COLLECTIVE_CHECK": check})
    ended = time.time()
    assert proc.returncode != 0, proc.stdout[-2000:]
    assert "STILL ALIVE" not in proc.stdout
    assert "timed out; TORCH_NEURONX_ASYNC_ERROR_HANDLING=3: exiting the process" in proc.stderr, proc.stderr[-3000:]
    assert "exitcode  : 1" in proc.stderr, proc.stderr[-3000:]
    # Launch to the end of the whole job (rank 1 is then stopped by torchrun).
    assert ended - float(stamp.read_text()) < TIMEOUT_S + 3, ended - float(stamp.read_text())


def test_exit_with_works_completing():
    """A rank that drops its works and exits while the transport is still
    completing them: the completions release tensors the script still holds
    (which takes the GIL) and must not do so during finalization, where the
    thread would be ended through a noexcept frame (std::terminate, rc 134).
    The exit point sweeps across the completions, ten jobs."""
    script = """
import os, time, torch, torch.distributed as dist
dist.init_process_group("neuron")
rank = dist.get_rank()
dev = torch.device("neuron", rank)
bufs = [torch.full((1024,), float(rank), device=dev) for _ in range(8)]
# Broadcast goes through the transport's futures; the last references to
# the works are then the transport's completion callbacks.
works = [dist.broadcast(b, src=1, async_op=True) for b in bufs]
del works
end = time.perf_counter() + float(os.environ["EXIT_DELAY"])
while time.perf_counter() < end:
    pass
print("OK", rank, flush=True)
"""
    for i in range(10):
        proc, _ = torchrun(script, timeout=90, env={"EXIT_DELAY": str(i * 0.0007)})
        assert proc.returncode == 0, (i, proc.stdout[-2000:] + proc.stderr[-4000:])
        assert proc.stdout.count("OK") == 2, proc.stdout[-2000:]
