#!/usr/bin/env python3
"""Graph replay against the eager loop on ``neuron`` and on CPU, in one process.

A device graph (docs/graphs.md) records the kernels that eager ops queue and replays
them as one launch: the Python, dispatcher, routing and per-op launch cost is paid once,
at capture. This script measures what a replay still costs (issue 25):

* ``chain-N`` -- a 300-op chain of small-op pointwise math (``mul``/``add``/``sigmoid``/
  ``tanh``/``sub``/``gelu`` in turn) on a tensor of N elements (1, 64, 4096): the
  workload bound by per-op cost, where the goal is replay <= 0.1x the eager loop on
  ``neuron``;
* ``mlp`` -- a 4-layer MLP (``linear`` + ``gelu``, batch 8, width 256), small matmuls.

Modes: ``eager-neuron`` (the ops called one by one on ``neuron``), ``eager-cpu`` (the
same on CPU tensors) and ``replay`` (``g.replay()`` of a graph captured from the
``neuron`` loop). A sample runs a mode ``--inner`` times and then synchronizes; the
modes alternate in rounds, so drift on a shared machine reaches all of them. Reported:
min and median per call over ``--samples`` samples, and the ratios replay/eager-neuron
and replay/eager-cpu of the medians (min ratios in brackets). Every case runs at
``--threads`` (default 1) and at the process's default thread count, in this one run.
The replay's results are checked against the eager loop's before timing.

Examples::

    python benchmarks/graphs.py
    python benchmarks/graphs.py --samples 21 --only chain-64 --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time

import torch

import torch_neuronx  # noqa: F401  (registers the neuron device)

CHAIN_GOAL = 0.1
CHAIN_OPS = 300


def chain_step(t: torch.Tensor, i: int) -> torch.Tensor:
    k = i % 6
    if k == 0:
        return t * 1.0001
    if k == 1:
        return t + 0.001
    if k == 2:
        return torch.sigmoid(t)
    if k == 3:
        return torch.tanh(t)
    if k == 4:
        return t - 0.5
    return torch.nn.functional.gelu(t)


def make_chain(n):
    def setup(device):
        x = torch.linspace(-1, 1, n).to(device)

        def body():
            t = x
            for i in range(CHAIN_OPS):
                t = chain_step(t, i)
            return t

        return x, body

    return setup


def make_mlp(device):
    g = torch.Generator().manual_seed(0)
    width, layers = 256, 4
    ws = [(torch.randn(width, width, generator=g) / width**0.5).to(device) for _ in range(layers)]
    bs = [torch.randn(width, generator=g).to(device) for _ in range(layers)]
    x = torch.randn(8, width, generator=g).to(device)

    def body():
        t = x
        for w, b in zip(ws, bs):
            t = torch.nn.functional.gelu(torch.nn.functional.linear(t, w, b))
        return t

    return x, body


CASES = {f"chain-{n}": (make_chain(n), CHAIN_OPS) for n in (1, 64, 4096)}
CASES["mlp"] = (make_mlp, 8)


def sync(device):
    if device != "cpu":
        torch.neuron.synchronize()


def capture(body):
    torch.neuron.synchronize()
    s = torch.neuron.Stream()
    s.wait_stream(torch.neuron.current_stream())
    with torch.neuron.stream(s):
        body()  # warm-up outside capture (first-call costs)
    torch.neuron.current_stream().wait_stream(s)
    torch.neuron.synchronize()
    g = torch.neuron.NeuronGraph()
    with torch.neuron.graph(g):
        out = body()
    return g, out


def run_case(name, args):
    setup, ops = CASES[name]
    x_n, body_n = setup("neuron")
    x_c, body_c = setup("cpu")
    g, static_out = capture(body_n)
    g.replay()
    expect = body_n()
    torch.neuron.synchronize()
    if not torch.equal(static_out.cpu(), expect.cpu()):
        raise SystemExit(f"{name}: replay differs from the eager loop")

    modes = {
        "eager-neuron": (body_n, "neuron"),
        "eager-cpu": (body_c, "cpu"),
        "replay": (g.replay, "neuron"),
    }
    times = {m: [] for m in modes}
    for fn, dev in modes.values():
        for _ in range(args.warmup):
            fn()
        sync(dev)
    for _ in range(args.samples):
        for m, (fn, dev) in modes.items():
            t0 = time.perf_counter()
            for _ in range(args.inner):
                fn()
            sync(dev)
            times[m].append((time.perf_counter() - t0) / args.inner)
    res = {m: {"min_us": min(v) * 1e6, "median_us": statistics.median(v) * 1e6} for m, v in times.items()}
    r, en, ec = res["replay"], res["eager-neuron"], res["eager-cpu"]
    res["ops"] = ops
    res["replay/eager-neuron"] = r["median_us"] / en["median_us"]
    res["replay/eager-neuron_min"] = r["min_us"] / en["min_us"]
    res["replay/eager-cpu"] = r["median_us"] / ec["median_us"]
    res["replay/eager-cpu_min"] = r["min_us"] / ec["min_us"]
    res["replay_us_per_op"] = r["min_us"] / ops
    del g
    return res


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--samples", type=int, default=11, help="timed samples per mode (min and median reported)")
    p.add_argument("--inner", type=int, default=10, help="calls per sample")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--threads", type=int, default=1, help="the low thread count (the default count runs too)")
    p.add_argument("--only", choices=sorted(CASES), action="append", help="run these cases only")
    p.add_argument("--json", metavar="PATH", help="also write the results as JSON ('-' for stdout)")
    args = p.parse_args(argv)

    default_threads = torch.get_num_threads()
    thread_counts = sorted({args.threads, default_threads})
    names = args.only or list(CASES)
    load = os.getloadavg()
    results = []
    print(f"torch {torch.__version__}, {platform.machine()}, load average {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}")
    hdr = (f"{'case':<11}{'thr':>4}{'eager-neuron us':>17}{'eager-cpu us':>14}{'replay us':>11}"
           f"{'us/op':>7}{'replay/eager-neuron':>21}{'replay/eager-cpu':>18}")
    print(hdr)
    for threads in thread_counts:
        torch.set_num_threads(threads)
        for name in names:
            res = run_case(name, args)
            res.update(case=name, threads=threads)
            results.append(res)
            en, ec, r = res["eager-neuron"], res["eager-cpu"], res["replay"]
            print(f"{name:<11}{threads:>4}{en['median_us']:>17.1f}{ec['median_us']:>14.1f}{r['median_us']:>11.1f}"
                  f"{res['replay_us_per_op']:>7.2f}"
                  f"{res['replay/eager-neuron']:>12.3f} [{res['replay/eager-neuron_min']:.3f}]"
                  f"{res['replay/eager-cpu']:>9.3f} [{res['replay/eager-cpu_min']:.3f}]", flush=True)
    print(f"(median per call over {args.samples} samples x {args.inner} calls, [min ratio]; "
          f"us/op = min replay time / recorded ops; goal for chain-*: replay/eager-neuron <= {CHAIN_GOAL})")
    if args.json:
        out = {"load_average": load, "torch": torch.__version__, "results": results}
        text = json.dumps(out, indent=2)
        if args.json == "-":
            print(text)
        else:
            with open(args.json, "w") as f:
                f.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
