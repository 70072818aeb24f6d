#!/usr/bin/env python3
"""``torch.compile`` on the ``neuron`` device against eager and against CPU Inductor.

Workloads (``--workloads``; default ``mlp-train,tfm-infer,tfm-train``):

* ``mlp-train``  -- 4 x (Linear 512 -> GELU -> LayerNorm), batch 64: forward + backward
* ``tfm-infer``  -- a pre-LN transformer block (hidden 256, 4 heads, causal
  ``F.scaled_dot_product_attention``, MLP 1024, seq 128, batch 8): forward under ``no_grad``
* ``tfm-train``  -- the same block: forward + backward
* ``conv-train`` -- optional: 3 x (Conv2d -> BatchNorm -> ReLU) + pool + Linear on
  32 x 3 x 32 x 32 images, cross-entropy: forward + backward (updates BN running stats)

Variants (step = one call of the workload's step, then ``synchronize``):

* ``eager-neuron``    -- eager on ``neuron``
* ``neuron``          -- ``torch.compile(m, backend="neuron")`` on ``neuron``
* ``inductor-neuron`` -- ``torch.compile(m)`` (default Inductor: the same lowering as ``backend="neuron"``)
* ``eager-cpu``       -- eager on CPU
* ``inductor-cpu``    -- ``torch.compile(m)`` on CPU

Goals (printed as ok/MISS):

* steady state: compiled neuron / compiled CPU step time <= 1.0 (same throughput or better)
* cold compile (fresh cache dir) neuron / CPU <= 1.2
* warm compile (second process, same cache dir) <= 15% of cold, per device (issue 9)

Method. Every measurement runs in a fresh subprocess (``--worker``) with
``torch.set_num_threads(--threads)`` (default 1: the machine is shared, and OpenMP with
all cores under contention is far noisier than one thread). Compile time is the time of
the first step minus the steady-state median step of the same process. For each workload
and compiled device (``neuron`` backend, ``inductor-cpu``) a *cold* process runs with a new
empty ``TORCHINDUCTOR_CACHE_DIR``, then a *warm* process with the same directory; both
report Inductor's FX-graph-cache and AOTAutograd-cache counters
(``torch._dynamo.utils.counters``). ``inductor-neuron`` shares the neuron lowering (and so
the FX-graph-cache entries) with ``backend="neuron"``: it runs only warm, in the neuron
cache dir, after the neuron cold run (first workload only unless
``--warm-inductor-neuron all``). Compile CPU time (user + sys of the process and its reaped
children) is reported next to wall time; it is the steadier number on a loaded machine,
and ``TORCHINDUCTOR_COMPILE_THREADS=1`` (``--compile-threads``) keeps the C++ compiler runs
in reaped children rather than in a worker pool. Steady-state step times then come from
one process per workload that builds all five variants (compiled ones from a merged copy of the warm
cache dirs) and times them in alternating rounds, so drift on the shared machine hits all
variants alike; ``--samples`` rounds of ``--inner`` steps, the median per step is reported.

Examples::

    nice -n 10 python benchmarks/compile.py
    nice -n 10 python benchmarks/compile.py --quick            # mlp-train only, fewer samples
    nice -n 10 python benchmarks/compile.py --workloads mlp-train,conv-train --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import date

STEADY_GOAL = 1.0   # compiled neuron / compiled CPU step time
COLD_GOAL = 1.2     # cold compile neuron / CPU
WARM_GOAL = 0.15    # warm / cold compile

WORKLOADS = ("mlp-train", "tfm-infer", "tfm-train", "conv-train")
DEFAULT_WORKLOADS = ("mlp-train", "tfm-infer", "tfm-train")
VARIANTS = ("eager-neuron", "neuron", "inductor-neuron", "eager-cpu", "inductor-cpu")
VARIANT_SPEC = {  # name -> (device, torch.compile backend or None for eager)
    "eager-neuron": ("neuron", None),
    "neuron": ("neuron", "neuron"),
    "inductor-neuron": ("neuron", "inductor"),
    "eager-cpu": ("cpu", None),
    "inductor-cpu": ("cpu", "inductor"),
}
COUNTER_KEYS = {
    "inductor": ("fxgraph_cache_hit", "fxgraph_cache_miss", "fxgraph_cache_bypass"),
    "aot_autograd": ("autograd_cache_hit", "autograd_cache_miss", "autograd_cache_bypass",
                     "autograd_cache_saved"),
}


# ============================================================================ workloads
def build(workload: str, device: str):
    """Returns (module, step(module_or_compiled) -> None). Same init on every device."""
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)

    if workload == "mlp-train":
        layers = []
        for _ in range(4):
            layers += [nn.Linear(512, 512), nn.GELU(), nn.LayerNorm(512)]
        model = nn.Sequential(*layers)
        x = torch.randn(64, 512, generator=g)
        model, x = model.to(device), x.to(device)

        def step(m):
            model.zero_grad(set_to_none=True)
            m(x).sum().backward()

        return model, step

    if workload in ("tfm-infer", "tfm-train"):
        hidden, heads, seq, batch = 256, 4, 128, 8

        class Block(nn.Module):
            def __init__(self):
                super().__init__()
                self.ln1 = nn.LayerNorm(hidden)
                self.qkv = nn.Linear(hidden, 3 * hidden)
                self.proj = nn.Linear(hidden, hidden)
                self.ln2 = nn.LayerNorm(hidden)
                self.fc1 = nn.Linear(hidden, 4 * hidden)
                self.fc2 = nn.Linear(4 * hidden, hidden)

            def forward(self, x):
                b, s, h = x.shape
                q, k, v = self.qkv(self.ln1(x)).view(b, s, 3, heads, h // heads).permute(2, 0, 3, 1, 4)
                a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
                x = x + self.proj(a.transpose(1, 2).reshape(b, s, h))
                return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))

        model = Block()
        x = torch.randn(batch, seq, hidden, generator=g)
        model, x = model.to(device), x.to(device)
        if workload == "tfm-infer":
            model.eval()

            def step(m):
                with torch.no_grad():
                    m(x)
        else:
            def step(m):
                model.zero_grad(set_to_none=True)
                m(x).sum().backward()

        return model, step

    if workload == "conv-train":
        def block(cin, cout, stride):
            return [nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout), nn.ReLU()]

        model = nn.Sequential(*block(3, 32, 1), *block(32, 64, 2), *block(64, 64, 2),
                              nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 10))
        x = torch.randn(32, 3, 32, 32, generator=g)
        y = torch.randint(0, 10, (32,), generator=g)
        model, x, y = model.to(device), x.to(device), y.to(device)

        def step(m):
            model.zero_grad(set_to_none=True)
            F.cross_entropy(m(x), y).backward()

        return model, step

    raise ValueError(workload)


# ============================================================================ worker side
def _sync(device: str) -> None:
    import torch

    if device != "cpu":
        torch.neuron.synchronize()


def _make_variant(workload: str, variant: str):
    import torch

    device, backend = VARIANT_SPEC[variant]
    model, step = build(workload, device)
    fn = model if backend is None else torch.compile(model, backend=backend)

    def run():
        step(fn)
        _sync(device)

    return run


def _time(run, n: int) -> float:
    t = time.perf_counter()
    for _ in range(n):
        run()
    return (time.perf_counter() - t) / n


def _counters() -> dict:
    from torch._dynamo.utils import counters

    return {group: {k: counters[group][k] for k in keys if counters[group][k]}
            for group, keys in COUNTER_KEYS.items()}


def _cpu() -> float:
    """CPU seconds of this process and its reaped children (the C++ compiler runs)."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def _phase_times(top: int = 8) -> dict:
    """Dynamo's per-phase compile timers (seconds, summed), largest first."""
    from torch._dynamo.utils import compilation_time_metrics

    tot = {k: sum(v) for k, v in compilation_time_metrics.items()}
    return dict(sorted(tot.items(), key=lambda kv: -kv[1])[:top])


def worker_compile(spec: dict) -> dict:
    """First step (compile) then steady state, for one variant."""
    run = _make_variant(spec["workload"], spec["variant"])
    t, c = time.perf_counter(), _cpu()
    run()
    first, first_cpu = time.perf_counter() - t, _cpu() - c
    for _ in range(spec["warmup"]):
        run()
    steps, cpus = [], []
    for _ in range(spec["steps"]):
        t, c = time.perf_counter(), _cpu()
        run()
        steps.append(time.perf_counter() - t)
        cpus.append(_cpu() - c)
    median, median_cpu = statistics.median(steps), statistics.median(cpus)
    from torch._dynamo.utils import counters

    return {"first_s": first, "step_s": median, "compile_s": max(first - median, 0.0),
            "first_cpu_s": first_cpu, "compile_cpu_s": max(first_cpu - median_cpu, 0.0),
            "counters": _counters(), "frames_ok": counters["frames"]["ok"], "phases_s": _phase_times()}


def worker_steady(spec: dict) -> dict:
    """All variants in one process, timed in alternating rounds."""
    runs, errors, compile_s = {}, {}, {}
    for v in spec["variants"]:
        try:
            run = _make_variant(spec["workload"], v)
            t = time.perf_counter()
            run()
            compile_s[v] = time.perf_counter() - t
            runs[v] = run
        except Exception as e:  # reported, not fatal
            errors[v] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300]
    for run in runs.values():
        for _ in range(spec["warmup"]):
            run()
    samples = {v: [] for v in runs}
    for _ in range(spec["samples"]):
        for v, run in runs.items():
            samples[v].append(_time(run, spec["inner"]))
    return {"step_s": {v: statistics.median(s) for v, s in samples.items()},
            "min_s": {v: min(s) for v, s in samples.items()},
            "first_s": compile_s, "errors": errors, "counters": _counters()}


def worker_main(spec_path: str, out_path: str) -> None:
    import torch

    with open(spec_path) as f:
        spec = json.load(f)
    torch.set_num_threads(spec["threads"])
    try:
        res = worker_compile(spec) if spec["kind"] == "compile" else worker_steady(spec)
    except Exception as e:
        import traceback

        res = {"error": f"{type(e).__name__}: {e}"[:2000], "traceback": traceback.format_exc()[-4000:]}
    with open(out_path, "w") as f:
        json.dump(res, f)


# ============================================================================ driver side
def spawn(spec: dict, cache_dir: str, timeout: float) -> dict:
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=cache_dir,
               TORCHINDUCTOR_COMPILE_THREADS=str(spec.get("compile_threads", 1)))
    with tempfile.TemporaryDirectory() as tmp:
        spec_path, out_path = os.path.join(tmp, "spec.json"), os.path.join(tmp, "out.json")
        with open(spec_path, "w") as f:
            json.dump(spec, f)
        t = time.perf_counter()
        try:
            p = subprocess.run([sys.executable, os.path.abspath(__file__), "--worker", spec_path, out_path],
                               env=env, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return {"error": f"timeout after {timeout:.0f}s"}
        wall = time.perf_counter() - t
        if not os.path.exists(out_path):
            return {"error": f"worker exited {p.returncode}: {p.stderr[-2000:]}"}
        with open(out_path) as f:
            res = json.load(f)
        res["process_wall_s"] = wall
        return res


def merge_dirs(srcs, dst) -> None:
    """Inductor's cache dirs are content-addressed, so a union of copies is a valid cache."""
    for s in srcs:
        if os.path.isdir(s):
            shutil.copytree(s, dst, dirs_exist_ok=True, symlinks=True)


def _cache_summary(c: dict) -> str:
    if not c or "counters" not in c:
        return "-"
    ind, aot = c["counters"].get("inductor", {}), c["counters"].get("aot_autograd", {})
    parts = []
    fx = [f"{k.split('_')[-1]} {v}" for k, v in ind.items()]
    parts.append("fx: " + (", ".join(fx) if fx else "none"))
    au = [f"{k.split('_')[-1]} {v}" for k, v in aot.items()]
    parts.append("aot: " + (", ".join(au) if au else "not used"))
    return "; ".join(parts)


def _ms(s):
    return "-" if s is None else f"{s * 1e3:.2f}"


def _sec(s):
    return "-" if s is None else f"{s:.1f}"


def _ratio(a, b):
    return None if a is None or b is None or b == 0 else a / b


def _r(x, goal=None, le=True):
    if x is None:
        return "-"
    s = f"{x:.2f}"
    if goal is not None:
        s += " ok" if (x <= goal if le else x >= goal) else " MISS"
    return s


def run_workload(w: str, args, root: str, first: bool) -> dict:
    res: dict = {"workload": w, "compile": {}, "steady": None}
    base = {"workload": w, "threads": args.threads, "kind": "compile", "compile_threads": args.compile_threads,
            "warmup": args.compile_warmup, "steps": args.compile_steps}
    dirs = {}
    for variant in ("neuron", "inductor-cpu"):
        dirs[variant] = d = os.path.join(root, f"{w}-{variant}")
        os.makedirs(d)
        for phase in ("cold", "warm"):
            log(f"  {w:10s} {variant:15s} {phase} ...")
            r = spawn({**base, "variant": variant}, d, args.timeout)
            res["compile"].setdefault(variant, {})[phase] = r
            log(f"    {_describe(r)}")
    if args.warm_inductor_neuron == "all" or (args.warm_inductor_neuron == "first" and first):
        # default Inductor on neuron: same lowering and FX-graph-cache entries as backend="neuron"
        log(f"  {w:10s} inductor-neuron  warm (neuron cache dir) ...")
        r = spawn({**base, "variant": "inductor-neuron"}, dirs["neuron"], args.timeout)
        res["compile"]["inductor-neuron"] = {"warm": r}
        log(f"    {_describe(r)}")

    merged = os.path.join(root, f"{w}-merged")
    merge_dirs(dirs.values(), merged)
    log(f"  {w:10s} steady state, all variants ...")
    res["steady"] = spawn({"workload": w, "threads": args.threads, "kind": "steady",
                           "compile_threads": args.compile_threads,
                           "variants": list(args.variants), "warmup": args.warmup,
                           "samples": args.samples, "inner": args.inner}, merged, args.timeout)
    if "error" in res["steady"]:
        log(f"    ERROR {res['steady']['error'][:500]}")
    for v, e in res["steady"].get("errors", {}).items():
        log(f"    {v}: ERROR {e}")
    return res


def _describe(r: dict) -> str:
    if "error" in r:
        return "ERROR " + r["error"][:500]
    return (f"first {r['first_s']:.1f}s  step {r['step_s'] * 1e3:.2f}ms  compile {r['compile_s']:.1f}s "
            f"(cpu {r['compile_cpu_s']:.1f}s)  "
            f"[{_cache_summary(r)}]  (process {r['process_wall_s']:.1f}s)")


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def derive(res: dict) -> dict:
    """Ratios for one workload."""
    st = (res["steady"] or {}).get("step_s", {})
    c = res["compile"]

    def comp(v, phase, key="compile_s"):
        r = c.get(v, {}).get(phase, {})
        return r.get(key)

    out = {
        "speedup_neuron": _ratio(st.get("eager-neuron"), st.get("neuron")),
        "speedup_inductor_neuron": _ratio(st.get("eager-neuron"), st.get("inductor-neuron")),
        "speedup_cpu": _ratio(st.get("eager-cpu"), st.get("inductor-cpu")),
        "neuron_vs_cpu_compiled": _ratio(st.get("neuron"), st.get("inductor-cpu")),
        "inductor_neuron_vs_cpu_compiled": _ratio(st.get("inductor-neuron"), st.get("inductor-cpu")),
        "eager_neuron_vs_cpu": _ratio(st.get("eager-neuron"), st.get("eager-cpu")),
        "cold_neuron_s": comp("neuron", "cold"), "cold_cpu_s": comp("inductor-cpu", "cold"),
        "warm_neuron_s": comp("neuron", "warm"), "warm_cpu_s": comp("inductor-cpu", "warm"),
        "warm_inductor_neuron_s": comp("inductor-neuron", "warm"),
        "cold_neuron_cpu_s": comp("neuron", "cold", "compile_cpu_s"),
        "cold_cpu_cpu_s": comp("inductor-cpu", "cold", "compile_cpu_s"),
        "warm_neuron_cpu_s": comp("neuron", "warm", "compile_cpu_s"),
        "warm_cpu_cpu_s": comp("inductor-cpu", "warm", "compile_cpu_s"),
    }
    out["cold_neuron_vs_cpu"] = _ratio(out["cold_neuron_s"], out["cold_cpu_s"])
    out["warm_over_cold_neuron"] = _ratio(out["warm_neuron_s"], out["cold_neuron_s"])
    out["warm_over_cold_cpu"] = _ratio(out["warm_cpu_s"], out["cold_cpu_s"])
    out["cold_neuron_vs_cpu_cputime"] = _ratio(out["cold_neuron_cpu_s"], out["cold_cpu_cpu_s"])
    out["warm_over_cold_neuron_cputime"] = _ratio(out["warm_neuron_cpu_s"], out["cold_neuron_cpu_s"])
    out["warm_over_cold_cpu_cputime"] = _ratio(out["warm_cpu_cpu_s"], out["cold_cpu_cpu_s"])
    return out


def report(results: list, args, meta: dict) -> str:
    lines = []
    lines.append("Steady-state median step time (ms), all variants alternating in one process per workload:")
    lines.append("")
    lines.append("| workload | eager-neuron | neuron | inductor-neuron | eager-cpu | inductor-cpu "
                 "| speedup neuron (eager/compiled) | compiled neuron / compiled CPU (goal <= 1.0) "
                 "| inductor-neuron / compiled CPU |")
    lines.append("|---|---|---|---|---|---|---|---|---|")
    for res in results:
        st = (res["steady"] or {}).get("step_s", {})
        d = res["derived"]
        lines.append(f"| {res['workload']} | " + " | ".join(_ms(st.get(v)) for v in VARIANTS)
                     + f" | {_r(d['speedup_neuron'])}x | {_r(d['neuron_vs_cpu_compiled'], STEADY_GOAL)}"
                     + f" | {_r(d['inductor_neuron_vs_cpu_compiled'], STEADY_GOAL)} |")
    lines.append("")
    lines.append("Compile time (s) = first step - steady step, fresh process each; cold = empty "
                 "TORCHINDUCTOR_CACHE_DIR, warm = second process on the same dir:")
    lines.append("")
    lines.append("| workload | cold neuron | cold CPU | cold neuron/CPU (goal <= 1.2) | warm neuron "
                 "| warm/cold neuron (goal <= 0.15) | warm CPU | warm/cold CPU | warm inductor-neuron |")
    lines.append("|---|---|---|---|---|---|---|---|---|")
    for res in results:
        d = res["derived"]
        lines.append(f"| {res['workload']} | {_sec(d['cold_neuron_s'])} | {_sec(d['cold_cpu_s'])} "
                     f"| {_r(d['cold_neuron_vs_cpu'], COLD_GOAL)} | {_sec(d['warm_neuron_s'])} "
                     f"| {_r(d['warm_over_cold_neuron'], WARM_GOAL)} | {_sec(d['warm_cpu_s'])} "
                     f"| {_r(d['warm_over_cold_cpu'], WARM_GOAL)} | {_sec(d['warm_inductor_neuron_s'])} |")
    lines.append("")
    lines.append("Compile CPU time (s) of the same processes (user+sys, incl. the C++ compiler runs; "
                 "less sensitive to load on a shared machine than wall time):")
    lines.append("")
    lines.append("| workload | cold neuron | cold CPU | cold neuron/CPU | warm neuron | warm/cold neuron "
                 "| warm CPU | warm/cold CPU |")
    lines.append("|---|---|---|---|---|---|---|---|")
    for res in results:
        d = res["derived"]
        lines.append(f"| {res['workload']} | {_sec(d['cold_neuron_cpu_s'])} | {_sec(d['cold_cpu_cpu_s'])} "
                     f"| {_r(d['cold_neuron_vs_cpu_cputime'], COLD_GOAL)} | {_sec(d['warm_neuron_cpu_s'])} "
                     f"| {_r(d['warm_over_cold_neuron_cputime'], WARM_GOAL)} | {_sec(d['warm_cpu_cpu_s'])} "
                     f"| {_r(d['warm_over_cold_cpu_cputime'], WARM_GOAL)} |")
    lines.append("")
    lines.append("Caches (torch._dynamo.utils.counters; fx = inductor fxgraph_cache_*, "
                 "aot = aot_autograd autograd_cache_*):")
    lines.append("")
    lines.append("| workload | variant | cold | warm |")
    lines.append("|---|---|---|---|")
    for res in results:
        for v in ("neuron", "inductor-neuron", "inductor-cpu"):
            c = res["compile"].get(v, {})
            lines.append(f"| {res['workload']} | {v} | {_cache_summary(c.get('cold'))} | "
                         f"{_cache_summary(c.get('warm'))} |")
    errs = []
    for res in results:
        for v, c in res["compile"].items():
            for phase, r in c.items():
                if "error" in r:
                    errs.append(f"{res['workload']} {v} {phase}: {r['error'][:300]}")
        st = res["steady"] or {}
        if "error" in st:
            errs.append(f"{res['workload']} steady: {st['error'][:300]}")
        for v, e in st.get("errors", {}).items():
            errs.append(f"{res['workload']} steady {v}: {e}")
    if errs:
        lines.append("")
        lines.append("Failures:")
        lines += [f"- {e}" for e in errs]
    return "\n".join(lines)


def main() -> None:
    if len(sys.argv) == 4 and sys.argv[1] == "--worker":
        worker_main(sys.argv[2], sys.argv[3])
        return

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workloads", default=",".join(DEFAULT_WORKLOADS),
                    help=f"comma-separated subset of {','.join(WORKLOADS)} (or 'all')")
    ap.add_argument("--variants", default=",".join(VARIANTS), help="variants of the steady-state phase")
    ap.add_argument("--quick", action="store_true", help="mlp-train only, fewer samples")
    ap.add_argument("--threads", type=int, default=1, help="torch.set_num_threads in every process (default 1)")
    ap.add_argument("--compile-threads", type=int, default=1,
                    help="TORCHINDUCTOR_COMPILE_THREADS of every process (default 1: C++ builds run "
                         "in-process, no compile worker pool, so their CPU time is accounted)")
    ap.add_argument("--samples", type=int, default=11, help="steady-state rounds")
    ap.add_argument("--inner", type=int, default=3, help="steps per round")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--compile-warmup", type=int, default=2)
    ap.add_argument("--compile-steps", type=int, default=5, help="steady steps after the compile step")
    ap.add_argument("--warm-inductor-neuron", choices=("first", "all", "none"), default="first",
                    help="extra warm process for torch.compile(m) on neuron (in the backend=neuron "
                         "cache dir): for the first workload only (default), all, or none")
    ap.add_argument("--timeout", type=float, default=900.0, help="per subprocess, seconds")
    ap.add_argument("--cache-root", default=None, help="keep cache dirs here (default: temp, removed)")
    ap.add_argument("--json", default=None, help="write results as JSON here")
    args = ap.parse_args()

    if args.quick:
        args.workloads = "mlp-train"
        args.samples, args.inner, args.compile_steps = 7, 2, 3
    workloads = list(WORKLOADS) if args.workloads == "all" else args.workloads.split(",")
    for w in workloads:
        if w not in WORKLOADS:
            ap.error(f"unknown workload {w!r}")
    args.variants = args.variants.split(",")

    import torch

    meta = {"date": date.today().isoformat(), "torch": torch.__version__, "python": platform.python_version(),
            "machine": platform.machine(), "cpus": os.cpu_count(), "threads": args.threads,
            "command": " ".join(["python", "benchmarks/compile.py", *sys.argv[1:]])}
    log(f"torch {meta['torch']}, {meta['cpus']} cpus, threads {args.threads}, workloads {workloads}")

    t0 = time.perf_counter()
    root = args.cache_root or tempfile.mkdtemp(prefix="neuron-compile-bench-")
    results = []
    try:
        for w in workloads:
            res = run_workload(w, args, root, first=not results)
            res["derived"] = derive(res)
            results.append(res)
    finally:
        if args.cache_root is None:
            shutil.rmtree(root, ignore_errors=True)
    meta["wall_s"] = time.perf_counter() - t0

    print(f"# torch.compile benchmark -- {meta['date']}, torch {meta['torch']}, {meta['cpus']} cpus, "
          f"threads {meta['threads']}, wall {meta['wall_s']:.0f}s")
    print(report(results, args, meta))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"meta": meta, "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
