#!/usr/bin/env python3
"""Small-M float32 matmuls (a batched decode step's projections), GFLOP/s, in one process.

``F.linear(x, w)`` with x [M, K] and w [N, K] as nn.Linear stores it, at SmolLM2-135M's
shapes (K -> N: q/o 576 -> 576, k/v 576 -> 192, gate/up 576 -> 1536 and fused 576 -> 3072,
down 1536 -> 576, LM head 576 -> 49152), three ways, timed in alternating rounds:

* ``neuron`` -- on neuron tensors: the runtime's GEMV (M <= 4) or small-M GEMM kernel
  (5 <= M <= 64; csrc/runtime/Gemm.h), else ATen's CPU kernel on device memory;
* ``mkl``    -- on CPU tensors: ATen's CPU kernel (MKL sgemm, packing per call);
* ``onednn`` -- on CPU tensors with the weight prepacked once by oneDNN, as vLLM's CPU
  platform does at load (``torch.ops.mkldnn._reorder_linear_weight`` then
  ``torch.ops.mkldnn._linear_pointwise``), when this torch has them.

A sample runs enough calls for ~5 ms then synchronizes; the minimum over ``--samples``
samples is reported (the machine is shared: the minimum is the least disturbed figure).
Every way's result is checked against the CPU kernel's at matmul tolerances.

``--cold MB`` reads the weights from memory, as a model's decode step does (its weights are far
larger than the caches): each way cycles through distinct copies of the weight, at least MB
megabytes of them (each way prepacks its own for oneDNN), and the table adds the weight read
rate the neuron figure implies (GB/s) and, first, this machine's memory read rate at one
thread (``sum`` over 512 MB of device memory, the same allocator as the weights).

    python benchmarks/small_gemm.py --threads 1
    python benchmarks/small_gemm.py --threads 1 --cold 256 --rows 16
"""
import argparse
import itertools
import math
import time

import torch
import torch.nn.functional as F
import torch_neuronx  # noqa: F401

SHAPES = [(576, 576), (576, 192), (576, 1536), (576, 3072), (1536, 576), (576, 49152)]


def timed(fn, samples, sync):
    fn()
    sync()
    t0 = time.perf_counter()
    fn()
    sync()
    inner = max(1, int(5e-3 / max(time.perf_counter() - t0, 1e-6)))
    best = float("inf")
    for _ in range(samples):
        t0 = time.perf_counter()
        for _ in range(inner):
            fn()
        sync()
        best = min(best, (time.perf_counter() - t0) / inner)
    return best


def cycling(fn, weights):
    """fn on the next of `weights` at each call (one weight: always that one)."""
    it = itertools.cycle(weights)
    return lambda: fn(next(it))


def read_rate(samples):
    """GB/s of a sum over 512 MB of device memory, one call at a time."""
    x = torch.ones(128 << 20, device="neuron")
    t = timed(lambda: x.sum(), samples, torch.neuron.synchronize)
    del x
    return (128 << 22) / t / 1e9


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rows", default="4,8,16,32,64")
    ap.add_argument("--shapes", default=None, help="K:N,K:N,... (default: SmolLM2-135M's)")
    ap.add_argument("--samples", type=int, default=7)
    ap.add_argument("--cold", type=float, default=0,
                    help="cycle through distinct weight copies of at least this many MB (0: one weight, warm)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    shapes = SHAPES if args.shapes is None else [tuple(map(int, s.split(":"))) for s in args.shapes.split(",")]
    rows = [int(r) for r in args.rows.split(",")]
    has_onednn = hasattr(torch.ops.mkldnn, "_reorder_linear_weight") and torch.backends.mkldnn.is_available()
    sync = torch.neuron.synchronize
    print(f"threads={args.threads}  GFLOP/s (min time of {args.samples} samples); "
          "ratio = neuron / best of the CPU ways" + (f"; weights cold ({args.cold:g} MB of copies)" if args.cold else ""))
    if args.cold:
        print(f"memory read rate: {read_rate(args.samples):.1f} GB/s (sum over 512 MB on neuron)")
    print(f"{'K':>5} {'N':>6} {'M':>3} {'neuron':>8} {'mkl':>8} {'onednn':>8} {'ratio':>6}  kernel"
          + ("   GB/s" if args.cold else ""))
    g = torch.Generator().manual_seed(0)
    for k, n in shapes:
        w = torch.randn(n, k, generator=g) / k**0.5
        copies = max(1, math.ceil(args.cold * 1e6 / w.nbytes)) if args.cold else 1
        ws = [w] + [w.clone() for _ in range(copies - 1)]
        dws = [c.to("neuron") for c in ws]
        dw = dws[0]
        for m in rows:
            x = torch.randn(m, k, generator=g)
            dx = x.to("neuron")
            want = F.linear(x, w)
            gemv0, gemm0 = torch_neuronx._C._gemv_calls(), torch_neuronx._C._gemm_calls()
            got = F.linear(dx, dw).cpu()
            kernel = ("gemv" if torch_neuronx._C._gemv_calls() > gemv0
                      else "gemm" if torch_neuronx._C._gemm_calls() > gemm0 else "aten")
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
            ways = {"neuron": (cycling(lambda c: F.linear(dx, c), dws), sync),
                    "mkl": (cycling(lambda c: F.linear(x, c), ws), lambda: None)}
            if has_onednn:
                pws = [torch.ops.mkldnn._reorder_linear_weight(c, m) for c in ws]
                onednn = cycling(lambda c: torch.ops.mkldnn._linear_pointwise(x, c, None, "none", [], ""), pws)
                torch.testing.assert_close(onednn(), want, rtol=1e-4, atol=1e-4)
                ways["onednn"] = (onednn, lambda: None)
            best = {name: float("inf") for name in ways}
            for _ in range(2):  # alternating rounds
                for name, (fn, s) in ways.items():
                    best[name] = min(best[name], timed(fn, args.samples, s))
            gflops = {name: 2.0 * m * n * k / t / 1e9 for name, t in best.items()}
            cpu_best = max(v for name, v in gflops.items() if name != "neuron")
            print(f"{k:>5} {n:>6} {m:>3} {gflops['neuron']:8.1f} {gflops['mkl']:8.1f} "
                  f"{gflops.get('onednn', float('nan')):8.1f} {gflops['neuron'] / cpu_best:6.2f}  {kernel}"
                  + (f" {w.nbytes / best['neuron'] / 1e9:6.1f}" if args.cold else ""), flush=True)
            del ways
            if has_onednn:
                del pws, onednn


if __name__ == "__main__":
    main()
