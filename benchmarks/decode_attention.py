#!/usr/bin/env python3
"""Per-call time of single-query SDPA (a decode step's attention), in one process.

Shapes of SmolLM2-135M decode: 9 query heads, 3 key/value heads, head_dim 64, one
query position, keys read from a static cache through a slice (non-contiguous K/V
views) with an additive float mask over the cache length. Three ways are timed in
alternating rounds:

* ``decode``  -- ``F.scaled_dot_product_attention`` on neuron: the direct
  single-query kernel (csrc/aten/DecodeAttention.cpp);
* ``flash``   -- the host flash-attention kernel on the same neuron tensors (the
  path SDPA took before; called as ``aten::_scaled_dot_product_flash_attention_for_cpu``);
* ``cpu``     -- ``F.scaled_dot_product_attention`` on CPU tensors.

``eager`` rows time the calls as issued (dispatch included); ``replayed`` rows capture
``--inner`` calls of each neuron way in one ``torch.neuron.graph`` and time its replay,
which leaves the kernel and its launch (what a decode graph pays per layer). A sample
runs ``--inner`` calls (or one replay of them) then ``torch.neuron.synchronize()``; the
minimum over ``--samples`` samples is reported per call (the machine is shared: the
minimum is the least disturbed figure).

    python benchmarks/decode_attention.py --threads 1 --keys 100
"""
import argparse
import time

import torch
import torch.nn.functional as F
import torch_neuronx  # noqa: F401


def timed(fn, inner, samples, sync):
    best = float("inf")
    for _ in range(samples):
        t0 = time.perf_counter()
        for _ in range(inner):
            fn()
        sync()
        best = min(best, (time.perf_counter() - t0) / inner)
    return best * 1e6


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--keys", type=int, default=100, help="keys attended (the static cache's used length)")
    ap.add_argument("--cache", type=int, default=256, help="static cache length")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--inner", type=int, default=200)
    ap.add_argument("--samples", type=int, default=15)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 9, 1, 64, generator=g).to(dtype)
    cache_k, cache_v = (torch.randn(1, 3, args.cache, 64, generator=g).to(dtype) for _ in range(2))
    k, v = cache_k[:, :, : args.keys], cache_v[:, :, : args.keys]
    mask = torch.zeros(1, 1, 1, args.keys, dtype=dtype)
    dq, dk, dv, dmask = (t.to("neuron") for t in (q, cache_k, cache_v, mask))
    dk, dv = dk[:, :, : args.keys], dv[:, :, : args.keys]
    cases = {
        "decode": (lambda: F.scaled_dot_product_attention(dq, dk, dv, attn_mask=dmask, enable_gqa=True),
                   torch.neuron.synchronize),
        "flash": (lambda: torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(dq, dk, dv, attn_mask=dmask),
                  torch.neuron.synchronize),
        "cpu": (lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True), lambda: None),
    }
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
    got = cases["decode"][0]().cpu()
    tol = {} if dtype == torch.float32 else dict(atol=2e-2, rtol=2e-2)  # as tests/test_attention.py
    torch.testing.assert_close(got, ref, **tol)
    graphs = {}
    for name in ("decode", "flash"):
        fn = cases[name][0]
        fn(), torch.neuron.synchronize()
        graphs[name] = torch.neuron.NeuronGraph()
        with torch.neuron.graph(graphs[name]):
            for _ in range(args.inner):
                fn()
    results = {f"eager {name}": [] for name in cases} | {f"replayed {name}": [] for name in graphs}
    for _ in range(3):  # alternating rounds
        for name, (fn, sync) in cases.items():
            fn(), sync()
            results[f"eager {name}"].append(timed(fn, args.inner, args.samples, sync))
        for name, graph in graphs.items():
            results[f"replayed {name}"].append(timed(graph.replay, 1, args.samples, torch.neuron.synchronize)
                                               / args.inner)
    print(f"threads={args.threads} dtype={args.dtype} keys={args.keys} cache={args.cache}")
    for name, r in results.items():
        print(f"  {name:16s} {min(r):8.2f} us/call")
    for mode in ("eager", "replayed"):
        print(f"  {mode}: flash/decode {min(results[mode + ' flash']) / min(results[mode + ' decode']):.2f}x")


if __name__ == "__main__":
    main()
