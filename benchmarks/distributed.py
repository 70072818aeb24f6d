#!/usr/bin/env python3
"""Collective bandwidth, latency and parallel-training step time of the ``neuron``
c10d backend against CPU Gloo, measured in one run on one host.

What is measured (``--world`` ranks, spawned by this script; default 2):

* **Bus bandwidth** of ``all_reduce``, ``reduce_scatter_tensor`` and
  ``all_gather_into_tensor`` on fp32 tensors of 4 KiB ... 256 MiB, following the
  nccl-tests convention: ``size`` is the full buffer (all_reduce: the tensor;
  reduce_scatter: the input; all_gather: the output), ``algbw = size / time`` and
  ``busbw = algbw * 2(n-1)/n`` for all_reduce, ``algbw * (n-1)/n`` for the other
  two, so that busbw is comparable across world sizes and with a link's speed.
* **The memcpy bound**: single-process ``dst.copy_(src)`` bandwidth for the same size
  (bytes copied per second; the best of 1 thread and the setting under test),
  measured in this run before the ranks start. An
  intra-node collective moves at least that many bytes through memory per rank,
  so ``busbw / memcpy`` says how close a collective gets to the machine.
* **Small-message latency**: ``all_reduce`` of 8 B ... 4 KiB.
* **Step time** of DDP, FSDP2 (``fully_shard``) and DTensor tensor parallelism
  (``ColwiseParallel``/``RowwiseParallel``) on a small MLP: forward, backward, SGD step.

Engines (columns): ``neuron`` is the ``neuron`` backend on neuron tensors as users
get it (with its intra-node shared-memory fast path unless ``TORCH_NEURONX_SHM=0``,
single-copy for messages of 256 KiB and more); ``neuron/slots`` (bandwidth only) is
the fast path without the single-copy step (``TORCH_NEURONX_SHM_DIRECT=0``: every
byte copied through the shared segment's slots);
``neuron/gloo`` is the same backend with the fast path off (``TORCH_NEURONX_SHM=0``
for that group), i.e. Gloo moving zero-copy host views of device memory; ``gloo``
is plain CPU Gloo on CPU tensors. One process group
``"cpu:gloo,neuron:neuron"`` serves ``neuron`` (neuron tensors) and ``gloo`` (CPU
tensors); ``neuron/gloo`` is a second group. Each case runs on every engine in
turn in the same processes, so the ratios come from one run.

Each configuration is measured at the default thread count and at
``torch.set_num_threads(1)`` (``--threads``).

Timing: a warm-up call, then three runs of ``n`` back-to-back calls (together about
``--target`` seconds); a run's time is its slowest rank's (all_reduce MAX over Gloo)
and the median run is reported. The memcpy bound is the best of five runs.

Examples::

    python benchmarks/distributed.py            # world 2, both thread settings
    python benchmarks/distributed.py --quick    # smoke: few sizes, short timings
    python benchmarks/distributed.py --threads 1 --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from datetime import timedelta

import torch

KiB = 1024
MiB = 1024 * KiB
SIZES = [4 * KiB * 4**i for i in range(9)]  # 4 KiB ... 256 MiB
QUICK_SIZES = [4 * KiB, 1 * MiB, 16 * MiB]
LATENCY_SIZES = [8, 64, 512, 4 * KiB]
# all_gather_inplace: the input is the rank's block of the output (as FSDP2 calls it).
COLLECTIVES = ["all_reduce", "reduce_scatter", "all_gather", "all_gather_inplace"]
JOBS = ["DDP", "FSDP2", "TP"]
SHM_GATE = 0.5  # fast-path goal: busbw >= 50 % of the memcpy bound for >= 1 MiB


def human(nbytes: int) -> str:
    for unit, scale in (("MiB", MiB), ("KiB", KiB)):
        if nbytes >= scale:
            return f"{nbytes // scale} {unit}"
    return f"{nbytes} B"


# ---- the memcpy bound (parent process) -------------------------------------------


def memcpy_bandwidth(nbytes: int, target: float, samples: int = 5) -> float:
    """Bytes per second of ``dst.copy_(src)`` for ``nbytes`` fp32 (this process's
    threads): the best of ``samples`` timings, as a bound should be."""
    src = torch.ones(nbytes // 4)
    dst = torch.empty_like(src)
    dst.copy_(src)  # touch the pages
    n = 1
    while True:  # calls per sample
        start = time.perf_counter()
        for _ in range(n):
            dst.copy_(src)
        elapsed = time.perf_counter() - start
        if elapsed >= target / samples or n >= 10000:
            break
        n = max(n * 2, int(n * target / samples / max(elapsed, 1e-6)))
    best = elapsed
    for _ in range(samples - 1):
        start = time.perf_counter()
        for _ in range(n):
            dst.copy_(src)
        best = min(best, time.perf_counter() - start)
    return nbytes * n / best


# ---- the ranks ----------------------------------------------------------------------


def _timed(fn, target: float, sync, min_iters: int = 2, max_iters: int = 2000, samples: int = 3,
           runs_out: list | None = None) -> float:
    """Seconds per call of ``fn``: after one warm-up call, ``samples`` runs of
    ``n`` back-to-back calls; each run counts at its slowest rank; the median
    run is reported (the machine is shared: single runs are noisy). The runs
    themselves go to ``runs_out`` when given."""
    start = time.perf_counter()
    fn()
    warm = sync(time.perf_counter() - start)
    n = int(min(max_iters, max(min_iters, target / samples / max(warm, 1e-6))))
    runs = []
    for _ in range(samples):
        start = time.perf_counter()
        for _ in range(n):
            fn()
        runs.append(sync(time.perf_counter() - start) / n)
    if runs_out is not None:
        runs_out.extend(runs)
    return sorted(runs)[len(runs) // 2]


def _mlp(dim: int, ffn: int, blocks: int) -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(*[
        torch.nn.Sequential(torch.nn.Linear(dim, ffn), torch.nn.GELU(), torch.nn.Linear(ffn, dim))
        for _ in range(blocks)])


def _rank_main(rank: int, world: int, init_file: str, out_file: str, cfg: dict) -> None:
    import warnings

    import torch.distributed as dist

    warnings.filterwarnings("ignore")  # deprecation notes of the collectives under test
    if cfg["threads"]:
        torch.set_num_threads(cfg["threads"])
    torch.neuron.set_device(rank)
    timeout = timedelta(seconds=120)
    dist.init_process_group("cpu:gloo,neuron:neuron", init_method=f"file://{init_file}", rank=rank,
                            world_size=world, timeout=timeout)
    main = dist.group.WORLD

    def group_with(var: str, value: str):
        # The same backend with a transport switched off (read at construction).
        previous = os.environ.get(var)
        os.environ[var] = value
        group = dist.new_group(backend="neuron", timeout=timeout)
        if previous is None:
            del os.environ[var]
        else:
            os.environ[var] = previous
        return group

    plain = group_with("TORCH_NEURONX_SHM", "0")
    slots = group_with("TORCH_NEURONX_SHM_DIRECT", "0")
    dev = torch.device("neuron", rank)
    engines = {"neuron": (main, dev), "neuron/gloo": (plain, dev), "gloo": (main, torch.device("cpu"))}
    bandwidth_engines = {**engines, "neuron/slots": (slots, dev)}
    if cfg.get("skip_gloo"):
        bandwidth_engines = {k: v for k, v in bandwidth_engines.items() if k in ("neuron", "neuron/slots")}

    def sync(seconds: float) -> float:
        t = torch.tensor([seconds], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=main)  # cpu tensor: Gloo
        return t.item()

    results: dict = {"bandwidth": {}, "latency": {}, "steps": {}}
    factor = {"all_reduce": 2 * (world - 1) / world, "reduce_scatter": (world - 1) / world,
              "all_gather": (world - 1) / world, "all_gather_inplace": (world - 1) / world}
    for size in cfg["sizes"]:
        numel = size // 4
        for coll in COLLECTIVES:
            for name, (group, device) in bandwidth_engines.items():
                if coll == "all_reduce":
                    t = torch.ones(numel, device=device)
                    fn = lambda: dist.all_reduce(t, group=group)  # noqa: E731
                elif coll == "reduce_scatter":
                    src = torch.ones(numel, device=device)
                    dst = torch.empty(numel // world, device=device)
                    fn = lambda: dist.reduce_scatter_tensor(dst, src, group=group)  # noqa: E731
                elif coll == "all_gather":
                    src = torch.ones(numel // world, device=device)
                    dst = torch.empty(numel, device=device)
                    fn = lambda: dist.all_gather_into_tensor(dst, src, group=group)  # noqa: E731
                else:
                    dst = torch.ones(numel, device=device)
                    src = dst.chunk(world)[rank]
                    fn = lambda: dist.all_gather_into_tensor(dst, src, group=group)  # noqa: E731
                runs: list = []
                seconds = _timed(fn, cfg["target"], sync, runs_out=runs)
                results["bandwidth"][f"{coll}|{size}|{name}"] = size / seconds * factor[coll]
                # The memcpy bound is a best-of-5: the best run is the like-for-like figure.
                results.setdefault("bandwidth_best", {})[f"{coll}|{size}|{name}"] = size / min(runs) * factor[coll]
                del fn
    for size in cfg["latency_sizes"]:
        for name, (group, device) in engines.items():
            t = torch.ones(max(1, size // 4), device=device)
            seconds = _timed(lambda: dist.all_reduce(t, group=group), cfg["target"], sync, min_iters=20)
            results["latency"][f"{size}|{name}"] = seconds

    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
    from torch.nn.parallel import DistributedDataParallel as DDP

    dim, ffn, blocks, batch = cfg["model"]
    for job in cfg["jobs"]:
        for name, (group, device) in engines.items():
            model = _mlp(dim, ffn, blocks).to(device)
            if job == "DDP":
                model = DDP(model, device_ids=[rank] if device.type == "neuron" else None, process_group=group)
            elif job == "FSDP2":
                mesh = DeviceMesh.from_group(group, device.type)
                for block in model:
                    fully_shard(block, mesh=mesh)
                fully_shard(model, mesh=mesh)
            else:
                mesh = DeviceMesh.from_group(group, device.type)
                plan = {}
                for i in range(blocks):
                    plan[f"{i}.0"] = ColwiseParallel()
                    plan[f"{i}.2"] = RowwiseParallel()
                model = parallelize_module(model, mesh, plan)
            opt = torch.optim.SGD(model.parameters(), lr=1e-3)
            g = torch.Generator().manual_seed(rank if job != "TP" else 0)  # TP: one batch for all ranks
            x = torch.randn(batch, dim, generator=g).to(device)

            def step():
                opt.zero_grad(set_to_none=True)
                model(x).square().mean().backward()
                opt.step()

            step()  # lazy initialization (FSDP2 and DDP build their state on the first step)
            results["steps"][f"{job}|{name}"] = _timed(step, cfg["target"] * 2, sync, min_iters=3)
            del model, opt
    if rank == 0:
        with open(out_file, "w") as f:
            json.dump(results, f)
    dist.barrier(group=main)
    dist.destroy_process_group()


def run_ranks(world: int, cfg: dict) -> dict:
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as tmp:
        init_file = os.path.join(tmp, "init")
        out_file = os.path.join(tmp, "results.json")
        mp.spawn(_rank_main, args=(world, init_file, out_file, cfg), nprocs=world, join=True)
        with open(out_file) as f:
            return json.load(f)


# ---- report ------------------------------------------------------------------------------


def fmt_bw(bps: float | None) -> str:
    return "—" if bps is None else f"{bps / 1e9:.2f}"


def report(threads_label: str, world: int, cfg: dict, memcpy: dict, r: dict) -> str:
    engines = ("neuron", "neuron/gloo", "gloo")
    lines = [f"### {threads_label} (world {world})"]
    if cfg["sizes"]:
        lines += ["", "Bus bandwidth, GB/s (nccl-tests busbw); `%memcpy` = busbw / memcpy bandwidth.", "",
                  "| collective | size | memcpy | neuron | neuron/slots | neuron/gloo | gloo | neuron / gloo "
                  "| neuron %memcpy | slots %memcpy | neuron %memcpy, best run |",
                  "|---|---|---|---|---|---|---|---|---|---|---|"]
        for coll in COLLECTIVES:
            for size in cfg["sizes"]:
                bw = {e: r["bandwidth"].get(f"{coll}|{size}|{e}") for e in engines + ("neuron/slots",)}
                mc = memcpy[str(size)]
                gloo = f"{bw['neuron'] / bw['gloo']:.2f}x" if bw["gloo"] else "—"
                lines.append(f"| {coll} | {human(size)} | {fmt_bw(mc)} | {fmt_bw(bw['neuron'])} | "
                             f"{fmt_bw(bw['neuron/slots'])} | {fmt_bw(bw['neuron/gloo'])} | {fmt_bw(bw['gloo'])} | "
                             f"{gloo} | {100 * bw['neuron'] / mc:.0f} % | {100 * bw['neuron/slots'] / mc:.0f} % | "
                             f"{100 * r.get('bandwidth_best', r['bandwidth'])[f'{coll}|{size}|neuron'] / mc:.0f} % |")
        big = [s for s in cfg["sizes"] if s >= MiB]
        if big:
            worst = {c: min(r["bandwidth"][f"{c}|{s}|neuron"] / memcpy[str(s)] for s in big) for c in COLLECTIVES}
            lines += ["", f"Fast-path gate (busbw >= {SHM_GATE:.0%} of memcpy for >= 1 MiB), worst size per collective: "
                      + ", ".join(f"{c} {v:.0%} {'pass' if v >= SHM_GATE else 'FAIL'}" for c, v in worst.items())]
            best = r.get("bandwidth_best", r["bandwidth"])
            worst = {c: min(best[f"{c}|{s}|neuron"] / memcpy[str(s)] for s in big) for c in COLLECTIVES}
            lines += ["", "Same, best run of each case (as the memcpy bound is a best of 5): "
                      + ", ".join(f"{c} {v:.0%} {'pass' if v >= SHM_GATE else 'FAIL'}" for c, v in worst.items())]
    if cfg["latency_sizes"]:
        lines += ["", "all_reduce latency, µs per call (ratio = neuron / gloo; lower is better).", "",
                  "| size | neuron | neuron/gloo | gloo | ratio |", "|---|---|---|---|---|"]
        for size in cfg["latency_sizes"]:
            t = {e: r["latency"][f"{size}|{e}"] * 1e6 for e in engines}
            lines.append(f"| {human(size)} | {t['neuron']:.0f} | {t['neuron/gloo']:.0f} | {t['gloo']:.0f} | "
                         f"{t['neuron'] / t['gloo']:.2f} |")
    if cfg["jobs"]:
        dim, ffn, blocks, batch = cfg["model"]
        lines += ["", f"Step time, ms (MLP {blocks}x[{dim}->{ffn}->{dim}], batch {batch}, SGD; "
                  "ratio = neuron / the same job on CPU Gloo).", "",
                  "| job | neuron | neuron/gloo | gloo (CPU) | ratio |", "|---|---|---|---|---|"]
        for job in cfg["jobs"]:
            t = {e: r["steps"][f"{job}|{e}"] * 1e3 for e in engines}
            lines.append(f"| {job} | {t['neuron']:.1f} | {t['neuron/gloo']:.1f} | {t['gloo']:.1f} | "
                         f"{t['neuron'] / t['gloo']:.2f} |")
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--quick", action="store_true", help="smoke run: 3 sizes, short timings")
    p.add_argument("--threads", choices=["default", "1", "both"], default="both")
    p.add_argument("--target", type=float, default=None, help="seconds per measurement (default 0.25, quick 0.05)")
    p.add_argument("--only", default="bandwidth,latency,steps",
                   help="comma-separated parts to run: bandwidth, latency, steps")
    p.add_argument("--min-size", type=int, default=0, help="skip bandwidth sizes below this many bytes")
    p.add_argument("--skip-gloo", action="store_true",
                   help="bandwidth: skip the Gloo engines (neuron/gloo, gloo), the slowest to measure")
    p.add_argument("--json", help="also write the raw results here")
    args = p.parse_args()
    if args.world > 2 and "NEURON_RT_NUM_CORES" not in os.environ:
        os.environ["NEURON_RT_NUM_CORES"] = str(args.world)  # one NeuronCore per rank
    target = args.target or (0.05 if args.quick else 0.25)
    parts = set(args.only.split(","))
    sizes = [s for s in (QUICK_SIZES if args.quick else SIZES) if s >= args.min_size]
    cfg = {"sizes": sizes if "bandwidth" in parts else [],
           "latency_sizes": ([8, 4 * KiB] if args.quick else LATENCY_SIZES) if "latency" in parts else [],
           "target": target, "jobs": JOBS if "steps" in parts else [], "skip_gloo": args.skip_gloo,
           "model": (256, 1024, 2, 16) if args.quick else (512, 2048, 2, 64)}
    settings = {"default": [None], "1": [1], "both": [None, 1]}[args.threads]
    print(f"# benchmarks/distributed.py: torch {torch.__version__}, {platform.machine()}, "
          f"{os.cpu_count()} cpus, world {args.world}, TORCH_NEURONX_SHM={os.environ.get('TORCH_NEURONX_SHM', '(unset)')}")
    raw = {}
    for threads in settings:
        label = "1 thread" if threads == 1 else f"default threads ({torch.get_num_threads()})"
        # The bound is the fastest copy: one thread, and (default setting)
        # also the intra-op pool, whose wake-ups a loaded machine can delay.
        saved = torch.get_num_threads()
        memcpy = {}
        for count in sorted({1, threads or saved}):
            torch.set_num_threads(count)
            for s in cfg["sizes"]:
                memcpy[str(s)] = max(memcpy.get(str(s), 0.0), memcpy_bandwidth(s, target))
        torch.set_num_threads(saved)
        results = run_ranks(args.world, {**cfg, "threads": threads})
        raw[label] = {"memcpy": memcpy, **results}
        print()
        print(report(label, args.world, cfg, memcpy, results), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"world": args.world, "cfg": cfg, "results": raw}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
