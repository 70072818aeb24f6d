#!/usr/bin/env python3
"""NKI kernels against the eager ATen chain and ``torch.compile`` of the same PyTorch code.

Five fused kernels, from ``tests/nki_kernels.py``, on ``neuron`` tensors (the PyTorch code
of the new ones is there too, ``*_ref``):

* ``rmsnorm``   -- ``rmsnorm_wide``: RMSNorm of [tokens, hidden] with a [1, hidden] weight.
  PyTorch code: ``x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w``.
* ``silu_mul``  -- ``silu_mul``: SwiGLU's gating of [tokens, hidden]. PyTorch code:
  ``F.silu(gate) * up``.
* ``softmax``   -- ``softmax_fused``: numerically stable row softmax of [tokens, hidden].
  PyTorch code: ``e = (x - x.amax(-1, keepdim=True)).exp(); e / e.sum(-1, keepdim=True)``
  (the op chain; ``torch.softmax`` is one fused ATen kernel, not a chain).
* ``attention`` -- ``attention_head``: one head, ``softmax(scale * q @ k.T) @ v`` with the
  softmax above, q/k/v [seq, 64]; ``--seqs`` lists the sequence lengths (128: one tile).
* ``pool``      -- ``avgpool_bias_relu``: ``relu(avg_pool2d(x, 2) + b)`` on NCHW (a conv
  epilogue fused with the pool). PyTorch code: ``F.relu(F.avg_pool2d(x, 2) + b.view(1, C, 1, 1))``.

Variants, timed in alternating rounds in one process (ratios from one run):

* ``eager``     -- the PyTorch code, op by op on ``neuron``
* ``compiled``  -- ``torch.compile(code, backend="neuron")``
* ``nki``       -- the kernel on the native executor (csrc/runtime/nki, lowered by nki/_native.py;
  ``NKI_EXECUTOR=native``, so a kernel the executor does not cover is an error, not a fallback)
* ``interp``    -- the kernel on the Python interpreter (``NKI_EXECUTOR=interpreter``),
  the executor before the native one; fewer samples (``--interp-samples``, 0 skips it)

Goals (issue 23): nki at least 1.5x faster than eager (``eager/nki >= 1.5``) and at least
1.1x faster than compiled (``compiled/nki >= 1.1``). Each sample is one call followed by
``torch.neuron.synchronize()``; the table shows the median (and min) per call, and the
ratios of medians (and of mins: on a machine shared with other jobs the median mostly
measures the load, the min what each variant can do). Every configuration runs at the
default thread count and at 1 thread (``--threads``). The load average is printed before
and after the run.

    python benchmarks/nki.py
    taskset -c 1 python benchmarks/nki.py --threads 1 --samples 30
    python benchmarks/nki.py --cases softmax,attention --json nki.json --samples 21
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import statistics
import sys
import time

# This file is named nki.py: keep its directory from shadowing the nki package.
_HERE = os.path.dirname(os.path.abspath(__file__))
_ROOT = os.path.dirname(_HERE)
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]
sys.path.insert(0, _ROOT)

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import nki  # noqa: E402
import torch_neuronx  # noqa: E402,F401

EAGER_GOAL, COMPILED_GOAL = 1.5, 1.1
CASES = ("rmsnorm", "silu_mul", "softmax", "attention", "pool")


def _kernels():
    spec = importlib.util.spec_from_file_location("nki_kernels", os.path.join(_ROOT, "tests", "nki_kernels.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def rmsnorm_code(x, w, eps: float = 1e-6):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def pool_code(x, b):
    return F.relu(F.avg_pool2d(x, 2) + b.view(1, -1, 1, 1))


def _cases(K, cases, dtypes, tokens, hidden, image, seqs, head_dim=64):
    """(name, dtype, eager, compiled, args, kernel) per case and dtype."""
    n, c, h = image
    for dtype in dtypes:
        g = torch.Generator().manual_seed(0)

        def rand(*shape):
            return torch.randn(*shape, generator=g).to(dtype).to("neuron")

        if "rmsnorm" in cases:
            x, w = rand(tokens, hidden), rand(1, hidden)
            yield (f"rmsnorm {tokens}x{hidden}", dtype, lambda x=x, w=w: rmsnorm_code(x, w),
                   torch.compile(rmsnorm_code, backend="neuron"), (x, w), lambda x=x, w=w: K.rmsnorm_wide(x, w, 1e-6))
        if "silu_mul" in cases:
            gate, up = rand(tokens, hidden), rand(tokens, hidden)
            yield (f"silu_mul {tokens}x{hidden}", dtype, lambda a=gate, b=up: K.silu_mul_ref(a, b),
                   torch.compile(K.silu_mul_ref, backend="neuron"), (gate, up),
                   lambda a=gate, b=up: K.silu_mul(a, b))
        if "softmax" in cases:
            x = rand(tokens, hidden)
            yield (f"softmax {tokens}x{hidden}", dtype, lambda x=x: K.softmax_ref(x),
                   torch.compile(K.softmax_ref, backend="neuron"), (x,), lambda x=x: K.softmax_fused(x))
        if "attention" in cases:
            scale = head_dim ** -0.5
            for seq in seqs:
                q, k, v = rand(seq, head_dim), rand(seq, head_dim), rand(seq, head_dim)
                yield (f"attention {seq}x{head_dim}", dtype, lambda q=q, k=k, v=v: K.attention_ref(q, k, v, scale),
                       torch.compile(K.attention_ref, backend="neuron"), (q, k, v, scale),
                       lambda q=q, k=k, v=v: K.attention_head(q, k, v, scale))
        if "pool" in cases:
            x, b = rand(n, c, h, h), rand(c, 1)
            yield (f"pool {n}x{c}x{h}x{h}", dtype, lambda x=x, b=b: pool_code(x, b),
                   torch.compile(pool_code, backend="neuron"), (x, b), lambda x=x, b=b: K.avgpool_bias_relu(x, b))


def _time(fn):
    t = time.perf_counter()
    fn()
    torch.neuron.synchronize()
    return time.perf_counter() - t


def _with_executor(mode, fn):
    def run():
        old = os.environ.get("NKI_EXECUTOR")
        os.environ["NKI_EXECUTOR"] = mode
        try:
            return fn()
        finally:
            if old is None:
                os.environ.pop("NKI_EXECUTOR", None)
            else:
                os.environ["NKI_EXECUTOR"] = old
    return run


def _check(name, dtype, eager, compiled, nki_out, interp_out):
    tol = 1e-4 if dtype == torch.float32 else 5e-2
    for what, r in (("compiled", compiled), ("nki", nki_out)):
        err = (r.float().cpu() - eager.float().cpu()).abs().max().item()
        if err > tol * max(1.0, eager.float().abs().max().item()):
            raise SystemExit(f"{name} {dtype}: {what} differs from eager by {err}")
    # exp/silu use libm on the native executor and torch's kernels in the interpreter
    # (docs/nki.md, "Contract with the interpreter"): a few ulp, not bit identity
    if interp_out is not None:
        err = (nki_out.float().cpu() - interp_out.float().cpu()).abs().max().item()
        if err > tol * max(1.0, interp_out.float().abs().max().item()):
            raise SystemExit(f"{name} {dtype}: the native executor and the interpreter disagree by {err}")


def run_case(name, dtype, eager, compiled_fn, args, kernel, samples, interp_samples, warmup):
    compiled = lambda: compiled_fn(*args)  # noqa: E731
    native = _with_executor("native", kernel)
    interp = _with_executor("interpreter", kernel)
    _check(name, dtype, eager(), compiled(), native(), interp() if interp_samples else None)
    variants = {"eager": eager, "compiled": compiled, "nki": native}
    for fn in variants.values():
        for _ in range(warmup):
            fn()
    times = {k: [] for k in variants}
    times["interp"] = []
    for i in range(samples):
        for k, fn in variants.items():  # alternating: drift hits every variant alike
            times[k].append(_time(fn))
        if i < interp_samples:
            times["interp"].append(_time(interp))
    return {k: (statistics.median(v), min(v)) if v else None for k, v in times.items()}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--samples", type=int, default=15)
    ap.add_argument("--interp-samples", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--threads", default="default,1", help="comma list: 'default' and/or counts")
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--image", default="16,128,56", help="N,C,H (square images)")
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--cases", default=",".join(CASES), help="comma list of " + ", ".join(CASES))
    ap.add_argument("--seqs", default="128,512", help="attention sequence lengths (head dim 64)")
    ap.add_argument("--json")
    a = ap.parse_args()
    K = _kernels()
    default_threads = torch.get_num_threads()
    dtypes = [getattr(torch, d) for d in a.dtypes.split(",")]
    image = tuple(int(v) for v in a.image.split(","))
    cases = a.cases.split(",")
    unknown = set(cases) - set(CASES)
    if unknown:
        raise SystemExit(f"unknown cases {sorted(unknown)}; known: {', '.join(CASES)}")
    seqs = [int(v) for v in a.seqs.split(",")]
    load_before = os.getloadavg()
    rows = []
    for th in a.threads.split(","):
        n = default_threads if th == "default" else int(th)
        torch.set_num_threads(n)
        for name, dtype, eager, compiled, args, kernel in _cases(K, cases, dtypes, a.tokens, a.hidden, image, seqs):
            r = run_case(name, dtype, eager, compiled, args, kernel, a.samples, a.interp_samples, a.warmup)
            rows.append({"case": name, "dtype": str(dtype).replace("torch.", ""), "threads": n,
                         **{f"{k}_ms": (None if v is None else round(v[0] * 1e3, 3)) for k, v in r.items()},
                         **{f"{k}_min_ms": (None if v is None else round(v[1] * 1e3, 3)) for k, v in r.items()},
                         "eager_over_nki": r["eager"][0] / r["nki"][0],
                         "compiled_over_nki": r["compiled"][0] / r["nki"][0],
                         "eager_over_nki_min": r["eager"][1] / r["nki"][1],
                         "compiled_over_nki_min": r["compiled"][1] / r["nki"][1],
                         "interp_over_nki": None if r["interp"] is None else r["interp"][0] / r["nki"][0]})
            print(_row(rows[-1]), flush=True)
    print()
    print(f"torch {torch.__version__}, {platform.machine()}, executor isa {torch_neuronx._C._nki_kernel_isa()}, "
          f"load (1/5/15 min) {'/'.join(f'{v:.1f}' for v in load_before)} before, "
          f"{'/'.join(f'{v:.1f}' for v in os.getloadavg())} after, "
          f"samples {a.samples} (median ms per call, min in parentheses; ratios of medians (of mins), "
          f"goal flags median/min)")
    print("| case | dtype | threads | eager | compiled | nki | interp | eager/nki (goal >= 1.5) "
          "| compiled/nki (goal >= 1.1) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(_row(r))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)


def _row(r):
    def ms(k):
        v = r[f"{k}_ms"]
        return "-" if v is None else f"{v:.2f} ({r[f'{k}_min_ms']:.2f})"
    def ratio(k, goal):
        med, low = r[k], r[k + "_min"]
        return f"{med:.2f}x ({low:.2f}x) {'ok' if med >= goal else 'MISS'}/{'ok' if low >= goal else 'MISS'}"
    return (f"| {r['case']} | {r['dtype']} | {r['threads']} | {ms('eager')} | {ms('compiled')} | {ms('nki')} | "
            f"{ms('interp')} | {ratio('eager_over_nki', EAGER_GOAL)} | {ratio('compiled_over_nki', COMPILED_GOAL)} |")


if __name__ == "__main__":
    main()
