#!/usr/bin/env python3
"""Denoising-step time of a FLUX-style transformer (Diffusers' ``FluxTransformer2DModel``,
random weights) on ``neuron`` against CPU, eager and compiled.

One step = one transformer forward under ``no_grad`` on a batch of 1 (packed latents,
text embeddings, timestep, position ids), then ``synchronize``: what a pipeline's
denoising loop does per step without classifier-free guidance.

Variants, all built from the same seed in one process:

* ``eager-cpu`` / ``eager-neuron``        -- the model as is
* ``compiled-cpu``                         -- ``torch.compile(m, fullgraph=True)`` (Inductor)
* ``compiled-neuron``                      -- ``torch.compile(m, backend="neuron", fullgraph=True)``

Method. One worker process per thread count (``--threads``, default ``default,1``:
torch's default and 1 thread; Inductor fixes the OpenMP thread count when it generates
code, so thread counts do not share a process). A worker builds the four variants,
warms each up (the first compiled call compiles; its time is reported as compile time),
checks the compiled outputs against eager, then times them in ``--samples`` alternating
rounds of ``--inner`` steps, so drift on a shared machine hits all variants alike. The
median per step is reported, with neuron/CPU ratios for eager and compiled.

Examples::

    nice -n 10 python benchmarks/diffusion.py
    python benchmarks/diffusion.py --blocks 8 --hidden 1024 --latent 64      # the full-size case
    python benchmarks/diffusion.py --quick --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time

VARIANTS = ("eager-cpu", "eager-neuron", "compiled-cpu", "compiled-neuron")


def build(args, device):
    """(model, inputs) for a FLUX-style transformer: ``--blocks`` split evenly into
    double-stream (joint) and single-stream blocks, ``--hidden`` = heads x 128."""
    import torch
    from diffusers import FluxTransformer2DModel

    head_dim = 128 if args.hidden >= 128 else args.hidden // 2
    double = args.blocks // 2
    torch.manual_seed(0)
    model = FluxTransformer2DModel(patch_size=1, in_channels=64, num_layers=double,
                                   num_single_layers=args.blocks - double, attention_head_dim=head_dim,
                                   num_attention_heads=args.hidden // head_dim, joint_attention_dim=args.text_dim,
                                   pooled_projection_dim=768, guidance_embeds=True,
                                   axes_dims_rope=[head_dim // 8, 7 * head_dim // 16, 7 * head_dim // 16])
    model.eval()
    # 16-channel latents of latent x latent, packed 2x2 as FluxPipeline does: (latent/2)^2 tokens of 64.
    side = args.latent // 2
    g = torch.Generator().manual_seed(1)
    rows, cols = torch.meshgrid(torch.arange(side, dtype=torch.float32), torch.arange(side, dtype=torch.float32),
                                indexing="ij")
    inputs = dict(
        hidden_states=torch.randn(1, side * side, 64, generator=g),
        encoder_hidden_states=torch.randn(1, args.text_len, args.text_dim, generator=g),
        pooled_projections=torch.randn(1, 768, generator=g),
        timestep=torch.tensor([0.5]),
        guidance=torch.tensor([3.5]),
        img_ids=torch.stack([torch.zeros_like(rows), rows, cols], -1).reshape(-1, 3),
        txt_ids=torch.zeros(args.text_len, 3),
    )
    return model.to(device), {k: v.to(device) for k, v in inputs.items()}


def worker(args) -> dict:
    import torch
    import torch_neuronx  # noqa: F401  (registers the device and the "neuron" backend)

    if args.threads != "default":
        torch.set_num_threads(int(args.threads))
    torch.set_grad_enabled(False)
    variants, compile_s, outputs = {}, {}, {}
    for name in VARIANTS:
        device = name.split("-")[1]
        model, inputs = build(args, device)
        if name.startswith("compiled"):
            backend = "neuron" if device == "neuron" else "inductor"
            model = torch.compile(model, backend=backend, fullgraph=True)

        def step(m=model, x=inputs, device=device):
            out = m(**x, return_dict=False)[0]
            if device == "neuron":
                torch.neuron.synchronize()
            return out

        start = time.perf_counter()
        outputs[name] = step().cpu()
        compile_s[name] = time.perf_counter() - start
        variants[name] = step
    ref = outputs["eager-cpu"]
    max_diff = {name: (out - ref).abs().max().item() for name, out in outputs.items()}

    times = {name: [] for name in VARIANTS}
    for _ in range(args.samples):
        for name in VARIANTS:
            start = time.perf_counter()
            for _ in range(args.inner):
                variants[name]()
            times[name].append((time.perf_counter() - start) / args.inner)
    return {
        "threads": args.threads if args.threads != "default" else f"default ({torch.get_num_threads()})",
        "step_ms": {name: statistics.median(t) * 1e3 for name, t in times.items()},
        "first_call_s": compile_s,
        "max_abs_diff_vs_eager_cpu": max_diff,
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--blocks", type=int, default=8, help="transformer blocks (half double-, half single-stream)")
    p.add_argument("--hidden", type=int, default=512, help="hidden size (heads x 128)")
    p.add_argument("--latent", type=int, default=32, help="latent side (16 channels; packed 2x2 into tokens)")
    p.add_argument("--text-len", type=int, default=64)
    p.add_argument("--text-dim", type=int, default=512)
    p.add_argument("--threads", default="default,1", help="comma-separated: 'default' and/or integers")
    p.add_argument("--samples", type=int, default=5)
    p.add_argument("--inner", type=int, default=2)
    p.add_argument("--quick", action="store_true", help="2 samples of 1 step")
    p.add_argument("--json", help="write the results here")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.quick:
        args.samples, args.inner = 2, 1

    if args.worker:
        print(json.dumps(worker(args)))
        return 0

    results = []
    for threads in args.threads.split(","):
        cmd = [sys.executable, __file__, "--worker", "--threads", threads, "--blocks", str(args.blocks),
               "--hidden", str(args.hidden), "--latent", str(args.latent), "--text-len", str(args.text_len),
               "--text-dim", str(args.text_dim), "--samples", str(args.samples), "--inner", str(args.inner)]
        env = dict(os.environ, TORCHINDUCTOR_COMPILE_THREADS="1")
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
        if proc.returncode != 0:
            sys.stderr.write(proc.stderr)
            return proc.returncode
        results.append(json.loads(proc.stdout.strip().splitlines()[-1]))

    tokens = (args.latent // 2) ** 2 + args.text_len
    print(f"FLUX-style transformer: {args.blocks} blocks, hidden {args.hidden}, {args.latent}x{args.latent} "
          f"latents ({tokens} tokens incl. {args.text_len} text), batch 1, fp32; "
          f"median of {args.samples} x {args.inner} steps")
    print("| threads | eager cpu ms | eager neuron ms | eager neuron/cpu | compiled cpu ms | compiled neuron ms "
          "| compiled neuron/cpu | compiled vs eager (neuron) | first call s (cpu / neuron compiled) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in results:
        t, c = r["step_ms"], r["first_call_s"]
        print(f"| {r['threads']} | {t['eager-cpu']:.1f} | {t['eager-neuron']:.1f} | "
              f"{t['eager-neuron'] / t['eager-cpu']:.2f} | {t['compiled-cpu']:.1f} | {t['compiled-neuron']:.1f} | "
              f"{t['compiled-neuron'] / t['compiled-cpu']:.2f} | {t['compiled-neuron'] / t['eager-neuron']:.2f} | "
              f"{c['compiled-cpu']:.1f} / {c['compiled-neuron']:.1f} |")
        print("  max |diff| vs eager cpu: " + ", ".join(f"{k} {v:.1e}" for k, v in
                                                          r["max_abs_diff_vs_eager_cpu"].items()))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"config": vars(args), "machine": platform.machine(), "results": results}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
