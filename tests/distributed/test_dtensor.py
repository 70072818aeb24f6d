"""DTensor on the neuron backend beyond Colwise/Rowwise (test_stack.py):
redistribute across Shard/Replicate/Partial, SequenceParallel eager and
compiled, and DTensor random ops. World 2, torchrun.

Each job initializes ``"cpu:gloo,neuron:neuron"`` so one process holds a
neuron mesh and a CPU Gloo mesh over the same ranks; the same DTensor program
runs on both and the results are compared rank by rank.
"""
import pytest

from _common import torchrun

pytestmark = pytest.mark.distributed

PRELUDE = """
import os, torch, torch.nn as nn, torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor
local = int(os.environ["LOCAL_RANK"])
torch.neuron.set_device(local)
dist.init_process_group("cpu:gloo,neuron:neuron")
rank, world = dist.get_rank(), dist.get_world_size()
dev = torch.device("neuron", local)
meshes = {t: init_device_mesh(t, (world,)) for t in ("neuron", "cpu")}
"""


def run(script, timeout=240):
    proc, _ = torchrun(PRELUDE + script, timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    assert proc.stdout.count("OK") == 2, proc.stdout[-3000:]


def test_redistribute_shard_replicate_partial_match_cpu_gloo():
    # Small integers in fp32: every reduction is exact, so neuron and Gloo
    # agree bit for bit. 5 rows over 2 ranks exercises uneven shards.
    run("""
def program(t):
    mesh = meshes[t]
    full = torch.arange(20.0).reshape(5, 4) - 7
    mine = (torch.arange(20.0).reshape(5, 4) % 5) * (rank + 1)  # differs per rank
    out = {}
    s0 = distribute_tensor(full.to(t), mesh, [Shard(0)])
    out["S0"] = s0
    out["S0->R"] = s0.redistribute(mesh, [Replicate()])
    out["S0->S1"] = s0.redistribute(mesh, [Shard(1)])
    r = distribute_tensor(full.to(t), mesh, [Replicate()])
    out["R->S1"] = r.redistribute(mesh, [Shard(1)])
    # Shard(1) @ Shard(0) contracts the sharded dim: a Partial(sum) result
    # (redistributing to Partial directly is internal-only in torch).
    p = out["S0->S1"] @ distribute_tensor(full.T.contiguous().to(t), mesh, [Shard(0)])
    assert p.placements == (Partial(),), p.placements
    out["S1@S0 P->R"] = p.redistribute(mesh, [Replicate()])
    for op in ("sum", "max", "avg"):
        p = DTensor.from_local(mine.to(t), mesh, [Partial(op)])
        out[f"P({op})->R"] = p.redistribute(mesh, [Replicate()])
        out[f"P({op})->S0"] = p.redistribute(mesh, [Shard(0)])
        out[f"P({op})->S1"] = p.redistribute(mesh, [Shard(1)])
    out["S0@R"] = s0 @ r.T
    return out
got, ref = program("neuron"), program("cpu")
for k in ref:
    g, c = got[k], ref[k]
    assert g.placements == c.placements, (k, g.placements, c.placements)
    assert g.to_local().device == dev, (k, g.to_local().device)
    torch.testing.assert_close(g.to_local().cpu(), c.to_local(), rtol=0, atol=0, msg=k)
    torch.testing.assert_close(g.full_tensor().cpu(), c.full_tensor(), rtol=0, atol=0, msg=k)
full = torch.arange(20.0).reshape(5, 4) - 7
torch.testing.assert_close(got["S0->S1"].full_tensor().cpu(), full, rtol=0, atol=0)
torch.testing.assert_close(got["P(sum)->R"].to_local().cpu(), (torch.arange(20.0).reshape(5, 4) % 5) * 3)
print("OK", rank)
dist.destroy_process_group()
""")


def test_sequence_parallel_block_eager_and_compiled_match_cpu_gloo():
    """A pre-norm attention + MLP block: LayerNorms SequenceParallel, q/k/v and
    up ColwiseParallel from the sequence shard, o and down RowwiseParallel back
    to the sequence shard. Eager and torch.compile(backend="neuron") outputs
    and every parameter's gradient equal the same program on the CPU Gloo
    mesh."""
    run("""
from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel, SequenceParallel,
                                               parallelize_module)

class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(8), nn.LayerNorm(8)
        self.q, self.k, self.v, self.o = (nn.Linear(8, 8) for _ in range(4))
        self.up, self.down = nn.Linear(8, 16), nn.Linear(16, 8)

    def forward(self, x):  # x: this rank's sequence shard [batch, seq / world, 8]
        h = self.norm1(x)
        # Heads of 2 dims: the Colwise projections hold this rank's heads.
        q, k, v = (m(h).unflatten(-1, (-1, 2)).transpose(1, 2) for m in (self.q, self.k, self.v))
        a = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.o(a.transpose(1, 2).flatten(2))
        return x + self.down(nn.functional.gelu(self.up(self.norm2(x))))

seq = Shard(1)
plan = {"norm1": SequenceParallel(), "norm2": SequenceParallel(),
        "q": ColwiseParallel(input_layouts=seq), "k": ColwiseParallel(input_layouts=seq),
        "v": ColwiseParallel(input_layouts=seq), "o": RowwiseParallel(output_layouts=seq),
        "up": ColwiseParallel(input_layouts=seq), "down": RowwiseParallel(output_layouts=seq)}

def job(t, compiled):
    mesh = meshes[t]
    torch.manual_seed(0)
    model = parallelize_module(Block().to(t), mesh, plan)
    x = torch.randn(2, 6, 8, generator=torch.Generator().manual_seed(1))
    fn = torch.compile(model, backend="neuron") if compiled else model
    out = fn(x.chunk(world, dim=1)[rank].to(t))
    assert not isinstance(out, DTensor) and out.device.type == t, type(out)
    out.pow(2).sum().backward()
    full = DTensor.from_local(out.detach(), mesh, [seq]).full_tensor().cpu()
    grads = {n: p.grad.full_tensor().cpu() for n, p in model.named_parameters()}
    return full, grads

ref = job("cpu", False)
for compiled in (False, True):
    out, grads = job("neuron", compiled)
    torch.testing.assert_close(out, ref[0], rtol=1e-5, atol=1e-5, msg=f"compiled={compiled}: output")
    assert grads.keys() == ref[1].keys()
    for n in ref[1]:
        torch.testing.assert_close(grads[n], ref[1][n], rtol=1e-5, atol=1e-5, msg=f"compiled={compiled}: {n}")
from torch._dynamo.utils import counters
assert counters["stats"]["unique_graphs"] >= 1 and not counters["graph_break"], dict(counters["graph_break"])
print("OK", rank)
dist.destroy_process_group()
""", timeout=300)


def test_random_ops_same_full_tensor_on_every_rank():
    """torch.distributed.tensor.randn/rand and dropout on sharded DTensors.

    A CPU Gloo mesh has no DTensor RNG (OffsetBasedRNGTracker refuses cpu and
    ``distributed.tensor.randn`` asserts there), so the reference is DTensor's
    contract itself: the full tensor is identical on every rank, the shards
    are different draws (not the same stream replayed per rank), the same
    seed reproduces it, and every rank's generator ends at the same offset.
    """
    run("""
import torch.distributed.tensor as dtensor
mesh = meshes["neuron"]

def draws(seed):
    torch.manual_seed(seed)
    out = {
        "randn S0": dtensor.randn(64, 32, device_mesh=mesh, placements=[Shard(0)]),
        "rand S1": dtensor.rand(64, 32, device_mesh=mesh, placements=[Shard(1)]),
        "randn R": dtensor.randn(8, 8, device_mesh=mesh, placements=[Replicate()]),
    }
    ones = distribute_tensor(torch.ones(64, 32, device=dev), mesh, [Shard(0)])
    out["dropout S0"] = nn.functional.dropout(ones, p=0.5)
    ones_r = distribute_tensor(torch.ones(8, 8, device=dev), mesh, [Replicate()])
    out["dropout R"] = nn.functional.dropout(ones_r, p=0.5)
    # After the DTensor ops every rank's generator is at the same offset.
    out["next plain draw"] = torch.randn(4, device=dev)
    return {k: v.full_tensor().cpu() if isinstance(v, DTensor) else v.cpu() for k, v in out.items()}, \\
           {k: v.to_local().cpu() for k, v in out.items() if isinstance(v, DTensor)}

full, shards = draws(7)
again, _ = draws(7)
other, _ = draws(8)
for k, v in full.items():
    # Same full tensor on every rank.
    gathered = [torch.empty_like(v) for _ in range(world)]
    dist.all_gather(gathered, v)  # cpu tensors: Gloo
    for r, g in enumerate(gathered):
        torch.testing.assert_close(g, v, rtol=0, atol=0, msg=f"{k}: rank {r} vs rank {rank}")
    torch.testing.assert_close(again[k], v, rtol=0, atol=0, msg=f"{k}: reseeded")
    assert not torch.equal(other[k], v), f"{k}: seed ignored"
a = full["randn S0"]
assert not torch.equal(a[:32], a[32:]), "the shards replay one stream"
assert abs(a.mean().item()) < 0.1 and abs(a.std().item() - 1) < 0.1, (a.mean(), a.std())
b = full["rand S1"]
assert b.min().item() >= 0 and b.max().item() < 1 and not torch.equal(b[:, :16], b[:, 16:])
d = full["dropout S0"]
assert set(d.unique().tolist()) <= {0.0, 2.0} and 0.4 < (d == 0).float().mean().item() < 0.6
assert not torch.equal(d[:32], d[32:]), "dropout masks repeat across shards"
torch.testing.assert_close(shards["dropout S0"], d[32 * rank:32 * (rank + 1)], rtol=0, atol=0)
print("OK", rank)
dist.destroy_process_group()
""")
