"""Diffusers on ``neuron``: tiny random pipelines (built from configs, no Hub
access) run 2 denoising steps on CPU and on neuron with the same CPU
generator; images and latents must match. Also: the transformer/UNet under
``torch.compile(fullgraph=True)`` (one graph, no recompiles), CPU offload
hooks targeting neuron, and one LoRA training step against CPU.

Every pipeline's denoiser is compiled with both backends (about 5 minutes).
"""
import copy
import gc
import os
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from conftest import assert_same
from diffusers_tiny import BUILDERS, flux_transformer, qwen_transformer, sd_unet

PROMPTS = ("a photo of a cat", "a photo of a dog")  # same token count: same shapes
FP32 = dict(atol=1e-5, rtol=1e-5)


def _run(pipe, kwargs, prompt=PROMPTS[0], output_type="pt"):
    pipe.set_progress_bar_config(disable=True)
    out = pipe(prompt=prompt, num_inference_steps=2, generator=torch.Generator("cpu").manual_seed(0),
               output_type=output_type, **kwargs)
    return out[0]


def _denoiser_attr(pipe):
    return "unet" if hasattr(pipe, "unet") else "transformer"


# ---- device detection and random draws (Diffusers' own neuron code paths) -------------------------


def test_diffusers_detects_neuron():
    from diffusers.utils.torch_utils import TorchDeviceBackend

    # Diffusers asks torch.accelerator first; neuron must answer there.
    assert TorchDeviceBackend._detect_device_type() == "neuron"
    pipe, _ = BUILDERS["sd"]()
    pipe.to("neuron")
    assert pipe._execution_device.type == "neuron"


def test_randn_tensor_on_neuron_draws_on_cpu():
    from diffusers.utils.torch_utils import randn_tensor

    shape = (2, 4, 8, 8)
    got = randn_tensor(shape, generator=torch.Generator("cpu").manual_seed(3), device=torch.device("neuron"))
    assert_same(got, torch.randn(shape, generator=torch.Generator("cpu").manual_seed(3)), atol=0, rtol=0)


def test_neuron_generator_is_refused_clearly():
    # Diffusers 0.42.1 draws neuron latents on CPU but keeps the generator: a neuron generator
    # fails with ATen's device check (documented in docs/diffusers.md), never with garbage.
    from diffusers.utils.torch_utils import randn_tensor

    with pytest.raises(RuntimeError, match="Expected a 'cpu' device type for generator"):
        randn_tensor((2, 3), generator=torch.Generator("neuron").manual_seed(0), device=torch.device("neuron"))


# ---- eager pipelines --------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(BUILDERS))
def test_pipeline_eager_matches_cpu(name):
    pipe, kwargs = BUILDERS[name]()
    ref_latents = _run(pipe, kwargs, output_type="latent")
    ref_image = _run(pipe, kwargs)
    assert ref_image.std() > 0.01  # a real image, not a constant
    pipe.to("neuron")
    assert_same(_run(pipe, kwargs, output_type="latent"), ref_latents, **FP32)
    assert_same(_run(pipe, kwargs), ref_image, **FP32)


@pytest.mark.parametrize("name", sorted(BUILDERS))
def test_pipeline_bf16_matches_cpu(name):
    # The same bf16 host kernels run on the same data (attention included), so the latents agree to
    # within one bf16 rounding step (measured: bit-identical for all six pipelines).
    pipe, kwargs = BUILDERS[name]()
    pipe.to(torch.bfloat16)
    ref = _run(pipe, kwargs, output_type="latent")
    pipe.to("neuron")
    got = _run(pipe, kwargs, output_type="latent")
    assert got.dtype == torch.bfloat16
    assert_same(got, ref, atol=1e-2, rtol=2**-7)


# ---- compiled denoiser --------------------------------------------------------------------------------


def _check_compiled(name, backend):
    from torch._dynamo.testing import CompileCounterWithBackend
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    pipe, kwargs = BUILDERS[name]()
    pipe.to("neuron")
    eager = [_run(pipe, kwargs, prompt) for prompt in PROMPTS]
    attr = _denoiser_attr(pipe)
    cnt = CompileCounterWithBackend(backend)
    setattr(pipe, attr, torch.compile(getattr(pipe, attr), backend=cnt, fullgraph=True))
    compiled = [_run(pipe, kwargs, prompt) for prompt in PROMPTS]
    # Two prompts x 2 steps (x CFG branches) reuse one graph: no recompiles, no graph breaks.
    assert cnt.frame_count == 1, f"{cnt.frame_count} graphs compiled"
    assert cnt.op_count > 0
    assert not counters["graph_break"], dict(counters["graph_break"])
    assert counters["stats"]["unique_graphs"] == 1
    for got, want in zip(compiled, eager):
        assert got.device.type == "neuron"
        torch.testing.assert_close(got.cpu(), want.cpu(), **FP32)


@pytest.mark.parametrize("backend", ["neuron", "inductor"])
@pytest.mark.parametrize("name", sorted(BUILDERS))
def test_compiled_denoiser(name, backend):
    _check_compiled(name, backend)


def test_flux_transformer_aoti_matches_cpu(tmp_path):
    # torch.export + AOTInductor of a FLUX transformer on neuron (issue 11 §1):
    # the package runs through the neuron AOTI model runner, equal to eager CPU.
    cpu = flux_transformer().eval()
    dev = flux_transformer().eval().to("neuron")
    torch.manual_seed(0)
    seq, txt = 16, 8
    img_ids = torch.stack([torch.zeros(seq), torch.arange(seq) // 4, torch.arange(seq) % 4], dim=-1)
    inputs = dict(hidden_states=torch.randn(1, seq, 4), encoder_hidden_states=torch.randn(1, txt, 32),
                  pooled_projections=torch.randn(1, 32), timestep=torch.tensor([0.5]), img_ids=img_ids,
                  txt_ids=torch.zeros(txt, 3))
    on_dev = {k: v.to("neuron") for k, v in inputs.items()}
    ep = torch.export.export(dev, (), {**on_dev, "return_dict": False})
    path = torch._inductor.aoti_compile_and_package(ep, package_path=str(tmp_path / "flux.pt2"))
    model = torch._inductor.aoti_load_package(path)
    with torch.no_grad():
        want = cpu(**inputs, return_dict=False)[0]
    got = model(**on_dev, return_dict=False)[0]
    assert_same(got, want, **FP32)


# ---- memory: CPU offload onto neuron --------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["model", "sequential"])
def test_cpu_offload(mode):
    pipe, kwargs = BUILDERS["flux"]()
    ref = _run(pipe, kwargs)
    weight_bytes = sum(p.numel() * p.element_size() for c in pipe.components.values()
                       if isinstance(c, torch.nn.Module) for p in c.parameters())

    gc.collect()
    base = torch.neuron.memory_allocated()  # what earlier tests left alive
    pipe.to("neuron")
    torch.neuron.reset_peak_memory_stats()
    _run(pipe, kwargs)
    full_peak = torch.neuron.max_memory_allocated() - base
    del pipe
    gc.collect()

    pipe, kwargs = BUILDERS["flux"]()
    getattr(pipe, f"enable_{mode}_cpu_offload")(device="neuron")
    assert pipe._execution_device.type == "neuron"
    base = torch.neuron.memory_allocated()
    torch.neuron.reset_peak_memory_stats()
    image = _run(pipe, kwargs)
    peak = torch.neuron.max_memory_allocated() - base
    assert_same(image, ref, **FP32)
    assert peak < full_peak, (peak, full_peak)
    if mode == "sequential":  # one layer's weights at a time: never the whole model
        assert peak < weight_bytes, (peak, weight_bytes)


# ---- training: one LoRA step ------------------------------------------------------------------------------


def _flux_batch(gen):
    b, h, w, txt = 2, 4, 4, 6
    latents = torch.randn(b, h * w, 4, generator=gen)
    rows, cols = torch.meshgrid(torch.arange(h, dtype=torch.float32), torch.arange(w, dtype=torch.float32),
                                indexing="ij")
    img_ids = torch.stack([torch.zeros_like(rows), rows, cols], -1)
    return latents, dict(encoder_hidden_states=torch.randn(b, txt, 32, generator=gen),
                         pooled_projections=torch.randn(b, 32, generator=gen),
                         img_ids=img_ids.reshape(-1, 3), txt_ids=torch.zeros(txt, 3))


def _qwen_batch(gen):
    b, h, w, txt = 2, 4, 4, 6
    latents = torch.randn(b, h * w, 16, generator=gen)
    return latents, dict(encoder_hidden_states=torch.randn(b, txt, 16, generator=gen),
                         encoder_hidden_states_mask=torch.ones(b, txt, dtype=torch.long),
                         img_shapes=[[(1, h, w)]] * b)


def _flow_matching_loss(model, latents, cond, gen):
    """Rectified-flow objective of Diffusers' Flux/Qwen-Image LoRA scripts:
    x_t = (1 - s) x0 + s noise, target = noise - x0, MSE in fp32."""
    noise = torch.randn(latents.shape, generator=gen)
    sigmas = torch.rand(latents.shape[0], generator=gen)
    dev = next(model.parameters()).device
    x0, noise, sigmas = latents.to(dev), noise.to(dev), sigmas.to(dev)
    noisy = (1 - sigmas[:, None, None]) * x0 + sigmas[:, None, None] * noise
    cond = {k: v.to(dev) if isinstance(v, torch.Tensor) else v for k, v in cond.items()}
    pred = model(hidden_states=noisy, timestep=sigmas, return_dict=False, **cond)[0]
    return F.mse_loss(pred.float(), (noise - x0).float())


def _epsilon_loss(model, latents, cond, gen):
    """Noise-prediction objective of Diffusers' SD LoRA script (DDPM add_noise, epsilon target)."""
    from diffusers import DDPMScheduler

    sched = DDPMScheduler(beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear")
    noise = torch.randn(latents.shape, generator=gen)
    t = torch.randint(0, sched.config.num_train_timesteps, (latents.shape[0],), generator=gen)
    dev = next(model.parameters()).device
    latents, noise, t = latents.to(dev), noise.to(dev), t.to(dev)
    noisy = sched.add_noise(latents, noise, t)  # on the model's device, as the training scripts do
    pred = model(noisy, t, cond["encoder_hidden_states"].to(dev), return_dict=False)[0]
    return F.mse_loss(pred.float(), noise.float())


def _sd_batch(gen):
    return torch.randn(2, 4, 16, 16, generator=gen), dict(encoder_hidden_states=torch.randn(2, 7, 32, generator=gen))


LORA_CASES = {
    "flux": (flux_transformer, _flux_batch, _flow_matching_loss, ["to_q", "to_k", "to_v", "to_out.0"]),
    "qwenimage": (qwen_transformer, _qwen_batch, _flow_matching_loss, ["to_q", "to_k", "to_v", "to_out.0"]),
    "sd-unet": (sd_unet, _sd_batch, _epsilon_loss, ["to_q", "to_k", "to_v", "to_out.0"]),
}


@pytest.mark.parametrize("name", sorted(LORA_CASES))
def test_lora_step_matches_cpu(name):
    from peft import LoraConfig

    build, batch, loss_fn, targets = LORA_CASES[name]
    model = build()
    model.requires_grad_(False)
    model.add_adapter(LoraConfig(r=4, lora_alpha=4, init_lora_weights="gaussian", target_modules=targets))
    # LoRA B starts at zero, which would leave A without gradient: give it trained-looking values.
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if "lora_B" in pname:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.1)
    model.train()
    neuron_model = copy.deepcopy(model).to("neuron")

    results = {}
    for dev, m in (("cpu", model), ("neuron", neuron_model)):
        gen = torch.Generator().manual_seed(0)
        latents, cond = batch(gen)
        loss = loss_fn(m, latents, cond, gen)
        loss.backward()
        opt = torch.optim.AdamW([p for p in m.parameters() if p.requires_grad], lr=1e-3)
        grads = {n: p.grad.clone() for n, p in m.named_parameters() if p.requires_grad}
        opt.step()
        results[dev] = loss.detach(), grads, {n: p.detach() for n, p in m.named_parameters() if p.requires_grad}

    (loss_c, grads_c, params_c), (loss_n, grads_n, params_n) = results["cpu"], results["neuron"]
    assert_same(loss_n, loss_c, **FP32)
    assert grads_c and grads_c.keys() == grads_n.keys()
    assert all("lora" in n for n in grads_c)  # only the adapters train
    assert any(g.abs().sum() > 0 for n, g in grads_c.items() if "lora_A" in n)
    for n in grads_c:
        assert_same(grads_n[n], grads_c[n], atol=1e-5, rtol=1e-4, msg=n)
        assert_same(params_n[n], params_c[n], **FP32, msg=n)


# ---- examples/diffusion.py ----------------------------------------------------------------------------------


@pytest.fixture
def example():
    """examples/diffusion.py imported in this process (its main takes argv), so the runs share
    the already imported torch/Diffusers instead of paying for a fresh interpreter each."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
    try:
        import diffusion

        yield diffusion
    finally:
        sys.path.pop(0)


def test_example_tiny_pipeline_says_noise_and_matches_cpu(example, tmp_path, capsys):
    from PIL import Image

    assert example.main(["--steps", "2", "--output", str(tmp_path / "neuron.png")]) == 0
    out = capsys.readouterr()
    assert "RANDOM weights" in out.out and "noise" in out.out
    assert "2/2" in out.err  # Diffusers' own per-step progress bar
    # Round trip through a local model directory, then the same run on CPU.
    example.main(["--save-tiny", str(tmp_path / "tiny")])
    size = ["--height", "32", "--width", "32"]  # the tiny pipeline's default, not the loaded config's
    model = ["--model", str(tmp_path / "tiny"), "--steps", "2", *size]
    example.main([*model, "--output", str(tmp_path / "loaded.png")])
    example.main([*model, "--device", "cpu", "--output", str(tmp_path / "cpu.png")])
    pixels = [torch.tensor(list(Image.open(tmp_path / f).getdata())) for f in ("neuron.png", "loaded.png", "cpu.png")]
    assert pixels[0].float().std() > 1  # not a flat image
    for got in pixels[:2]:
        assert (got - pixels[2]).abs().max() <= 1  # uint8 rounding of fp32-equal images


@pytest.mark.parametrize("args,message", [
    (["--tp", "2"], "--tp 2 needs 2 processes"),
    (["--model", "/nonexistent"], "not a Diffusers pipeline directory"),
    (["--device", "nowhere"], "--device nowhere:"),
])
def test_example_rejects_bad_arguments(example, args, message):
    with pytest.raises(SystemExit, match=message):
        example.main(args)
