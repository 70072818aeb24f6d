"""torchrun contracts on the neuron backend: an elastic restart after a rank
exits, and a two-agent (``--nnodes=2``) job over loopback c10d rendezvous, the
multi-node path. Launchers run as subprocesses with timeouts; the tests assert
exit codes and what each rank printed."""
import os
import subprocess
import sys
import tempfile
import textwrap

import pytest

from _common import free_port, launcher_env, torchrun

pytestmark = pytest.mark.distributed


def test_max_restarts_recovers_after_a_rank_exits():
    # Attempt 0: rank 1 exits with code 3 after the first collective, while
    # rank 0 waits in the next one; attempt 1: rank 0 does the same (exit 4).
    # torchrun tears the group down each time and starts a new attempt
    # (TORCHELASTIC_RESTART_COUNT), and attempt 2 must complete. Each new
    # attempt rendezvous in the agent's store, which still holds the dead
    # attempts' Gloo addresses and shared-memory keys: without a per-attempt
    # prefix the transport read them and failed to connect or hung (racy: 2 of
    # 4 single restarts), or one rank took the shared-memory path on a stale
    # "attached" flag while its peer took Gloo (2 of 3 runs); two restarts
    # make it likelier to show.
    proc, _ = torchrun("""
import datetime, os, sys, torch, torch.distributed as dist
attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
# A group timeout well inside the test's: a rendezvous that cannot connect fails, not hangs.
dist.init_process_group("neuron", timeout=datetime.timedelta(seconds=30))
rank = dist.get_rank()
dev = torch.device("neuron", int(os.environ["LOCAL_RANK"]))
t = torch.full((4,), float(rank + 1), device=dev)
dist.all_reduce(t)
assert t.cpu().tolist() == [3.0] * 4, t
print(f"attempt {attempt} rank {rank} first all_reduce ok", flush=True)
if attempt < 2:
    if rank == 1 - attempt:
        os._exit(3 + attempt)  # a rank dies without cleanup
    dist.all_reduce(t)  # its peer is gone: raises, or torchrun stops this worker
    raise SystemExit("unreachable: all_reduce returned without the peer")
t = torch.arange(6.0, device=dev) * (rank + 1)
dist.all_reduce(t)
assert t.cpu().tolist() == (torch.arange(6.0) * 3).tolist(), t
print(f"OK attempt {attempt} rank {rank}", flush=True)
dist.destroy_process_group()
""", args=("--max-restarts=2", "--monitor-interval=0.2"), timeout=240)
    out = proc.stdout
    assert proc.returncode == 0, out[-3000:] + proc.stderr[-6000:]
    for attempt in (0, 1, 2):
        for rank in (0, 1):
            assert f"attempt {attempt} rank {rank} first all_reduce ok" in out, out[-3000:]
    assert "OK attempt 2 rank 0" in out and "OK attempt 2 rank 1" in out, out[-3000:]
    assert "OK attempt 0" not in out and "OK attempt 1" not in out, out[-3000:]
    # The agent saw each dying rank's exit code before restarting.
    assert "(exitcode: 3) local_rank: 1" in proc.stderr, proc.stderr[-4000:]
    assert "(exitcode: 4) local_rank: 0" in proc.stderr, proc.stderr[-4000:]


MULTI_NODE_JOB = """
import os, torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
# One process per agent: both are LOCAL_RANK 0, i.e. neuron:0 of their "node".
assert os.environ["LOCAL_RANK"] == "0" and os.environ["WORLD_SIZE"] == "2"
dist.init_process_group("neuron")
rank = dist.get_rank()
dev = torch.device("neuron", 0)
assert torch.device("neuron").index in (None, 0) and torch.neuron.current_device() == 0
t = torch.full((3,), float(rank + 1), device=dev)
dist.all_reduce(t)
assert t.device == dev and t.cpu().tolist() == [3.0] * 3, t

def mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))

g = torch.Generator().manual_seed(rank)
x, y = torch.randn(4, 6, generator=g), torch.randn(4, 2, generator=g)
model = DDP(mlp().to(dev), device_ids=[0])
opt = torch.optim.SGD(model.parameters(), lr=0.1)
loss = torch.nn.functional.mse_loss(model(x.to(dev)), y.to(dev))
loss.backward()
opt.step()
# Reference: the same DDP step on CPU tensors over a Gloo group.
gloo = dist.new_group(backend="gloo")
ref = DDP(mlp(), process_group=gloo)
ropt = torch.optim.SGD(ref.parameters(), lr=0.1)
rloss = torch.nn.functional.mse_loss(ref(x), y)
rloss.backward()
ropt.step()
torch.testing.assert_close(loss.item(), rloss.item(), rtol=1e-6, atol=1e-6)
for p, q in zip(model.parameters(), ref.parameters()):
    torch.testing.assert_close(p.detach().cpu(), q.detach(), rtol=1e-6, atol=1e-6)
print(f"OK rank {rank} node {os.environ['GROUP_RANK']}", flush=True)
dist.destroy_process_group()
"""


def test_two_agents_nnodes_2_over_c10d_rendezvous():
    port = free_port()
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(textwrap.dedent(MULTI_NODE_JOB))
        path = f.name
    agents = []
    try:
        for node in (0, 1):
            cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", f"--node-rank={node}",
                   "--nproc-per-node=1", "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}",
                   "--rdzv-id=neuron-two-agents", "--rdzv-conf=timeout=60", path]
            agents.append(subprocess.Popen(cmd, env=launcher_env(), stdout=subprocess.PIPE,
                                           stderr=subprocess.PIPE, text=True))
        outs = []
        for a in agents:
            try:
                outs.append(a.communicate(timeout=180))
            except subprocess.TimeoutExpired:
                a.kill()
                outs.append(a.communicate())
                raise AssertionError(f"agent hung:\n{outs[-1][0][-2000:]}\n{outs[-1][1][-4000:]}")
    finally:
        for a in agents:
            if a.poll() is None:
                a.kill()
                a.wait()
        os.remove(path)
    for a, (out, err) in zip(agents, outs):
        assert a.returncode == 0, out[-2000:] + err[-6000:]
    lines = sorted(line for out, _ in outs for line in out.splitlines() if line.startswith("OK"))
    # Two nodes, one global rank each (the rendezvous assigns which).
    assert [line.split()[:3] for line in lines] == [["OK", "rank", "0"], ["OK", "rank", "1"]], lines
    assert sorted(line.split()[-1] for line in lines) == ["0", "1"], lines
