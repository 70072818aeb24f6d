"""Diffusers' tensor and context parallelism on the neuron backend (world 2, torchrun).

Tiny FLUX.1, FLUX.2 and Qwen-Image transformers (2 attention heads: one per
rank) run one forward through Diffusers 0.42.1's ``enable_parallelism``. Each
rank compares its output with the same model run unsharded on CPU in the same
process (fp32, ``atol=rtol=1e-5``). The eager cases share one torchrun job (one
launch, one import of Diffusers); every case reports its own line, so one
failing case does not hide the others.
"""
import os
import re

import pytest

from _common import torchrun

pytestmark = pytest.mark.distributed

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLES = os.path.join(os.path.dirname(TESTS), "examples")
# Compiled TP of FLUX.2 and Qwen-Image repeat FLUX.1's compiled case on other models.
slow = pytest.mark.skipif(os.environ.get("TORCH_NEURONX_SLOW") != "1", reason="slow: set TORCH_NEURONX_SLOW=1")
STEPS = ["--steps", "2", "--height", "32", "--width", "32"]
MODELS = ("flux", "flux2", "qwenimage")
FP32 = "atol=1e-5, rtol=1e-5"

# Shared by the jobs: tiny transformers, one input batch, the CPU reference.
PRELUDE = f"""
import os, sys, torch, torch.distributed as dist
sys.path.insert(0, {TESTS!r})
from diffusers import ContextParallelConfig, TensorParallelConfig, attention_backend
from diffusers_tiny import flux_transformer, flux2_transformer

from datetime import timedelta

local = int(os.environ["LOCAL_RANK"])
# A short timeout: a case that desynchronizes the ranks ends the job in a minute, not 30.
dist.init_process_group("neuron", device_id=torch.device("neuron", local), timeout=timedelta(seconds=60))
rank = dist.get_rank()
dev = torch.device("neuron", local)


def qwen_transformer():
    # diffusers_tiny's Qwen-Image has 3 heads; TP and Ulysses split heads across 2 ranks.
    from diffusers import QwenImageTransformer2DModel

    torch.manual_seed(0)
    return QwenImageTransformer2DModel(patch_size=2, in_channels=16, out_channels=4, num_layers=2,
                                       attention_head_dim=16, num_attention_heads=2, joint_attention_dim=16,
                                       guidance_embeds=False, axes_dims_rope=(8, 4, 4))


BUILD = {{"flux": flux_transformer, "flux2": flux2_transformer, "qwenimage": qwen_transformer}}
H = W = 4  # 16 image tokens and 6 text tokens: both split evenly across 2 ranks
TXT = 6


def inputs(name, seed, mask=True):
    g = torch.Generator().manual_seed(seed)
    t = torch.tensor([0.5])
    if name == "flux":
        rows, cols = torch.meshgrid(torch.arange(H * 1.0), torch.arange(W * 1.0), indexing="ij")
        img_ids = torch.stack([torch.zeros_like(rows), rows, cols], -1).reshape(-1, 3)
        return dict(hidden_states=torch.randn(1, H * W, 4, generator=g),
                    encoder_hidden_states=torch.randn(1, TXT, 32, generator=g),
                    pooled_projections=torch.randn(1, 32, generator=g), img_ids=img_ids,
                    txt_ids=torch.zeros(TXT, 3), timestep=t)
    if name == "flux2":  # (t, h, w, l) position ids with a batch dimension
        _, rows, cols, _ = torch.meshgrid(torch.arange(1.0), torch.arange(H * 1.0), torch.arange(W * 1.0),
                                          torch.arange(1.0), indexing="ij")
        img_ids = torch.stack([torch.zeros_like(rows), rows, cols, torch.zeros_like(rows)], -1).reshape(1, -1, 4)
        txt_ids = torch.zeros(1, TXT, 4)
        txt_ids[..., 3] = torch.arange(TXT)
        return dict(hidden_states=torch.randn(1, H * W, 4, generator=g),
                    encoder_hidden_states=torch.randn(1, TXT, 16, generator=g),
                    img_ids=img_ids, txt_ids=txt_ids, timestep=t, guidance=torch.tensor([4.0]))
    # The pipeline passes no mask when every text token is valid (native flash attention takes none).
    return dict(hidden_states=torch.randn(1, H * W, 16, generator=g),
                encoder_hidden_states=torch.randn(1, TXT, 16, generator=g),
                encoder_hidden_states_mask=torch.ones(1, TXT, dtype=torch.long) if mask else None,
                timestep=t, img_shapes=[[(1, H, W)]])


def to_dev(kwargs):
    return {{k: v.to(dev) if torch.is_tensor(v) else v for k, v in kwargs.items()}}


def cpu_reference(name, kwargs):
    with torch.no_grad():
        return BUILD[name]().eval()(**kwargs, return_dict=False)[0]


def say(line):
    os.write(1, (line + "\\n").encode())  # one write: the two ranks share stdout


def check(got, want):
    assert got.device == dev, got.device
    torch.testing.assert_close(got.cpu(), want, {FP32})
    return float((got.cpu() - want).abs().max())
"""

EAGER_JOB = PRELUDE + """
def seen_sequence(model):
    # Length of the image sequence the first attention layer receives: half of it under CP.
    attn = model.transformer_blocks[0].attn
    seen = []
    attn.register_forward_pre_hook(
        lambda m, args, kw: seen.append((kw.get("hidden_states", args[0] if args else None)).shape[1]),
        with_kwargs=True)
    return seen


def tp(name):
    model = BUILD[name]().eval()
    model.enable_parallelism(config=TensorParallelConfig(tp_degree=2))
    model.to(dev)
    w = model.transformer_blocks[0].attn.to_q.weight
    full = BUILD[name]().transformer_blocks[0].attn.to_q.weight
    # Really sharded: each rank holds its half of to_q's output rows, on its own device.
    assert w.to_local().shape[0] == full.shape[0] // 2 and w.to_local().device == dev, (w.to_local().shape, w.device)
    torch.testing.assert_close(w.to_local().cpu(), full.detach().chunk(2)[rank], rtol=0, atol=0)
    kwargs = inputs(name, 1)
    with torch.no_grad():
        got = model(**to_dev(kwargs), return_dict=False)[0]
    return check(got, cpu_reference(name, kwargs))


def cp(name, config, backend="native", mask=True):
    model = BUILD[name]().eval().to(dev)
    kwargs = inputs(name, 2, mask=mask)
    # The context manager, not model.set_attention_backend: that also changes the global default.
    with attention_backend(backend), torch.no_grad():
        model.enable_parallelism(config=config)
        seen = seen_sequence(model)
        got = model(**to_dev(kwargs), return_dict=False)[0]
    assert seen == [H * W // 2], seen  # each rank attends from its half of the image tokens
    return check(got, cpu_reference(name, kwargs))


CASES = {}
for name in ("flux", "flux2", "qwenimage"):
    CASES[f"tp-{name}"] = lambda name=name: tp(name)
    CASES[f"ulysses-{name}"] = lambda name=name: cp(name, ContextParallelConfig(ulysses_degree=2))
    # Ring attention merges partial results by their log-sum-exp; Diffusers' native (SDPA) backend
    # returns none, so ring runs on its "_native_flash" backend (aten::_scaled_dot_product_flash_attention).
    CASES[f"ring-{name}"] = lambda name=name: cp(name, ContextParallelConfig(ring_degree=2), "_native_flash",
                                                 mask=False)

for case, fn in CASES.items():
    try:
        say(f"CASE {case} rank{rank} OK maxdiff={fn():.3g}")
    except Exception as e:  # noqa: BLE001 - reported per case, the job goes on
        say(f"CASE {case} rank{rank} FAIL {type(e).__name__}: {str(e).splitlines()[0][:300]}")
    dist.barrier()
dist.destroy_process_group()
"""


@pytest.fixture(scope="module")
def eager_results():
    proc, _ = torchrun(EAGER_JOB, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    results = {}
    for case, rank, status, detail in re.findall(r"^CASE (\S+) (rank\d) (OK|FAIL) (.*)$", proc.stdout, re.M):
        results.setdefault(case, {})[rank] = (status, detail)
    return results


def _case(results, case):
    got = results.get(case, {})
    assert set(got) == {"rank0", "rank1"}, f"{case}: no result from every rank: {got}"
    return got


@pytest.mark.parametrize("mode", ["tp", "ulysses"])
@pytest.mark.parametrize("model", MODELS)
def test_parallel_forward_matches_cpu(eager_results, model, mode):
    """TensorParallelConfig(tp_degree=2) and ContextParallelConfig(ulysses_degree=2):
    every rank's output equals the unsharded CPU forward."""
    for rank, (status, detail) in _case(eager_results, f"{mode}-{model}").items():
        assert status == "OK", f"{rank}: {detail}"


@pytest.mark.parametrize("model", MODELS)
def test_ring_attention(eager_results, model):
    """ContextParallelConfig(ring_degree=2). Ring needs an attention op that returns
    the log-sum-exp: Diffusers' "_native_flash" backend calls
    aten::_scaled_dot_product_flash_attention (csrc/aten/Attention.cpp)."""
    for rank, (status, detail) in _case(eager_results, f"ring-{model}").items():
        assert status == "OK", f"{rank}: {detail}"


COMPILED_JOB = PRELUDE + """
from torch._dynamo.testing import CompileCounterWithBackend
from torch._dynamo.utils import counters

name = os.environ["MODEL"]
model = BUILD[name]().eval()
model.enable_parallelism(config=TensorParallelConfig(tp_degree=2))
model.to(dev)
cnt = CompileCounterWithBackend("neuron")
compiled = torch.compile(model, backend=cnt, fullgraph=True)
# Two inputs of the same shape (two denoising steps): one graph, no recompile.
for seed in (1, 2):
    kwargs = inputs(name, seed)
    with torch.no_grad():
        got = compiled(**to_dev(kwargs), return_dict=False)[0]
        eager = model(**to_dev(kwargs), return_dict=False)[0]
    diff = check(got, cpu_reference(name, kwargs))
    torch.testing.assert_close(got.cpu(), eager.cpu(), """ + FP32 + """)
assert cnt.frame_count == 1, f"{cnt.frame_count} graphs"
assert not counters["graph_break"], dict(counters["graph_break"])
say(f"OK rank{rank} maxdiff={diff:.3g} ops={cnt.op_count}")
dist.destroy_process_group()
"""


@pytest.mark.parametrize("model", ["flux", pytest.param("flux2", marks=slow), pytest.param("qwenimage", marks=slow)])
def test_tensor_parallel_compiled(model):
    """The TP transformer under torch.compile(fullgraph=True, backend="neuron"):
    one graph for two steps, output equal to eager TP and to the CPU run."""
    proc, _ = torchrun(COMPILED_JOB, timeout=600, env={"MODEL": model})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    assert proc.stdout.count("OK rank") == 2, proc.stdout[-3000:]


def _example_tp(tmp_path, args, output):
    """Runs examples/diffusion.py --tp 2 (one main() per process: a torchrun job cannot re-create
    its default group, as Gloo's rendezvous keys of the first one are still in the store)."""
    script = f"""
import sys
sys.path.insert(0, {EXAMPLES!r})
import diffusion
sys.exit(diffusion.main(["--tp", "2", *{STEPS!r}, *{args!r}, "--output", {str(tmp_path / output)!r}]))
"""
    proc, _ = torchrun(script, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    assert proc.stdout.count("on 2 NeuronCores (tensor parallel)") == 1, proc.stdout  # rank 0 reports
    assert "2/2" in proc.stderr  # Diffusers' own per-step progress bar
    return proc


def _cpu_image(tmp_path, args):
    import sys

    sys.path.insert(0, EXAMPLES)
    try:
        import diffusion
    finally:
        sys.path.pop(0)
    assert diffusion.main([*args, *STEPS, "--device", "cpu", "--output", str(tmp_path / "cpu.png")]) == 0
    return _pixels(tmp_path / "cpu.png")


def _pixels(path):
    import torch
    from PIL import Image

    return torch.tensor(list(Image.open(path).getdata()))


def test_example_tensor_parallel_matches_cpu(tmp_path):
    """examples/diffusion.py --tp 2 under torchrun, no model: the tiny FLUX pipeline, its
    transformer sharded with enable_parallelism; rank 0 saves the single-process CPU image."""
    proc = _example_tp(tmp_path, [], "tp.png")
    assert "RANDOM weights" in proc.stdout and "noise" in proc.stdout
    ref = _cpu_image(tmp_path, ["--tiny", "flux"])
    assert ref.float().std() > 1  # not a flat image
    assert (_pixels(tmp_path / "tp.png") - ref).abs().max() <= 1  # uint8 rounding of fp32-equal images


def test_example_tensor_parallel_from_model_dir(tmp_path):
    """--model DIR --tp 2: the transformer comes from from_pretrained(parallel_config=...), each
    rank reading only its slice of the planned weights."""
    import sys

    sys.path.insert(0, EXAMPLES)
    try:
        import diffusion
    finally:
        sys.path.pop(0)
    assert diffusion.main(["--tiny", "flux", "--save-tiny", str(tmp_path / "tiny")]) == 0
    _example_tp(tmp_path, ["--model", str(tmp_path / "tiny")], "tp.png")
    ref = _cpu_image(tmp_path, ["--model", str(tmp_path / "tiny")])
    assert (_pixels(tmp_path / "tp.png") - ref).abs().max() <= 1
