#!/usr/bin/env python3
"""Asynchronous execution on ``neuron``: stream overlap and launch-blocking cost.

* ``streams``  -- the same work (a chain of matmuls, ``--size``, ``--chain`` long) twice:
  once after another on one stream, then once on each of two streams. With two idle cores
  the two-stream wall time approaches one chain (ratio two-streams / one-stream -> 0.5).
  Run with 1 intra-op thread per kernel so that each stream's executor uses one core.
* ``decode``   -- a decoder layer stack's eager decode step (a tiny Llama built from a
  config; ``--layers``, ``--hidden``) timed with asynchronous launches and, in a child
  process, with ``NEURON_RT_LAUNCH_BLOCKING=1``; CPU eager in the same run.

Ratios are measured in one run; medians of ``--samples``.

Examples::

    python benchmarks/overlap.py
    python benchmarks/overlap.py --only streams --threads 1
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import torch


def _chain(a, n):
    for _ in range(n):
        a = torch.mm(a, a).clamp_(-1, 1)
    return a


def bench_streams(size: int, chain: int, samples: int) -> dict:
    a = torch.randn(size, size, device="neuron") / size
    s1, s2 = torch.neuron.Stream(), torch.neuron.Stream()
    one, two = [], []
    for _ in range(samples):
        torch.neuron.synchronize()
        t = time.perf_counter()
        with torch.neuron.stream(s1):
            _chain(a, chain)
            _chain(a, chain)
        torch.neuron.synchronize()
        one.append(time.perf_counter() - t)
        t = time.perf_counter()
        with torch.neuron.stream(s1):
            _chain(a, chain)
        with torch.neuron.stream(s2):
            _chain(a, chain)
        torch.neuron.synchronize()
        two.append(time.perf_counter() - t)
    m1, m2 = statistics.median(one), statistics.median(two)
    return {"one_stream_s": m1, "two_streams_s": m2, "ratio": m2 / m1}


DECODE = r"""
import json, statistics, sys, time, torch, transformers
device, layers, hidden, steps, samples, threads = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6])
if threads:
    torch.set_num_threads(threads)
torch.manual_seed(0)
cfg = transformers.LlamaConfig(vocab_size=8192, hidden_size=hidden, intermediate_size=hidden * 3 // 1,
                               num_hidden_layers=layers, num_attention_heads=hidden // 64, num_key_value_heads=hidden // 192 or 1,
                               max_position_embeddings=1024)
model = transformers.LlamaForCausalLM(cfg).eval().to(device)
ids = torch.randint(0, 8192, (1, 16), device=device)
times = []
with torch.no_grad():
    for _ in range(samples + 1):
        cache = transformers.DynamicCache(config=cfg)
        out = model(ids, past_key_values=cache, use_cache=True)
        tok = out.logits[:, -1:].argmax(-1)
        t = time.perf_counter()
        for _ in range(steps):
            out = model(tok, past_key_values=cache, use_cache=True)
            tok = out.logits[:, -1:].argmax(-1)
        tok.cpu()
        times.append((time.perf_counter() - t) / steps)
print(json.dumps({"step_ms": statistics.median(times[1:]) * 1e3}))
"""


def bench_decode(layers: int, hidden: int, steps: int, samples: int, threads: int) -> dict:
    def run(device, blocking):
        env = dict(os.environ)
        env["NEURON_RT_LAUNCH_BLOCKING"] = "1" if blocking else "0"
        out = subprocess.run([sys.executable, "-c", DECODE, device, str(layers), str(hidden), str(steps),
                              str(samples), str(threads)], env=env, capture_output=True, text=True, check=True)
        return json.loads(out.stdout.strip().splitlines()[-1])["step_ms"]

    cpu = run("cpu", False)
    blocking = run("neuron", True)
    queued = run("neuron", False)
    return {"cpu_ms": cpu, "neuron_blocking_ms": blocking, "neuron_async_ms": queued,
            "async_vs_cpu": cpu / queued, "blocking_vs_cpu": cpu / blocking, "async_vs_blocking": blocking / queued}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", choices=["streams", "decode"])
    p.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (0: default; streams uses 1)")
    p.add_argument("--size", type=int, default=512)
    p.add_argument("--chain", type=int, default=16)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--hidden", type=int, default=576)
    p.add_argument("--steps", type=int, default=32)
    p.add_argument("--samples", type=int, default=5)
    p.add_argument("--json", metavar="PATH")
    args = p.parse_args()
    results = {"default_threads": torch.get_num_threads()}
    if args.only in (None, "streams"):
        prev = torch.get_num_threads()
        torch.set_num_threads(args.threads or 1)
        r = bench_streams(args.size, args.chain, args.samples)
        torch.set_num_threads(prev)
        results["streams"] = r
        print(f"two streams: one stream {r['one_stream_s'] * 1e3:.1f} ms, two streams {r['two_streams_s'] * 1e3:.1f} ms "
              f"(ratio {r['ratio']:.2f}; 0.5 = full overlap) at {args.threads or 1} thread(s) per kernel")
    if args.only in (None, "decode"):
        for threads in ([args.threads] if args.threads else [0, 1]):
            r = bench_decode(args.layers, args.hidden, args.steps, args.samples, threads)
            results[f"decode_threads_{threads or 'default'}"] = r
            print(f"decode step ({args.layers} layers, hidden {args.hidden}, threads {threads or 'default'}): "
                  f"CPU {r['cpu_ms']:.2f} ms, neuron async {r['neuron_async_ms']:.2f} ms, "
                  f"NEURON_RT_LAUNCH_BLOCKING=1 {r['neuron_blocking_ms']:.2f} ms; "
                  f"neuron/CPU speed {r['async_vs_cpu']:.2f}x (blocking {r['blocking_vs_cpu']:.2f}x)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
