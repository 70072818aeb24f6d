#!/usr/bin/env python3
"""Decode throughput of SmolLM2-135M-Instruct: ``--device`` (default neuron) against CPU.

One run measures, for the target device and for CPU:

* ``eager-dynamic``   -- eager forward, DynamicCache (``cache_implementation="dynamic"``)
* ``compiled-static`` -- StaticCache with the decode step compiled by Transformers
  (``torch.compile``, Inductor, ``mode="reduce-overhead"``; auto on neuron, forced on CPU)
* ``eager-static``    -- optional (``--variants``): StaticCache, ``disable_compile=True``
* ``graphs``          -- optional (``--variants``): StaticCache, decode step compiled with
  ``backend="neuron", mode="reduce-overhead"``, i.e. replayed as one neuron graph per token
  (docs/graphs.md); CPU has no graphs, so its column is CPU Inductor (``compiled-static``'s
  CPU run). The report gives graphs' tokens/s over CPU eager and CPU Inductor.
* ``graphs-eager``    -- optional (``--variants``): StaticCache, no torch.compile: the eager
  decode step is captured with ``torch.neuron.graph`` and replayed per token
  (examples/generate.py, ``DecodeGraph``); its CPU column is CPU eager with the static cache.

Each variant gets ``--warmup`` untimed generations (the first one of ``compiled-static``
includes compilation) and ``--runs`` timed ones of exactly ``--max-new-tokens`` new tokens
(EOS is suppressed with ``min_new_tokens``); the two devices' timed runs alternate, so
that drift on a shared machine reaches both alike; the median decode tokens/s is reported.
Decode time is taken from the streamer's per-token callbacks, i.e. it excludes prefill.

It also measures the device's copy bandwidth (``dst.copy_(src)`` of a ``--copy-mb`` tensor,
counted as read + write bytes) before and after the runs and reports the memory-bandwidth
bound on decode, ``bandwidth / weight bytes per token`` with the higher of the two, and the
fraction of it reached.
A variant that fails (e.g. Inductor not supporting the device) is reported, not fatal.

Examples::

    python benchmarks/generate.py                       # neuron vs CPU
    python benchmarks/generate.py --device cpu          # self-check on CPU only
    python benchmarks/generate.py --json results.json --runs 5
    python benchmarks/generate.py --variants eager-dynamic,compiled-static,graphs --threads 1
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import json
import os
import platform
import statistics
import sys
import time
import traceback
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402


def _load_example():
    """The helpers live in examples/generate.py (same name as this file, so load it by path)."""
    path = Path(__file__).resolve().parents[1] / "examples" / "generate.py"
    spec = importlib.util.spec_from_file_location("smollm2_generate_example", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


ex = _load_example()

ALL_VARIANTS = ("eager-dynamic", "eager-static", "compiled-static", "graphs", "graphs-eager")
COMPILED_VARIANTS = ("compiled-static", "graphs")


def log(*args):
    print(*args, file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- bandwidth
def copy_bandwidth(device: str, megabytes: int, iters: int) -> dict:
    """Median bandwidth of ``dst.copy_(src)`` for ``megabytes`` MiB tensors, read + write bytes."""
    numel = megabytes * 2**20 // 4
    src = torch.empty(numel, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    src.fill_(1.0)
    for _ in range(2):  # first touch / allocator warm-up
        dst.copy_(src)
    ex.synchronize(device)
    times = []
    for _ in range(iters):
        start = time.perf_counter()
        dst.copy_(src)
        ex.synchronize(device)
        times.append(time.perf_counter() - start)
    del src, dst
    module = getattr(torch, device_type := ex.device_type(device), None)
    if device_type != "cpu" and hasattr(module, "reset_peak_memory_stats"):
        module.reset_peak_memory_stats()  # so the reported peak is the model's, not these buffers'
    moved = 2 * numel * 4
    best, median = min(times), statistics.median(times)
    return {
        "copy_mb": megabytes,
        "iters": iters,
        "median_GBps": moved / median / 1e9,
        "best_GBps": moved / best / 1e9,
    }


# --------------------------------------------------------------------------- decode runs
def variant_kwargs(variant: str, device: str, args) -> dict:
    cache = "dynamic" if variant == "eager-dynamic" else "static"
    compiled = variant in COMPILED_VARIANTS
    # Transformers compiles by itself on neuron/cuda/...; on CPU it has to be forced.
    force = compiled and ex.device_type(device) not in ex.AUTO_COMPILE_DEVICE_TYPES
    backend, mode = (args.compile_backend, args.compile_mode) if compiled else (None, None)
    if variant == "graphs" and ex.device_type(device) == "neuron":
        backend, mode = "neuron", "reduce-overhead"
    return ex.generation_kwargs(
        args.max_new_tokens,
        cache,
        no_compile=not compiled,
        force_compile=force,
        compile_backend=backend,
        compile_mode=mode,
        min_new_tokens=args.max_new_tokens,
    )


class _Variant:
    """One variant of one device: its warm-up and timed generations, and the result."""

    def __init__(self, state: dict, variant: str, args):
        self.state, self.variant, self.args = state, variant, args
        self.kwargs = variant_kwargs(variant, state["device"], args)
        self.result: dict = {"variant": variant, "ok": False}
        self.warm: list = []
        self.runs: list = []
        self.ids = None
        model = state["model"]
        if variant in COMPILED_VARIANTS and hasattr(model, "_compiled_call"):
            del model._compiled_call  # make "compiled" below reflect this variant only
        # CPU has no graphs: its graphs-eager column is plain eager decode.
        self.decode_graph = (ex.install_decode_graph(model)
                             if variant == "graphs-eager" and ex.device_type(state["device"]) == "neuron" else None)

    def guarded(self, step) -> None:
        if "error" in self.result:
            return
        try:
            step()
        except Exception as error:  # noqa: BLE001 -- report and go on with the other variants
            first = (str(error).strip().splitlines() or [""])[0]
            self.result["error"] = f"{type(error).__name__}: {first}"[:500]
            log(f"    [{self.state['device']}] {self.variant} FAILED: {self.result['error']}")
            if self.args.verbose:
                traceback.print_exc()

    def warm_up(self) -> None:
        def step():
            start = time.perf_counter()
            ex.run_generate(self.state["model"], self.state["inputs"], self.kwargs)
            self.warm.append(time.perf_counter() - start)
        self.guarded(step)

    def timed(self) -> None:
        def step():
            replays = self._replays()
            self.ids, stats = ex.run_generate(self.state["model"], self.state["inputs"], self.kwargs)
            stats["graph_replays"] = self._replays() - replays
            self.runs.append(stats)
            log(f"    [{self.state['device']}] {self.variant}: {stats['decode_tok_s']:.2f} tok/s")
        self.guarded(step)

    def _replays(self) -> int:
        return _graph_replays() + (self.decode_graph.replays if self.decode_graph else 0)

    def finish(self) -> dict:
        model = self.state["model"]
        if self.decode_graph is not None:
            del model.forward  # back to the class's forward
            if self.decode_graph.failed and "error" not in self.result:
                self.result["error"] = f"decode step not captured: {self.decode_graph.failed}"[:500]
        if "error" not in self.result:
            rates = [r["decode_tok_s"] for r in self.runs]
            self.result.update(
                ok=True,
                compiled=getattr(model, "_compiled_call", None) is not None,
                warmup_s=self.warm,
                decode_tok_s_median=statistics.median(rates),
                decode_tok_s_min=min(rates),
                decode_tok_s_max=max(rates),
                prefill_s_median=statistics.median(r["prefill_s"] for r in self.runs),
                decode_tokens=self.runs[0]["decode_tokens"],
                runs=rates,
                token_ids=self.ids,
                graph_replays_per_run=[r["graph_replays"] for r in self.runs],
            )
            if self.variant in COMPILED_VARIANTS and not self.result["compiled"]:
                self.result.update(ok=False, error="generate() did not compile the decode step "
                                                   "(transformers' auto-compile criteria not met)")
        if self.variant in COMPILED_VARIANTS and hasattr(model, "_compiled_call"):
            del model._compiled_call
        bound = self.state["out"].get("bound_tok_s")
        if self.result.get("ok") and bound:
            self.result["fraction_of_bound"] = self.result["decode_tok_s_median"] / bound
        return self.result


def _graph_replays() -> int:
    """Neuron graph replays so far (0 without torch_neuronx)."""
    module = sys.modules.get("torch_neuronx._compile.graphs")
    return module.graph_stats()["replays"] if module is not None else 0


def load_device(device: str, tokenizer, args) -> dict:
    """Model, inputs and copy bandwidth of one device; ``out`` collects its results."""
    out: dict = {"device": device, "variants": {}}
    state = {"device": device, "out": out, "model": None}
    log(f"[{device}] loading model ...")
    try:
        model, load_s = ex.load_model(device, ex.DTYPES[args.dtype])
    except Exception as error:  # noqa: BLE001
        out["error"] = f"load failed: {type(error).__name__}: {error}"[:500]
        log(f"[{device}] {out['error']}")
        if args.verbose:
            traceback.print_exc()
        return state
    out["load_s"] = load_s
    out["weight_bytes"] = ex.weight_bytes(model)
    log(f"[{device}] loaded in {load_s:.1f}s, {out['weight_bytes'] / 2**20:.0f} MiB of weights")

    try:
        out["bandwidth"] = copy_bandwidth(device, args.copy_mb, args.copy_iters)
        bw = out["bandwidth"]["median_GBps"] * 1e9
        out["bound_tok_s"] = bw / out["weight_bytes"]
        log(f"[{device}] copy bandwidth {out['bandwidth']['median_GBps']:.2f} GB/s (read+write) "
            f"-> bound {out['bound_tok_s']:.1f} tok/s")
    except Exception as error:  # noqa: BLE001
        out["bandwidth_error"] = f"{type(error).__name__}: {error}"[:500]
        log(f"[{device}] bandwidth measurement failed: {out['bandwidth_error']}")

    state["model"] = model
    state["inputs"] = ex.chat_inputs(tokenizer, args.prompt, model.device)
    out["prompt_tokens"] = int(state["inputs"]["input_ids"].shape[1])
    return state


def bench_devices(devices, tokenizer, args) -> dict:
    """Every variant on every device, the devices' timed runs alternating (device A's
    run 1, device B's run 1, A's run 2, ...) so that drift on a shared machine reaches
    both alike; returns ``{device: results}``."""
    states = [load_device(d, tokenizer, args) for d in devices]
    live = [s for s in states if s["model"] is not None]
    for variant in args.variants:
        log(f"{variant}: {args.warmup} warm-up + {args.runs} timed runs per device, alternating ...")
        runs = [_Variant(s, variant, args) for s in live]
        for r in runs:
            for _ in range(args.warmup):
                r.warm_up()
        for _ in range(args.runs):
            for r in runs:
                r.timed()
        for r in runs:
            r.state["out"]["variants"][variant] = r.finish()
        if variant in COMPILED_VARIANTS:
            torch._dynamo.reset()
    for s in live:
        s["out"]["memory"] = memory_report(s["device"])
        s["model"] = s["inputs"] = None
    gc.collect()
    for s in live:
        remeasure_bound(s["out"], args)
    return {s["device"]: s["out"] for s in states}


def remeasure_bound(out: dict, args) -> None:
    """Measures the copy bandwidth again after the runs; the bound uses the higher of
    the two medians. One measurement before the runs can fall far below the machine's
    bandwidth when another job is busy just then (one run measured 9 GB/s on neuron and
    21 on CPU, the same memory), which put decode at over 100 % of its "bound"."""
    if "bandwidth" not in out:
        return
    try:
        out["bandwidth_after"] = copy_bandwidth(out["device"], args.copy_mb, args.copy_iters)
    except Exception as error:  # noqa: BLE001
        out["bandwidth_error"] = f"{type(error).__name__}: {error}"[:500]
        return
    best = max(out["bandwidth"]["median_GBps"], out["bandwidth_after"]["median_GBps"])
    out["bound_GBps"] = best
    out["bound_tok_s"] = best * 1e9 / out["weight_bytes"]
    for result in out["variants"].values():
        if result.get("ok"):
            result["fraction_of_bound"] = result["decode_tok_s_median"] / out["bound_tok_s"]


def memory_report(device: str) -> dict:
    """Host peak RSS and, where the device module has it, the device's peak allocation."""
    import resource

    report = {"host_peak_rss_MiB": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}
    module = getattr(torch, ex.device_type(device), None)
    if ex.device_type(device) != "cpu" and module is not None and hasattr(module, "max_memory_allocated"):
        try:
            report["device_max_allocated_MiB"] = module.max_memory_allocated() / 2**20
        except Exception as error:  # noqa: BLE001
            report["device_max_allocated_error"] = str(error)[:200]
    return report


# --------------------------------------------------------------------------- report
def _fmt(value, spec=".2f", missing="-"):
    return missing if value is None else format(value, spec)


def summarize(target: dict, cpu: dict, variants) -> dict:
    summary = {}
    for v in variants:
        t = target.get("variants", {}).get(v, {})
        c = cpu.get("variants", {}).get(v, {})
        entry = {
            "device_tok_s": t.get("decode_tok_s_median") if t.get("ok") else None,
            "cpu_tok_s": c.get("decode_tok_s_median") if c.get("ok") else None,
            "device_fraction_of_bound": t.get("fraction_of_bound"),
            "cpu_fraction_of_bound": c.get("fraction_of_bound"),
            "device_error": t.get("error"),
            "cpu_error": c.get("error"),
        }
        entry["ratio_device_over_cpu"] = (
            entry["device_tok_s"] / entry["cpu_tok_s"] if entry["device_tok_s"] and entry["cpu_tok_s"] else None
        )
        if t.get("ok") and c.get("ok"):
            entry["tokens_match_cpu"] = t.get("token_ids") == c.get("token_ids")
        summary[v] = entry
    # the two comparisons the benchmark is about: eager vs eager, compiled vs compiled
    if "eager-dynamic" in summary and "compiled-static" in summary:
        e, k = summary["eager-dynamic"], summary["compiled-static"]
        summary["_speedup_compiled_over_eager"] = {
            "device": k["device_tok_s"] / e["device_tok_s"] if k["device_tok_s"] and e["device_tok_s"] else None,
            "cpu": k["cpu_tok_s"] / e["cpu_tok_s"] if k["cpu_tok_s"] and e["cpu_tok_s"] else None,
        }
    if "graphs" in summary:
        g = summary["graphs"]["device_tok_s"]
        cpu_eager = next((summary[v]["cpu_tok_s"] for v in ("eager-dynamic", "eager-static", "graphs-eager")
                          if v in summary and summary[v]["cpu_tok_s"]), None)
        # The graphs row's CPU column is CPU Inductor, timed alternately with the graph runs.
        cpu_inductor = summary["graphs"]["cpu_tok_s"] or summary.get("compiled-static", {}).get("cpu_tok_s")
        summary["_graphs_over_cpu"] = {
            "eager": g / cpu_eager if g and cpu_eager else None,
            "inductor": g / cpu_inductor if g and cpu_inductor else None,
            "replays_per_run": target.get("variants", {}).get("graphs", {}).get("graph_replays_per_run"),
        }
    if "graphs-eager" in summary:
        g = summary["graphs-eager"]["device_tok_s"]
        # Its CPU column is CPU eager (static cache), timed alternately with the graph runs.
        cpu_eager = summary["graphs-eager"]["cpu_tok_s"]
        cpu_inductor = next((summary[v]["cpu_tok_s"] for v in ("compiled-static", "graphs")
                             if v in summary and summary[v]["cpu_tok_s"]), None)
        summary["_graphs_eager_over_cpu"] = {
            "eager": g / cpu_eager if g and cpu_eager else None,
            "inductor": g / cpu_inductor if g and cpu_inductor else None,
            "replays_per_run": target.get("variants", {}).get("graphs-eager", {}).get("graph_replays_per_run"),
        }
    return summary


def print_report(report: dict, stream) -> None:
    dev = report["config"]["device"]
    target, cpu = report["results"][dev], report["results"]["cpu"]
    p = lambda *a: print(*a, file=stream)  # noqa: E731
    p()
    p(f"SmolLM2-135M-Instruct ({report['config']['dtype']}), {report['config']['max_new_tokens']} new tokens, "
      f"prompt {target.get('prompt_tokens', '?')} tokens, median of {report['config']['runs']} runs "
      f"after {report['config']['warmup']} warm-up")
    p(f"torch {report['env']['torch']}, transformers {report['env']['transformers']}, "
      f"{report['env']['cpu_count']} CPUs, {report['env']['torch_threads']} threads, "
      f"loadavg before/after {report['env']['loadavg_before']}/{report['env']['loadavg_after']}")
    if report["config"]["self_check"]:
        p("self-check: --device cpu, so the CPU reference is the same measurement (ratios are 1 by construction)")
    for name, r in ((dev, target), ("cpu", cpu)) if dev != "cpu" else ((dev, target),):
        if "error" in r:
            p(f"  {name}: {r['error']}")
            continue
        bw = r.get("bandwidth", {})
        after = r.get("bandwidth_after", {})
        p(f"  {name}: load {r['load_s']:.1f}s; weights {r['weight_bytes'] / 1e6:.1f} MB/token; "
          f"copy bandwidth {_fmt(bw.get('median_GBps'))} before / {_fmt(after.get('median_GBps'))} after the runs "
          f"GB/s (read+write, {bw.get('copy_mb', '?')} MiB; the bound uses the higher) "
          f"-> bound {_fmt(r.get('bound_tok_s'), '.1f')} tok/s"
          + (f"  [bandwidth error: {r['bandwidth_error']}]" if "bandwidth_error" in r else ""))
        mem = r.get("memory", {})
        if "device_max_allocated_MiB" in mem:
            p(f"  {name}: peak device allocation {mem['device_max_allocated_MiB']:.0f} MiB")
    p()
    header = f"{'variant':<17}{dev + ' tok/s':>14}{'cpu tok/s':>12}{'ratio':>9}{dev + ' %bound':>15}{'cpu %bound':>12}  match"
    p(header)
    p("-" * len(header))
    for v in report["config"]["variants"]:
        s = report["summary"][v]
        pct = lambda f: "-" if f is None else f"{100 * f:.1f}%"  # noqa: E731
        match = {True: "yes", False: "NO", None: "-"}[s.get("tokens_match_cpu")]
        p(f"{v:<17}{_fmt(s['device_tok_s']):>14}{_fmt(s['cpu_tok_s']):>12}"
          f"{_fmt(s['ratio_device_over_cpu'], '.2f') + 'x' if s['ratio_device_over_cpu'] else '-':>9}"
          f"{pct(s['device_fraction_of_bound']):>15}{pct(s['cpu_fraction_of_bound']):>12}  {match}")
    for v in report["config"]["variants"]:
        s = report["summary"][v]
        for side in ("device",) if report["config"]["self_check"] else ("device", "cpu"):
            if s.get(f"{side}_error"):
                p(f"  {v} on {dev if side == 'device' else 'cpu'} failed: {s[f'{side}_error']}")
    sp = report["summary"].get("_speedup_compiled_over_eager")
    if sp:
        p(f"compiled-static / eager-dynamic: {dev} {_fmt(sp['device'])}x"
          + ("" if report["config"]["self_check"] else f", cpu {_fmt(sp['cpu'])}x"))
    for name, key in (("graphs", "_graphs_over_cpu"), ("graphs-eager", "_graphs_eager_over_cpu")):
        gr = report["summary"].get(key)
        if gr:
            p(f"{name} ({dev}) / cpu eager: {_fmt(gr['eager'])}x; / cpu inductor: {_fmt(gr['inductor'])}x; "
              f"graph replays per timed run: {gr['replays_per_run']}")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="neuron", help="device to benchmark against CPU (default: neuron)")
    p.add_argument("--dtype", choices=tuple(ex.DTYPES), default="float32")
    p.add_argument("--prompt", default=ex.DEFAULT_PROMPT)
    p.add_argument("--max-new-tokens", type=int, default=64, help="new tokens per run (EOS suppressed)")
    p.add_argument("--runs", type=int, default=3, help="timed runs per variant (median reported)")
    p.add_argument("--warmup", type=int, default=1, help="untimed runs per variant (compiles, warms caches)")
    p.add_argument("--variants", default="eager-dynamic,compiled-static",
                   help=f"comma-separated subset of {','.join(ALL_VARIANTS)}")
    p.add_argument("--compile-backend", default=None, help="torch.compile backend (default: inductor)")
    p.add_argument("--compile-mode", default=None, help="torch.compile mode (default: reduce-overhead)")
    p.add_argument("--copy-mb", type=int, default=256, help="tensor size for the copy-bandwidth test (MiB)")
    p.add_argument("--copy-iters", type=int, default=10)
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's choice)")
    p.add_argument("--json", metavar="PATH", default=None, help="write the full results as JSON ('-' = stdout)")
    p.add_argument("--verbose", action="store_true", help="print tracebacks of failures")
    p.add_argument("--strict", action="store_true", help="exit 1 if any load or variant failed")
    args = p.parse_args(argv)
    args.variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    bad = [v for v in args.variants if v not in ALL_VARIANTS]
    if bad:
        p.error(f"unknown variant(s) {bad}; choose from {ALL_VARIANTS}")
    if args.runs < 1:
        p.error("--runs must be >= 1")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    ex.import_backend(args.device)
    if args.threads:
        torch.set_num_threads(args.threads)
    import transformers

    loadavg_before = [round(x, 2) for x in os.getloadavg()]
    tokenizer, tok_s = ex.load_tokenizer()
    log(f"tokenizer loaded in {tok_s:.1f}s")

    self_check = ex.device_type(args.device) == "cpu"
    results = bench_devices([args.device] if self_check else [args.device, "cpu"], tokenizer, args)
    if self_check:
        results["cpu"] = results[args.device]

    report = {
        "model": ex.GGUF_NAME,
        "config": {
            "device": args.device,
            "dtype": args.dtype,
            "max_new_tokens": args.max_new_tokens,
            "runs": args.runs,
            "warmup": args.warmup,
            "variants": args.variants,
            "compile_backend": args.compile_backend or "inductor",
            "compile_mode": args.compile_mode or "reduce-overhead",
            "prompt": args.prompt,
            "self_check": self_check,
            "bound_definition": "copy bandwidth (read+write bytes/s; the higher of the measurements "
                                "before and after the runs) / distinct weight bytes",
        },
        "env": {
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "python": platform.python_version(),
            "cpu_count": os.cpu_count(),
            "torch_threads": torch.get_num_threads(),
            "loadavg_before": loadavg_before,
            "loadavg_after": [round(x, 2) for x in os.getloadavg()],
            "tokenizer_load_s": tok_s,
        },
        "results": results,
    }
    report["summary"] = summarize(results[args.device], results["cpu"], args.variants)

    to_stdout_json = args.json == "-"
    print_report(report, sys.stderr if to_stdout_json else sys.stdout)
    if args.json:
        # token ids are only for the match check; keep the JSON readable
        slim = json.loads(json.dumps(report, default=str))
        for res in slim["results"].values():
            for v in res.get("variants", {}).values():
                v.pop("token_ids", None)
        text = json.dumps(slim, indent=2)
        if to_stdout_json:
            print(text)
        else:
            Path(args.json).write_text(text + "\n")
            log(f"wrote {args.json}")
    failed = any("error" in r or not all(v.get("ok") for v in r.get("variants", {}).values())
                 for r in results.values())
    return 1 if (failed and args.strict) else 0  # failures are reported, fatal only with --strict


if __name__ == "__main__":
    sys.exit(main())
