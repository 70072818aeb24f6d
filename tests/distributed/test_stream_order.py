"""Collectives order against queued kernels (launches are asynchronous).

The transport reads and writes host aliases of device memory, so the work
queued on the caller's stream must have run first: before that, collectives
read tensors their producer kernels had not written yet (garbage) and a
queued ``zero_`` could overwrite a gathered result.
"""
import os

import pytest

from _common import torchrun

pytestmark = [
    pytest.mark.distributed,
    pytest.mark.skipif(os.environ.get("NEURON_RT_LAUNCH_BLOCKING") == "1",
                       reason="launches are synchronous in this mode: nothing is queued"),
]


@pytest.mark.parametrize("shm", ["1", "0"], ids=["shm", "gloo"])
def test_collectives_see_queued_producers(shm):
    # With the shared-memory path off, Gloo's path prepares scratch copies
    # (PREMUL_SUM's scaled input) on the host: those reads wait too.
    proc, _ = torchrun("""
import os, torch, torch.distributed as dist
assert os.environ.get("NEURON_RT_LAUNCH_BLOCKING", "0") != "1"
dist.init_process_group("neuron")
rank, world = dist.get_rank(), dist.get_world_size()
dev = torch.device("neuron", rank)
n = 1 << 18  # large enough that the kernels are still queued at the collective
base = torch.arange(n, dtype=torch.float32)
want = sum(base * (r + 1) + 1 for r in range(world))
for _ in range(3):
    t = torch.arange(n, dtype=torch.float32, device=dev) * (rank + 1) + 1  # queued
    dist.all_reduce(t)
    assert torch.equal(t.cpu(), want), "all_reduce read unfinished inputs"
    out = torch.empty(world, n, device=dev)
    out.zero_()  # queued before the transport writes the result
    dist.all_gather_into_tensor(out, (torch.ones(n, device=dev) * (rank + 5)))
    assert torch.equal(out.cpu(), torch.stack([torch.full((n,), r + 5.0) for r in range(world)])), "all_gather"
    factor = torch.full((1,), 0.5, device=dev) * 4  # PREMUL_SUM factor from a queued kernel: 2.0
    s = torch.ones(n, device=dev) * 3  # queued
    dist.all_reduce(s, op=dist._make_nccl_premul_sum(factor))
    assert torch.equal(s.cpu(), torch.full((n,), 6.0 * world)), "PREMUL_SUM read unfinished inputs"
    msg = torch.arange(n, dtype=torch.float32, device=dev) + 7  # queued
    if rank == 0:
        dist.send(msg, 1)
    else:
        got = torch.empty(n, device=dev)
        dist.recv(got, 0)
        assert torch.equal(got.cpu(), base + 7), "send read unfinished data"
print("OK", rank, flush=True)
dist.destroy_process_group()
""", timeout=180, env={"TORCH_NEURONX_SHM": shm})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    assert proc.stdout.count("OK") == 2, proc.stdout[-3000:]
