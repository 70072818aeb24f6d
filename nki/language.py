"""nki.language (``nl``): tensors and buffers, tile-level operators that
allocate their result in SBUF, loops, SPMD ids and tile limits.

Every operator is recorded into the kernel's program while tracing and runs
as a whole-tile torch operation (fp32 compute, rounded on store).

One module over 600 lines on purpose: it is the public ``nki.language``
namespace, one short function per operator, as users import it."""
import builtins
import math
import numbers

import torch

from . import _checks, _dtypes, _target
from . import _philox, _trace
from ._dtypes import (bfloat16, bool_, float8_e4m3, float8_e4m3fn, float8_e5m2, float16, float32,  # noqa: F401
                      int8, int16, int32, tfloat32, uint8, uint16, uint32)
from ._errors import NKIError, fail
from ._ops import OPS, ElementwiseOp, reduce as _reduce_fn
from ._target import tile_size  # noqa: F401
from ._tensor import DynSlice, NkiTensor, hbm, private_hbm, psum, sbuf, shared_hbm  # noqa: F401
from ._tensor import buffer_of as _buffer_of

ndarray_type = NkiTensor
tile = NkiTensor

# Elementwise functions: nl.add, nl.exp, ... (also the ``op=`` of nki.isa).
globals().update(OPS)
__all__ = sorted(OPS)


# -- allocation ------------------------------------------------------------
def ndarray(shape, dtype, buffer=sbuf, name="", **kwargs):
    """A new tensor (uninitialised: the simulator fills it with NaN)."""
    instr = "nki.language.ndarray"
    shape = (shape,) if isinstance(shape, int) else tuple(int(s) for s in shape)
    dtype = _dtypes.check(dtype, "dtype", instr)
    buffer = _buffer_of(buffer)
    if len(shape) > 5:
        fail(instr, "shape", f"tensors have at most 5 dimensions, got {len(shape)}")
    if buffer.on_chip:
        if not shape:
            fail(instr, "shape", "an on-chip tensor needs a partition dimension")
        _checks.partitions(instr, "shape", shape[0])
        row_bytes = math.prod(shape[1:]) * dtype.itemsize
        if buffer is psum and row_bytes > _target.psum_tile_bytes():
            if _target.psum_tile_bytes() == _target.PSUM_BANK_BYTES:
                fail(instr, "shape", f"PSUM tile of {row_bytes} bytes per partition exceeds the 2 KiB PSUM bank "
                                     f"(512 fp32 elements, nl.tile_size.psum_bank_fmax) on {_target.current()}")
            fail(instr, "shape", f"PSUM tile of {row_bytes} bytes per partition exceeds the "
                                 f"{_target.psum_tile_bytes()}-byte PSUM partition")
        cap = _target.sbuf_partition_bytes()
        if buffer is sbuf and row_bytes > cap:
            fail(instr, "shape", f"SBUF tile of {row_bytes} bytes per partition exceeds the {cap}-byte SBUF "
                                 f"partition of {_target.current()}")
    st = _trace.current(instr).new_storage(buffer, dtype, shape, name)
    return NkiTensor(st, shape, _check=False)


def zeros(shape, dtype, buffer=sbuf, name="", **kw):
    return full(shape, 0, dtype, buffer, name)


def ones(shape, dtype, buffer=sbuf, name="", **kw):
    return full(shape, 1, dtype, buffer, name)


def full(shape, fill_value, dtype, buffer=sbuf, name="", **kw):
    t = ndarray(shape, dtype, buffer, name)
    _memset(t, fill_value, "nki.language.full")
    return t


def zeros_like(a, dtype=None, buffer=None, name="", **kw):
    return zeros(a.shape, dtype or a.dtype, buffer or a.buffer, name)


def ones_like(a, dtype=None, buffer=None, name="", **kw):
    return ones(a.shape, dtype or a.dtype, buffer or a.buffer, name)


def full_like(a, fill_value, dtype=None, buffer=None, name="", **kw):
    return full(a.shape, fill_value, dtype or a.dtype, buffer or a.buffer, name)


def empty_like(a, dtype=None, buffer=None, name="", **kw):
    return ndarray(a.shape, dtype or a.dtype, buffer or a.buffer, name)


def rand(shape, dtype=float32, buffer=sbuf, name="", **kw):
    """Uniform [0, 1) values: Philox keyed once per kernel call from torch's
    generator (nki/_philox.py)."""
    t = ndarray(shape, dtype, buffer, name)
    k, seed = _philox.stream("nki.language.rand")
    _trace.record("nki.language.rand", lambda env: env.write(t, _philox.uniform(env.key(), k, t.shape)), t, seed,
                  ir=("random", {"dst": t, "seed": seed, "data": None, "prob": 0.0, "mode": 0, "stream": k}))
    return t


def shared_identity_matrix(n, dtype=bfloat16, **kw):
    t = ndarray((n, n), dtype, sbuf)
    # Natively: zeros, then ones on the diagonal (element p of partition p).
    diag = NkiTensor(t.storage, (n, 1), (n + 1, 1), 0, _check=False)
    ir = ("seq", {"parts": [("memset", {"dst": t, "value": 0}), ("memset", {"dst": diag, "value": 1})]})
    _trace.record("nki.language.shared_identity_matrix", lambda env: env.write(t, torch.eye(n)), t, ir=ir)
    return t


def _temp(shape, dtype=float32):
    """An SBUF tile (fp32 unless said) for the native lowering of a composite
    (a ``seq`` of executor records, nki/_native.py); the interpreter never
    touches it."""
    shape = tuple(shape)
    return NkiTensor(_trace.current().new_storage(sbuf, dtype, shape, "tmp"), shape, _check=False)


def _memset(t, value, instr):
    if not isinstance(value, (int, float, bool)):
        fail(instr, "value", f"expected a number, got {type(value).__name__}")
    _trace.record(instr, lambda env: env.view(t).fill_(value), t, ir=("memset", {"dst": t, "value": value}))


# -- helpers ---------------------------------------------------------------
def _tensors(*xs):
    return [x for x in xs if isinstance(x, NkiTensor)]


def _result(shape, dtype):
    return ndarray(tuple(shape), dtype, sbuf)


def _promote(ts, dtype):
    if dtype is not None:
        return _dtypes.check(dtype, "dtype")
    d = ts[0].dtype
    for t in ts[1:]:
        d = torch.promote_types(d, t.dtype)
    return d


def _value(env, x, impl=None, ndim=None):
    if isinstance(x, NkiTensor):
        v = env.ints(x) if impl is not None and impl.kind == "bitvec" else env.f32(x)
        if ndim is not None and v.ndim < ndim:
            v = v.reshape(tuple(v.shape) + (1,) * (ndim - v.ndim))
        return v
    return x


def _broadcast_shape(instr, ts):
    """Tiles broadcast from the partition axis: a [P] tile (a reduction's
    result) meets a [P, F] tile as [P, 1], not as numpy's trailing-aligned
    [1, P]."""
    nd = builtins.max(t.ndim for t in ts)
    try:
        return tuple(torch.broadcast_shapes(*[tuple(t.shape) + (1,) * (nd - t.ndim) for t in ts]))
    except RuntimeError:
        fail(instr, "x1", f"shapes {[list(t.shape) for t in ts]} do not broadcast")


def _expanded(t, shape):
    """``t`` as the interpreter broadcasts it to ``shape`` (trailing dims
    added, size-1 dims repeated): a view with zero strides."""
    nd = len(shape)
    tshape = tuple(t.shape) + (1,) * (nd - t.ndim)
    tstrides = tuple(t.strides) + (0,) * (nd - t.ndim)
    if tshape == tuple(shape) and nd == t.ndim:
        return t
    strides = tuple(0 if n != s else st for n, s, st in zip(tshape, shape, tstrides))
    return NkiTensor(t.storage, tuple(shape), strides, t.offset, _check=False)


def _per_partition(t, shape):
    """``t`` as a [P, 1] per-partition operand of a ``shape`` tile, or None."""
    tshape = tuple(t.shape) + (1,) * (len(shape) - t.ndim)
    if len(shape) < 2 or tshape[0] != shape[0] or builtins.any(n != 1 for n in tshape[1:]):
        return None
    return NkiTensor(t.storage, (shape[0], 1), (t.strides[0] if t.ndim else 0, 0), t.offset, _check=False)


def _elementwise_ir(impl, args, out, shape):
    """The engine instruction an elementwise op amounts to, for the native
    executor (nki/_native.py): an activation (unary ops), a tensor_scalar (a
    number or a [P, 1] operand) or a tensor_tensor; bitvector ops the same
    forms of OP_BITS (integer rows)."""
    if impl.kind == "bitvec":
        ir = _arith_ir(impl, args, out, shape) if impl.arity == 2 else None
        if ir is None:
            return None
        if ir[0] == "tensor_tensor":
            return ("bits", {"dst": out, "data": ir[1]["data"], "data2": ir[1]["data2"], "form": 0, "op0": impl})
        return ("bits", dict(ir[1], form=1))
    return _arith_ir(impl, args, out, shape)


def _arith_ir(impl, args, out, shape):
    if impl.arity == 1:
        return ("activation", {"dst": out, "op": impl, "data": _expanded(args[0], shape), "bias": None,
                               "scale": 1.0, "cmd": "idle", "reduce_op": None, "reduce_res": None,
                               "engine": "scalar"})
    a, b = args

    def scalar(data, operand, reverse):
        return ("tensor_scalar", {"dst": out, "data": _expanded(data, shape), "op0": impl, "operand0": operand,
                                  "reverse0": reverse, "op1": None, "operand1": None, "reverse1": False})
    if not isinstance(b, NkiTensor):
        return scalar(a, b, False)
    if not isinstance(a, NkiTensor):
        return scalar(b, a, True)
    pa, pb = _per_partition(a, shape), _per_partition(b, shape)
    if pb is not None and pa is None:
        return scalar(a, pb, False)
    if pa is not None and pb is None:
        return scalar(b, pa, True)
    return ("tensor_tensor", {"dst": out, "data": _expanded(a, shape), "data2": _expanded(b, shape), "op": impl})


def _elementwise(impl, args, dtype):
    instr = f"nki.language.{impl.name}"
    ts = _tensors(*args)
    if not ts:  # constants fold while tracing
        return impl.compute(*args).item()
    for i, a in enumerate(args):
        if isinstance(a, NkiTensor):
            _checks.tile(instr, f"x{i}" if len(args) > 1 else "x", a)
        elif not isinstance(a, (int, float, bool)):
            fail(instr, f"x{i}", f"expected a tile or a number, got {type(a).__name__}")
    _checks.bitvec(instr, impl, *ts)
    shape = _broadcast_shape(instr, ts)
    out = _result(shape, _promote(ts, dtype))

    def run(env):
        env.write(out, impl.compute(*[_value(env, a, impl, len(shape)) for a in args]).expand(shape))
    _trace.record(instr, run, out, *ts, ir=_elementwise_ir(impl, args, out, shape))
    return out


def _assign(dst, value):
    """``dst[...] = value``: a copy (tensor) or memset (number)."""
    if isinstance(value, NkiTensor):
        _checks.tile("nki.language.copy", "value", value, _checks.ANY)

        def run(env):
            env.write(dst, env.view(value).expand(dst.shape) if value.shape != dst.shape else env.view(value))
        try:
            torch.broadcast_shapes(value.shape, dst.shape)
        except RuntimeError:
            fail("nki.language.copy", "value", f"shape {list(value.shape)} does not fit {list(dst.shape)}")
        # (expand aligns trailing dims: natively only a value of dst's rank)
        ir = ("copy", {"dst": dst, "src": _expanded(value, dst.shape)}) if value.ndim == dst.ndim else None
        _trace.record("nki.language.copy", run, dst, value, ir=ir)
    else:
        _memset(dst, value, "nki.language.copy")


# -- movement --------------------------------------------------------------
def load(src, dtype=None, **kw):
    """HBM -> a new SBUF tile."""
    instr = "nki.language.load"
    _checks.tile(instr, "src", src, _checks.ANY)
    if src.ndim == 0:
        src = src.reshape((1,))
    _checks.partitions(instr, "src", src.shape[0])
    out = _result(src.shape, dtype or src.dtype)
    _trace.record(instr, lambda env: env.write(out, env.view(src)), out, src, ir=("copy", {"dst": out, "src": src}))
    return out


def store(dst, value, **kw):
    """A tile -> ``dst`` (HBM)."""
    instr = "nki.language.store"
    _checks.tile(instr, "dst", dst, _checks.ANY)
    if isinstance(value, NkiTensor):
        _checks.tile(instr, "value", value, _checks.ANY)
        if value.size != dst.size:
            fail(instr, "value", f"shape {list(value.shape)} does not match dst {list(dst.shape)}")
        _trace.record(instr, lambda env: env.write(dst, env.view(value).reshape(dst.shape)), dst, value,
                      ir=("copy", {"dst": dst, "src": value}))
    else:
        _memset(dst, value, instr)


def copy(x, dtype=None, **kw):
    instr = "nki.language.copy"
    _checks.tile(instr, "x", x)
    out = _result(x.shape, dtype or x.dtype)
    _trace.record(instr, lambda env: env.write(out, env.view(x)), out, x, ir=("copy", {"dst": out, "src": x}))
    return out


# nl.copy is also the identity activation (``op=nl.copy``).
copy._nki_op = OPS["copy"]


def _transpose2d(instr, name, what, size_name, src, dtype, where=_checks.ON_CHIP):
    """A 2-D transpose into a fresh SBUF tile (``transpose`` of a tile,
    ``load_transpose2d`` of an HBM tensor): the source's free size becomes the
    partitions."""
    _checks.tile(instr, name, src, where)
    if src.ndim != 2:
        fail(instr, name, f"expected a 2-D {what}, got {list(src.shape)}")
    _checks.partitions(instr, size_name, src.shape[1])
    out = _result((src.shape[1], src.shape[0]), dtype or src.dtype)
    _trace.record(instr, lambda env: env.write(out, env.view(src).t()), out, src,
                  ir=("transpose", {"dst": out, "src": src, "axes": (1, 0)}))
    return out


def load_transpose2d(src, dtype=None, **kw):
    return _transpose2d("nki.language.load_transpose2d", "src", "tensor", "src", src, dtype, ("hbm",))


# -- reductions ------------------------------------------------------------
def _reduction(name, x, axis, dtype, keepdims, fn):
    instr = f"nki.language.{name}"
    _checks.tile(instr, "x", x)
    axes = (axis,) if isinstance(axis, int) else tuple(axis)
    axes = tuple(a + x.ndim if a < 0 else a for a in axes)
    if any(a < 0 or a >= x.ndim for a in axes):
        fail(instr, "axis", f"axis {axis} out of range for a {x.ndim}-D tile")
    shape = [1 if i in axes else s for i, s in enumerate(x.shape)] if keepdims else \
        [s for i, s in enumerate(x.shape) if i not in axes]
    if not shape:
        shape = [1]
    out = _result(shape, dtype or x.dtype)

    # Natively a tensor_reduce (the same torch reduction) over trailing free
    # axes that are one contiguous run; any other axes in the documented order.
    direct = _trailing_run(x, axes)

    def run(env):
        v, a = (env.f32(x), axes) if direct else _axes_last(env.f32(x), axes)
        env.write(out, fn(v, a, keepdims and direct).reshape(out.shape))
    ir = _reduction_ir(name, x, axes, out) if direct else _moved_reduction_ir(name, x, axes, out)
    _trace.record(instr, run, out, x, ir=ir)
    return out


def _trailing_run(x, axes):
    """Trailing free ``axes`` whose elements are one contiguous run per
    reduction: torch reduces them as the executor's row reduction does."""
    if 0 in axes or sorted(axes) != list(builtins.range(x.ndim - len(axes), x.ndim)):
        return False
    expect = 1
    for d in sorted(axes, reverse=True):
        if x.shape[d] > 1:
            if x.strides[d] != expect:
                return False
            expect *= x.shape[d]
    return True


def _axes_last(v, axes):
    """The reduction order of every other form (docs/nki.md, "Reduction
    order"): the reduced axes moved last in their order, the tile made
    contiguous, then reduced over those trailing axes; returns (tile, axes)."""
    kept = [d for d in builtins.range(v.ndim) if d not in axes]
    v = v.permute(kept + sorted(axes)).contiguous()
    return v, tuple(builtins.range(len(kept), v.ndim))


def _moved_layout(x, axes):
    """The executor side of _axes_last: an fp32 temporary [lead, K, reduced...]
    (lead: the partitions when they are kept, else 1; K the other kept
    elements), the records that copy ``x`` into it, and its reduced axes."""
    axes = sorted(axes)
    kept = [d for d in builtins.range(x.ndim) if d not in axes]
    red = tuple(x.shape[d] for d in axes)
    lead = x.shape[0] if 0 not in axes else 1
    K = math.prod(x.shape[d] for d in kept) // lead
    t = _temp((lead, K) + red)
    if 0 in axes:  # the copy mixes partitions: a transpose record (run whole)
        copy = ("transpose", {"dst": t, "src": x, "axes": tuple(kept + axes)})
    else:
        src = NkiTensor(x.storage, tuple(x.shape[d] for d in kept + axes), tuple(x.strides[d] for d in kept + axes),
                        x.offset, _check=False)
        copy = ("copy", {"dst": t, "src": src})
    return t, copy, tuple(builtins.range(2, 2 + len(red))), (lead, K)


def _moved_reduction_ir(name, x, axes, out):
    """A reduction over the partition axis, non-trailing free axes or a view
    with gaps: x copied into the [lead, K, reduced...] temporary, then the
    trailing-axes records into ``out`` seen as [lead, K]."""
    if x.shape[0] > 128 or x.ndim + 1 > 8:
        return None
    t, copy, red_axes, kept = _moved_layout(x, axes)
    ir = _reduction_ir(name, t, red_axes, NkiTensor(out.storage, kept, _check=False))
    return ("seq", {"parts": [copy] + (ir[1]["parts"] if ir[0] == "seq" else [ir])})


_REDUCE_OPS = {"sum": "add", "max": "maximum", "min": "minimum"}


def _reduce_part(dst, x, op, axes):
    return ("tensor_reduce", {"dst": dst, "data": x, "op": OPS[op], "axes": axes, "negate": False})


def _scalar_part(dst, data, op0, operand0, op1=None, operand1=None):
    return ("tensor_scalar", {"dst": dst, "data": data, "op0": OPS[op0], "operand0": operand0, "reverse0": False,
                              "op1": OPS[op1] if op1 else None, "operand1": operand1, "reverse1": False})


def _reduction_ir(name, x, axes, out):
    """The executor records of a reduction over trailing free axes."""
    if name in _REDUCE_OPS:
        return _reduce_part(out, x, _REDUCE_OPS[name], axes)
    m = math.prod(x.shape[a] for a in axes)
    groups = math.prod(x.shape[1:]) // m
    if name == "mean":
        # torch's CPU mean: the sum, then a division by the count (in fp32).
        s = _temp((x.shape[0], groups))
        return ("seq", {"parts": [_reduce_part(s, x, "add", axes), _scalar_part(out, s, "divide", m)]})
    if name == "prod":
        from .isa import _product_parts
        return _product_parts(out, x, axes)
    if name == "var":
        return ("variance", {"dst": out, "data": x, "axes": axes})
    if name == "all":
        # (x != 0) as 1.0/0.0, then its minimum.
        t = _temp(x.shape)
        return ("seq", {"parts": [_scalar_part(t, x, "not_equal", 0), _reduce_part(out, t, "minimum", axes)]})
    return None


def sum(x, axis, dtype=None, keepdims=False, **kw):
    return _reduction("sum", x, axis, dtype, keepdims, lambda v, a, k: v.sum(dim=a, keepdim=k))


def max(x, axis, dtype=None, keepdims=False, **kw):
    return _reduction("max", x, axis, dtype, keepdims, lambda v, a, k: v.amax(dim=a, keepdim=k))


def min(x, axis, dtype=None, keepdims=False, **kw):
    return _reduction("min", x, axis, dtype, keepdims, lambda v, a, k: v.amin(dim=a, keepdim=k))


def mean(x, axis, dtype=None, keepdims=False, **kw):
    return _reduction("mean", x, axis, dtype, keepdims, lambda v, a, k: v.mean(dim=a, keepdim=k))


def var(x, axis, dtype=None, keepdims=False, **kw):
    return _reduction("var", x, axis, dtype, keepdims, lambda v, a, k: v.var(dim=a, keepdim=k, correction=0))


def prod(x, axis, dtype=None, keepdims=False, **kw):
    return _reduction("prod", x, axis, dtype, keepdims, lambda v, a, k: _reduce_fn(OPS["multiply"], v, a, k))


def all(x, axis, dtype=None, keepdims=False, **kw):
    return _reduction("all", x, axis, dtype, keepdims,
                      lambda v, a, k: (v != 0).to(torch.float32).amin(dim=a, keepdim=k))


# -- composites ------------------------------------------------------------
def softmax(x, axis, dtype=None, **kw):
    instr = "nki.language.softmax"
    _checks.tile(instr, "x", x)
    out = _result(x.shape, dtype or x.dtype)
    _trace.record(instr, lambda env: env.write(out, torch.softmax(env.f32(x), dim=axis)), out, x,
                  ir=_softmax_ir(out, x, axis))
    return out


def _softmax_ir(out, x, axis):
    """Natively (a 2-D tile along its free axis): -max (tensor_reduce with
    negate), exp(x + -max), its sum, a division. torch's fused kernel has its
    own exp and order: within the transcendental tolerance (docs/nki.md)."""
    if not isinstance(axis, int) or not -x.ndim <= axis < x.ndim or x.shape[0] > 128 or x.ndim > 7:
        return None
    axis %= x.ndim
    if x.ndim != 2 or axis != 1:
        return _softmax_other_axis_ir(out, x, axis)
    P, F = x.shape
    m, e, s = _temp((P, 1)), _temp((P, F)), _temp((P, 1))
    return ("seq", {"parts": [
        ("tensor_reduce", {"dst": m, "data": x, "op": OPS["maximum"], "axes": (1,), "negate": True}),
        ("activation", {"dst": e, "op": OPS["exp"], "data": x, "bias": m, "scale": 1.0, "cmd": "idle",
                        "reduce_op": None, "reduce_res": None, "engine": "scalar"}),
        _reduce_part(s, e, "add", (1,)),
        _scalar_part(out, e, "divide", s)]})


def _softmax_other_axis_ir(out, x, axis):
    """Softmax along the partition axis (partition reductions, broadcast back
    with zero partition strides) or along any free axis of an N-D tile
    (that axis moved last in an fp32 temporary, row reductions over it, the
    result copied back through the inverse permutation). The same
    max / exp / sum / divide steps, within the same tolerance."""
    if axis == 0:
        shape = tuple(x.shape)
        red = (1,) + shape[1:]
        m, s, e = _temp(red), _temp(red), _temp(shape)
        return ("seq", {"parts": [
            ("partition_reduce", {"dst": m, "data": x, "op": OPS["maximum"]}),
            ("tensor_tensor", {"dst": e, "data": x, "data2": _expanded(m, shape), "op": OPS["subtract"]}),
            ("activation", {"dst": e, "op": OPS["exp"], "data": e, "bias": None, "scale": 1.0, "cmd": "idle",
                            "reduce_op": None, "reduce_res": None, "engine": "scalar"}),
            ("partition_reduce", {"dst": s, "data": e, "op": OPS["add"]}),
            ("tensor_tensor", {"dst": out, "data": e, "data2": _expanded(s, shape), "op": OPS["divide"]})]})
    perm = [d for d in builtins.range(x.ndim) if d != axis] + [axis]
    shape = tuple(x.shape[d] for d in perm)
    red = shape[:-1] + (1,)
    t, m, s = _temp(shape), _temp(red), _temp(red)
    last = (len(shape) - 1,)
    parts = []
    if axis != x.ndim - 1:
        parts.append(("copy", {"dst": t, "src": NkiTensor(x.storage, shape, tuple(x.strides[d] for d in perm),
                                                          x.offset, _check=False)}))
        src = t
    else:
        src = x
    parts += [
        ("tensor_reduce", {"dst": m, "data": src, "op": OPS["maximum"], "axes": last, "negate": False}),
        ("tensor_tensor", {"dst": t, "data": src, "data2": _expanded(m, shape), "op": OPS["subtract"]}),
        ("activation", {"dst": t, "op": OPS["exp"], "data": t, "bias": None, "scale": 1.0, "cmd": "idle",
                        "reduce_op": None, "reduce_res": None, "engine": "scalar"}),
        _reduce_part(s, t, "add", last),
        ("tensor_tensor", {"dst": t, "data": t, "data2": _expanded(s, shape), "op": OPS["divide"]})]
    inv = [perm.index(d) for d in builtins.range(x.ndim)]
    parts.append(("copy", {"dst": out, "src": NkiTensor(t.storage, tuple(x.shape), tuple(t.strides[i] for i in inv),
                                                        0, _check=False)}))
    return ("seq", {"parts": parts})


def rms_norm(x, w, axis, n, epsilon=1e-6, dtype=None, **kw):
    """``x * rsqrt(sum(x**2, axis) / n + epsilon) * w``."""
    instr = "nki.language.rms_norm"
    _checks.tile(instr, "x", x)
    _checks.tile(instr, "w", w)
    try:
        torch.broadcast_shapes(x.shape, w.shape)
    except RuntimeError:
        fail(instr, "w", f"shape {list(w.shape)} does not broadcast to x {list(x.shape)}")
    out = _result(x.shape, dtype or x.dtype)

    axes = _rms_axes(x, axis)

    def run(env):
        v = env.f32(x)
        if axes is None or _trailing_axes(x, axes):
            s = v.square().sum(dim=axis, keepdim=True)
        else:  # the documented order of other axes (_axes_last)
            q, a = _axes_last(v.square(), axes)
            s = q.sum(dim=a).reshape([1 if d in axes else n_ for d, n_ in enumerate(x.shape)])
        r = torch.rsqrt(s / n + epsilon)
        env.write(out, v * r * env.f32(w))
    _trace.record(instr, run, out, x, w, ir=_rms_norm_ir(out, x, w, axis, n, epsilon))
    return out


def _rms_norm_ir(out, x, w, axis, n, epsilon):
    """Natively (normalised over trailing free axes): x * x, its sum, / n +
    epsilon, rsqrt, then (x * r) * w (one scalar_tensor_tensor when r is one
    value per partition): the interpreter's fp32 operations in its order.
    Other axes: _rms_norm_moved_ir (the documented order, _axes_last)."""
    if not isinstance(n, numbers.Real) or not isinstance(epsilon, numbers.Real) or w.ndim != x.ndim or \
            x.shape[0] > 128:
        return None
    axes = _rms_axes(x, axis)
    if axes is None:
        return None
    if not _trailing_axes(x, axes):
        return _rms_norm_moved_ir(out, x, w, axes, n, epsilon)
    P = x.shape[0]
    whole = len(axes) == x.ndim - 1  # one r per partition
    red = (P, 1) if whole else tuple(1 if d in axes else n_ for d, n_ in enumerate(x.shape))
    sq, s, r = _temp(x.shape), _temp(red), _temp(red)
    act = {"bias": None, "scale": 1.0, "cmd": "idle", "reduce_op": None, "reduce_res": None, "engine": "scalar"}
    parts = [
        ("activation", dict(act, dst=sq, op=OPS["square"], data=x)),
        _reduce_part(s, sq, "add", axes),
        _scalar_part(s, s, "divide", n, "add", epsilon),
        ("activation", dict(act, dst=r, op=OPS["rsqrt"], data=s))]
    if whole:
        parts.append(("scalar_tensor_tensor", {
            "dst": out, "data": x, "op0": OPS["multiply"], "operand0": r, "reverse0": False,
            "op1": OPS["multiply"], "operand1": _expanded(w, x.shape), "reverse1": False, "reduce": False}))
    else:
        parts += [("tensor_tensor", {"dst": sq, "data": x, "data2": _expanded(r, x.shape), "op": OPS["multiply"]}),
                  ("tensor_tensor", {"dst": out, "data": sq, "data2": _expanded(w, x.shape), "op": OPS["multiply"]})]
    return ("seq", {"parts": parts})


def _rms_axes(x, axis):
    """rms_norm's axes, sorted and non-negative (None: not valid axes)."""
    axes = (axis,) if isinstance(axis, int) else tuple(axis) if isinstance(axis, (tuple, list)) else ()
    if not axes or not builtins.all(isinstance(a, int) and -x.ndim <= a < x.ndim for a in axes):
        return None
    return tuple(sorted({a % x.ndim for a in axes}))


def _trailing_axes(x, axes):
    return 0 not in axes and list(axes) == list(builtins.range(x.ndim - len(axes), x.ndim))


def _rms_norm_moved_ir(out, x, w, axes, n, epsilon):
    """rms_norm over the partition axis or non-trailing free axes: the squares
    moved into the [lead, K, reduced...] order (_moved_layout), their row
    sums, / n + epsilon, rsqrt, broadcast back over the reduced axes:
    (x * r) * w, as the interpreter computes it."""
    if x.ndim + 1 > 8:
        return None
    sq = _temp(x.shape)
    t, copy, red_axes, kept = _moved_layout(sq, axes)
    s, r = _temp(kept), _temp(kept)
    keep = tuple(1 if d in axes else n_ for d, n_ in enumerate(x.shape))
    act = {"bias": None, "scale": 1.0, "cmd": "idle", "reduce_op": None, "reduce_res": None, "engine": "scalar"}
    return ("seq", {"parts": [
        ("activation", dict(act, dst=sq, op=OPS["square"], data=x)),
        copy,
        _reduce_part(s, t, "add", red_axes),
        _scalar_part(s, s, "divide", n, "add", epsilon),
        ("activation", dict(act, dst=r, op=OPS["rsqrt"], data=s)),
        ("tensor_tensor", {"dst": sq, "data": x, "data2": _expanded(NkiTensor(r.storage, keep, _check=False), x.shape),
                           "op": OPS["multiply"]}),
        ("tensor_tensor", {"dst": out, "data": sq, "data2": _expanded(w, x.shape), "op": OPS["multiply"]})]})


def matmul(x, y, transpose_x=False, **kw):
    """``x @ y`` into a new fp32 PSUM tile (``x`` is [K, M] when
    ``transpose_x``, as the Tensor Engine wants it)."""
    instr = "nki.language.matmul"
    _checks.tile(instr, "x", x, _checks.SBUF)
    _checks.tile(instr, "y", y, _checks.SBUF)
    K, M = (x.shape[0], x.shape[1]) if transpose_x else (x.shape[1], x.shape[0])
    from .isa import _matmul_limits
    _matmul_limits(instr, K, M, y, 4)
    out = ndarray((M, y.shape[1]), float32, psum)

    def run(env):
        a = env.f32(x)
        env.write(out, (a if transpose_x else a.t()).t() @ env.f32(y))
    # Natively: nc_matmul's record (stationary [K, M]: x itself, or x [M, K]
    # seen transposed), overwriting the fresh PSUM tile.
    _trace.record(instr, run, out, x, y, ir=("matmul", {"dst": out, "stationary": x, "moving": y, "accumulate": False,
                                                         "transpose_stationary": not transpose_x}))
    return out


def transpose(x, dtype=None, **kw):
    return _transpose2d("nki.language.transpose", "x", "tile", "x (free size)", x, dtype)


def where(condition, x, y, dtype=None, **kw):
    instr = "nki.language.where"
    ts = _tensors(condition, x, y)
    if not ts:
        fail(instr, "condition", "condition, x or y must be a tile (it gives the result's shape)")
    for t in ts:
        _checks.tile(instr, "operand", t)
    shape = _broadcast_shape(instr, ts)
    out = _result(shape, dtype or _promote(_tensors(x, y) or ts, None))

    def run(env):
        c = _value(env, condition, ndim=len(shape))
        c = c != 0 if isinstance(c, torch.Tensor) else torch.tensor(bool(c))
        a, b = _value(env, x, ndim=len(shape)), _value(env, y, ndim=len(shape))
        env.write(out, torch.where(c, torch.as_tensor(a), torch.as_tensor(b)).expand(shape))
    # Natively a select record (tile operands broadcast to the result's shape).
    ir = None
    if isinstance(condition, NkiTensor) and builtins.all(isinstance(v, (NkiTensor, int, float)) for v in (x, y)):
        ir = ("select", {"dst": out, "cond": _expanded(condition, shape),
                         "x": _expanded(x, shape) if isinstance(x, NkiTensor) else x,
                         "y": _expanded(y, shape) if isinstance(y, NkiTensor) else y})
        if _wide_ints(x, y) and out.dtype in (int32, uint32) and out.shape[0] <= 128:
            ir = _where_ints_ir(out, ir[1]["cond"], x, y)
    elif isinstance(condition, (int, float)) and builtins.all(isinstance(v, (NkiTensor, int, float)) for v in (x, y)):
        ir = _where_const_ir(out, x if condition else y, (x, y), shape)
    _trace.record(instr, run, out, *ts, ir=ir)
    return out


def _wide_ints(x, y):
    """Two integers, one of them past fp32's exact range (the interpreter's
    torch.where gives an int64 tile)."""
    return builtins.all(isinstance(v, int) and -2 ** 63 <= v < 2 ** 63 for v in (x, y)) and \
        not builtins.all(abs(v) <= 2 ** 24 for v in (x, y))


def _where_ints_ir(out, cond, x, y):
    """``cond ? x : y`` of two wide integers into an int32/uint32 tile without
    fp32: a mask m (-1 or 0, a select of exact values into an int32
    temporary), then ``(m & (x ^ y)) ^ y`` in int64 (bitvector records),
    stored with copy_'s wrapping as the interpreter's int64 result is."""
    m = _temp(out.shape, int32)
    # The store keeps the low 32 bits, and the bitwise ops commute with that:
    # x and y taken modulo 2^32 first (past 2^53 too, as exact immediates).
    x, y = (_wrapped(v, out.dtype) for v in (x, y))
    return ("seq", {"parts": [
        ("select", {"dst": m, "cond": cond, "x": -1, "y": 0}),
        ("bits", {"dst": out, "data": m, "op0": OPS["bitwise_and"], "operand0": x ^ y, "reverse0": False,
                  "op1": OPS["bitwise_xor"], "operand1": y, "reverse1": False, "form": 1})]})


def _wrapped(v, dtype):
    """The int64 number ``v`` as a store into ``dtype`` converts it (copy_)."""
    return torch.tensor(v, dtype=torch.int64).to(dtype).item()


def _where_const_ir(out, v, both, shape):
    """``where`` of a number condition: the chosen operand in fp32 (what
    torch.where gives), stored; a number through an fp32 tile filled with it
    (an integer only where fp32 holds it: int64 on the interpreter)."""
    if out.shape[0] > 128:
        return None
    act = {"op": OPS["copy"], "bias": None, "scale": 1.0, "cmd": "idle", "reduce_op": None, "reduce_res": None,
           "engine": "scalar"}
    if isinstance(v, NkiTensor):
        return ("activation", dict(act, dst=out, data=_expanded(v, shape)))
    ints = not builtins.any(isinstance(o, (float, NkiTensor)) for o in both)
    if ints and abs(v) > 2 ** 24:
        return None
    f = float(torch.tensor(float(v), dtype=float32))
    t = _temp(tuple(out.shape))
    return ("seq", {"parts": [("memset", {"dst": t, "value": f}), ("activation", dict(act, dst=out, data=t))]})


def broadcast_to(x, shape, **kw):
    instr = "nki.language.broadcast_to"
    _checks.tile(instr, "x", x)
    shape = tuple(shape)
    out = _result(shape, x.dtype)
    k = len(shape) - x.ndim
    if k == 0:
        ir = ("copy", {"dst": out, "src": _expanded(x, shape)})
    elif k > 0:  # torch's expand: new leading dims, repeated (stride 0)
        ir = ("copy", {"dst": out, "src": NkiTensor(x.storage, shape, (0,) * k + tuple(
            0 if n != s else st for n, s, st in zip(x.shape, shape[k:], x.strides)), x.offset, _check=False)})
    else:
        ir = None
    _trace.record(instr, lambda env: env.write(out, env.view(x).expand(shape)), out, x, ir=ir)
    return out


def expand_dims(x, axis, **kw):
    return x.expand_dim(axis)


def dropout(x, rate, dtype=None, **kw):
    instr = "nki.language.dropout"
    _checks.tile(instr, "x", x)
    out = _result(x.shape, dtype or x.dtype)

    k, seed = _philox.stream(instr)

    def run(env):
        v = env.f32(x)
        r = float(rate) if not isinstance(rate, NkiTensor) else env.f32(rate).reshape(-1)[0].item()
        keep = _philox.uniform(env.key(), k, v.shape) >= r
        env.write(out, torch.where(keep, v / (1 - r), torch.zeros(())))
    ir = ("random", {"dst": out, "seed": seed, "data": x, "prob": rate, "mode": 2, "stream": k})
    _trace.record(instr, run, out, seed, *_tensors(x, rate), ir=ir)
    return out


PRINT = "nki.print"  # storages of device_print snapshots (bound by the native executor)


def device_print(prefix, x, **kw):
    """Prints ``prefix`` and the tile. The interpreter prints as it runs; the
    native executor copies the tile into a snapshot buffer and prints the
    snapshots in program order after the launch (the same text)."""
    _checks.tile("nki.language.device_print", "x", x, _checks.ANY)
    snap = NkiTensor(_trace.current().new_storage(private_hbm, x.dtype, x.shape, PRINT), x.shape, _check=False)
    snap.storage.print_prefix = prefix
    _trace.record("nki.language.device_print", lambda env: builtins.print(prefix, env.view(x)), x, snap,
                  ir=("copy", {"dst": snap, "src": x}))


# -- SPMD and loops --------------------------------------------------------
def program_id(axis=0):
    tr = _trace.current("nki.language.program_id")
    if axis >= len(tr.grid):
        return 0
    return tr.program_id[axis]


def num_programs(axes=None):
    tr = _trace.current("nki.language.num_programs")
    if axes is None:
        return math.prod(tr.grid) if tr.grid else 1
    if isinstance(axes, int):
        return tr.grid[axes] if axes < len(tr.grid) else 1
    return tuple(tr.grid[a] if a < len(tr.grid) else 1 for a in axes)


def program_ndim():
    return len(_trace.current("nki.language.program_ndim").grid)


def range(*args, **kw):
    """A loop the trace unrolls (the iterations are independent tile programs)."""
    return builtins.range(*args)


affine_range = sequential_range = static_range = range


def ds(start, size, step=None):
    return DynSlice(start, size, step)


def fori_loop(lower, upper, body_fun, init_val, **kw):
    """``for i in range(lower, upper): val = body_fun(i, val)`` (unrolled)."""
    val = init_val
    for i in builtins.range(lower, upper):
        val = body_fun(i, val)
    return val


def while_loop(cond_fun, body_fun, init_val, max_iterations=1 << 20, **kw):
    """``while cond_fun(val): val = body_fun(val)``. A Python-valued condition
    resolves while tracing; a tile-valued one ([1, 1], nonzero = continue) is
    a device loop: the condition and the body are traced once and the
    executor re-runs them until the tile reads zero."""
    c = cond_fun(init_val)
    if not isinstance(c, NkiTensor):
        val = init_val
        while c:
            val = body_fun(val)
            c = cond_fun(val)
        return val
    if type(max_iterations) is not int or not 0 <= max_iterations < 1 << 62:
        # (a device loop counts its iterations in int64 on the executor)
        fail("nki.language.while_loop", "max_iterations",
             f"expected an integer in [0, 2**62) for a device loop, got {max_iterations!r}")
    tr = _trace.current("nki.language.while_loop")
    # ``c`` was recorded in the parent program (the first test); trace the
    # body and the re-test once, into the loop's own instruction list.
    outer = tr.instrs
    tr.instrs = []
    try:
        body_val = body_fun(init_val)
        again = cond_fun(body_val)
    finally:
        loop, tr.instrs = tr.instrs, outer
    if body_val is not init_val and not _same_structure(body_val, init_val):
        raise NKIError("nki.language.while_loop: body_fun must update its state in place and return it")
    if not isinstance(again, NkiTensor):
        raise NKIError("nki.language.while_loop: cond_fun returned a tile once and a Python value after the body")
    from ._exec import run_subprogram

    def run(env):
        n = 0
        flag = c
        while env.f32(flag).reshape(-1)[0].item() != 0:
            n += 1
            if n > max_iterations:
                raise NKIError(f"nki.language.while_loop: more than {max_iterations} iterations")
            run_subprogram(env, loop)
            flag = again
    touched = [t for ins in loop for t in ins.tensors]
    _trace.record("nki.language.while_loop", run, c, again, *touched,
                  ir=("while", {"cond": c, "again": again, "body": loop, "max": max_iterations}))
    return body_val


def _same_structure(a, b):
    if isinstance(a, (tuple, list)) and isinstance(b, (tuple, list)):
        return len(a) == len(b) and builtins.all(x is y for x, y in zip(a, b))
    return a is b


__all__ += ["ndarray", "zeros", "ones", "full", "zeros_like", "ones_like", "full_like", "empty_like", "rand",
            "shared_identity_matrix", "load", "store", "copy", "load_transpose2d", "sum", "max", "min", "mean",
            "var", "prod", "all", "softmax", "rms_norm", "matmul", "transpose", "where", "broadcast_to",
            "expand_dims", "dropout", "device_print", "program_id", "num_programs", "program_ndim", "range",
            "affine_range", "sequential_range", "static_range", "ds", "fori_loop", "while_loop", "tile_size",
            "sbuf", "psum", "hbm", "private_hbm", "shared_hbm", "bool_", "int8", "int16", "int32", "uint8",
            "uint16", "uint32", "float16", "bfloat16", "tfloat32", "float32", "float8_e4m3", "float8_e4m3fn",
            "float8_e5m2", "ElementwiseOp", "NkiTensor"]


_LEGACY = {"arange": "slices or nl.ds", "mgrid": "slices, nl.ds or NkiTensor.ap", "par_dim": "the first dimension",
           "mask": "slices", "spmd_dim": "kernel[grid]"}


def __getattr__(name):
    if name in _LEGACY:
        raise AttributeError(f"nki.language.{name} belongs to the legacy neuronxcc.nki API, removed in NKI 0.3; "
                             f"use {_LEGACY[name]}")
    raise AttributeError(f"module 'nki.language' has no attribute '{name}'")
