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

Tensor parallelism (``--tp N``): the eager neuron step with the transformer sharded by
Diffusers' ``TensorParallelConfig(tp_degree=N)`` on N processes (torchrun, one NeuronCore
and one thread each) against the same unsharded step in 1 process (also under torchrun,
1 thread). Reported: speedup, and the communication share: the time rank 0 spends in
c10d collectives (the self time of profiler events named ``c10d``: the all-reduces after
row-wise layers, waits included, so load imbalance between ranks counts as communication),
over a profiled step.

Examples::

    nice -n 10 python benchmarks/diffusion.py
    python benchmarks/diffusion.py --blocks 8 --hidden 1024 --latent 64      # the full-size case
    python benchmarks/diffusion.py --quick --json out.json
    python benchmarks/diffusion.py --tp 2                                    # TP=2 vs 1 process
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


def tp_worker(args) -> dict | None:
    """One rank of the tensor-parallel measurement (torchrun); WORLD_SIZE 1 is the unsharded baseline."""
    import torch
    import torch.distributed as dist
    import torch_neuronx  # noqa: F401
    from torch.profiler import ProfilerActivity, profile

    torch.set_num_threads(1)
    torch.set_grad_enabled(False)
    local = int(os.environ["LOCAL_RANK"])
    dev = torch.device("neuron", local)
    dist.init_process_group("neuron", device_id=dev)
    world = dist.get_world_size()
    model, inputs = build(args, "cpu")
    ref = model(**inputs, return_dict=False)[0]
    if world > 1:
        from diffusers import TensorParallelConfig

        model.enable_parallelism(config=TensorParallelConfig(tp_degree=world))
    model.to(dev)
    inputs = {k: v.to(dev) for k, v in inputs.items()}

    def step():
        out = model(**inputs, return_dict=False)[0]
        torch.neuron.synchronize()
        return out

    max_diff = (step().cpu() - ref).abs().max().item()  # warm-up and check
    times = []
    for _ in range(args.samples):
        dist.barrier()
        start = time.perf_counter()
        for _ in range(args.inner):
            step()
        times.append((time.perf_counter() - start) / args.inner)
    dist.barrier()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        start = time.perf_counter()
        for _ in range(args.inner):
            step()
        profiled = (time.perf_counter() - start) / args.inner
    comm = sum(e.self_cpu_time_total for e in prof.key_averages() if "c10d" in e.key) / 1e3 / args.inner
    dist.destroy_process_group()
    if local != 0:
        return None
    return {"processes": world, "step_ms": statistics.median(times) * 1e3, "comm_ms": comm,
            "profiled_step_ms": profiled * 1e3, "max_abs_diff_vs_cpu": max_diff}


def run_tp(args) -> list:
    """The unsharded step on 1 process, then the TP step on ``args.tp`` processes."""
    import socket

    results = []
    for nproc in (1, args.tp):
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={nproc}", "--master-addr=127.0.0.1",
               f"--master-port={port}", __file__, "--tp-worker", "--blocks", str(args.blocks), "--hidden",
               str(args.hidden), "--latent", str(args.latent), "--text-len", str(args.text_len), "--text-dim",
               str(args.text_dim), "--samples", str(args.samples), "--inner", str(args.inner)]
        env = dict(os.environ, OMP_NUM_THREADS="1")
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
        if proc.returncode != 0:
            sys.stderr.write(proc.stdout[-3000:] + proc.stderr[-6000:])
            raise SystemExit(proc.returncode)
        results.append(json.loads([line for line in proc.stdout.splitlines() if line.startswith("{")][-1]))
    return results


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
    p.add_argument("--tp", type=int, default=1,
                   help="N > 1: eager neuron step with tensor parallelism on N processes vs 1 process "
                        "(instead of the eager/compiled comparison)")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--tp-worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.quick:
        args.samples, args.inner = 2, 1

    if args.worker:
        print(json.dumps(worker(args)))
        return 0
    if args.tp_worker:
        result = tp_worker(args)
        if result is not None:
            print(json.dumps(result), flush=True)
        return 0
    tokens = (args.latent // 2) ** 2 + args.text_len
    shape = (f"FLUX-style transformer: {args.blocks} blocks, hidden {args.hidden}, {args.latent}x{args.latent} "
             f"latents ({tokens} tokens incl. {args.text_len} text), batch 1, fp32; "
             f"median of {args.samples} x {args.inner} steps")
    if args.tp > 1:
        results = run_tp(args)
        base = results[0]["step_ms"]
        print(shape + "; eager neuron, 1 thread per process")
        print("| processes | step ms | speedup | comm ms/step (rank 0) | comm share | max |diff| vs cpu |")
        print("|---|---|---|---|---|---|")
        for r in results:
            share = r["comm_ms"] / r["profiled_step_ms"]
            print(f"| {r['processes']} | {r['step_ms']:.1f} | {base / r['step_ms']:.2f} | {r['comm_ms']:.1f} | "
                  f"{share:.0%} | {r['max_abs_diff_vs_cpu']:.1e} |")
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"config": vars(args), "machine": platform.machine(), "results": results}, f, indent=1)
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

    print(shape)
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
