#!/usr/bin/env python3
"""OpInfo-driven differential test runner: CPU (reference) vs. device D.

For every OpInfo in ``torch.testing._internal.common_methods_invocations.op_db``
and every dtype in {float32, bfloat16, int64, bool, complex64} that the OpInfo
supports on CPU, iterate ``op.sample_inputs('cpu', dtype, requires_grad=False)``,
run the op on CPU and on device D (every tensor of the SampleInput copied with
``.to(D)``), and compare the outputs (and any mutated inputs) after moving them
back to CPU.  Besides the plain call (``function``), two call variants probe
classes of backend bugs the plain call cannot see:

* ``out_cpu``  ops with ``supports_out``: device inputs, ``out=`` a CPU tensor.
               PyTorch requires a RuntimeError about devices (as on CUDA);
               silently accepting it is a ``fail``.
* ``conjneg``  the first input is a lazy view: ``x.conj()`` for complex
               samples, ``x._neg_view()`` for floating ones, built on each side
               (a device conj/neg view must be materialized correctly).

Usage (from the repository root)::

    python tests/opinfo/runner.py --device cpu --json /tmp/x.json --md /tmp/x.md
    python -m tests.opinfo.runner --ops add,mul,softmax --max-samples-per-op 3
    python tests/opinfo/runner.py --help

See docs/opinfo.md for what is compared, the tolerances and the skip lists.

Library use::

    from tests.opinfo import runner            # or import by path
    cfg = runner.RunConfig(device="neuron", ops="add,mul", max_samples=3)
    report = runner.run(cfg)                   # dict, same as the JSON report
    print(report["totals"])

Statuses recorded per (op, variant, call, dtype, sample_idx):

* ``pass``            outputs (and mutated inputs) match the CPU reference
* ``fail``            device ran but results differ (values, dtype, shape,
                      structure, or an output tensor is not on device D)
* ``error``           the CPU reference ran but the device run raised
* ``crash``           the worker process died (segfault/abort) or hung on it
* ``reference_error`` the CPU reference raised (N/A; device not run)
* ``skipped``         sample not applicable (sparse/quantized...)

pass rate = pass / (pass + fail + error + crash)
"""

from __future__ import annotations

import argparse
import collections
import fnmatch
import itertools
import json
import math
import os
import platform
import random
import re
import sys
import time
import traceback
import warnings
import zlib
from dataclasses import asdict, dataclass
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

STATUSES = ("pass", "fail", "error", "crash", "reference_error", "skipped")
DEFAULT_DTYPES = ("float32", "bfloat16", "int64", "bool", "complex64")
CALL_VARIANTS = ("function", "method", "inplace", "out_cpu", "conjneg")
DEFAULT_CALLS = ("function", "out_cpu", "conjneg")

# ---------------------------------------------------------------------------
# Skip / special-case lists (documented in docs/opinfo.md)
# ---------------------------------------------------------------------------

# Ops whose output *values* are random. Compared by value when the device
# draws the CPU's numbers (torch_neuronx's rng mode "cpu", the default; both
# runs are seeded alike); otherwise the streams are unrelated, so only
# structure / shape / dtype / device are compared ("metadata-only" check).
# fnmatch patterns against ``op.name``.
RANDOM_OPS = (
    "bernoulli", "multinomial", "normal", "uniform", "cauchy", "exponential",
    "geometric", "log_normal", "poisson", "rand", "rand_like", "randn",
    "randn_like", "randint", "randint_like", "randperm",
    "nn.functional.dropout", "nn.functional.dropout2d",
    "nn.functional.dropout3d", "nn.functional.alpha_dropout",
    "nn.functional.feature_alpha_dropout", "nn.functional.rrelu",
    # random pooling regions / random projections
    "nn.functional.fractional_max_pool2d", "nn.functional.fractional_max_pool3d",
    "svd_lowrank", "pca_lowrank",
)

# Ops whose output contains uninitialized memory: metadata-only as well.
UNINITIALIZED_OPS = (
    "empty", "empty_like", "empty_strided", "empty_permuted",
    "new_empty", "new_empty_strided",
    "resize_", "resize_as_",          # growing a tensor exposes garbage
)


def _sdpa_random(sample) -> bool:
    return float(sample.kwargs.get("dropout_p", 0.0) or 0.0) > 0.0


def _mha_random(sample) -> bool:
    return bool(sample.kwargs.get("training", False))


# Ops that are random only for some samples (dropout inside attention).
RANDOM_SAMPLE_PREDICATES = {
    "nn.functional.scaled_dot_product_attention": _sdpa_random,
    "nn.functional.multi_head_attention_forward": _mha_random,
}

# Ops that address the raw storage of their input (offset/strides relative to
# the storage, not to the view).  For these, the whole storage is copied to D
# and the view re-created with the same size/stride/storage_offset, instead of
# a plain ``.to(D)`` (which would compact a partial view and change meaning).
STORAGE_OPS = ("as_strided", "as_strided_copy", "as_strided_scatter")

# Arguments that must stay on CPU by design (PyTorch requires it on every
# accelerator): op name -> positions in ``sample.args`` / names in kwargs.
CPU_ARGS: Dict[str, Tuple[Any, ...]] = {
    "tensor_split": (0, "tensor_indices_or_sections"),  # indices tensor
}

# Ops whose out= is implemented in Python by copying the result into the given
# tensors (torch.functional._lu_with_infos: ``out[i].resize_as_(r).copy_(r)``),
# which PyTorch accepts across devices on every backend, CUDA included: the
# out_cpu check does not apply.
PYTHON_OUT_COPY_OPS = ("lu",)

# Ops whose tensor outputs are on CPU by design even when the inputs are on
# device D.  (None in op_db today once device arguments are rewritten; kept as
# the documented hook.)  Outputs of samples that contain no tensor and no
# device argument (pure factory calls) are always expected on CPU.
CPU_OUTPUT_OPS: Tuple[str, ...] = ()

# Reductions / contractions / normalizations: a different accumulation order is
# legitimate, so tolerances are scaled up ("accumulate" class).  Substrings of
# op.name.
ACCUMULATE_SUBSTRINGS = (
    "sum", "mean", "prod", "cum", "std", "var", "norm", "dist", "dot", "mm",
    "mv", "matmul", "einsum", "tensordot", "inner", "linear", "bilinear",
    "conv", "softmax", "softmin", "logsumexp", "loss", "cross_entropy", "pool",
    "interpolate", "upsample", "grid_sample", "grid_sampler", "trapz",
    "trapezoid", "attention", "cosine_similarity", "cov", "corrcoef",
    "gradient", "quantile", "trace", "kron", "stft", "fft", "histc",
    "logaddexp", "embedding_bag", "_segment_reduce", "index_reduce",
    "scatter_reduce", "index_add", "scatter_add", "put", "addcdiv", "addcmul",
    "lerp", "polar",
)
# Decompositions / solvers: implementation-dependent algorithms ("linalg").
LINALG_NAMES = (
    "cholesky", "cholesky_inverse", "cholesky_solve", "lu", "lu_solve",
    "lu_unpack", "qr", "svd", "pinverse", "matrix_exp", "triangular_solve",
    "logdet", "geqrf", "ormqr", "inverse", "det", "cdist", "pdist",
)

# (rtol, atol) by output dtype and op class.  Integer / bool: exact.
TOLERANCES: Dict[str, Dict[str, Tuple[float, float]]] = {
    "default": {
        "float32": (1.3e-6, 1e-5), "complex64": (1.3e-6, 1e-5),
        "bfloat16": (1.6e-2, 1.6e-2), "float16": (1e-3, 1e-5),
        "complex32": (1e-3, 1e-5), "float64": (1e-7, 1e-7),
        "complex128": (1e-7, 1e-7),
    },
    "accumulate": {
        "float32": (1.3e-5, 1e-4), "complex64": (1.3e-5, 1e-4),
        "bfloat16": (3.2e-2, 5e-2), "float16": (2e-3, 1e-3),
        "complex32": (2e-3, 1e-3), "float64": (1e-7, 1e-7),
        "complex128": (1e-7, 1e-7),
    },
    "linalg": {
        "float32": (1e-3, 1e-3), "complex64": (1e-3, 1e-3),
        "bfloat16": (5e-2, 1e-1), "float16": (1e-2, 1e-2),
        "complex32": (1e-2, 1e-2), "float64": (1e-6, 1e-6),
        "complex128": (1e-6, 1e-6),
    },
}

# Curated fast subset used by tests/test_opinfo.py (transformer-ish ops).
TRANSFORMER_OPS = (
    "add", "sub", "mul", "div", "neg", "abs", "pow", "exp", "log", "sqrt",
    "rsqrt", "reciprocal", "tanh", "sigmoid", "erf", "sin", "cos", "clamp",
    "where", "masked_fill", "eq", "ne", "lt", "gt", "logical_not",
    "sum", "mean", "amax", "argmax", "var", "cumsum", "topk",
    "matmul", "mm", "bmm", "addmm", "baddbmm", "nn.functional.linear",
    "softmax", "log_softmax", "nn.functional.layer_norm", "nn.functional.rms_norm",
    "nn.functional.gelu", "nn.functional.silu", "nn.functional.relu",
    "nn.functional.embedding", "nn.functional.cross_entropy",
    "nn.functional.dropout", "nn.functional.scaled_dot_product_attention",
    "view", "reshape", "transpose", "permute", "contiguous", "flatten",
    "unsqueeze", "squeeze", "expand", "cat", "stack", "split", "chunk",
    "narrow", "select", "index_select", "gather", "triu", "tril", "clone",
    "arange", "zeros_like", "ones_like", "full", "repeat",
)

# Complex / FFT additions to the fast subset: complex arithmetic and views, and
# the FFT family, whose real-input variants (ifft, hfft*, ihfft*) build complex
# intermediates and conj views inside ATen.
COMPLEX_FAST_OPS = (
    "view_as_real", "view_as_complex", "conj_physical", "resolve_conj",
    "resolve_neg", "real", "imag", "angle", "polar",
    "fft.fft", "fft.ifft", "fft.rfft", "fft.irfft", "fft.hfft", "fft.ihfft",
    "fft.fft2", "fft.hfft2", "fft.ihfft2", "fft.hfftn", "fft.ihfftn",
)

# Ops with an out= overload, for the out_cpu check in the fast subset (the
# subset list above already brings add/mul/mm/cat/... ).
OUT_FAST_OPS = ("nonzero", "index_select", "sort", "max.reduction_with_dim")

# Named op lists usable as "@name" in --ops / --exclude-ops.
OP_LISTS = {
    "transformer": TRANSFORMER_OPS,
    "complex": COMPLEX_FAST_OPS,
    "out": OUT_FAST_OPS,
    "fast": TRANSFORMER_OPS + COMPLEX_FAST_OPS + OUT_FAST_OPS,
}

# "missing kernel" errors: the dispatcher's, and torch_neuronx's own when the
# host fallback is disabled (TORCH_NEURONX_DISABLE_FALLBACK=1).
_MISSING_KERNEL_RE = re.compile(
    r"Could not run '([^']+)' with arguments from the '[^']+' backend"
    r"|The operator '([^']+)' has no neuron kernel")


# ---------------------------------------------------------------------------
# Configuration
# ---------------------------------------------------------------------------

@dataclass
class RunConfig:
    device: str = "neuron"
    dtypes: Sequence[str] = DEFAULT_DTYPES
    ops: Optional[str] = None            # filter: comma list / substring / glob
    exclude_ops: Optional[str] = None
    max_samples: Optional[int] = None    # per (op, variant, call, dtype)
    jobs: int = 1
    isolate: bool = True                 # run in spawn'ed worker processes
    timeout: float = 300.0               # seconds without progress => crash
    max_crashes_per_group: int = 2
    calls: Sequence[str] = DEFAULT_CALLS
    tol_scale: float = 1.0
    imports: Optional[Sequence[str]] = None  # modules imported in workers
    seed: int = 0
    check_inputs: bool = True            # compare (mutated) inputs after call
    verbose: bool = False

    def import_modules(self) -> List[str]:
        if self.imports is not None:
            return list(self.imports)
        dev_type = self.device.split(":")[0]
        return ["torch_neuronx"] if dev_type == "neuron" else []


# ---------------------------------------------------------------------------
# Helpers usable without torch imported at module import time
# ---------------------------------------------------------------------------

def _matches_any(name: str, patterns: Sequence[str]) -> bool:
    return any(fnmatch.fnmatchcase(name, p) for p in patterns)


def op_key(name: str, variant: str, call: str = "function") -> str:
    key = name + ("." + variant if variant else "")
    if call != "function":
        key += "(%s)" % call
    return key


def tol_class(op_name: str) -> str:
    base = op_name.split(".")[-1]
    if op_name.startswith("linalg.") or base in LINALG_NAMES:
        return "linalg"
    if any(s in op_name for s in ACCUMULATE_SUBSTRINGS):
        return "accumulate"
    return "default"


def _short(s: str, n: int = 300) -> str:
    s = " ".join(str(s).split())
    return s if len(s) <= n else s[: n - 3] + "..."


def _exc_msg(e: BaseException, n: int = 300) -> str:
    text = str(e).strip().splitlines()
    first = text[0] if text else ""
    # Keep the interesting "Could not run ..." line if it is not the first one
    m = _MISSING_KERNEL_RE.search(str(e))
    if m and m.group(0) not in first:
        first = m.group(0) + " | " + first
    return _short("%s: %s" % (type(e).__name__, first), n)


def select_ops(op_db, ops: Optional[str], exclude: Optional[str]) -> List[int]:
    """Indices into op_db selected by the --ops / --exclude-ops filters.

    Each comma-separated token is matched against ``name`` and
    ``name.variant_test_name``: glob if it contains * ? [, exact if some op has
    exactly that name/full name, otherwise substring.
    """
    def full(op):
        return op.name + ("." + op.variant_test_name if op.variant_test_name else "")

    def build(spec):
        toks = [t.strip() for t in spec.split(",") if t.strip()]
        names = {o.name for o in op_db} | {full(o) for o in op_db}
        preds = []
        for t in toks:
            if any(c in t for c in "*?["):
                preds.append(lambda o, t=t: fnmatch.fnmatchcase(o.name, t)
                             or fnmatch.fnmatchcase(full(o), t))
            elif t in names:
                preds.append(lambda o, t=t: o.name == t or full(o) == t)
            else:
                preds.append(lambda o, t=t: t in full(o))
        return lambda o: any(p(o) for p in preds)

    inc = build(ops) if ops else (lambda o: True)
    exc = build(exclude) if exclude else (lambda o: False)
    return [i for i, o in enumerate(op_db) if inc(o) and not exc(o)]


def enumerate_tasks(op_db, cfg: RunConfig) -> List[Tuple[int, str, str]]:
    """(op_index, call, dtype_name) groups to run, in op_db order."""
    import torch
    tasks = []
    for i in select_ops(op_db, cfg.ops, cfg.exclude_ops):
        op = op_db[i]
        supported = op.supported_dtypes("cpu")
        for call in cfg.calls:
            if call == "method" and op.get_method() is None:
                continue
            if call == "inplace" and op.get_inplace() is None:
                continue
            if call == "out_cpu" and (not op.supports_out or cfg.device.split(":")[0] == "cpu"):
                continue                   # (a CPU out= is right for a CPU self-check)
            for dn in cfg.dtypes:
                dt = getattr(torch, dn)
                if dt not in supported:
                    continue
                if call == "conjneg" and not (dt.is_floating_point or dt.is_complex):
                    continue               # no conj/neg view for int / bool
                tasks.append((i, call, dn))
    return tasks


# ---------------------------------------------------------------------------
# The per-sample engine (runs inside a worker, or in-process)
# ---------------------------------------------------------------------------

class GroupRunner:
    """Runs (op, call, dtype) groups and yields one record per sample."""

    def __init__(self, cfg: RunConfig):
        import torch
        warnings.filterwarnings("ignore")
        for mod in cfg.import_modules():
            __import__(mod)
        from torch.testing._internal.common_methods_invocations import op_db
        self.torch = torch
        self.op_db = op_db
        self.cfg = cfg
        self.device = torch.device(cfg.device)
        self.dev_type = self.device.type
        dev_mod = getattr(torch, self.dev_type, None)
        self.random_by_value = self.dev_type == "cpu" or getattr(dev_mod, "get_rng_mode", lambda: None)() == "cpu"
        # Fail fast (in the worker) if the device is unusable.
        t = torch.arange(4, dtype=torch.float32).to(self.device)
        if t.device.type != self.dev_type or t.cpu().tolist() != [0.0, 1.0, 2.0, 3.0]:
            raise RuntimeError("device %s round-trip sanity check failed" % cfg.device)

    # -- sample inspection / transformation ---------------------------------

    def _leaves(self, obj) -> Iterator[Any]:
        torch = self.torch
        if isinstance(obj, torch.Tensor):
            yield obj
        elif isinstance(obj, (list, tuple)) and not isinstance(obj, torch.Size):
            for x in obj:
                yield from self._leaves(x)
        elif isinstance(obj, dict):
            for x in obj.values():
                yield from self._leaves(x)
        else:
            yield obj

    def _sample_parts(self, s):
        return (s.input, s.args, s.kwargs)

    def _unsupported_reason(self, s) -> Optional[str]:
        torch = self.torch
        for x in self._leaves(self._sample_parts(s)):
            if isinstance(x, torch.Tensor):
                if x.layout != torch.strided:
                    return "sparse/non-strided input"
                if x.is_quantized:
                    return "quantized input"
                if x.device.type != "cpu":
                    return "non-cpu input"
        return None

    def _map(self, obj, fn_tensor, fn_other, memo):
        torch = self.torch
        if isinstance(obj, torch.Tensor):
            k = id(obj)
            if k not in memo:          # preserve aliasing inside one sample
                memo[k] = fn_tensor(obj)
            return memo[k]
        if isinstance(obj, torch.Size):
            return obj
        if isinstance(obj, list):
            return [self._map(x, fn_tensor, fn_other, memo) for x in obj]
        if isinstance(obj, tuple):
            items = [self._map(x, fn_tensor, fn_other, memo) for x in obj]
            if type(obj) is tuple:
                return tuple(items)
            if hasattr(obj, "_fields"):
                return type(obj)(*items)
            return type(obj)(items)
        if isinstance(obj, dict):
            return type(obj)((k, self._map(v, fn_tensor, fn_other, memo)) for k, v in obj.items())
        return fn_other(obj)

    def _to_device(self, s, storage_exact=False, keep_cpu=()):
        """Copy of the sample with every tensor copied to D and device
        arguments (torch.device('cpu') / 'cpu') rewritten to D."""
        torch = self.torch
        dev = self.device
        touched = [False]

        def ft(t):
            touched[0] = True
            if storage_exact and t.layout == torch.strided:
                # Copy the whole storage and re-create the view, so ops that
                # address raw storage (as_strided on a partial view) see the
                # same memory as on CPU.
                n = t.untyped_storage().nbytes() // t.element_size()
                flat = torch.empty(0, dtype=t.dtype).set_(
                    t.untyped_storage(), 0, (n,), (1,))
                out = flat.to(dev, copy=True).as_strided(
                    t.size(), t.stride(), t.storage_offset())
                return out
            out = t.detach().to(dev, copy=True)
            if t.requires_grad:
                out.requires_grad_(True)
            return out

        def fo(x):
            if isinstance(x, torch.device) and x.type == "cpu":
                touched[0] = True
                return dev
            if isinstance(x, str) and x in ("cpu", "cpu:0"):
                touched[0] = True
                return str(dev)
            return x

        memo: Dict[int, Any] = {}
        inp = self._map(s.input, ft, fo, memo)
        args = self._map(s.args, ft, fo, memo)
        kwargs = self._map(s.kwargs, ft, fo, memo)
        if keep_cpu:
            def cpu_copy(x):
                return x.clone() if isinstance(x, torch.Tensor) else x
            args = tuple(cpu_copy(s.args[i]) if i in keep_cpu and i < len(s.args) else a
                         for i, a in enumerate(args))
            kwargs = {k: cpu_copy(s.kwargs[k]) if k in keep_cpu else v
                      for k, v in kwargs.items()}
        return inp, args, kwargs, touched[0]

    def _describe(self, s, n=240) -> str:
        torch = self.torch

        def d(x):
            if isinstance(x, torch.Tensor):
                dt = str(x.dtype).replace("torch.", "")
                extra = "" if x.is_contiguous() else ",nc"
                return "T%s:%s%s" % (list(x.shape), dt, extra)
            if isinstance(x, torch.Size):
                return str(tuple(x))
            if isinstance(x, (list, tuple)):
                b = "[]" if isinstance(x, list) else "()"
                return b[0] + ",".join(d(y) for y in x) + b[1]
            if isinstance(x, dict):
                return "{" + ",".join("%s=%s" % (k, d(v)) for k, v in x.items()) + "}"
            return repr(x)

        parts = [d(s.input)] + [d(a) for a in s.args] + \
            ["%s=%s" % (k, d(v)) for k, v in s.kwargs.items()]
        return _short("(" + ", ".join(parts) + ")", n)

    # -- comparison ---------------------------------------------------------

    def _tol(self, dtype, klass) -> Tuple[float, float]:
        name = str(dtype).replace("torch.", "")
        rtol, atol = TOLERANCES[klass].get(name, TOLERANCES["default"]["float32"])
        return rtol * self.cfg.tol_scale, atol * self.cfg.tol_scale

    def _contains(self, obj, pred) -> bool:
        return any(pred(x) for x in self._leaves(obj))

    def _compare(self, ref, dev, path, ctx, msgs: List[str]) -> None:
        torch = self.torch
        if isinstance(ref, torch.Tensor):
            if not isinstance(dev, torch.Tensor):
                msgs.append("%s: expected Tensor, got %s" % (path, type(dev).__name__))
                return
            if ctx["expected_device"] is not None and dev.device.type != ctx["expected_device"]:
                msgs.append("%s: on device '%s', expected '%s'"
                            % (path, dev.device, ctx["expected_device"]))
            if dev.dtype != ref.dtype:
                msgs.append("%s: dtype %s != reference %s" % (path, dev.dtype, ref.dtype))
                return
            if dev.shape != ref.shape:
                msgs.append("%s: shape %s != reference %s"
                            % (path, tuple(dev.shape), tuple(ref.shape)))
                return
            if ctx["meta_only"]:
                return
            r = ref.detach()
            d = dev.detach().to("cpu")     # exceptions propagate -> "error"
            if r.layout != torch.strided or d.layout != torch.strided:
                r, d = r.to_dense(), d.to_dense()
            r = r.resolve_conj().resolve_neg()
            d = d.resolve_conj().resolve_neg()
            dtype = r.dtype
            if dtype == torch.complex32:   # few CPU kernels (not even equal) for chalf
                r, d = r.to(torch.complex64), d.to(torch.complex64)
            if torch.equal(d, r):          # fast path (bitwise-equal, no NaNs)
                return
            if r.is_floating_point() or r.is_complex():
                rtol, atol = self._tol(dtype, ctx["klass"])
                try:
                    torch.testing.assert_close(
                        d, r, rtol=rtol, atol=atol, equal_nan=True,
                        check_device=False, check_dtype=False, check_layout=False,
                        check_stride=False)
                except AssertionError as e:
                    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
                    msgs.append("%s: %s" % (path, _short(" | ".join(lines[1:4]) or str(e), 260)))
            else:                          # integer / bool: exact
                ne = (d != r)
                n_bad = int(ne.sum())
                idx = tuple(int(v) for v in ne.nonzero()[0]) if n_bad else ()
                msgs.append("%s: %d/%d elements differ (exact %s), first at %s: %s vs ref %s"
                            % (path, n_bad, r.numel(), str(r.dtype).replace("torch.", ""),
                               idx, d[idx].item() if n_bad else "?",
                               r[idx].item() if n_bad else "?"))
            return
        if isinstance(dev, torch.Tensor):
            msgs.append("%s: expected %s, got Tensor" % (path, type(ref).__name__))
            return
        if isinstance(ref, (list, tuple)) and not isinstance(ref, torch.Size):
            if type(ref) is not type(dev):
                msgs.append("%s: container type %s != reference %s"
                            % (path, type(dev).__name__, type(ref).__name__))
                return
            if len(ref) != len(dev):
                msgs.append("%s: length %d != reference %d" % (path, len(dev), len(ref)))
                return
            fields = getattr(ref, "_fields", None)
            for i, (a, b) in enumerate(zip(ref, dev)):
                sub = "%s.%s" % (path, fields[i]) if fields and i < len(fields) else "%s[%d]" % (path, i)
                self._compare(a, b, sub, ctx, msgs)
            return
        if isinstance(ref, dict):
            if not isinstance(dev, dict) or set(ref) != set(dev):
                msgs.append("%s: dict keys differ" % path)
                return
            for k in ref:
                self._compare(ref[k], dev[k], "%s[%r]" % (path, k), ctx, msgs)
            return
        if ctx.get("tensors_only"):      # inputs: non-tensor args were rewritten
            return
        if ctx["meta_only"]:
            if type(ref) is not type(dev):
                msgs.append("%s: type %s != reference %s" % (path, type(dev).__name__, type(ref).__name__))
            return
        if isinstance(ref, torch.device):
            if isinstance(dev, torch.device) and dev.type in (ref.type, ctx["expected_device"]):
                return
            msgs.append("%s: %r != reference %r" % (path, dev, ref))
            return
        if isinstance(ref, float) and not isinstance(ref, bool) and isinstance(dev, (float, int)):
            rtol, atol = self._tol(ctx["dtype"], ctx["klass"])
            if math.isnan(ref) and math.isnan(dev):
                return
            if ref == dev or (math.isfinite(ref) and abs(dev - ref) <= atol + rtol * abs(ref)):
                return
            msgs.append("%s: %r != reference %r" % (path, dev, ref))
            return
        try:
            same = bool(ref == dev)
        except Exception:  # noqa: BLE001
            same = False
        if not same:
            msgs.append("%s: %s != reference %s" % (path, _short(repr(dev), 80), _short(repr(ref), 80)))

    # -- the conjneg and out_cpu variants ------------------------------------

    def _lazy_view(self, x):
        """The lazy view the conjneg variant feeds as first input, or None."""
        torch = self.torch
        if not isinstance(x, torch.Tensor) or x.layout != torch.strided:
            return None
        if x.is_complex():
            return lambda t: t.conj()
        if x.is_floating_point():
            return lambda t: t._neg_view()
        return None

    def _check_out_cpu(self, fn, s, ref, d_in, d_args, d_kwargs, seed) -> Dict[str, Any]:
        """Device inputs with a CPU ``out=``: PyTorch's contract (CUDA's
        behaviour) is a RuntimeError naming the device mismatch. Accepting it
        would write results into memory of another device, or silently move
        them."""
        torch = self.torch
        ref_leaves = list(self._leaves(ref))
        if not ref_leaves or not all(isinstance(x, torch.Tensor) for x in ref_leaves):
            return dict(status="skipped", msg="out_cpu: output is not a tensor / tuple of tensors")
        if not any(isinstance(x, torch.Tensor) and x.device.type == self.dev_type
                   for x in self._leaves((d_in, d_args, d_kwargs))):
            return dict(status="skipped", msg="out_cpu: no tensor input on the device")

        def cpu_out():
            if isinstance(ref, torch.Tensor):
                return torch.empty_like(ref)
            return tuple(torch.empty_like(x) for x in ref)

        # The same out= must be valid on CPU, otherwise the sample says nothing.
        self._seed(seed)
        try:
            fn(s.input, *s.args, out=cpu_out(), **s.kwargs)
        except Exception as e:  # noqa: BLE001
            return dict(status="reference_error", msg="out= on CPU raised: " + _exc_msg(e))
        self._seed(seed)
        try:
            fn(d_in, *d_args, out=cpu_out(), **d_kwargs)
        except RuntimeError as e:
            if "device" in str(e).lower():
                return dict(status="pass")
            return dict(status="fail", msg="out_cpu: RuntimeError without naming the device: "
                        + _exc_msg(e))
        except Exception as e:  # noqa: BLE001
            return dict(status="fail", msg="out_cpu: expected a RuntimeError about devices, got "
                        + _exc_msg(e))
        return dict(status="fail", msg="out_cpu: a CPU out= tensor was accepted for %s inputs"
                    % self.dev_type)

    # -- running ------------------------------------------------------------

    def group_seed(self, op, dtype_name) -> int:
        k = "%s|%s|%s|%d" % (op.name, op.variant_test_name, dtype_name, self.cfg.seed)
        return zlib.crc32(k.encode()) & 0x7FFFFFFF

    def _seed(self, seed):
        self.torch.manual_seed(seed)
        random.seed(seed)
        try:
            import numpy as np
            np.random.seed(seed)
        except Exception:  # noqa: BLE001
            pass

    def run_group(self, op_idx: int, call: str, dtype_name: str,
                  start: int = 0) -> Iterator[Tuple[str, Any]]:
        """Yields ('begin', n_samples) then ('rec', record) per sample."""
        torch = self.torch
        op = self.op_db[op_idx]
        dtype = getattr(torch, dtype_name)
        base = dict(op=op.name, variant=op.variant_test_name, call=call, dtype=dtype_name)
        seed = self.group_seed(op, dtype_name)
        self._seed(seed)
        try:
            gen = op.sample_inputs("cpu", dtype, requires_grad=False)
            samples = list(itertools.islice(gen, self.cfg.max_samples)) \
                if self.cfg.max_samples else list(gen)
        except Exception as e:  # noqa: BLE001
            yield "begin", 1
            if start == 0:
                yield "rec", dict(base, sample_idx=0, status="reference_error",
                                  msg="sample_inputs raised: " + _exc_msg(e))
            return
        yield "begin", len(samples)
        if call in ("function", "out_cpu", "conjneg"):
            fn = op.op
        elif call == "method":
            fn = op.get_method()
        else:
            fn = op.get_inplace()
        for i in range(start, len(samples)):
            t0 = time.perf_counter()
            rec = dict(base, sample_idx=i)
            try:
                rec.update(self._run_sample(op, fn, call, dtype, samples[i], seed + i))
            except Exception as e:  # noqa: BLE001  (harness bug: never fatal)
                rec.update(status="error", msg="harness: " + _exc_msg(e))
            if rec["status"] != "pass" and "desc" not in rec:
                try:
                    rec["desc"] = self._describe(samples[i])
                except Exception:  # noqa: BLE001
                    pass
            rec["ms"] = round((time.perf_counter() - t0) * 1e3, 2)
            yield "rec", rec

    def _run_sample(self, op, fn, call, dtype, s, seed) -> Dict[str, Any]:
        torch = self.torch
        reason = self._unsupported_reason(s)
        if not reason and call == "out_cpu" and "out" in s.kwargs:
            reason = "sample passes out= itself"
        if not reason and call == "out_cpu" and op.name in PYTHON_OUT_COPY_OPS:
            reason = "out_cpu: out= is a Python-level copy (any device allowed)"
        view = None
        if not reason and call == "conjneg":
            view = self._lazy_view(s.input)
            if view is None:
                reason = "first input has no conj/neg view"
        if reason:
            return dict(status="skipped", msg=reason)

        meta = None
        if _matches_any(op.name, RANDOM_OPS):
            meta = None if self.random_by_value else "random"
        elif _matches_any(op.name, UNINITIALIZED_OPS) or op.has_nondeterministic_output:
            meta = "uninitialized"
        elif op.name in RANDOM_SAMPLE_PREDICATES and RANDOM_SAMPLE_PREDICATES[op.name](s):
            meta = None if self.random_by_value else "random"

        # 1. device copy of the pristine sample (before the reference may mutate it)
        move_exc = None
        try:
            d_in, d_args, d_kwargs, touched = self._to_device(
                s, storage_exact=_matches_any(op.name, STORAGE_OPS),
                keep_cpu=CPU_ARGS.get(op.name, ()))
        except Exception as e:  # noqa: BLE001
            move_exc = e

        # The conjneg variant builds the same lazy view on both sides: the
        # device view must come from the device copy (.to() would resolve it).
        c_in = s.input
        if view is not None:
            c_in = view(s.input)
            if move_exc is None:
                try:
                    d_in = view(d_in)
                except Exception as e:  # noqa: BLE001
                    move_exc = e

        # 2. CPU reference. For conjneg the reference value is the op on the
        # materialized view: CPU kernels do not all honour the bits either
        # (max_pool1d ignores the neg bit). CPU's call on the lazy view only
        # tells whether the op accepts one (view_as_real refuses a conj view).
        if view is not None:
            c_in = c_in.resolve_conj().resolve_neg()
        self._seed(seed)
        try:
            ref = fn(c_in, *s.args, **s.kwargs)
        except Exception as e:  # noqa: BLE001
            return dict(status="reference_error", msg=_exc_msg(e))
        if view is not None:
            self._seed(seed)
            try:
                fn(view(s.input), *s.args, **s.kwargs)
            except Exception as e:  # noqa: BLE001
                return dict(status="reference_error", msg="on the lazy view: " + _exc_msg(e))

        def bad_ref(x):
            if isinstance(x, torch.Tensor):
                if x.layout != torch.strided:
                    return "sparse/non-strided output"
                if x.is_quantized:
                    return "quantized output"
            return None

        for x in self._leaves(ref):
            r = bad_ref(x)
            if r:
                return dict(status="skipped", msg=r)

        if move_exc is not None:
            return dict(status="error", msg="moving inputs to device: " + _exc_msg(move_exc))

        if call == "out_cpu":
            return self._check_out_cpu(fn, s, ref, d_in, d_args, d_kwargs, seed)

        # 3. device run
        self._seed(seed)
        try:
            out = fn(d_in, *d_args, **d_kwargs)
        except Exception as e:  # noqa: BLE001
            return dict(status="error", msg=_exc_msg(e))

        # 4. compare
        if op.name in CPU_OUTPUT_OPS:
            expected = "cpu"
        else:
            expected = self.dev_type if touched else "cpu"
        ctx = dict(expected_device=expected, meta_only=meta is not None,
                   klass=tol_class(op.name), dtype=dtype)
        msgs: List[str] = []
        try:
            self._compare(ref, out, "out", ctx, msgs)
            if self.cfg.check_inputs and meta is None:
                # Inputs may be mutated (in-place ops, out=, running stats):
                # the device-side inputs must end up equal to the CPU ones.
                ictx = dict(ctx, expected_device=None, tensors_only=True)
                self._compare(c_in, d_in, "input", ictx, msgs)
                self._compare(list(s.args), list(d_args), "args", ictx, msgs)
                self._compare(dict(s.kwargs), dict(d_kwargs), "kwargs", ictx, msgs)
        except Exception as e:  # noqa: BLE001
            return dict(status="error", msg="while comparing/copying back: " + _exc_msg(e))
        res: Dict[str, Any] = dict(status="fail" if msgs else "pass")
        if msgs:
            res["msg"] = _short("; ".join(msgs[:3]) + (" (+%d more)" % (len(msgs) - 3) if len(msgs) > 3 else ""), 600)
        if meta:
            res["check"] = "meta:" + meta
        return res


# ---------------------------------------------------------------------------
# Worker processes (crash isolation + --jobs)
# ---------------------------------------------------------------------------

def _worker_main(conn, cfg_dict: Dict[str, Any], num_threads: int) -> None:
    """Entry point of a spawn'ed worker.  Protocol (over a Pipe):
    worker -> ('ready', None) | ('fatal', msg); then per task
    ('begin', tid, n) ('rec', tid, rec)* ('done', tid, None)."""
    try:
        import torch
        torch.set_num_threads(max(1, num_threads))
        runner = GroupRunner(RunConfig(**cfg_dict))
    except BaseException as e:  # noqa: BLE001
        conn.send(("fatal", None, _exc_msg(e, 2000) + "\n" + traceback.format_exc()[-3000:]))
        return
    conn.send(("ready", None, None))
    while True:
        try:
            msg = conn.recv()
        except EOFError:
            return
        if msg is None:
            return
        tid, op_idx, call, dtype_name, start = msg
        for kind, payload in runner.run_group(op_idx, call, dtype_name, start):
            conn.send((kind, tid, payload))
        conn.send(("done", tid, None))


STARTUP_TIMEOUT = 300.0   # importing torch + op_db (+ backend) in a worker


class _Slot:
    def __init__(self):
        self.proc = None
        self.conn = None
        self.ready = False
        self.task = None        # (tid, op_idx, call, dtype, start)
        self.n_total = None
        self.next_idx = 0
        self.last = 0.0
        self.started = 0.0


def _run_isolated(cfg: RunConfig, op_db, tasks, records: List[Dict[str, Any]],
                  log) -> Optional[str]:
    import multiprocessing as mp
    from multiprocessing.connection import wait

    ctx = mp.get_context("spawn")
    jobs = max(1, min(cfg.jobs, len(tasks)))
    threads = max(1, (os.cpu_count() or 1) // jobs)
    cfg_dict = asdict(cfg)
    queue = collections.deque((tid, i, c, d, 0) for tid, (i, c, d) in enumerate(tasks))
    crashes_per_group: Dict[Tuple[int, str, str], int] = collections.Counter()
    slots = [_Slot() for _ in range(jobs)]
    startup_failures = 0
    done_groups = 0
    n_groups = len(tasks)
    t_start = time.time()

    def start(slot):
        parent, child = ctx.Pipe()
        p = ctx.Process(target=_worker_main, args=(child, cfg_dict, threads), daemon=True)
        p.start()
        child.close()
        slot.proc, slot.conn, slot.ready = p, parent, False
        slot.task, slot.last, slot.started = None, time.time(), time.time()

    def base(task):
        op = op_db[task[1]]
        return dict(op=op.name, variant=op.variant_test_name, call=task[2], dtype=task[3])

    def kill(slot):
        try:
            slot.proc.kill()
        except Exception:  # noqa: BLE001
            pass
        slot.proc.join(5)
        try:
            slot.conn.close()
        except Exception:  # noqa: BLE001
            pass
        slot.proc = slot.conn = None
        slot.ready = False

    def handle_crash(slot, why):
        nonlocal done_groups
        task = slot.task
        slot.task = None
        if task is None:
            return
        tid, op_idx, call, dn, st = task
        gkey = (op_idx, call, dn)
        crashes_per_group[gkey] += 1
        idx = slot.next_idx
        records.append(dict(base(task), sample_idx=idx, status="crash", msg=why))
        log("CRASH %s %s sample %d: %s" % (op_key(*[base(task)[k] for k in ("op", "variant", "call")]), dn, idx, why))
        if slot.n_total is not None and idx + 1 < slot.n_total:
            if crashes_per_group[gkey] < cfg.max_crashes_per_group:
                queue.appendleft((tid, op_idx, call, dn, idx + 1))
                return
            for j in range(idx + 1, slot.n_total):
                records.append(dict(base(task), sample_idx=j, status="skipped",
                                    msg="not run: group aborted after %d crashes" % crashes_per_group[gkey]))
        done_groups += 1

    def drain(s, now) -> Tuple[bool, Optional[str]]:
        """Read all pending messages of a slot. Returns (eof, fatal)."""
        nonlocal done_groups, startup_failures
        try:
            while s.conn.poll():
                kind, tid, payload = s.conn.recv()
                s.last = now
                if kind == "ready":
                    s.ready = True
                    startup_failures = 0
                elif kind == "fatal":
                    return True, "worker failed to start: " + payload
                elif kind == "begin":
                    s.n_total = payload
                elif kind == "rec":
                    records.append(payload)
                    s.next_idx = payload["sample_idx"] + 1
                elif kind == "done":
                    s.task = None
                    done_groups += 1
                    if cfg.verbose or done_groups % 100 == 0:
                        log("[%d/%d groups, %d samples, %.0fs]"
                            % (done_groups, n_groups, len(records), now - t_start))
        except (EOFError, OSError):
            return True, None
        return False, None

    try:
        while queue or any(s.task is not None for s in slots):
            # (re)start workers, hand out tasks
            for s in slots:
                if s.proc is None and queue:
                    start(s)
                if s.proc is not None and s.ready and s.task is None and queue:
                    s.task = queue.popleft()
                    s.n_total, s.next_idx, s.last = None, s.task[4], time.time()
                    s.conn.send(s.task)
            live = [s for s in slots if s.proc is not None]
            if not live:
                break
            waitables = [s.conn for s in live] + [s.proc.sentinel for s in live]
            ready = wait(waitables, timeout=5.0)
            now = time.time()
            for s in live:
                eof, fatal = drain(s, now)
                if fatal:
                    return fatal
                if eof or s.proc.sentinel in ready or not s.proc.is_alive():
                    s.proc.join(2)
                    if s.proc.is_alive():      # EOF but still alive: kill it
                        s.proc.kill()
                        s.proc.join(5)
                    eof, fatal = drain(s, now)  # anything sent just before death
                    if fatal:
                        return fatal
                    code = s.proc.exitcode
                    was_ready, task = s.ready, s.task
                    kill(s)
                    if not was_ready:
                        startup_failures += 1
                        if startup_failures >= 3:
                            return "worker died during start-up (exit code %s)" % code
                        continue
                    if task is None:
                        continue
                    why = "worker died (exit code %s%s)" % (
                        code, ", signal %d" % -code if code is not None and code < 0 else "")
                    s.task = task
                    handle_crash(s, why)
                elif not s.ready and now - s.started > max(cfg.timeout, STARTUP_TIMEOUT):
                    kill(s)
                    return "worker start-up timed out after %.0fs" % (now - s.started)
                elif s.task is not None and now - s.last > cfg.timeout:
                    task = s.task
                    kill(s)
                    s.task = task
                    handle_crash(s, "timeout: no progress for %.0fs" % cfg.timeout)
    finally:
        for s in slots:
            if s.proc is not None:
                try:
                    s.conn.send(None)
                except Exception:  # noqa: BLE001
                    pass
                s.proc.join(10)
                if s.proc.is_alive():
                    kill(s)
    return None


def _run_inprocess(cfg: RunConfig, tasks, records, log) -> Optional[str]:
    try:
        runner = GroupRunner(cfg)
    except Exception as e:  # noqa: BLE001
        return "could not initialise device/runner: " + _exc_msg(e, 2000)
    t0 = time.time()
    for n, (i, c, d) in enumerate(tasks, 1):
        for kind, payload in runner.run_group(i, c, d):
            if kind == "rec":
                records.append(payload)
        if cfg.verbose or n % 100 == 0:
            log("[%d/%d groups, %d samples, %.0fs]" % (n, len(tasks), len(records), time.time() - t0))
    return None


# ---------------------------------------------------------------------------
# Reporting
# ---------------------------------------------------------------------------

def summarize(records: List[Dict[str, Any]]) -> Dict[str, Any]:
    totals = collections.Counter(r["status"] for r in records)
    out = {k: totals.get(k, 0) for k in STATUSES}
    out["samples"] = len(records)
    denom = out["pass"] + out["fail"] + out["error"] + out["crash"]
    out["pass_rate"] = (out["pass"] / denom) if denom else None
    out["metadata_only"] = sum(1 for r in records if r.get("check", "").startswith("meta"))
    return out


def build_report(cfg: RunConfig, records, tasks, op_db, duration, fatal) -> Dict[str, Any]:
    import torch
    records.sort(key=lambda r: (r["op"], r["variant"], r["call"], r["dtype"], r["sample_idx"]))
    per_op: Dict[str, Dict[str, Any]] = {}
    per_dtype: Dict[str, Dict[str, Any]] = {}
    missing = collections.Counter()
    skip_reasons = collections.Counter()
    for r in records:
        k = op_key(r["op"], r["variant"], r["call"])
        e = per_op.setdefault(k, dict({s: 0 for s in STATUSES}, failing_dtypes=[], messages=[]))
        e[r["status"]] += 1
        if r["status"] in ("fail", "error", "crash"):
            if r["dtype"] not in e["failing_dtypes"]:
                e["failing_dtypes"].append(r["dtype"])
            if len(e["messages"]) < 3:
                e["messages"].append("[%s #%d] %s" % (r["dtype"], r["sample_idx"], r.get("msg", "")))
            m = _MISSING_KERNEL_RE.search(r.get("msg", ""))
            if m:
                missing[m.group(1) or m.group(2)] += 1
        if r["status"] == "skipped":
            skip_reasons[r.get("msg", "")] += 1
        pd = per_dtype.setdefault(r["dtype"], collections.Counter())
        pd[r["status"]] += 1
    for d, c in per_dtype.items():
        denom = c["pass"] + c["fail"] + c["error"] + c["crash"]
        per_dtype[d] = dict({s: c.get(s, 0) for s in STATUSES},
                            pass_rate=(c["pass"] / denom) if denom else None)
    return dict(
        meta=dict(
            device=cfg.device, torch_version=torch.__version__,
            python=platform.python_version(), platform=platform.platform(),
            started=time.strftime("%Y-%m-%d %H:%M:%S"), duration_s=round(duration, 1),
            argv=sys.argv, config=asdict(cfg), op_groups=len(tasks),
            ops=len({t[0] for t in tasks}), fatal=fatal,
        ),
        totals=summarize(records),
        per_dtype=per_dtype,
        per_op=per_op,
        missing_kernels=dict(missing.most_common()),
        skip_reasons=dict(skip_reasons.most_common()),
        results=records,
    )


def render_markdown(report: Dict[str, Any], max_rows: int = 400) -> str:
    m, t = report["meta"], report["totals"]
    pr = "n/a" if t["pass_rate"] is None else "%.2f%%" % (100 * t["pass_rate"])
    L = ["# OpInfo differential test: cpu vs `%s`" % m["device"], ""]
    L.append("torch %s, python %s, %s; %d ops / %d (op, call, dtype) groups; %.0f s."
             % (m["torch_version"], m["python"], m["started"], m["ops"], m["op_groups"], m["duration_s"]))
    if m.get("fatal"):
        L += ["", "**FATAL: %s**" % _short(m["fatal"], 2000)]
    L += ["", "## Totals", "",
          "| samples | pass | fail | error | crash | reference_error | skipped | pass rate |",
          "|---|---|---|---|---|---|---|---|",
          "| %d | %d | %d | %d | %d | %d | %d | %s |" % (
              t["samples"], t["pass"], t["fail"], t["error"], t["crash"],
              t["reference_error"], t["skipped"], pr),
          "",
          "pass rate = pass / (pass + fail + error + crash). %d samples of random / "
          "uninitialized-output ops were checked for structure, shape, dtype and device only."
          % t["metadata_only"],
          "", "## Per dtype", "",
          "| dtype | pass | fail | error | crash | reference_error | skipped | pass rate |",
          "|---|---|---|---|---|---|---|---|"]
    for d, c in sorted(report["per_dtype"].items()):
        L.append("| %s | %d | %d | %d | %d | %d | %d | %s |" % (
            d, c["pass"], c["fail"], c["error"], c["crash"], c["reference_error"], c["skipped"],
            "n/a" if c["pass_rate"] is None else "%.2f%%" % (100 * c["pass_rate"])))
    bad = [(k, v) for k, v in report["per_op"].items() if v["fail"] or v["error"] or v["crash"]]
    bad.sort(key=lambda kv: (-(kv[1]["crash"] * 1000 + kv[1]["fail"] + kv[1]["error"]), kv[0]))
    L += ["", "## Failing ops (%d)" % len(bad), ""]
    if bad:
        L += ["| op | dtypes | pass | fail | error | crash | first message |", "|---|---|---|---|---|---|---|"]
        for k, v in bad[:max_rows]:
            msg = v["messages"][0] if v["messages"] else ""
            L.append("| `%s` | %s | %d | %d | %d | %d | %s |" % (
                k, ",".join(v["failing_dtypes"]), v["pass"], v["fail"], v["error"], v["crash"],
                _short(msg, 220).replace("|", "\\|")))
        if len(bad) > max_rows:
            L.append("\n... %d more in the JSON report" % (len(bad) - max_rows))
    else:
        L.append("None.")
    crashes = [r for r in report["results"] if r["status"] == "crash"]
    if crashes:
        L += ["", "## Crashes", ""]
        for r in crashes[:100]:
            L.append("- `%s` %s sample %d: %s" % (op_key(r["op"], r["variant"], r["call"]),
                                                  r["dtype"], r["sample_idx"], r.get("msg", "")))
    if report["missing_kernels"]:
        L += ["", "## Missing kernels (from 'Could not run ...' / 'has no neuron kernel' errors)", "",
              "| kernel | samples |", "|---|---|"]
        for k, n in list(report["missing_kernels"].items())[:100]:
            L.append("| `%s` | %d |" % (k, n))
    if report["skip_reasons"]:
        L += ["", "## Skipped samples by reason", "", "| reason | samples |", "|---|---|"]
        for k, n in report["skip_reasons"].items():
            L.append("| %s | %d |" % (k.replace("|", "\\|"), n))
    reo = collections.Counter()
    for r in report["results"]:
        if r["status"] == "reference_error":
            reo[op_key(r["op"], r["variant"], r["call"])] += 1
    if reo:
        L += ["", "## reference_error (CPU reference raised; N/A)", "",
              ", ".join("`%s` (%d)" % kv for kv in sorted(reo.items()))]
    return "\n".join(L) + "\n"


# ---------------------------------------------------------------------------
# Entry points
# ---------------------------------------------------------------------------

def _maybe_disable_backend_autoload(device: str) -> None:
    """torch >= 2.5 auto-imports every installed out-of-tree backend that
    declares a ``torch.backends`` entry point (torch_neuronx does) on
    ``import torch``.  For a CPU self-check that is pure risk (e.g. its _C.so
    being rebuilt in place under a running process crashes it), so it is
    disabled unless the user set TORCH_DEVICE_BACKEND_AUTOLOAD explicitly.
    Must run before ``import torch`` to affect this process; spawn'ed workers
    inherit it either way."""
    if device.split(":")[0] == "cpu":
        os.environ.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")


def run(cfg: RunConfig, log=None) -> Dict[str, Any]:
    """Run the suite; returns the report dict (see build_report)."""
    if log is None:
        def log(msg):
            print(msg, file=sys.stderr, flush=True)
    _maybe_disable_backend_autoload(cfg.device)
    warnings.filterwarnings("ignore")
    import torch  # noqa: F401
    from torch.testing._internal.common_methods_invocations import op_db
    tasks = enumerate_tasks(op_db, cfg)
    log("opinfo: %d ops, %d (op, call, dtype) groups, device=%s, jobs=%d, isolate=%s"
        % (len({t[0] for t in tasks}), len(tasks), cfg.device, cfg.jobs, cfg.isolate))
    records: List[Dict[str, Any]] = []
    t0 = time.time()
    if not tasks:
        fatal = None
    elif cfg.isolate:
        fatal = _run_isolated(cfg, op_db, tasks, records, log)
    else:
        fatal = _run_inprocess(cfg, tasks, records, log)
    if fatal:
        log("opinfo: FATAL: " + fatal)
    return build_report(cfg, records, tasks, op_db, time.time() - t0, fatal)


def _parse_args(argv=None):
    p = argparse.ArgumentParser(
        description="OpInfo differential test: CPU reference vs device D.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--device", default="neuron", help="device D (use 'cpu' for a self-check)")
    p.add_argument("--dtypes", default=",".join(DEFAULT_DTYPES), help="comma list of dtypes")
    p.add_argument("--ops", default=None,
                   help="comma list of op filters; each is a glob (* ? []), an exact op name / "
                        "name.variant, or else a substring. '@NAME' expands a named list: "
                        + ", ".join("@" + k for k in OP_LISTS))
    p.add_argument("--exclude-ops", default=None, help="same syntax as --ops")
    p.add_argument("--max-samples-per-op", type=int, default=None,
                   help="max samples per (op, variant, call, dtype) group")
    p.add_argument("--jobs", type=int, default=1, help="parallel worker processes")
    p.add_argument("--no-isolate", action="store_true",
                   help="run in this process (no crash isolation; --jobs ignored)")
    p.add_argument("--timeout", type=float, default=300.0,
                   help="seconds without progress before a worker is killed (=> crash)")
    p.add_argument("--calls", default=",".join(DEFAULT_CALLS),
                   help="comma list of call variants: " + ",".join(CALL_VARIANTS))
    p.add_argument("--tol-scale", type=float, default=1.0, help="multiply all float tolerances")
    p.add_argument("--import", dest="imports", action="append", default=None,
                   help="module to import in workers before using the device "
                        "(default: torch_neuronx for device 'neuron')")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-check-inputs", action="store_true",
                   help="do not compare (possibly mutated) inputs after the call")
    p.add_argument("--json", default=None, help="write the JSON report here")
    p.add_argument("--md", default=None, help="write the markdown summary here")
    p.add_argument("--fail-under", type=float, default=None,
                   help="exit 1 if pass rate < this (0..1) or any crash")
    p.add_argument("--list", action="store_true", help="list selected groups and exit")
    p.add_argument("-v", "--verbose", action="store_true")
    return p.parse_args(argv)


def _expand_lists(spec: Optional[str]) -> Optional[str]:
    """'@name' tokens -> the comma-joined OP_LISTS[name]."""
    if not spec:
        return spec
    toks = []
    for t in spec.split(","):
        t = t.strip()
        if t.startswith("@"):
            if t[1:] not in OP_LISTS:
                raise SystemExit("unknown op list %r (choose from %s)" % (t, ", ".join(OP_LISTS)))
            toks.extend(OP_LISTS[t[1:]])
        elif t:
            toks.append(t)
    return ",".join(toks)


def main(argv=None) -> int:
    a = _parse_args(argv)
    _maybe_disable_backend_autoload(a.device)
    ops, exclude = _expand_lists(a.ops), _expand_lists(a.exclude_ops)
    dtypes = [d.strip() for d in a.dtypes.split(",") if d.strip()]
    import torch
    for d in dtypes:
        if not isinstance(getattr(torch, d, None), torch.dtype):
            raise SystemExit("unknown dtype %r" % d)
    calls = [c.strip() for c in a.calls.split(",") if c.strip()]
    for c in calls:
        if c not in CALL_VARIANTS:
            raise SystemExit("unknown call variant %r (choose from %s)" % (c, CALL_VARIANTS))
    cfg = RunConfig(
        device=a.device, dtypes=dtypes,
        ops=ops, exclude_ops=exclude, max_samples=a.max_samples_per_op, jobs=a.jobs,
        isolate=not a.no_isolate, timeout=a.timeout, calls=calls,
        tol_scale=a.tol_scale, imports=a.imports,
        seed=a.seed, check_inputs=not a.no_check_inputs, verbose=a.verbose)
    if a.list:
        warnings.filterwarnings("ignore")
        from torch.testing._internal.common_methods_invocations import op_db
        for i, c, d in enumerate_tasks(op_db, cfg):
            print(op_key(op_db[i].name, op_db[i].variant_test_name, c), d)
        return 0
    report = run(cfg)
    if a.json:
        os.makedirs(os.path.dirname(os.path.abspath(a.json)), exist_ok=True)
        with open(a.json, "w") as f:
            json.dump(report, f, indent=1, default=str)
    md = render_markdown(report)
    if a.md:
        os.makedirs(os.path.dirname(os.path.abspath(a.md)), exist_ok=True)
        with open(a.md, "w") as f:
            f.write(md)
    t = report["totals"]
    print("opinfo %s: samples=%d pass=%d fail=%d error=%d crash=%d reference_error=%d "
          "skipped=%d pass_rate=%s metadata_only=%d time=%.0fs" % (
              cfg.device, t["samples"], t["pass"], t["fail"], t["error"], t["crash"],
              t["reference_error"], t["skipped"],
              "n/a" if t["pass_rate"] is None else "%.4f" % t["pass_rate"],
              t["metadata_only"], report["meta"]["duration_s"]))
    if report["meta"]["fatal"]:
        return 2
    if a.fail_under is not None:
        if t["crash"] or t["pass_rate"] is None or t["pass_rate"] < a.fail_under:
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
