"""nn.SyncBatchNorm on neuron: the per-channel statistics ops it calls
(PyTorch has only CUDA kernels; ours are csrc/aten/SyncBatchNorm.cpp) and the
module under DDP at world 2.

The reference is plain batch norm on CPU over the *global* batch, which is
what SyncBatchNorm computes (CPU has no SyncBatchNorm: the module refuses cpu
inputs, and the stat ops have no CPU kernels).
"""
import pytest
import torch
import torch.nn.functional as F

from _common import torchrun


def _ranks_in_one_process(dtype, sizes, channels_last=False):
    """Runs SyncBatchNorm's op sequence for len(sizes) simulated ranks (batch
    chunks of those sizes) on neuron, summing where the module all-reduces,
    and returns what it computed plus the CPU reference on the whole batch."""
    torch.manual_seed(0)
    C, eps, momentum = 3, 1e-5, 0.1
    full = torch.randn(sum(sizes), C, 4, 5) * 3 + 1
    grad_out = torch.randn_like(full)
    weight, bias = torch.rand(C) + 0.5, torch.randn(C)
    xs = [x.to(dtype) for x in full.split(sizes)]
    if channels_last:
        xs = [x.contiguous(memory_format=torch.channels_last) for x in xs]
    dys = [g.to(dtype) for g in grad_out.split(sizes)]
    w, b = weight.to("neuron"), bias.to("neuron")
    rm, rv = torch.zeros(C, device="neuron"), torch.ones(C, device="neuron")

    stats = [torch.batch_norm_stats(x.to("neuron"), eps) for x in xs]
    mean_all = torch.stack([m for m, _ in stats])
    invstd_all = torch.stack([s for _, s in stats])
    counts = torch.tensor([float(x.numel() // C) for x in xs], device="neuron")
    mean, invstd = torch.batch_norm_gather_stats_with_counts(xs[0].to("neuron"), mean_all, invstd_all, rm, rv,
                                                             momentum, eps, counts)
    outs = [torch.batch_norm_elemt(x.to("neuron"), w, b, mean, invstd, eps) for x in xs]
    reduced = [torch.batch_norm_backward_reduce(dy.to("neuron"), x.to("neuron"), mean, invstd, w, True, True, True)
               for dy, x in zip(dys, xs)]
    sum_dy = sum(r[0] for r in reduced)  # the module all-reduces these two
    sum_dy_xmu = sum(r[1] for r in reduced)
    count_i32 = counts.to(torch.int32).view(-1, 1)
    grads = [torch.batch_norm_backward_elemt(dy.to("neuron"), x.to("neuron"), mean, invstd, w, sum_dy, sum_dy_xmu,
                                             count_i32) for dy, x in zip(dys, xs)]
    got = {
        "local means": mean_all, "local invstd": invstd_all, "mean": mean, "invstd": invstd,
        "running_mean": rm, "running_var": rv, "out": torch.cat(outs), "grad_input": torch.cat(grads),
        "grad_weight": sum(r[2] for r in reduced), "grad_bias": sum(r[3] for r in reduced),
    }

    # CPU reference, computed in float64 from the same (rounded) inputs.
    x64 = torch.cat(xs).double().requires_grad_()
    w64, b64 = weight.double().requires_grad_(), bias.double().requires_grad_()
    ref_rm, ref_rv = torch.zeros(C, dtype=torch.float64), torch.ones(C, dtype=torch.float64)
    out = F.batch_norm(x64, ref_rm, ref_rv, w64, b64, training=True, momentum=momentum, eps=eps)
    out.backward(torch.cat(dys).double())
    dims = (0, 2, 3)
    local = [torch.var_mean(x.double(), dims, correction=0) for x in xs]
    var, m = torch.var_mean(x64.detach(), dims, correction=0)
    ref = {
        "local means": torch.stack([lm for _, lm in local]),
        "local invstd": torch.stack([(lv + eps).rsqrt() for lv, _ in local]),
        "mean": m, "invstd": (var + eps).rsqrt(), "running_mean": ref_rm, "running_var": ref_rv,
        "out": out.detach(), "grad_input": x64.grad, "grad_weight": w64.grad, "grad_bias": b64.grad,
    }
    return got, ref, outs, grads


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("sizes", [(4, 4), (5, 2, 1)], ids=["even", "uneven3"])
def test_stat_ops_equal_batch_norm_on_the_global_batch(dtype, sizes):
    got, ref, outs, grads = _ranks_in_one_process(dtype, sizes)
    acc = torch.float32  # statistics stay in float for bf16 inputs, as on CUDA
    for k in ("local means", "local invstd", "mean", "invstd", "running_mean", "running_var"):
        assert got[k].device.type == "neuron" and got[k].dtype == acc, (k, got[k].device, got[k].dtype)
    for t in outs + grads:
        assert t.dtype == dtype and t.device.type == "neuron"
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=2e-2, atol=3e-2)
    stat_tol = dict(rtol=1e-5, atol=1e-5)  # float statistics of the same inputs
    for k in ref:
        t = stat_tol if k not in ("out", "grad_input") else tol
        torch.testing.assert_close(got[k].cpu().double(), ref[k], **t, msg=k)


def test_stat_ops_keep_channels_last():
    got, ref, outs, grads = _ranks_in_one_process(torch.float32, (3, 3), channels_last=True)
    for t in outs + grads:
        assert t.is_contiguous(memory_format=torch.channels_last)
    torch.testing.assert_close(got["out"].cpu().double(), ref["out"], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got["grad_input"].cpu().double(), ref["grad_input"], rtol=1e-5, atol=1e-5)


def test_stat_ops_reject_bad_input():
    x = torch.randn(4, 3, 2, device="neuron")
    with pytest.raises(RuntimeError, match="at least 2 dimensions"):
        torch.batch_norm_stats(torch.randn(4, device="neuron"), 1e-5)
    with pytest.raises(RuntimeError, match="floating point"):
        torch.batch_norm_stats(torch.ones(4, 3, dtype=torch.int32, device="neuron"), 1e-5)
    with pytest.raises(RuntimeError, match=r"mean must have shape \[3\]"):
        torch.batch_norm_elemt(x, None, None, torch.zeros(2, device="neuron"), torch.ones(3, device="neuron"), 1e-5)
    with pytest.raises(RuntimeError, match="counts must have one entry per row"):
        torch.batch_norm_gather_stats_with_counts(x, torch.zeros(2, 3, device="neuron"), torch.ones(2, 3, device="neuron"),
                                                  None, None, 0.1, 1e-5, torch.ones(3, device="neuron"))


@pytest.mark.distributed
def test_sync_batchnorm_ddp_world2_equals_batch_norm_on_the_global_batch():
    """nn.SyncBatchNorm (converted from BatchNorm2d) under DDP, 2 SGD steps
    with different batch sizes per rank: outputs, input gradients, parameters
    and running statistics equal one CPU process running plain BatchNorm2d on
    both ranks' data concatenated."""
    proc, _ = torchrun("""
import os, torch, torch.nn as nn, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
dist.init_process_group("neuron", device_id=torch.device("neuron", int(os.environ["LOCAL_RANK"])))
rank, world = dist.get_rank(), dist.get_world_size()
dev = torch.device("neuron", rank)

# SyncBatchNorm gathers its statistics into a [1, world * n] tensor (any
# contiguous output of world x n elements, as NCCL takes it; Gloo alone splits
# dim 0 and refuses it).
mine = torch.arange(5.0, device=dev) + 10 * rank
out = torch.empty(1, 5 * world, device=dev)
dist.all_gather_into_tensor(out, mine)
torch.testing.assert_close(out.cpu(), torch.cat([torch.arange(5.0) + 10 * r for r in range(world)]).view(1, -1))

def net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(2, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.Conv2d(4, 1, 1))

sizes = [3, 5]  # uneven: the statistics are weighted by each rank's count
def data(step, r):
    g = torch.Generator().manual_seed(10 * step + r)
    return torch.randn(sizes[r], 2, 6, 6, generator=g) * 2 + 1, torch.randn(sizes[r], 1, 6, 6, generator=g)

model = nn.SyncBatchNorm.convert_sync_batchnorm(net()).to(dev)
assert isinstance(model[1], nn.SyncBatchNorm)
model = DDP(model, device_ids=[rank])
opt = torch.optim.SGD(model.parameters(), lr=0.1)
ref = net()
ropt = torch.optim.SGD(ref.parameters(), lr=0.1)
n = sum(sizes)
for step in range(2):
    x, y = data(step, rank)
    x = x.to(dev).requires_grad_()
    out = model(x)
    # Sum over this rank's elements, scaled so that DDP's average over ranks
    # is the global mean: the reference's loss.
    loss = ((out - y.to(dev)) ** 2).sum() * world / (n * 36)
    opt.zero_grad(); loss.backward(); opt.step()

    xs, ys = zip(*(data(step, r) for r in range(world)))
    rx = torch.cat(xs).requires_grad_()
    rout = ref(rx)
    rloss = ((rout - torch.cat(ys)) ** 2).mean()
    ropt.zero_grad(); rloss.backward(); ropt.step()
    lo = sum(sizes[:rank])
    torch.testing.assert_close(out.detach().cpu(), rout.detach()[lo:lo + sizes[rank]], rtol=1e-4, atol=1e-5,
                               msg=f"step {step} output")
    # SyncBatchNorm's input gradient is the global loss's (its backward sums
    # over ranks); DDP's mean of local losses is that loss / world.
    torch.testing.assert_close(x.grad.cpu() / world, rx.grad[lo:lo + sizes[rank]], rtol=1e-4, atol=1e-6,
                               msg=f"step {step} input grad")
for (name, p), q in zip(model.module.named_parameters(), ref.parameters()):
    torch.testing.assert_close(p.detach().cpu(), q.detach(), rtol=1e-4, atol=1e-5, msg=name)
bn, rbn = model.module[1], ref[1]
torch.testing.assert_close(bn.running_mean.cpu(), rbn.running_mean, rtol=1e-5, atol=1e-6)
torch.testing.assert_close(bn.running_var.cpu(), rbn.running_var, rtol=1e-5, atol=1e-6)
assert bn.num_batches_tracked.item() == 2
print("OK", rank)
dist.destroy_process_group()
""", timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    assert proc.stdout.count("OK") == 2, proc.stdout[-3000:]
