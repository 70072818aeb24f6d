"""The upstream stack on the neuron backend, tiny models, world 2 (torchrun).

Each job computes the reference in the same process: DDP against DDP on CPU
Gloo; FSDP2, DTensor TP and Transformers TP against the same model run
unsharded on CPU in one process.
"""
import pytest

from _common import torchrun

pytestmark = pytest.mark.distributed

PRELUDE = """
import os, torch, torch.distributed as dist
# Bound to the rank's device (as Transformers and DeviceMesh users do); the
# DDP job makes a Gloo group, which a neuron-bound default group cannot.
bind = {"device_id": torch.device("neuron", int(os.environ["LOCAL_RANK"]))} if BIND else {}
dist.init_process_group("neuron", **bind)
rank, world = dist.get_rank(), dist.get_world_size()
dev = torch.device("neuron", rank)

def mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))

def batch(step, r):
    g = torch.Generator().manual_seed(100 * step + r)
    return torch.randn(4, 8, generator=g), torch.randn(4, 4, generator=g)
"""


def run(script, timeout=240, bind=True):
    proc, _ = torchrun(f"BIND = {bind}\n" + PRELUDE + script, timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    assert proc.stdout.count("OK") == 2, proc.stdout[-3000:]


def test_ddp_loss_parity_with_cpu_gloo():
    run("""
from torch.nn.parallel import DistributedDataParallel as DDP
model = DDP(mlp().to(dev), device_ids=[rank])
opt = torch.optim.SGD(model.parameters(), lr=0.1)
losses = []
for step in range(3):
    x, y = batch(step, rank)
    loss = torch.nn.functional.mse_loss(model(x.to(dev)), y.to(dev))
    opt.zero_grad(); loss.backward(); opt.step()
    losses.append(loss.item())
dist.barrier()
# The same training on CPU tensors over a plain Gloo group.
gloo = dist.new_group(backend="gloo")
ref = DDP(mlp(), process_group=gloo)
ropt = torch.optim.SGD(ref.parameters(), lr=0.1)
ref_losses = []
for step in range(3):
    x, y = batch(step, rank)
    loss = torch.nn.functional.mse_loss(ref(x), y)
    ropt.zero_grad(); loss.backward(); ropt.step()
    ref_losses.append(loss.item())
torch.testing.assert_close(torch.tensor(losses), torch.tensor(ref_losses), rtol=1e-5, atol=1e-6)
for p, q in zip(model.parameters(), ref.parameters()):
    torch.testing.assert_close(p.detach().cpu(), q.detach(), rtol=1e-5, atol=1e-6)
print("OK", rank, losses)
dist.destroy_process_group()
""", bind=False)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_fsdp2_fully_shard(dtype):
    run(f"""
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard, MixedPrecisionPolicy
mesh = init_device_mesh("neuron", (world,))
param_dtype = getattr(torch, "{dtype}")
mp = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32)
model = mlp().to(dev)
for layer in (model[0], model[2]):
    fully_shard(layer, mesh=mesh, mp_policy=mp)
fully_shard(model, mesh=mesh, mp_policy=mp)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
# Reference: the unsharded model on CPU with the whole global batch (the
# mean over both ranks' data, which is what FSDP's averaged gradient means).
ref = mlp()
if param_dtype != torch.float32:
    ref_low = mlp().to(param_dtype)
ropt = torch.optim.SGD(ref.parameters(), lr=0.1)
losses, ref_losses = [], []
for step in range(3):
    x, y = batch(step, rank)
    loss = torch.nn.functional.mse_loss(model(x.to(dev)).float(), y.to(dev))
    opt.zero_grad(); loss.backward(); opt.step()
    losses.append(loss.item())
    xs = torch.cat([batch(step, r)[0] for r in range(world)])
    ys = torch.cat([batch(step, r)[1] for r in range(world)])
    if param_dtype != torch.float32:
        # bf16 compute with fp32 master weights, as the policy prescribes.
        ref_low.load_state_dict({{k: v.to(param_dtype) for k, v in ref.state_dict().items()}})
        out = ref_low(xs.to(param_dtype)).float()
        full = torch.nn.functional.mse_loss(out, ys)
        ref_low.zero_grad(); full.backward()
        for p, q in zip(ref.parameters(), ref_low.parameters()):
            p.grad = q.grad.float()
        mine = torch.nn.functional.mse_loss(out[rank * 4:(rank + 1) * 4].detach(), ys[rank * 4:(rank + 1) * 4])
    else:
        out = ref(xs)
        full = torch.nn.functional.mse_loss(out, ys)
        ropt.zero_grad(); full.backward()
        mine = torch.nn.functional.mse_loss(out[rank * 4:(rank + 1) * 4].detach(), ys[rank * 4:(rank + 1) * 4])
    ropt.step()
    ref_losses.append(mine.item())
tol = dict(rtol=1e-5, atol=1e-6) if param_dtype == torch.float32 else dict(rtol=2e-2, atol=2e-2)
torch.testing.assert_close(torch.tensor(losses), torch.tensor(ref_losses), **tol)
for (name, p), q in zip(model.named_parameters(), ref.parameters()):
    full = p.full_tensor().cpu()
    assert full.dtype == torch.float32, (name, full.dtype)
    torch.testing.assert_close(full, q.detach(), **tol)
print("OK", rank, losses)
dist.destroy_process_group()
""")


def test_fsdp2_gradient_divide_factor():
    # A custom divide factor makes FSDP2 reduce-scatter with PREMUL_SUM(1/factor).
    run("""
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
mesh = init_device_mesh("neuron", (world,))
model = mlp().to(dev)
fully_shard(model, mesh=mesh)
model.set_gradient_divide_factor(8.0)
x, y = batch(0, rank)
torch.nn.functional.mse_loss(model(x.to(dev)), y.to(dev)).backward()
# Reference: sum over ranks of each rank's local gradient, divided by 8.
ref = mlp()
for r in range(world):
    xr, yr = batch(0, r)
    torch.nn.functional.mse_loss(ref(xr), yr).backward()
for (name, p), q in zip(model.named_parameters(), ref.parameters()):
    torch.testing.assert_close(p.grad.full_tensor().cpu(), q.grad / 8.0, rtol=1e-5, atol=1e-6, msg=name)
print("OK", rank)
dist.destroy_process_group()
""")


def test_dtensor_colwise_rowwise_tp():
    run("""
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
mesh = init_device_mesh("neuron", (world,))
model = parallelize_module(mlp().to(dev), mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
ref = mlp()
x, y = batch(0, 0)  # TP: every rank sees the same batch
out = model(x.to(dev))
loss = torch.nn.functional.mse_loss(out, y.to(dev))
loss.backward()
rout = ref(x)
rloss = torch.nn.functional.mse_loss(rout, y)
rloss.backward()
assert out.device == dev
torch.testing.assert_close(out.detach().cpu(), rout.detach(), rtol=1e-5, atol=1e-6)
for (name, p), q in zip(model.named_parameters(), ref.parameters()):
    torch.testing.assert_close(p.grad.full_tensor().cpu(), q.grad, rtol=1e-5, atol=1e-6, msg=name)
print("OK", rank)
dist.destroy_process_group()
""")


def _tiny_llama(path):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    LlamaForCausalLM(config).save_pretrained(path)


@pytest.mark.parametrize("layout", ["tp2", "tp2_fsdp2"])
def test_transformers_distributed_config_logits_match_cpu(tmp_path, layout):
    _tiny_llama(tmp_path)
    tp, fsdp, nproc = (2, 1, 2) if layout == "tp2" else (2, 2, 4)
    proc, _ = torchrun(f"""
import os, torch, torch.distributed as dist
from transformers import LlamaForCausalLM
from transformers.distributed import DistributedConfig
path = {str(tmp_path)!r}
ids = torch.arange(1, 17).reshape(2, 8) % 128
ref = LlamaForCausalLM.from_pretrained(path).eval()
with torch.no_grad():
    ref_logits = ref(ids).logits
cfg = DistributedConfig(tp_size={tp}, **({{"fsdp_size": {fsdp}}} if {fsdp} > 1 else {{}}))
model = LlamaForCausalLM.from_pretrained(path, distributed_config=cfg).eval()
rank, local = dist.get_rank(), int(os.environ["LOCAL_RANK"])
assert dist.group.WORLD._get_backend(torch.device("neuron")).name() == "neuron"
# Really sharded: each rank holds half of q_proj's output features.
w = model.model.layers[0].self_attn.q_proj.weight
shard = w.to_local() if hasattr(w, "to_local") else w
assert shard.shape[0] <= ref.model.layers[0].self_attn.q_proj.weight.shape[0] // 2, shard.shape
assert shard.device == torch.device("neuron", local), shard.device
with torch.no_grad():
    logits = model(ids.to(torch.device("neuron", local))).logits
logits = logits.full_tensor() if hasattr(logits, "full_tensor") else logits
assert logits.device == torch.device("neuron", local), logits.device
torch.testing.assert_close(logits.cpu(), ref_logits, rtol=1e-4, atol=1e-4)
print("OK", rank)
dist.destroy_process_group()
""", nproc=nproc, timeout=300, env={"NEURON_RT_NUM_CORES": str(nproc)})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    assert proc.stdout.count("OK") == nproc, proc.stdout[-3000:]


def test_accelerate_launch_multi_neuron(tmp_path):
    """accelerate launch --multi_gpu picks MULTI_NEURON and backend "neuron";
    each process gets neuron:LOCAL_RANK without set_device (the launcher
    default device), prepare() wraps the model in DDP, reduce/gather work."""
    import os
    import subprocess
    import sys

    from _common import free_port

    script = tmp_path / "job.py"
    script.write_text("""
import torch
from accelerate import Accelerator
from accelerate.utils import DistributedType
acc = Accelerator()
assert acc.state.distributed_type == DistributedType.MULTI_NEURON, acc.state.distributed_type
assert acc.state.backend == "neuron", acc.state.backend
rank = acc.process_index
assert acc.device == torch.device("neuron", acc.local_process_index), acc.device
assert torch.neuron.current_device() == acc.local_process_index
torch.manual_seed(0)
model = torch.nn.Linear(4, 2)
ref = torch.nn.Linear(4, 2)
ref.load_state_dict(model.state_dict())
opt = torch.optim.SGD(model.parameters(), lr=0.1)
model, opt = acc.prepare(model, opt)
assert isinstance(model, torch.nn.parallel.DistributedDataParallel)
x = torch.arange(8.0).reshape(2, 4) * (rank + 1)
acc.backward(model(x.to(acc.device)).sum())
xs = torch.cat([torch.arange(8.0).reshape(2, 4) * (r + 1) for r in range(acc.num_processes)])
ref(xs).sum().backward()
torch.testing.assert_close(model.module.weight.grad.cpu(), ref.weight.grad / acc.num_processes)
g = acc.gather(torch.tensor([float(rank)], device=acc.device))
assert g.cpu().tolist() == [0.0, 1.0], g
r = acc.reduce(torch.tensor([float(rank + 1)], device=acc.device), reduction="sum")
assert r.cpu().tolist() == [3.0], r
acc.wait_for_everyone()
print("OK", rank, flush=True)
acc.end_training()
""")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ)
    for key in ("NEURON_RT_NUM_CORES", "NEURON_RT_VISIBLE_CORES", "LOCAL_RANK", "RANK", "WORLD_SIZE"):
        env.pop(key, None)
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    env["HF_HOME"] = str(tmp_path / "hf")  # no user accelerate config
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
           "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
           "--main_process_port", str(free_port()), str(script)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    assert proc.stdout.count("OK") == 2, proc.stdout[-3000:]


def test_2d_mesh_world4():
    """A (2, 2) DeviceMesh ("fsdp", "tp") on 4 NeuronCores: per-dimension
    groups come from split() (each called once per bound device type), a
    flattened dimension, and a DTensor sharded on one dimension and
    replicated on the other."""
    proc, _ = torchrun("""
import os, torch, torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Replicate, Shard, distribute_tensor
local = int(os.environ["LOCAL_RANK"])
dist.init_process_group("neuron", device_id=torch.device("neuron", local))
rank = dist.get_rank()
mesh = init_device_mesh("neuron", (2, 2), mesh_dim_names=("fsdp", "tp"))
for name in ("fsdp", "tp"):
    group = mesh[name].get_group()
    ranks = dist.get_process_group_ranks(group)
    t = torch.full((3,), float(rank + 1), device="neuron")
    dist.all_reduce(t, group=group)
    torch.testing.assert_close(t.cpu(), torch.full((3,), float(sum(r + 1 for r in ranks))), msg=name)
flat = mesh._flatten("dp")
t = torch.full((2,), float(rank + 1), device="neuron")
dist.all_reduce(t, group=flat.get_group())
torch.testing.assert_close(t.cpu(), torch.full((2,), 10.0))
torch.manual_seed(0)
full = torch.randn(8, 4)
d = distribute_tensor(full.to("neuron"), mesh, [Shard(0), Replicate()])
assert d.to_local().shape == (4, 4) and d.to_local().device == torch.device("neuron", local)
torch.testing.assert_close(d.full_tensor().cpu(), full)
torch.testing.assert_close(d.redistribute(mesh, [Replicate(), Shard(1)]).full_tensor().cpu(), full)
print("OK", rank)
dist.destroy_process_group()
""", nproc=4, timeout=300, env={"NEURON_RT_NUM_CORES": "4"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    assert proc.stdout.count("OK") == 4, proc.stdout[-3000:]


def test_compiled_functional_collectives():
    """torch.compile(backend="neuron") of functional collectives: compiled
    results equal eager and the expected reductions."""
    run("""
import torch.distributed._functional_collectives as funcol
def f(x):
    s = funcol.all_reduce(x * 2, "sum", dist.group.WORLD)
    g = funcol.all_gather_tensor(x + 1, 0, dist.group.WORLD)
    r = funcol.reduce_scatter_tensor(g * 3, "sum", 0, dist.group.WORLD)
    return s + 1, g, r
x = torch.arange(4.0, device=dev) + 10 * rank
eager = f(x)
compiled = torch.compile(f, backend="neuron")(x)
xs = [torch.arange(4.0) + 10 * r for r in range(world)]
expected = (sum(2 * v for v in xs) + 1, torch.cat([v + 1 for v in xs]),
            (torch.cat([v + 1 for v in xs]) * 3 * world)[4 * rank:4 * (rank + 1)])
for e, c, want in zip(eager, compiled, expected):
    assert c.device == dev, c.device
    torch.testing.assert_close(c.cpu(), e.cpu())
    torch.testing.assert_close(c.cpu(), want)
print("OK", rank)
dist.destroy_process_group()
""")


def test_fsdp2_dcp_save_zero_load(tmp_path):
    """Distributed checkpoint of an FSDP2 model: save, zero, load restores the
    shards (plans travel by object collectives over the cpu binding)."""
    run(f"""
import torch.distributed.checkpoint as dcp
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
mesh = init_device_mesh("neuron", (world,))
model = mlp().to(dev)
fully_shard(model, mesh=mesh)
saved = {{k: v.full_tensor().cpu().clone() for k, v in model.state_dict().items()}}
dcp.save({{"model": model.state_dict()}}, checkpoint_id={str(tmp_path / "ckpt")!r})
with torch.no_grad():
    for p in model.parameters():
        p.zero_()
assert all(v.full_tensor().abs().sum().item() == 0 for v in model.state_dict().values())
state = {{"model": model.state_dict()}}
dcp.load(state, checkpoint_id={str(tmp_path / "ckpt")!r})
for k, v in model.state_dict().items():
    assert v.to_local().device == dev, (k, v.to_local().device)
    torch.testing.assert_close(v.full_tensor().cpu(), saved[k], rtol=0, atol=0, msg=k)
print("OK", rank)
dist.destroy_process_group()
""")
