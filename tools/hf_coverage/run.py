#!/usr/bin/env python
"""Transformers text-generation architecture coverage harness (top-100 architectures).

For every architecture (each in its own subprocess, with a timeout) this builds a tiny
random-weight model offline (tiny.py), generates greedily from a fixed batch of two
prompts (the second left-padded) on the reference device (cpu) and on the target
device, and compares the generated tokens and per-step logits.

Variants (``--variants``, default all three):

  eager     (a) eager forward + DynamicCache            (reference: cpu, same variant)
  static    (b) eager forward + StaticCache, disable_compile=True
                                                        (reference: cpu, same variant)
  compiled  (c) StaticCache, decode step auto-compiled by generate()
                                                        (reference: cpu eager + StaticCache)

On cuda/xpu/neuron/tpu Transformers auto-compiles the decode step when a static cache
is used. On cpu (``--device cpu`` self-check) compilation is forced through a
``CompileConfig`` with ``_compile_all_devices=True``.

Examples::

    python tools/hf_coverage/run.py --subset fast --device cpu
    python tools/hf_coverage/run.py --device neuron --jobs 2 --md cov.md --json cov.json
    python tools/hf_coverage/run.py --archs llama,gpt2 --variants eager,static -v

See docs/hf_coverage.md for verdict meanings and tolerances.
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures as cf
import copy
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

from architectures import ARCHITECTURES, FAST_SUBSET, rank  # noqa: E402

VARIANTS = ("eager", "static", "compiled")
_VARIANT_ALIASES = {"a": "eager", "b": "static", "c": "compiled", "dynamic": "eager"}
VARIANT_LABEL = {"eager": "(a) eager+dynamic", "static": "(b) eager+static", "compiled": "(c) compiled+static"}

# Architecture verdicts
PASS = "PASS"
FAIL = "FAIL"
NA_REF = "N/A_CPU_REFERENCE"
TOO_LARGE = "CONFIG_TOO_LARGE"
NOT_IN_VERSION = "NOT_IN_VERSION"
TIMEOUT = "TIMEOUT"
CRASH = "CRASH"
VERDICTS = (PASS, FAIL, NA_REF, TOO_LARGE, NOT_IN_VERSION, TIMEOUT, CRASH)
# Extra per-variant status: Transformers did not compile the decode step on the target
# (e.g. llama4 is hard-excluded from auto-compile, or its cache is not compileable).
NOT_COMPILED = "NOT_COMPILED"

PROMPT_LEN = 10
PAD_LEN = 3  # left padding of the second row


# ======================================================================================
# Worker (runs inside the per-architecture subprocess)
# ======================================================================================


def _short(e: BaseException, limit: int = 300) -> str:
    msg = str(e).strip().splitlines()
    first = msg[0] if msg else ""
    return f"{type(e).__name__}: {first}"[:limit]


def _special_ids(cfg) -> set[int]:
    ids: set[int] = set()
    for name in ("pad_token_id", "bos_token_id", "eos_token_id"):
        v = getattr(cfg, name, None)
        for x in v if isinstance(v, (list, tuple)) else [v]:
            if isinstance(x, int):
                ids.add(x)
    return ids


def make_inputs(cfg, seed: int):
    """Fixed prompt batch: row 0 = PROMPT_LEN tokens, row 1 = PAD_LEN pads + shorter prompt."""
    import torch

    text_cfg = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
    vocab = int(text_cfg.vocab_size)
    pad = getattr(text_cfg, "pad_token_id", None)
    if pad is None:
        pad = getattr(cfg, "pad_token_id", None)
    if not isinstance(pad, int):
        pad = 0
    special = _special_ids(text_cfg) | _special_ids(cfg) | {pad}
    g = torch.Generator().manual_seed(1000 + seed)
    ids = torch.randint(4, vocab, (2, PROMPT_LEN), generator=g)
    for s in special:  # keep prompts free of special tokens
        ids[ids == s] = (s + 1) % vocab if (s + 1) % vocab >= 4 else 4
    mask = torch.ones_like(ids)
    ids[1, :PAD_LEN] = pad
    mask[1, :PAD_LEN] = 0
    return ids, mask, pad


def _compile_config(device_type: str, args):
    """CompileConfig for variant (c). None = let Transformers pick its default."""
    from transformers import CompileConfig

    if device_type == "cpu":
        cc = CompileConfig(
            backend=args.compile_backend or "inductor", mode=args.compile_mode or "default", fullgraph=False
        )
        cc._compile_all_devices = True  # noqa: SLF001 - documented testing hook in transformers
        return cc
    kw = {k: v for k, v in (("backend", args.compile_backend), ("mode", args.compile_mode)) if v}
    return CompileConfig(**kw) if kw else None


def run_generate(model, ids, mask, pad, variant: str, device: str, args) -> dict:
    """Greedy generate for one variant. Returns cpu tensors + bookkeeping."""
    import torch

    dev = torch.device(device)
    # generate() fills unset (None) fields of the passed config from model.generation_config,
    # so EOS must be cleared on the model too, otherwise rows stop early and get padded.
    model.generation_config.eos_token_id = None
    gc = copy.deepcopy(model.generation_config)
    gc.update(
        max_new_tokens=args.max_new_tokens,
        min_new_tokens=None,
        do_sample=False,
        num_beams=1,
        temperature=None,
        top_p=None,
        top_k=None,
        output_logits=True,
        return_dict_in_generate=True,
        pad_token_id=pad,
        eos_token_id=None,  # never stop early: always N steps to compare
        use_cache=True,
    )
    gc.cache_implementation = None if variant == "eager" else "static"
    gc.disable_compile = variant != "compiled"
    if variant == "compiled":
        gc.compile_config = _compile_config(dev.type, args)
    t0 = time.perf_counter()
    with torch.no_grad():
        out = model.generate(input_ids=ids.to(dev), attention_mask=mask.to(dev), generation_config=gc)
    dt = time.perf_counter() - t0
    seq = out.sequences
    logits = list(out.logits or [])
    devices = {seq.device.type} | {t.device.type for t in logits}
    return {
        "sequences": seq.detach().to("cpu"),
        "logits": [t.detach().to("cpu", torch.float32) for t in logits],
        "devices": sorted(devices),
        "compiled": hasattr(model, "_compiled_call"),
        "cache": type(getattr(out, "past_key_values", None)).__name__,
        "seconds": dt,
    }


def compare(ref: dict, tgt: dict, device_type: str, atol: float, rtol: float) -> dict:
    """Compare target against reference. Returns {status, reason, max_abs_diff, ...}."""
    import torch

    res: dict[str, Any] = {"max_abs_diff": None, "first_token_divergence": None}
    if tgt["devices"] != [device_type]:
        return {**res, "status": FAIL, "reason": f"outputs on {tgt['devices']}, expected {device_type}"}
    if len(tgt["logits"]) != len(ref["logits"]) or tgt["sequences"].shape != ref["sequences"].shape:
        return {
            **res,
            "status": FAIL,
            "reason": f"shape mismatch: seq {tuple(tgt['sequences'].shape)} vs {tuple(ref['sequences'].shape)}, "
            f"{len(tgt['logits'])} vs {len(ref['logits'])} logit steps",
        }
    bad = [i for i, t in enumerate(tgt["logits"]) if not torch.isfinite(t).all()]
    if bad:
        return {**res, "status": FAIL, "reason": f"non-finite logits at step(s) {bad[:5]}"}
    p = ref["sequences"].shape[1] - len(ref["logits"])
    gen_r, gen_t = ref["sequences"][:, p:], tgt["sequences"][:, p:]
    if not torch.equal(ref["sequences"][:, :p], tgt["sequences"][:, :p]):
        return {**res, "status": FAIL, "reason": "prompt part of sequences differs"}
    diff_steps = (gen_r != gen_t).any(dim=0).nonzero().flatten().tolist()
    first_div = diff_steps[0] if diff_steps else None
    last = first_div if first_div is not None else len(ref["logits"]) - 1
    max_abs, worst_step, close = 0.0, None, True
    for s in range(last + 1):
        r, t = ref["logits"][s], tgt["logits"][s]
        if r.shape != t.shape:
            return {**res, "status": FAIL, "reason": f"logits shape mismatch at step {s}: {tuple(t.shape)} vs {tuple(r.shape)}"}
        d = (r - t).abs()
        m = float(d.max()) if d.numel() else 0.0
        if m > max_abs:
            max_abs, worst_step = m, s
        if not torch.allclose(t, r, atol=atol, rtol=rtol):
            close = False
    res["max_abs_diff"] = max_abs
    res["first_token_divergence"] = first_div
    if not close:
        return {**res, "status": FAIL, "reason": f"logits differ (max |diff| {max_abs:.3g} at step {worst_step})"}
    if first_div is not None:
        # Logits agree within tolerance but greedy picked different tokens: a numerical
        # near-tie in the reference (top-2 gap within tolerance) is accepted and reported.
        r = ref["logits"][first_div]
        for row in range(gen_r.shape[0]):
            a, b = int(gen_r[row, first_div]), int(gen_t[row, first_div])
            if a == b:
                continue
            gap = float(r[row, a] - r[row, b])
            if gap > 2 * (atol + rtol * abs(float(r[row, a]))):
                return {**res, "status": FAIL, "reason": f"tokens differ at step {first_div} (ref gap {gap:.3g})"}
        return {**res, "status": PASS, "reason": f"near-tie token flip at step {first_div}; logits compared up to it"}
    return {**res, "status": PASS, "reason": ""}


def worker(arch: str, args, checkpoint=lambda result: None) -> dict:
    """Run all variants for one architecture. ``checkpoint(result)`` is called with the
    partial result before every risky step so that a hard crash keeps what finished."""
    t_start = time.perf_counter()
    result: dict[str, Any] = {"arch": arch, "rank": rank(arch), "variants": {}, "verdict": None, "reason": ""}
    import torch

    torch.set_num_threads(max(1, int(os.environ.get("OMP_NUM_THREADS", "1"))))
    import transformers

    transformers.logging.set_verbosity_error()
    import tiny

    device = args.device
    device_type = torch.device(device).type
    reset_fb = report_fb = None  # torch_neuronx's fallback report: {op: calls}
    if device_type != "cpu":
        try:
            import torch_neuronx  # registers the PrivateUse1 "neuron" device

            reset_fb, report_fb = torch_neuronx.reset_fallback_report, torch_neuronx.fallback_report
        except Exception as e:  # noqa: BLE001
            if device_type == "neuron":
                result.update(verdict=CRASH, reason=f"import torch_neuronx failed: {_short(e)}")
                return result
    result["fallback_report_available"] = report_fb is not None

    # ---- build ------------------------------------------------------------------
    t0 = time.perf_counter()
    try:
        base, cfg, n_params = tiny.build_tiny_model(arch, seed=args.seed, init=args.init,
                                                    attn_implementation=args.attn_implementation)
    except tiny.NotInVersion as e:
        result.update(verdict=NOT_IN_VERSION, reason=str(e))
        return result
    except tiny.ConfigTooLarge as e:
        result.update(verdict=TOO_LARGE, reason=str(e))
        return result
    except Exception as e:  # noqa: BLE001
        result.update(verdict=NA_REF, reason=f"build: {_short(e)}", build_traceback=traceback.format_exc()[-2000:])
        return result
    result["n_params"] = n_params
    result["model_class"] = type(base).__name__
    result["build_seconds"] = time.perf_counter() - t0
    ids, mask, pad = make_inputs(cfg, args.seed)

    ref_cache: dict[str, Any] = {}
    fb_total: collections.Counter = collections.Counter()

    def reference(variant: str):
        key = "eager" if variant == "eager" else "static"  # (c) is checked against cpu eager+static
        if key not in ref_cache:
            try:
                m = copy.deepcopy(base)
                r = run_generate(m, ids, mask, pad, key, "cpu", args)
                del m
                bad = [i for i, t in enumerate(r["logits"]) if not torch.isfinite(t).all()]
                ref_cache[key] = (r, None) if not bad else (None, f"non-finite reference logits at steps {bad[:5]}")
            except Exception as e:  # noqa: BLE001
                ref_cache[key] = (None, f"{_short(e)}")
        return ref_cache[key]

    for variant in args.variants:
        v: dict[str, Any] = {}
        result["variants"][variant] = v
        result["running"] = variant
        checkpoint(result)
        ref, ref_err = reference(variant)
        if ref is None:
            v.update(status=NA_REF, reason=f"cpu reference failed: {ref_err}")
            continue
        v["ref_seconds"] = ref["seconds"]
        try:
            if variant == "compiled":
                torch._dynamo.reset()
            m = copy.deepcopy(base).to(device)
            if reset_fb:
                reset_fb()
            tgt = run_generate(m, ids, mask, pad, variant, device, args)
            if report_fb:
                v["fallback_ops"] = report_fb()
                fb_total.update(v["fallback_ops"])
            del m
        except Exception as e:  # noqa: BLE001
            v.update(status=FAIL, reason=f"target error: {_short(e)}", traceback=traceback.format_exc()[-2000:])
            if report_fb:
                fb_total.update(report_fb())
            continue
        v["target_seconds"] = tgt["seconds"]
        v["compiled"] = tgt["compiled"]
        v["cache"] = tgt["cache"]
        v.update(compare(ref, tgt, device_type, args.atol, args.rtol))
        if variant != "eager" and "Static" not in tgt["cache"] and v["status"] == PASS:
            v["reason"] = (v["reason"] + "; " if v["reason"] else "") + f"model used {tgt['cache']}, not a static cache"
        if variant == "compiled" and not tgt["compiled"] and v["status"] == PASS:
            v.update(status=NOT_COMPILED, reason="generate() did not compile the decode step (ran eager)")
        v["tokens"] = tgt["sequences"][:, ids.shape[1]:].tolist()

    if report_fb:
        result["fallback_ops"] = dict(sorted(fb_total.items(), key=lambda kv: -kv[1]))
        result["fallback_total"] = sum(fb_total.values())
        result["fallback_distinct"] = len(fb_total)

    result.pop("running", None)
    statuses = [v["status"] for v in result["variants"].values()]
    valid = [s for s in statuses if s not in (NA_REF, NOT_COMPILED)]
    if not valid:
        result["verdict"] = NA_REF
        result["reason"] = "; ".join(f"{k}: {v['reason']}" for k, v in result["variants"].items())
    elif any(s == FAIL for s in valid):
        result["verdict"] = FAIL
        result["reason"] = "; ".join(f"{k}: {v['reason']}" for k, v in result["variants"].items() if v["status"] == FAIL)
    else:
        result["verdict"] = PASS
        notes = [f"{k}: {v['status']} ({v['reason']})" for k, v in result["variants"].items()
                 if v["status"] != PASS or v.get("reason")]
        result["reason"] = "; ".join(notes)
    result["seconds"] = time.perf_counter() - t_start
    return result


# ======================================================================================
# Parent: scheduling, reporting
# ======================================================================================


def _run_one(arch: str, args, log_dir: str, threads: int) -> dict:
    res_file = os.path.join(log_dir, f"{arch}.result.json")
    log_file = os.path.join(log_dir, f"{arch}.log")
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", arch, "--result-file", res_file]
    cmd += _forward_args(args)
    env = dict(os.environ)
    env.update(
        OMP_NUM_THREADS=str(threads),
        MKL_NUM_THREADS=str(threads),
        TOKENIZERS_PARALLELISM="false",
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        TRANSFORMERS_VERBOSITY="error",
        PYTHONUNBUFFERED="1",
        PYTHONFAULTHANDLER="1",  # Python stack of a segfaulting worker ends up in its log
    )
    if args.device.split(":")[0] == "cpu":
        # Pure cpu self-check: do not auto-load out-of-tree device backends (torch_neuronx
        # registers one); the harness must be testable while the backend is being built.
        env["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"
    t0 = time.perf_counter()
    timed_out = False
    with open(log_file, "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True,
                                cwd=os.getcwd())
        try:
            rc = proc.wait(timeout=args.timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            try:
                os.killpg(proc.pid, signal.SIGKILL)  # the worker's own process group
            except ProcessLookupError:
                pass
            rc = proc.wait()
    elapsed = time.perf_counter() - t0
    if not timed_out and os.path.exists(res_file):
        with open(res_file) as f:
            res = json.load(f)
        res.update(seconds=elapsed, log=log_file)
        return res
    # TIMEOUT or CRASH: keep the variants that finished before the worker died.
    res: dict[str, Any] = {"arch": arch, "rank": rank(arch), "variants": {}}
    where = ""
    try:
        with open(res_file + ".partial") as f:
            res = json.load(f)
        running = res.pop("running", None)
        res.pop("partial", None)
        if running:
            what = f"timed out after {args.timeout:.0f}s" if timed_out else f"worker crashed (exit code {rc})"
            res["variants"][running] = {"status": FAIL, "reason": what}
            where = f" during variant {running}"
    except (OSError, ValueError):
        pass
    if timed_out:
        res.update(verdict=TIMEOUT, reason=f"exceeded {args.timeout:.0f}s{where}")
    else:
        tail = ""
        try:
            with open(log_file, errors="replace") as f:
                lines = [ln.rstrip() for ln in f.readlines() if ln.strip()]
            tail = " | ".join(lines[-3:])[-400:]
        except OSError:
            pass
        res.update(verdict=CRASH, reason=f"worker exited with code {rc}{where} without a result" + (f": {tail}" if tail else ""))
    res.update(seconds=elapsed, log=log_file)
    return res


def _forward_args(args) -> list[str]:
    out = ["--device", args.device, "--max-new-tokens", str(args.max_new_tokens), "--variants", ",".join(args.variants),
           "--atol", repr(args.atol), "--rtol", repr(args.rtol), "--seed", str(args.seed), "--init", args.init]
    for flag, value in (("--compile-backend", args.compile_backend), ("--compile-mode", args.compile_mode),
                        ("--attn-implementation", args.attn_implementation)):
        if value:
            out += [flag, value]
    return out


def summarize(results: list[dict], args) -> dict:
    n = len(results)
    counts = {v: sum(r["verdict"] == v for r in results) for v in VERDICTS}
    valid_ref = sum(r["verdict"] in (PASS, FAIL, TIMEOUT, CRASH) for r in results)
    per_variant = {}
    for var in args.variants:
        st = [r.get("variants", {}).get(var, {}).get("status") for r in results]
        per_variant[var] = {
            "pass": sum(s == PASS for s in st),
            "fail": sum(s == FAIL for s in st),
            "na_cpu_reference": sum(s == NA_REF for s in st),
            "not_compiled": sum(s == NOT_COMPILED for s in st),
            "valid_reference": sum(s in (PASS, FAIL, NOT_COMPILED) for s in st),
        }
    return {
        "architectures": n,
        "verdicts": counts,
        "pass": counts[PASS],
        "valid_cpu_reference": valid_ref,
        "pass_rate_valid": counts[PASS] / valid_ref if valid_ref else 0.0,
        "pass_rate_total": counts[PASS] / n if n else 0.0,
        "per_variant": per_variant,
        "fallback_total": sum(r.get("fallback_total", 0) or 0 for r in results),
    }


def _fmt_diff(x) -> str:
    return "-" if x is None else f"{x:.1e}"


def render_markdown(results: list[dict], summary: dict, meta: dict, args) -> str:
    L = []
    L.append(f"# Transformers text-generation coverage: `{meta['device']}` vs `cpu`\n")
    L.append(
        f"- transformers {meta['transformers']}, torch {meta['torch']}, {meta['started']}, "
        f"{meta['wall_seconds']:.0f}s wall, jobs={args.jobs}, timeout={args.timeout:.0f}s"
    )
    L.append(
        f"- variants: {', '.join(VARIANT_LABEL[v] for v in args.variants)}; max_new_tokens={args.max_new_tokens}; "
        f"atol={args.atol:g}, rtol={args.rtol:g}; init={args.init}; seed={args.seed}"
    )
    L.append(
        f"- **Headline: {summary['pass']}/{summary['valid_cpu_reference']} architectures with a valid CPU reference pass "
        f"({100 * summary['pass_rate_valid']:.1f}%); {summary['pass']}/{summary['architectures']} overall "
        f"({100 * summary['pass_rate_total']:.1f}%)**\n"
    )
    L.append("| verdict | count |\n|---|---|")
    for v, c in summary["verdicts"].items():
        if c:
            L.append(f"| {v} | {c} |")
    L.append("")
    L.append("| variant | pass | fail | N/A cpu ref | not compiled | valid ref |\n|---|---|---|---|---|---|")
    for var, s in summary["per_variant"].items():
        L.append(f"| {VARIANT_LABEL[var]} | {s['pass']} | {s['fail']} | {s['na_cpu_reference']} | {s['not_compiled']} "
                 f"| {s['valid_reference']} |")
    L.append("")
    hdr = "| rank | architecture | params | verdict | " + " | ".join(args.variants) + " | max abs diff | fallback ops | time (s) | notes |"
    L.append(hdr)
    L.append("|" + "---|" * (hdr.count("|") - 1))
    for r in sorted(results, key=lambda r: (r.get("rank") or 10**6, r["arch"])):
        vs = r.get("variants", {})
        cells = [vs.get(v, {}).get("status", "-") for v in args.variants]
        diffs = [vs[v]["max_abs_diff"] for v in args.variants if v in vs and vs[v].get("max_abs_diff") is not None]
        params = f"{r['n_params'] / 1e6:.2f}M" if r.get("n_params") else "-"
        fb = r.get("fallback_total")
        fb_s = "-" if fb is None else f"{r.get('fallback_distinct', 0)} ops / {fb} calls"
        note = (r.get("reason") or "").replace("|", "\\|").replace("\n", " ")[:220]
        L.append(f"| {r.get('rank') or '-'} | {r['arch']} | {params} | {r['verdict']} | " + " | ".join(cells)
                 + f" | {_fmt_diff(max(diffs) if diffs else None)} | {fb_s} | {r.get('seconds', 0):.0f} | {note} |")
    L.append("")
    # Aggregate CPU-fallback ops (target device only): which ops block the most architectures.
    by_op: dict[str, list] = {}
    for r in results:
        for op, c in (r.get("fallback_ops") or {}).items():
            by_op.setdefault(op, []).append((r["arch"], c))
    if by_op:
        L.append("## CPU-fallback ops (by number of architectures)\n")
        L.append("| op | architectures | calls | examples |\n|---|---|---|---|")
        for op, lst in sorted(by_op.items(), key=lambda kv: (-len(kv[1]), -sum(c for _, c in kv[1])))[:40]:
            L.append(f"| `{op}` | {len(lst)} | {sum(c for _, c in lst)} | {', '.join(a for a, _ in lst[:6])} |")
        L.append("")
    return "\n".join(L)


def _dist_version(name: str) -> str:
    # importlib.metadata: the parent never imports torch (a half-built backend that torch
    # auto-loads must not take the harness down; workers report such failures per arch).
    try:
        from importlib.metadata import version

        return version(name)
    except Exception:  # noqa: BLE001
        return "unknown"


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="neuron", help="target device (default: neuron; 'cpu' = self-check)")
    ap.add_argument("--archs", default=None, help="comma-separated model_types (overrides --subset)")
    ap.add_argument("--subset", choices=("all", "fast"), default="all", help="'fast' = small CI list")
    ap.add_argument("--variants", default=",".join(VARIANTS),
                    help="comma list of eager,static,compiled (or a,b,c); default: all")
    ap.add_argument("--max-new-tokens", type=int, default=8)
    ap.add_argument("--jobs", type=int, default=1, help="parallel worker subprocesses")
    ap.add_argument("--timeout", type=float, default=300.0, help="per-architecture timeout in seconds")
    ap.add_argument("--atol", type=float, default=1e-4)
    ap.add_argument("--rtol", type=float, default=1e-4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--init", choices=("scaled", "hf"), default="scaled",
                    help="weight init: fan-in scaled normal (default) or the model's own _init_weights")
    ap.add_argument("--attn-implementation", default=None, help="e.g. eager or sdpa (default: transformers default)")
    ap.add_argument("--compile-backend", default=None,
                    help="torch.compile backend for variant (c) (default: inductor on cpu, transformers default elsewhere)")
    ap.add_argument("--compile-mode", default=None, help="torch.compile mode for variant (c)")
    ap.add_argument("--md", default=None, help="write the markdown report here")
    ap.add_argument("--json", default=None, help="write the JSON report here")
    ap.add_argument("--log-dir", default=None, help="keep per-architecture worker logs here (default: temp dir)")
    ap.add_argument("--strict", action="store_true", help="exit 1 if any architecture is FAIL/CRASH/TIMEOUT")
    ap.add_argument("-v", "--verbose", action="store_true", help="print one line per architecture")
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--result-file", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    variants = []
    for v in args.variants.split(","):
        v = _VARIANT_ALIASES.get(v.strip(), v.strip())
        if v not in VARIANTS:
            ap.error(f"unknown variant {v!r}; choose from {VARIANTS}")
        if v not in variants:
            variants.append(v)
    args.variants = variants
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.worker:
        def checkpoint(partial: dict) -> None:
            with open(args.result_file + ".partial", "w") as f:
                json.dump({**partial, "partial": True}, f, indent=1, default=str)

        try:
            res = worker(args.worker, args, checkpoint)
        except BaseException as e:  # noqa: BLE001 - report, then exit non-zero
            res = {"arch": args.worker, "rank": rank(args.worker), "verdict": CRASH, "variants": {},
                   "reason": f"worker exception: {_short(e)}", "traceback": traceback.format_exc()[-3000:]}
        with open(args.result_file, "w") as f:
            json.dump(res, f, indent=1, default=str)
        return 0

    from tqdm import tqdm

    archs = [a.strip() for a in args.archs.split(",") if a.strip()] if args.archs else \
        list(FAST_SUBSET if args.subset == "fast" else ARCHITECTURES)
    log_dir = args.log_dir or tempfile.mkdtemp(prefix="hf_coverage_")
    os.makedirs(log_dir, exist_ok=True)
    threads = max(1, (os.cpu_count() or 1) // max(1, args.jobs))
    started = time.strftime("%Y-%m-%d %H:%M:%S")
    t0 = time.perf_counter()
    results: list[dict] = []
    lock = threading.Lock()
    bar = tqdm(total=len(archs), desc=f"hf-coverage[{args.device}]", unit="arch", dynamic_ncols=True)
    with cf.ThreadPoolExecutor(max_workers=max(1, args.jobs)) as ex:
        futs = {ex.submit(_run_one, a, args, log_dir, threads): a for a in archs}
        for fut in cf.as_completed(futs):
            r = fut.result()
            with lock:
                results.append(r)
                npass = sum(x["verdict"] == PASS for x in results)
                bar.set_postfix_str(f"pass={npass} last={r['arch']}:{r['verdict']}")
                bar.update(1)
                if args.verbose:
                    vs = " ".join(f"{k}={v.get('status')}" for k, v in r.get("variants", {}).items())
                    bar.write(f"{r['arch']:22s} {r['verdict']:18s} {vs} {r.get('seconds', 0):6.1f}s  {r.get('reason', '')[:160]}")
    bar.close()
    wall = time.perf_counter() - t0

    meta = {
        "device": args.device,
        "reference_device": "cpu",
        "transformers": _dist_version("transformers"),
        "torch": _dist_version("torch"),
        "python": platform.python_version(),
        "started": started,
        "wall_seconds": wall,
        "variants": args.variants,
        "max_new_tokens": args.max_new_tokens,
        "atol": args.atol,
        "rtol": args.rtol,
        "seed": args.seed,
        "init": args.init,
        "jobs": args.jobs,
        "timeout": args.timeout,
        "prompt": {"batch": 2, "prompt_len": PROMPT_LEN, "left_pad_row1": PAD_LEN},
        "log_dir": log_dir,
    }
    results.sort(key=lambda r: (r.get("rank") or 10**6, r["arch"]))
    summary = summarize(results, args)
    md = render_markdown(results, summary, meta, args)
    if args.md:
        with open(args.md, "w") as f:
            f.write(md)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"meta": meta, "summary": summary, "results": results}, f, indent=1, default=str)
    if not args.md:
        print(md)
    print(
        f"Headline: {summary['pass']}/{summary['valid_cpu_reference']} architectures with a valid CPU reference pass "
        f"({100 * summary['pass_rate_valid']:.1f}%), {summary['pass']}/{summary['architectures']} overall "
        f"({100 * summary['pass_rate_total']:.1f}%). Wall time {wall:.0f}s. Logs: {log_dir}"
    )
    for var, s in summary["per_variant"].items():
        print(f"  {VARIANT_LABEL[var]:22s} pass {s['pass']}/{s['valid_reference']} valid-ref "
              f"(fail {s['fail']}, N/A cpu ref {s['na_cpu_reference']}, not compiled {s['not_compiled']})")
    if args.strict and any(r["verdict"] in (FAIL, CRASH, TIMEOUT) for r in results):
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
