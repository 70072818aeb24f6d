#!/usr/bin/env python3
"""RMSNorm [tokens, hidden] against the copy of its input: how close the NKI kernel
and ``torch.compile`` are to the memory traffic every RMSNorm has.

An RMSNorm reads x once and writes y of x's size: a ``clone()`` of x on ``neuron``
(one read, one write of the same bytes; the runtime's copy is glibc's memcpy, which
streams stores this large) is the floor of that traffic at one thread. The script
times, alternating in one process: the copy, ``rmsnorm_wide`` of tests/nki_kernels.py
on the native executor, and ``torch.compile`` of the PyTorch code of benchmarks/nki.py.
It prints the mins and medians per call and the ratios of the mins.

    taskset -c 0 python benchmarks/nki_rmsnorm_floor.py --samples 25
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import sys
import time

_HERE = os.path.dirname(os.path.abspath(__file__))
_ROOT = os.path.dirname(_HERE)
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]
sys.path.insert(0, _ROOT)

import torch  # noqa: E402

import nki  # noqa: E402,F401
import torch_neuronx  # noqa: E402,F401


def rmsnorm_code(x, w, eps: float = 1e-6):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def _time(fn):
    t = time.perf_counter()
    fn()
    torch.neuron.synchronize()
    return time.perf_counter() - t


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--samples", type=int, default=25)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--dtypes", default="float32,bfloat16")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    os.environ["NKI_EXECUTOR"] = "native"
    spec = importlib.util.spec_from_file_location("nki_kernels", os.path.join(_ROOT, "tests", "nki_kernels.py"))
    K = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(K)
    compiled = torch.compile(rmsnorm_code, backend="neuron")
    print(f"load before {'/'.join(f'{v:.1f}' for v in os.getloadavg())}, threads {a.threads}, samples {a.samples}")
    for name in a.dtypes.split(","):
        dtype = getattr(torch, name)
        g = torch.Generator().manual_seed(0)
        x = torch.randn(a.tokens, a.hidden, generator=g).to(dtype).to("neuron")
        w = torch.randn(1, a.hidden, generator=g).to(dtype).to("neuron")
        variants = {"copy": lambda: x.clone(), "nki": lambda: K.rmsnorm_wide(x, w, 1e-6),
                    "compiled": lambda: compiled(x, w)}
        for fn in variants.values():
            fn()
            fn()
        times = {k: [] for k in variants}
        for _ in range(a.samples):
            for k, fn in variants.items():
                times[k].append(_time(fn))
        mins = {k: min(v) * 1e3 for k, v in times.items()}
        meds = {k: statistics.median(v) * 1e3 for k, v in times.items()}
        print(f"{name} {a.tokens}x{a.hidden}: " + ", ".join(f"{k} {mins[k]:.3f} ({meds[k]:.3f}) ms" for k in variants)
              + f"; min ratios compiled/nki {mins['compiled'] / mins['nki']:.2f}, copy/nki {mins['copy'] / mins['nki']:.2f},"
              f" copy/compiled {mins['copy'] / mins['compiled']:.2f}")
    print(f"load after {'/'.join(f'{v:.1f}' for v in os.getloadavg())}")


if __name__ == "__main__":
    main()
