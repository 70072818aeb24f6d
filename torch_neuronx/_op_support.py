"""What runs on `neuron`, from two sources: the dispatcher's live registrations
(how each ATen op reaches the device) and the op record (what did run).

The record is kept by csrc/aten/OpTracking.cpp: every neuron kernel notes its
op, the host fallback counts its calls. ``get_executed_ops()``,
``get_fallback_ops()`` and ``fallback_report()`` are views of it, in the
vendor TorchNeuron's formats (docs/compat.md).
"""
import re

import torch

from . import _C

# Route of an ATen overload on `neuron`, and the compatibility value the
# vendor's table gives it (Y / CPU_FALLBACK / N).
KERNEL = "neuron kernel"
COMPOSITE = "composite"
FALLBACK = "host fallback"
UNSUPPORTED = "unsupported"
STATUS = {KERNEL: "Y", COMPOSITE: "Y", FALLBACK: "CPU_FALLBACK", UNSUPPORTED: "N"}

_COMPOSITE_KEYS = ("CompositeImplicitAutograd", "CompositeExplicitAutograd", "CompositeExplicitAutogradNonFunctional")
# Quantized tensors have no neuron dtype (check_supported_dtype).
_QUANTIZED = re.compile(r"quantize|quantized|^q_|^int_repr|^_fake_quant|fake_quantize|^_make_per_")


def route(op: str) -> str:
    """How ``op`` ("aten::add.Tensor") reaches the device: a neuron kernel
    (host table, direct or dedicated), a composite of other ops, the counted
    host fallback over its CPU kernel, or nothing."""
    has = torch._C._dispatch_has_kernel_for_dispatch_key
    if has(op, "PrivateUse1"):
        return KERNEL
    if any(has(op, key) for key in _COMPOSITE_KEYS):
        return COMPOSITE
    if has(op, "CPU") and not _QUANTIZED.search(op.split("::", 1)[1]):
        return FALLBACK
    return UNSUPPORTED


def aten_overloads() -> list:
    """Every registered ATen overload, "aten::name.overload" (or "aten::name")."""
    return sorted(n for n in torch._C._dispatch_get_all_op_names() if n.startswith("aten::"))


def kernel_sources() -> dict:
    """Where each neuron kernel is registered: {"add.Tensor": "csrc/aten/Routes.cpp", ...},
    read from the dispatcher (the registration's source file)."""
    sources = {}
    for name in aten_overloads():
        if not torch._C._dispatch_has_kernel_for_dispatch_key(name, "PrivateUse1"):
            continue
        match = re.search(r"^PrivateUse1: registered at (\S+?):\d+", torch._C._dispatch_dump(name), re.M)
        path = match.group(1) if match else "?"
        sources[name[len("aten::"):]] = path[path.find("csrc/"):] if "csrc/" in path else path
    return sources


def neuron_kernels() -> list:
    """ATen overloads with a neuron kernel, spelled "add.Tensor" / "mm"."""
    return [n[len("aten::"):] for n in aten_overloads() if route(n) == KERNEL]


def compatibility() -> list:
    """``(op, status, note)`` per ATen op, its overloads folded by base name
    into the least supported one's status: ``Y`` when every overload has a
    neuron kernel or decomposes, ``CPU_FALLBACK`` when some run through the
    host fallback, ``N`` when some cannot run (the note names them)."""
    by_base = {}
    for name in aten_overloads():
        by_base.setdefault(name.split(".")[0], []).append((name, route(name)))
    rows = []
    for base, overloads in by_base.items():
        unsupported = [n for n, r in overloads if r == UNSUPPORTED]
        fallback = [n for n, r in overloads if r == FALLBACK]
        if unsupported:
            why = "quantized" if _QUANTIZED.search(base[6:]) else "no kernel for neuron or CPU"
            some = "" if len(unsupported) == len(overloads) else ": " + _names(unsupported)
            rows.append((base, "N", why + some))
        elif fallback:
            rows.append((base, "CPU_FALLBACK", _names(fallback)))
        else:
            rows.append((base, "Y", " + ".join(sorted({r for _, r in overloads}))))
    return rows


def _names(overloads) -> str:
    return ", ".join(f"`{n[len('aten::'):]}`" for n in overloads)


# ---- the op record ------------------------------------------------------------------


def get_executed_ops() -> list:
    """ATen ops that ran a neuron kernel since the last ``clear_op_tracking()``:
    a list of unique names such as ``"aten::add"`` (no overload), sorted."""
    return list(_C._executed_ops())


def get_fallback_ops() -> list:
    """ATen ops that ran through the host fallback since the last
    ``clear_op_tracking()``: unique names such as ``"aten::channel_shuffle"``
    or ``"aten::add.Tensor"`` (with the overload), sorted."""
    return sorted(_C._fallback_ops())


def clear_op_tracking() -> None:
    """Empties the op record (executed and fallback ops, and fallback_report())."""
    _C._clear_op_tracking()


def fallback_report() -> dict:
    """Ops that ran through the host fallback since the last reset: ``{op: calls}``
    with names as in ``supported_ops()`` ("add.Tensor"); the record's counts."""
    return dict(_C._fallback_counts())


def reset_fallback_report() -> None:
    """Clears the fallback part of the op record."""
    _C._reset_fallback_counts()
