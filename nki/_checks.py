"""Operand checks shared by nki.isa and nki.language: buffer kinds, tile
limits, dtypes. All run while tracing, so errors point at the kernel line."""
import math

from . import _dtypes, _target
from ._errors import fail
from ._tensor import NkiTensor

ON_CHIP = ("sbuf", "psum")
SBUF = ("sbuf",)
PSUM = ("psum",)
ANY = ("sbuf", "psum", "hbm")


def kind(t):
    return t.buffer.name if t.on_chip else "hbm"


def tile(instr, name, t, where=ON_CHIP):
    """``t`` is a tensor in one of ``where``; on-chip tiles fit the partitions
    and the engine's free-size limit."""
    if not isinstance(t, NkiTensor):
        fail(instr, name, f"expected a tensor, got {type(t).__name__}")
    k = kind(t)
    if k not in where:
        hint = " (HBM data must be moved on chip with nisa.dma_copy / nl.load first)" if k == "hbm" else ""
        if instr.endswith("dma_copy") and k == "psum":
            hint = " (copy PSUM to SBUF with nisa.tensor_copy first)"
        fail(instr, name, f"is in {t.buffer.name}, but {instr} accepts {' or '.join(where)}{hint}")
    if t.on_chip:
        if t.ndim == 0:
            fail(instr, name, "an on-chip tile needs a partition dimension")
        partitions(instr, name, t.shape[0])
        free = math.prod(t.shape[1:])
        limit = _target.PSUM_FREE_ELEMS if k == "psum" else _target.SBUF_FREE_ELEMS
        if not instr.endswith("dma_copy") and free > limit:
            fail(instr, name, f"free size {free} exceeds the {limit}-element limit of an engine access "
                              f"from {k}")
    return t


def partitions(instr, name, p):
    if p > _target.PMAX:
        fail(instr, name, f"partition dimension {p} exceeds maximum {_target.PMAX} (nl.tile_size.pmax)")


def same_shape(instr, names, *ts):
    shapes = [tuple(t.shape) for t in ts]
    if any(s != shapes[0] for s in shapes):
        desc = ", ".join(f"{n}={list(s)}" for n, s in zip(names, shapes))
        fail(instr, names[-1], f"shapes differ: {desc}")


def same_numel_per_partition(instr, names, *ts):
    if any(t.shape[0] != ts[0].shape[0] for t in ts) or any(
            math.prod(t.shape[1:]) != math.prod(ts[0].shape[1:]) for t in ts):
        desc = ", ".join(f"{n}={list(t.shape)}" for n, t in zip(names, ts))
        fail(instr, names[-1], f"shapes differ: {desc}")


def per_partition_scalar(instr, name, s, p):
    """An operand that is a number or a [p, 1] tile."""
    if isinstance(s, NkiTensor):
        tile(instr, name, s)
        if s.shape[0] != p or math.prod(s.shape[1:]) != 1:
            fail(instr, name, f"a per-partition operand must have shape [{p}, 1], got {list(s.shape)}")
    elif not isinstance(s, (int, float, bool)):
        fail(instr, name, f"expected a number or a [{p}, 1] tile, got {type(s).__name__}")
    return s


def op(instr, name, f, arity=None):
    """``f`` is an nl function (``nl.add``); raw integers or strings are not."""
    impl = getattr(f, "_nki_op", None)
    if impl is None:
        fail(instr, name, f"expected an nl function such as nl.add or nl.exp, got {f!r}")
    if arity is not None and impl.arity != arity:
        kinds = {1: "a unary (activation) function", 2: "a binary function"}
        fail(instr, name, f"expected {kinds[arity]}, got nl.{impl.name}")
    return impl


def bitvec(instr, impl, *ts):
    if impl.kind == "bitvec":
        for t in ts:
            if isinstance(t, NkiTensor) and t.dtype.is_floating_point:
                fail(instr, "op", f"nl.{impl.name} is a bitvector op and needs integer dtypes, got "
                                  f"{_dtypes.name(t.dtype)}")


def free_axes(instr, axis, ndim):
    axes = (axis,) if isinstance(axis, int) else tuple(axis)
    axes = tuple(a + ndim if a < 0 else a for a in axes)
    if any(a <= 0 or a >= ndim for a in axes):
        fail(instr, "axis", f"axis {axis} must name free dimensions (1..{ndim - 1}); the partition axis is "
                            f"reduced with nisa.tensor_partition_reduce or a matmul")
    return axes
