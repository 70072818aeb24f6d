"""nki.isa (``nisa``): one function per NeuronCore instruction. The
destination comes first and is written in place; every operand is checked
against the engine's rules while tracing.

One module over 600 lines on purpose: it is the public ``nki.isa`` namespace,
one function per instruction, as users import it."""
import enum
import math

import torch

from . import _checks, _dtypes, _philox, _target, _trace
from ._errors import fail
from ._ops import reduce as _reduce_fn
from ._tensor import NkiTensor, _contiguous_strides, sbuf as _sbuf


class _Enum:
    def __init__(self, kind, name):
        self.kind, self.name = kind, name

    def __repr__(self):
        return f"nisa.{self.kind}.{self.name}"


class engine:
    tensor = _Enum("engine", "tensor")
    vector = _Enum("engine", "vector")
    scalar = _Enum("engine", "scalar")
    activation = scalar
    gpsimd = _Enum("engine", "gpsimd")
    sync = _Enum("engine", "sync")
    unknown = _Enum("engine", "unknown")


class reduce_cmd:
    """How an instruction's free-axis reduction meets the engine's 128
    accumulator registers (one fp32 per partition): ``idle`` leaves them,
    ``reset`` zeroes them, ``reduce`` folds the new reduction into them,
    ``reset_reduce`` stores it, ``load_reduce`` stores ``reduce_init``
    folded with it. ``reduce_res`` then receives the registers; with
    ``idle``, passing ``reduce_res`` means ``reset_reduce``."""
    idle = _Enum("reduce_cmd", "idle")
    reset = _Enum("reduce_cmd", "reset")
    reduce = _Enum("reduce_cmd", "reduce")
    reset_reduce = _Enum("reduce_cmd", "reset_reduce")
    load_reduce = _Enum("reduce_cmd", "load_reduce")


class nc_version(enum.IntEnum):
    """NeuronCore generations (comparable: ``>= nc_version.gen4``)."""
    gen2 = 2  # trn1
    gen3 = 3  # trn2
    gen4 = 4  # trn3


def get_nc_version():
    """The target's NeuronCore generation (NEURON_PLATFORM_TARGET_OVERRIDE)."""
    return {"trn1": nc_version.gen2, "trn2": nc_version.gen3, "trn3": nc_version.gen4}[_target.current()]


def _engine(instr, e):
    if e is not None and not isinstance(e, _Enum):
        fail(instr, "engine", f"expected an nisa.engine value, got {e!r} (raw integers are rejected)")


def _name(instr):
    return f"nki.isa.{instr}"


# -- movement --------------------------------------------------------------
def dma_copy(dst, src, dst_rmw_op=None, oob_mode=None, dge_mode=None, name=None, **kw):
    """HBM <-> SBUF (or HBM -> HBM, SBUF -> SBUF) copy; DMA cannot reach PSUM."""
    instr = _name("dma_copy")
    where = ("sbuf", "hbm")
    _checks.tile(instr, "dst", dst, where)
    _checks.tile(instr, "src", src, where)
    if dst.size != src.size or (dst.shape != src.shape and _squeeze(dst.shape) != _squeeze(src.shape)):
        fail(instr, "src", f"shape {list(src.shape)} does not match dst {list(dst.shape)}")
    rmw = _checks.op(instr, "dst_rmw_op", dst_rmw_op, 2) if dst_rmw_op is not None else None
    if rmw is not None and rmw.kind == "bitvec":
        # The DMA engine's read-modify-write is arithmetic (the vendor documents nl.add).
        fail(instr, "dst_rmw_op", f"nl.{rmw.name} is a bitvector op; dst_rmw_op takes an arithmetic op "
                                  f"(nl.add, ...): use nisa.tensor_tensor for a bitwise update")

    def run(env):
        v = env.view(src).reshape(dst.shape)
        if rmw is not None:
            v = rmw.compute(env.f32(dst), v.to(torch.float32))
        env.write(dst, v)
    _trace.record(instr, run, dst, src, ir=("copy", {"dst": dst, "src": src}) if rmw is None else _rmw_ir(dst, src, rmw))


def _rmw_ir(dst, src, rmw):
    """``dst = rmw(dst, src)`` natively: a tensor_tensor over dst and src seen
    in dst's shape (the interpreter's fp32 operation on the reshaped source)."""
    if tuple(src.shape) != tuple(dst.shape):
        try:
            src = NkiTensor(src.storage, *_view_as(src, dst.shape), _check=False)
        except RuntimeError:
            return None
    return ("tensor_tensor", {"dst": dst, "data": dst, "data2": src, "op": rmw})


def _view_as(t, shape):
    """(shape, strides, offset) of ``t`` reshaped to ``shape`` as a view (torch's rule)."""
    m = torch.empty_strided(t.shape, t.strides, device="meta").view(shape)
    return tuple(m.shape), tuple(m.stride()), t.offset


def _squeeze(shape):
    return tuple(s for s in shape if s != 1)


def tensor_copy(dst, src, engine=None, name=None, dtype=None, **kw):
    instr = _name("tensor_copy")
    _engine(instr, engine)
    _checks.tile(instr, "dst", dst)
    _checks.tile(instr, "src", src)
    _checks.same_numel_per_partition(instr, ("dst", "src"), dst, src)
    _trace.record(instr, lambda env: env.write(dst, env.view(src).reshape(dst.shape)), dst, src,
                  ir=("copy", {"dst": dst, "src": src}))


def memset(dst, value, engine=None, name=None, **kw):
    instr = _name("memset")
    _engine(instr, engine)
    _checks.tile(instr, "dst", dst)
    if not isinstance(value, (int, float, bool)):
        fail(instr, "value", f"expected a number, got {type(value).__name__}")
    if isinstance(value, float) and not dst.dtype.is_floating_point:
        fail(instr, "value", f"float value {value!r} does not match the {_dtypes.name(dst.dtype)} dst "
                             f"(the value's dtype must match dst)")
    _trace.record(instr, lambda env: env.view(dst).fill_(value), dst, ir=("memset", {"dst": dst, "value": value}))


def dma_transpose(dst, src, axes=None, name=None, **kw):
    instr = _name("dma_transpose")
    _checks.tile(instr, "dst", dst, ("sbuf", "hbm"))
    _checks.tile(instr, "src", src, ("sbuf", "hbm"))
    axes = tuple(axes) if axes is not None else tuple(reversed(range(src.ndim)))
    want = tuple(src.shape[a] for a in axes)
    if tuple(dst.shape) != want:
        fail(instr, "dst", f"shape {list(dst.shape)} is not src {list(src.shape)} permuted by {axes}")
    _trace.record(instr, lambda env: env.write(dst, env.view(src).permute(axes)), dst, src,
                  ir=("transpose", {"dst": dst, "src": src, "axes": axes}))


# -- Tensor Engine ---------------------------------------------------------
def _matmul_limits(instr, K, M, moving, dst_itemsize, stationary_name="stationary"):
    _checks.partitions(instr, stationary_name, K)
    if M > _target.GEMM_STATIONARY_FMAX:
        fail(instr, stationary_name, f"free size {M} exceeds gemm_stationary_fmax {_target.GEMM_STATIONARY_FMAX}")
    if moving.shape[0] != K:
        fail(instr, "moving", f"contraction (partition) size {moving.shape[0]} does not match the stationary's "
                              f"{K}: K must lie on the partition axis of both inputs")
    N = math.prod(moving.shape[1:])
    limit = _target.gemm_moving_fmax(dst_itemsize)
    if N > limit:
        fail(instr, "moving", f"free size {N} exceeds gemm_moving_fmax {limit} on {_target.current()}")
    return N


_FP32ISH = (torch.float32,)


def nc_matmul(dst, stationary, moving, is_stationary_onezero=False, is_moving_onezero=False,
              is_transpose=False, tile_position=None, tile_size=None, perf_mode=None, accumulate=None,
              name=None, **kw):
    """``dst = stationary.T @ moving`` (K on the partitions of both inputs),
    accumulating into PSUM: with ``accumulate=None`` the first write to a PSUM
    location overwrites and later ones add."""
    instr = _name("nc_matmul")
    if is_transpose:
        fail(instr, "is_transpose", "PE transposes through nc_matmul are not modelled; use nisa.nc_transpose")
    _checks.tile(instr, "stationary", stationary, _checks.SBUF)
    _checks.tile(instr, "moving", moving, _checks.SBUF)
    _checks.tile(instr, "dst", dst, _checks.PSUM)
    if stationary.ndim != 2:
        fail(instr, "stationary", f"expected a 2-D [K, M] tile, got {list(stationary.shape)}")
    K, M = stationary.shape
    N = _matmul_limits(instr, K, M, moving, dst.dtype.itemsize)
    allowed_dst = (torch.float32, torch.bfloat16) if _target.current() == "trn3" else (torch.float32,)
    if dst.dtype not in allowed_dst:
        fail(instr, "dst", f"dtype {_dtypes.name(dst.dtype)} is not a PSUM matmul result type on "
                           f"{_target.current()} ({', '.join(_dtypes.name(d) for d in allowed_dst)})")
    if (stationary.dtype in _FP32ISH) != (moving.dtype in _FP32ISH):
        fail(instr, "moving", f"fp32 operands must pair with fp32 (stationary {_dtypes.name(stationary.dtype)}, "
                              f"moving {_dtypes.name(moving.dtype)})")
    for nm, t in (("stationary", stationary), ("moving", moving)):
        if not t.dtype.is_floating_point:
            fail(instr, nm, f"dtype {_dtypes.name(t.dtype)} is not a matmul input type")
    if dst.shape[0] != M or math.prod(dst.shape[1:]) != N:
        fail(instr, "dst", f"shape {list(dst.shape)} does not match the result [{M}, {N}]")

    def run(env):
        r = (env.f32(stationary).t() @ env.f32(moving).reshape(K, N)).reshape(dst.shape)
        cur = env.view(dst)
        add = accumulate
        if add is None:
            written = env.mask(dst)
            add = bool(written.all())
            if not add and written.any():
                r = torch.where(written, cur.to(torch.float32) + r, r)
        if add:
            r = cur.to(torch.float32) + r
        env.write(dst, r)
    _trace.record(instr, run, dst, stationary, moving,
                  ir=("matmul", {"dst": dst, "stationary": stationary, "moving": moving, "accumulate": accumulate}))


def nc_transpose(dst, data, engine=None, name=None, **kw):
    """Partition <-> free transpose of a 2-D tile (Tensor Engine: up to
    128x128 into PSUM; Vector Engine: up to 32x32)."""
    instr = _name("nc_transpose")
    _engine(instr, engine)
    _checks.tile(instr, "data", data)
    _checks.tile(instr, "dst", dst)
    if data.ndim != 2 or tuple(dst.shape) != (data.shape[1], data.shape[0]):
        fail(instr, "dst", f"shape {list(dst.shape)} is not the transpose of data {list(data.shape)}")
    on_vector = engine is not None and engine.name == "vector" or (
        (engine is None or engine.name == "unknown") and max(data.shape) <= 32 and _checks.kind(dst) != "psum")
    limit = 32 if on_vector else _target.PMAX
    if data.shape[1] > limit or data.shape[0] > limit:
        fail(instr, "data", f"shape {list(data.shape)} exceeds the {limit}x{limit} transpose limit of the "
                            f"{'Vector' if on_vector else 'Tensor'} Engine")
    if not on_vector:
        _checks.tile(instr, "data", data, _checks.SBUF)
        _checks.tile(instr, "dst", dst, _checks.PSUM)
    _trace.record(instr, lambda env: env.write(dst, env.view(data).t()), dst, data,
                  ir=("transpose", {"dst": dst, "src": data, "axes": (1, 0)}))


# -- Vector / Scalar engines -----------------------------------------------
def tensor_tensor(dst, data1, data2, op, engine=None, name=None, **kw):
    instr = _name("tensor_tensor")
    _engine(instr, engine)
    impl = _checks.op(instr, "op", op, 2)
    for nm, t in (("dst", dst), ("data1", data1), ("data2", data2)):
        _checks.tile(instr, nm, t)
    _checks.same_shape(instr, ("dst", "data1", "data2"), dst, data1, data2)
    _checks.bitvec(instr, impl, data1, data2)
    ints = impl.kind == "bitvec"

    def run(env):
        a, b = (env.ints(data1), env.ints(data2)) if ints else (env.f32(data1), env.f32(data2))
        env.write(dst, impl.compute(a, b))
    _trace.record(instr, run, dst, data1, data2,
                  ir=("bits", {"dst": dst, "data": data1, "data2": data2, "form": 0, "op0": impl}) if ints else
                  ("tensor_tensor", {"dst": dst, "data": data1, "data2": data2, "op": impl}))


def _apply(impl, x, s, reverse):
    return impl.compute(s, x) if reverse else impl.compute(x, s)


def tensor_scalar(dst, data, op0, operand0, reverse0=False, op1=None, operand1=None, reverse1=False,
                  engine=None, name=None, **kw):
    """``dst = op1(op0(data, operand0), operand1)``; operands are numbers or
    [P, 1] per-partition tiles."""
    instr = _name("tensor_scalar")
    _engine(instr, engine)
    _checks.tile(instr, "dst", dst)
    _checks.tile(instr, "data", data)
    _checks.same_numel_per_partition(instr, ("dst", "data"), dst, data)
    i0 = _checks.op(instr, "op0", op0, 2)
    _checks.per_partition_scalar(instr, "operand0", operand0, data.shape[0])
    i1 = None
    if op1 is not None:
        i1 = _checks.op(instr, "op1", op1, 2)
        _checks.per_partition_scalar(instr, "operand1", operand1, data.shape[0])
        if (i0.kind == "bitvec") != (i1.kind == "bitvec"):
            fail(instr, "op1", f"op0 (nl.{i0.name}) and op1 (nl.{i1.name}) must both be bitvector or both "
                               f"arithmetic ops")
    _checks.bitvec(instr, i0, data)

    def run(env):
        ints = i0.kind == "bitvec"
        x = env.ints(data) if ints else env.f32(data)
        r = _apply(i0, x, env.scalar(operand0, x.ndim, ints), reverse0)
        if i1 is not None:
            r = _apply(i1, r, env.scalar(operand1, x.ndim, ints), reverse1)
        env.write(dst, r.reshape(dst.shape))
    ir = ("bits" if i0.kind == "bitvec" else "tensor_scalar", {
        "dst": dst, "data": data, "op0": i0, "operand0": operand0, "reverse0": reverse0, "op1": i1,
        "operand1": operand1, "reverse1": reverse1, "form": 1})
    _trace.record(instr, run, dst, data, *[o for o in (operand0, operand1) if isinstance(o, NkiTensor)], ir=ir)


def scalar_tensor_tensor(dst, data, op0, operand0, op1, operand1, reverse0=False, reverse1=False,
                         reduce_cmd=reduce_cmd.reset_reduce, reduce_op=None, reduce_res=None, name=None, **kw):
    """Vector Engine: ``dst = (data <op0> operand0) <op1> operand1`` with
    ``operand0`` a number or [P, 1] tile and ``operand1`` a tile of
    ``data``'s shape; optionally reduces the result into ``reduce_res``."""
    instr = _name("scalar_tensor_tensor")
    _checks.tile(instr, "dst", dst)
    _checks.tile(instr, "data", data)
    _checks.tile(instr, "operand1", operand1)
    _checks.same_numel_per_partition(instr, ("dst", "data", "operand1"), dst, data, operand1)
    i0 = _checks.op(instr, "op0", op0, 2)
    i1 = _checks.op(instr, "op1", op1, 2)
    for nm, impl in (("op0", i0), ("op1", i1)):
        if impl.kind == "bitvec":
            fail(instr, nm, f"nl.{impl.name} is a bitvector op; scalar_tensor_tensor takes arithmetic ops")
    if _checks.kind(data) == "psum" and _checks.kind(operand1) == "psum":
        fail(instr, "operand1", "data and operand1 cannot both be in PSUM")
    _checks.per_partition_scalar(instr, "operand0", operand0, data.shape[0])
    rimpl = _check_reduce(instr, reduce_op, reduce_res, data, reduce_cmd) if reduce_op is not None or \
        reduce_res is not None else None
    cmd = reduce_cmd

    def run(env):
        x = _rows_value(env, data)
        r = _apply(i0, x, env.scalar(operand0, x.ndim), reverse0)
        r = _apply(i1, r, env.f32(operand1).reshape(x.shape), reverse1)
        env.write(dst, r.reshape(dst.shape))
        if rimpl is not None:
            _accumulate(env, "vector", cmd, rimpl, r, reduce_res)
    def stt(out):
        return ("scalar_tensor_tensor", {"dst": out, "data": data, "op0": i0, "operand0": operand0,
                                         "reverse0": reverse0, "op1": i1, "operand1": operand1,
                                         "reverse1": reverse1, "reduce": False})
    ir = stt(dst)
    if rimpl is not None:
        # Natively: the fp32 result in a temporary, stored, reduced into the registers.
        y = _row_temp(data, materialize=True)
        ir = None if y is None else ("seq", {"parts": [stt(y), ("copy", {"dst": dst, "src": y})] +
                                             _register_parts(y, rimpl, cmd, reduce_res, "vector")})
    _trace.record(instr, run, dst, data, operand1,
                  *[o for o in (operand0, reduce_res) if isinstance(o, NkiTensor)], ir=ir)


def tensor_tensor_scan(dst, data0, data1, initial, op0, op1, reverse0=False, reverse1=False, name=None, **kw):
    """Vector Engine scan along the flattened free axis of each partition:
    ``r[i] = op1(op0(data0[i], r[i-1]), data1[i])`` with ``r[-1] =
    initial`` (a number or a [P, 1] tile), e.g. the recurrence
    ``h = a * h + b`` of a state-space model (op0=nl.multiply, op1=nl.add)."""
    instr = _name("tensor_tensor_scan")
    for nm, t in (("dst", dst), ("data0", data0), ("data1", data1)):
        _checks.tile(instr, nm, t)
    _checks.same_numel_per_partition(instr, ("dst", "data0", "data1"), dst, data0, data1)
    if _checks.kind(data0) == "psum" and _checks.kind(data1) == "psum":
        fail(instr, "data1", "data0 and data1 cannot both be in PSUM")
    i0 = _checks.op(instr, "op0", op0, 2)
    i1 = _checks.op(instr, "op1", op1, 2)
    for nm, impl in (("op0", i0), ("op1", i1)):
        if impl.kind == "bitvec":
            fail(instr, nm, f"nl.{impl.name} is a bitvector op; tensor_tensor_scan takes arithmetic ops")
    _checks.per_partition_scalar(instr, "initial", initial, data0.shape[0])

    def run(env):
        p = data0.shape[0]
        a = env.f32(data0).reshape(p, -1)
        b = env.f32(data1).reshape(p, -1)
        prev = env.scalar(initial, 1).reshape(p) if isinstance(initial, NkiTensor) else torch.full((p,), float(initial))
        out = torch.empty_like(a)
        # Sequential along the free axis, vectorised over partitions (as the engine runs it).
        for i in range(a.shape[1]):
            x = _apply(i0, a[:, i], prev, reverse0)
            prev = _apply(i1, x, b[:, i], reverse1)
            out[:, i] = prev
        env.write(dst, out.reshape(dst.shape))
    _trace.record(instr, run, dst, data0, data1, *[t for t in (initial,) if isinstance(t, NkiTensor)],
                  ir=("scan", {"dst": dst, "data0": data0, "data1": data1, "initial": initial, "op0": i0, "op1": i1,
                               "reverse0": reverse0, "reverse1": reverse1}))


def _reduced_shape(shape, axes, keepdims):
    return tuple(1 if i in axes else s for i, s in enumerate(shape)) if keepdims else \
        tuple(s for i, s in enumerate(shape) if i not in axes)


def tensor_reduce(dst, op, data, axis, negate=False, keepdims=False, engine=None, name=None, **kw):
    instr = _name("tensor_reduce")
    _engine(instr, engine)
    impl = _checks.op(instr, "op", op, 2)
    if impl.reduce is None:
        fail(instr, "op", f"nl.{impl.name} is not a reduction op (use nl.add, nl.maximum, nl.minimum, ...)")
    _checks.tile(instr, "data", data)
    _checks.tile(instr, "dst", dst)
    axes = _checks.free_axes(instr, axis, data.ndim)
    if sorted(axes) != list(range(data.ndim - len(axes), data.ndim)):
        fail(instr, "axis", f"axis {axis} must be the last contiguous free dimensions of a {data.ndim}-D tile "
                            f"(e.g. ({data.ndim - 1},) or {tuple(range(1, data.ndim))})")
    shape = _reduced_shape(data.shape, axes, keepdims)
    if math.prod(dst.shape) != math.prod(shape) or dst.shape[0] != data.shape[0]:
        fail(instr, "dst", f"shape {list(dst.shape)} does not match the reduced shape {list(shape)}")

    ir, gathered = _tensor_reduce_ir(dst, data, impl, axes, negate)

    def run(env):
        x = env.ints(data) if impl.kind == "bitvec" else env.f32(data)
        if gathered:  # the documented order of other views: logical order, contiguous
            x = x.contiguous()
        r = _reduce_fn(impl, x, axes, keepdims)
        env.write(dst, (-r if negate else r).reshape(dst.shape))
    _trace.record(instr, run, dst, data, ir=ir)


def _tensor_reduce_ir(dst, data, impl, axes, negate):
    """(records, gathered): torch's own order where the records reproduce it
    (reduced elements one contiguous run per result; every free dim of a
    packed permuted view), else (gathered) the tile in its logical order."""
    if impl.kind == "bitvec":
        return ("bits", {"dst": dst, "data": data, "op0": impl, "axes": tuple(axes), "negate": negate,
                         "form": 2}), False
    run, step = True, 1
    for d in sorted(axes, reverse=True):
        if data.shape[d] > 1:
            run, step = run and data.strides[d] == step, step * data.shape[d]
    if run:
        return (_product_parts(dst, data, axes, negate) if impl.name == "multiply" else
                ("tensor_reduce", {"dst": dst, "data": data, "op": impl, "axes": tuple(axes), "negate": negate})), False
    ir = None if impl.name == "multiply" else _permuted_reduce_ir(dst, data, impl, axes, negate)
    return (ir, False) if ir is not None else (_gathered_reduce_ir(dst, data, impl, axes, negate), True)


def _gathered_reduce_ir(dst, data, impl, axes, negate):
    """A view with gaps, some dims of a permuted view kept, zero strides:
    ``data`` copied in its logical order into an fp32 [P, K, reduced...]
    temporary, whose contiguous rows the records reduce (docs/nki.md,
    "Reduction order")."""
    if data.shape[0] > 128 or data.ndim + 1 > 8:
        return None
    red = tuple(data.shape[d] for d in axes)
    t = _temp((data.shape[0], math.prod(data.shape[1:]) // math.prod(red)) + red)
    t_axes = tuple(range(2, 2 + len(red)))
    ir = _product_parts(dst, t, t_axes, negate) if impl.name == "multiply" else \
        ("tensor_reduce", {"dst": dst, "data": t, "op": impl, "axes": t_axes, "negate": negate})
    return ("seq", {"parts": [("copy", {"dst": t, "src": data})] + (ir[1]["parts"] if ir[0] == "seq" else [ir])})


def _permuted_reduce_ir(dst, data, impl, axes, negate):
    """A sum/max/min over every free dim of a permuted view whose elements
    are packed (dense): torch reads it in memory order, one flat run, so the
    records copy it into a temporary in that order and reduce the flat row.
    (None: the plain record, or its fallback.)"""
    if len(axes) != data.ndim - 1:
        return None
    y = _row_temp(data)
    if y is None or y.is_contiguous():
        return None
    free = sorted((st, n) for st, n in zip(data.strides[1:], data.shape[1:]) if n > 1)
    step = 1
    for st, n in free:  # packed: each stride the product of the inner extents
        if st != step:
            return None
        step *= n
    flat = NkiTensor(y.storage, tuple(y.storage.shape), _check=False)
    return ("seq", {"parts": [("copy", {"dst": y, "src": data}),
                              ("tensor_reduce", {"dst": dst, "data": flat, "op": impl, "axes": (1,), "negate": negate})]})


def _product_parts(dst, data, axes, negate=False):
    """A product over trailing ``axes`` as the interpreter computes it (_ops.reduce):
    one axis at a time, the last first, through fp32 temporaries; each step is
    torch's prod of contiguous rows, which the executor reproduces."""
    axes = sorted(axes)
    parts, cur = [], data
    for a in reversed(axes[1:]):
        t = _temp(tuple(n for i, n in enumerate(cur.shape) if i != a))
        parts.append(("tensor_reduce", {"dst": t, "data": cur, "op": _OPS["multiply"], "axes": (a,), "negate": False}))
        cur = t
    last = ("tensor_reduce", {"dst": dst, "data": cur, "op": _OPS["multiply"], "axes": (axes[0],), "negate": negate})
    return last if len(parts) == 0 else ("seq", {"parts": parts + [last]})


def _activation_common(instr, dst, op, data, bias, scale):
    impl = _checks.op(instr, "op", op, 1)
    _checks.tile(instr, "dst", dst)
    _checks.tile(instr, "data", data)
    _checks.same_numel_per_partition(instr, ("dst", "data"), dst, data)
    if bias is not None:
        _checks.per_partition_scalar(instr, "bias", bias, data.shape[0])
    _checks.per_partition_scalar(instr, "scale", scale, data.shape[0])
    return impl


def _activation_value(env, impl, data, bias, scale):
    x = _rows_value(env, data)
    y = x * env.scalar(scale, x.ndim)
    if bias is not None:
        y = y + env.scalar(bias, x.ndim)
    return impl.compute(y)


def _activation_ir(dst, impl, data, bias, scale, cmd, rimpl, reduce_res):
    reducing = cmd in ("reduce", "reset_reduce") or cmd == "idle" and reduce_res is not None
    y = _row_temp(data, materialize=True) if cmd == "load_reduce" or reducing else None
    if cmd == "load_reduce" or y is not None and (not y.is_contiguous() or not _dense_rows(data)):
        # The fp32 result in a temporary, stored, summed and folded into the
        # registers (load_reduce; or a permuted data, summed in its memory order).
        if y is None:
            return None
        return ("seq", {"parts": [_activation_ir(y, impl, data, bias, scale, "idle", None, None),
                                  ("copy", {"dst": dst, "src": y})] +
                        _register_parts(y, rimpl, getattr(reduce_cmd, cmd), reduce_res, "scalar")})
    return ("activation", {"dst": dst, "op": impl, "data": data, "bias": bias, "scale": scale, "cmd": cmd,
                           "reduce_op": rimpl, "reduce_res": reduce_res, "engine": "scalar"})


def _check_reduce(instr, reduce_op, reduce_res, data, cmd=None, only=None):
    """Validates the optional reduction of ``instr``; returns its op (or None)."""
    if cmd is not None and not (isinstance(cmd, _Enum) and cmd.kind == "reduce_cmd"):
        fail(instr, "reduce_cmd", f"expected an nisa.reduce_cmd value, got {cmd!r} (raw integers are rejected)")
    if reduce_op is None:
        if reduce_res is not None or (cmd is not None and cmd.name in ("reduce", "reset_reduce", "load_reduce")):
            fail(instr, "reduce_op", "a reduction (reduce_res or a reducing reduce_cmd) needs reduce_op")
        impl = None
    else:
        impl = _checks.op(instr, "reduce_op", reduce_op, 2)
        if impl.reduce is None or impl.kind == "bitvec":
            fail(instr, "reduce_op", f"nl.{impl.name} is not an arithmetic reduction op")
        if only is not None and impl.name not in only:
            fail(instr, "reduce_op", f"nl.{impl.name} is not supported here; reduce_op must be "
                                     f"{' or '.join('nl.' + o for o in only)}")
    if reduce_res is not None:
        _checks.tile(instr, "reduce_res", reduce_res)
        if reduce_res.shape[0] != data.shape[0] or math.prod(reduce_res.shape[1:]) != 1:
            fail(instr, "reduce_res", f"expected shape [{data.shape[0]}, 1], got {list(reduce_res.shape)}")
    return impl


def _accumulate(env, engine_name, cmd, impl, y, reduce_res, init=0.0, negate=False):
    """Applies ``cmd`` to ``engine_name``'s accumulator registers with the
    free-axis reduction of ``y`` and writes them to ``reduce_res``."""
    p = y.shape[0]
    regs = env.registers(engine_name)
    name = cmd.name
    if name == "idle" and reduce_res is not None:
        name = "reset_reduce"  # asking for reduce_res asks for this instruction's reduction
    if name == "reset":
        regs.zero_()
    elif name in ("reduce", "reset_reduce", "load_reduce"):
        axes = tuple(range(1, y.ndim))
        r = _reduce_fn(impl, y, axes, False) if axes else y.reshape(p)
        if name == "reduce":
            regs[:p] = _reduce_fn(impl, torch.stack([regs[:p], r]), (0,), False)
        elif name == "load_reduce":
            base = env.scalar(init, 1).reshape(-1) if isinstance(init, NkiTensor) else torch.full((p,), float(init))
            regs[:p] = _reduce_fn(impl, torch.stack([base, r]), (0,), False)
        else:
            regs[:p] = r
    if reduce_res is not None:
        v = regs[:p]
        env.write(reduce_res, (-v if negate else v).reshape(reduce_res.shape))


def activation(dst, op, data, bias=None, scale=1.0, reduce_op=None, reduce_res=None, reduce_cmd=reduce_cmd.idle,
               engine=None, name=None, **kw):
    """Scalar Engine: ``dst = op(data * scale + bias)`` (``bias``/``scale``
    numbers or [P, 1] tiles); ``reduce_cmd`` folds the sum of each
    partition of the result into the engine's accumulator registers, which
    ``reduce_res`` receives."""
    instr = _name("activation")
    _engine(instr, engine)
    impl = _activation_common(instr, dst, op, data, bias, scale)
    rimpl = _check_reduce(instr, reduce_op, reduce_res, data, reduce_cmd, only=("add",))
    cmd = reduce_cmd

    def run(env):
        y = _activation_value(env, impl, data, bias, scale)
        env.write(dst, y.reshape(dst.shape))
        if cmd.name != "idle" or reduce_res is not None:
            _accumulate(env, "scalar", cmd, rimpl, y, reduce_res)
    _trace.record(instr, run, dst, data, *[t for t in (bias, scale, reduce_res) if isinstance(t, NkiTensor)],
                  ir=_activation_ir(dst, impl, data, bias, scale, cmd.name, rimpl, reduce_res))


def activation_reduce(dst, op, data, reduce_op, reduce_res, bias=None, scale=1.0, name=None, **kw):
    """``activation`` with ``reduce_cmd=reset_reduce``: ``reduce_res`` gets
    the sum of each partition of the result."""
    instr = _name("activation_reduce")
    impl = _activation_common(instr, dst, op, data, bias, scale)
    if reduce_res is None:
        fail(instr, "reduce_res", "activation_reduce needs a [P, 1] reduce_res")
    rimpl = _check_reduce(instr, reduce_op, reduce_res, data, reduce_cmd.reset_reduce, only=("add",))

    def run(env):
        y = _activation_value(env, impl, data, bias, scale)
        env.write(dst, y.reshape(dst.shape))
        _accumulate(env, "scalar", reduce_cmd.reset_reduce, rimpl, y, reduce_res)
    _trace.record(instr, run, dst, data, reduce_res, *[t for t in (bias, scale) if isinstance(t, NkiTensor)],
                  ir=_activation_ir(dst, impl, data, bias, scale, "reset_reduce", rimpl, reduce_res))


def tensor_scalar_reduce(dst, data, op0, operand0, reduce_op, reduce_res=None, reverse0=False,
                         reduce_cmd=reduce_cmd.reset_reduce, reduce_init=None, reduce_res_negate=False, name=None,
                         **kw):
    """Vector Engine: ``dst = data <op0> operand0`` and its free-axis
    reduction (nl.add, nl.multiply, nl.maximum, nl.minimum) into the
    accumulator registers / ``reduce_res``."""
    instr = _name("tensor_scalar_reduce")
    _checks.tile(instr, "dst", dst)
    _checks.tile(instr, "data", data)
    _checks.same_numel_per_partition(instr, ("dst", "data"), dst, data)
    i0 = _checks.op(instr, "op0", op0, 2)
    if i0.kind == "bitvec":
        fail(instr, "op0", f"nl.{i0.name} is a bitvector op; tensor_scalar_reduce takes arithmetic ops")
    _checks.per_partition_scalar(instr, "operand0", operand0, data.shape[0])
    rimpl = _check_reduce(instr, reduce_op, reduce_res, data, reduce_cmd,
                          only=("add", "multiply", "maximum", "minimum"))
    cmd = reduce_cmd

    def run(env):
        x = _rows_value(env, data)
        y = _apply(i0, x, env.scalar(operand0, x.ndim), reverse0)
        env.write(dst, y.reshape(dst.shape))
        _accumulate(env, "vector", cmd, rimpl, y, reduce_res,
                    0.0 if reduce_init is None else reduce_init, reduce_res_negate)
    ir = None
    y = _row_temp(data, materialize=True)
    if y is not None:
        ir = ("seq", {"parts": [
            ("tensor_scalar", {"dst": y, "data": data, "op0": i0, "operand0": operand0, "reverse0": reverse0,
                               "op1": None, "operand1": None, "reverse1": False}),
            ("copy", {"dst": dst, "src": y})] + _register_parts(
                y, rimpl, cmd, reduce_res, "vector", 0.0 if reduce_init is None else reduce_init, reduce_res_negate)})
    _trace.record(instr, run, dst, data,
                  *[t for t in (operand0, reduce_res, reduce_init) if isinstance(t, NkiTensor)], ir=ir)


def exponential(dst, src, max_value=0.0, reduce_res=None, reduce_cmd=reduce_cmd.idle, reduce_init=0.0, name=None,
                **kw):
    """Vector Engine, NeuronCore-v4 (trn3) and newer: ``dst = exp(src -
    max_value)`` (``max_value`` a number or a [P, 1] tile); ``reduce_cmd``
    folds the row sums into the accumulator registers / ``reduce_res``."""
    instr = _name("exponential")
    if _target.current() != "trn3":
        fail(instr, None, f"is available only on NeuronCore-v4 (trn3) and newer, the target is "
                          f"{_target.current()} (use nisa.activation(op=nl.exp, bias=...) instead)")
    _checks.tile(instr, "dst", dst)
    _checks.tile(instr, "src", src)
    _checks.same_numel_per_partition(instr, ("dst", "src"), dst, src)
    _checks.per_partition_scalar(instr, "max_value", max_value, src.shape[0])
    rimpl = _check_reduce(instr, _OPS_ADD, reduce_res, src, reduce_cmd)
    if reduce_cmd.name != "load_reduce" and (isinstance(reduce_init, NkiTensor) or reduce_init != 0.0):
        fail(instr, "reduce_init", "reduce_init is only used with reduce_cmd=nisa.reduce_cmd.load_reduce")
    cmd = reduce_cmd

    def run(env):
        x = _rows_value(env, src)
        y = torch.exp(x - env.scalar(max_value, x.ndim))
        env.write(dst, y.reshape(dst.shape))
        if cmd.name != "idle" or reduce_res is not None:
            _accumulate(env, "vector", cmd, rimpl, y, reduce_res, reduce_init)
    ir = None
    y = _row_temp(src, materialize=True)
    if y is not None:
        ir = ("seq", {"parts": [
            ("tensor_scalar", {"dst": y, "data": src, "op0": _OPS["subtract"], "operand0": max_value,
                               "reverse0": False, "op1": None, "operand1": None, "reverse1": False}),
            _activation_ir(y, _OPS["exp"], y, None, 1.0, "idle", None, None),
            ("copy", {"dst": dst, "src": y})] + _register_parts(y, rimpl, cmd, reduce_res, "vector", reduce_init)})
    _trace.record(instr, run, dst, src,
                  *[t for t in (max_value, reduce_res, reduce_init) if isinstance(t, NkiTensor)], ir=ir)


def reciprocal(dst, data, name=None, **kw):
    instr = _name("reciprocal")
    _checks.tile(instr, "dst", dst)
    _checks.tile(instr, "data", data)
    _checks.same_shape(instr, ("dst", "data"), dst, data)
    _trace.record(instr, lambda env: env.write(dst, torch.reciprocal(env.f32(data))), dst, data,
                  ir=_activation_ir(dst, _OPS["reciprocal"], data, None, 1.0, "idle", None, None))


# bn_stats packs, per partition, (count, mean, count * variance) into 6
# slots (the hardware's layout is opaque; only bn_aggr reads it).
_BN_SLOTS = 6


def bn_stats(dst, data, name=None, **kw):
    instr = _name("bn_stats")
    _checks.tile(instr, "dst", dst)
    _checks.tile(instr, "data", data)
    free = math.prod(data.shape[1:])
    if free > _target.BN_STATS_FMAX:
        fail(instr, "data", f"free size {free} exceeds bn_stats_fmax {_target.BN_STATS_FMAX}")
    if dst.shape[0] != data.shape[0] or math.prod(dst.shape[1:]) != _BN_SLOTS:
        fail(instr, "dst", f"expected shape [{data.shape[0]}, {_BN_SLOTS}], got {list(dst.shape)}")

    def run(env):
        x = env.f32(data).reshape(data.shape[0], -1)
        n = x.shape[1]
        mean = x.mean(dim=1)
        m2 = ((x - mean[:, None]) ** 2).sum(dim=1)
        out = torch.zeros(x.shape[0], _BN_SLOTS)
        out[:, 0], out[:, 1], out[:, 2] = n, mean, m2
        env.write(dst, out.reshape(dst.shape))
    _trace.record(instr, run, dst, data, ir=_bn_stats_ir(dst, data))


def bn_aggr(dst, data, name=None, **kw):
    """Combines bn_stats groups ([P, 6k]) into [P, 2] (mean, population variance)."""
    instr = _name("bn_aggr")
    _checks.tile(instr, "dst", dst)
    _checks.tile(instr, "data", data)
    free = math.prod(data.shape[1:])
    if free % _BN_SLOTS:
        fail(instr, "data", f"free size {free} is not a multiple of {_BN_SLOTS} (bn_stats outputs)")
    if dst.shape[0] != data.shape[0] or math.prod(dst.shape[1:]) != 2:
        fail(instr, "dst", f"expected shape [{data.shape[0]}, 2], got {list(dst.shape)}")

    def run(env):
        s = env.f32(data).reshape(data.shape[0], -1, _BN_SLOTS)
        # The columns made contiguous first: each sum reads a contiguous row,
        # as the executor's records do (docs/nki.md, "Reduction order").
        n, mean, m2 = (s[..., j].contiguous() for j in range(3))
        total = n.sum(dim=1)
        mu = (n * mean).sum(dim=1) / total
        m2_all = (m2 + n * (mean - mu[:, None]) ** 2).sum(dim=1)
        env.write(dst, torch.stack([mu, m2_all / total], dim=1).reshape(dst.shape))
    _trace.record(instr, run, dst, data, ir=_bn_aggr_ir(dst, data))


# -- native lowerings of the composite instructions ------------------------
def _row_temp(data, materialize=False):
    """An fp32 temporary for ``data``'s fp32 result: [P, F] memory, seen in
    ``data``'s shape laid out as the interpreter's result is. torch's
    elementwise result keeps its input's dim order (dense), and its reductions
    iterate that memory order; a permuted ``data`` then gets a permuted view,
    whose rows the reductions read flat (_register_parts)."""
    if data.shape[0] > 128 or data.ndim > 8:
        return None
    if not _dense_rows(data):  # materialized by the interpreter (_rows_value): logical order
        return _temp((data.shape[0], math.prod(data.shape[1:]))) if materialize else None
    free = [(st, n, d) for d, (st, n) in enumerate(zip(data.strides[1:], data.shape[1:]), 1) if n > 1]
    order = sorted(free, key=lambda f: -f[0])  # outermost first
    y = _temp((data.shape[0], math.prod(data.shape[1:])))
    if [f[2] for f in order] == [f[2] for f in free]:
        return y  # row-major already
    strides, step = [0] * data.ndim, 1
    for _st, n, d in reversed(order):
        strides[d] = step
        step *= n
    strides[0] = y.strides[0]
    return NkiTensor(y.storage, tuple(data.shape), tuple(strides), 0, _check=False)


def _dense_rows(v):
    """No zero stride and no overlapping elements in ``v``'s free dims: torch's
    elementwise result then keeps its dim order (_row_temp)."""
    free = sorted(((st, n) for st, n in zip(v.strides[1:], v.shape[1:]) if n > 1), key=lambda f: -f[0])
    return all(st > 0 for st, _n in free) and all(a[0] >= b[0] * b[1] for a, b in zip(free, free[1:]))


def _rows_value(env, v):
    """``v`` in fp32 for an instruction whose result the registers reduce: a
    view with a zero stride or overlapping elements (a broadcast operand) is
    made contiguous first, so the result and its row reduction are in logical
    order (docs/nki.md, "Reduction order"); torch's own layout for such a
    result is its heuristic, which no record follows."""
    x = env.f32(v)
    return x if _dense_rows(v) else x.contiguous()


_REG_CMD = {"reduce": 2, "reset_reduce": 3, "reset": 4, "load_reduce": 5}


def _register_parts(y, rimpl, cmd, reduce_res, engine, init=0.0, negate=False):
    """The records of _accumulate after a [P, F] fp32 result ``y``: its row
    reduction, then the register update and reduce_res."""
    name = cmd.name
    if name == "idle" and reduce_res is not None:
        name = "reset_reduce"
    if name == "idle":
        return []
    y = NkiTensor(y.storage, tuple(y.storage.shape), _check=False)  # the rows in memory order
    r = _temp((y.shape[0], 1))
    parts = []
    if name != "reset":
        parts.append(("tensor_reduce", {"dst": r, "data": y, "op": rimpl, "axes": (1,), "negate": False}))
    parts.append(("registers", {"dst": reduce_res if reduce_res is not None else r, "r": r, "cmd": _REG_CMD[name],
                                "op": rimpl, "engine": engine, "res": reduce_res is not None, "negate": negate,
                                "init": init}))
    return parts


# Sequences of executor records (nki/_native.py, "seq") through fp32 SBUF
# temporaries: the interpreter's fp32 operations, in its order.
def _temp(shape):
    shape = tuple(shape)
    return NkiTensor(_trace.current().new_storage(_sbuf, torch.float32, shape, "tmp"), shape, _check=False)


def _column(t, j, k=1, every=1):
    """Columns j, j + every, ... (k of them) of a 2-D tile, as a [P, k] view."""
    return NkiTensor(t.storage, (t.shape[0], k), (t.strides[0], every * t.strides[1]), t.offset + j * t.strides[1],
                     _check=False)


def _ts(dst, data, op0, operand0):
    return ("tensor_scalar", {"dst": dst, "data": data, "op0": _OPS[op0], "operand0": operand0, "reverse0": False,
                              "op1": None, "operand1": None, "reverse1": False})


def _tt(dst, a, b, op):
    return ("tensor_tensor", {"dst": dst, "data": a, "data2": b, "op": _OPS[op]})


def _sum(dst, data, axes=(1,)):
    return ("tensor_reduce", {"dst": dst, "data": data, "op": _OPS["add"], "axes": tuple(axes), "negate": False})


def _bn_stats_ir(dst, data):
    # mean: torch's sum, then / n; m2: ((x - mean) * (x - mean)).sum()  (** 2 is a product in torch).
    if dst.ndim != 2 or dst.shape[0] > 128:
        return None
    P, F = data.shape[0], math.prod(data.shape[1:])
    s, mean, d, m2 = _temp((P, 1)), _temp((P, 1)), _temp((P, F)), _temp((P, 1))
    return ("seq", {"parts": [
        _sum(s, data, range(1, data.ndim)), _ts(mean, s, "divide", F), _ts(d, data, "subtract", mean),
        _tt(d, d, d, "multiply"), _sum(m2, d), ("memset", {"dst": dst, "value": 0}),
        ("memset", {"dst": _column(dst, 0), "value": F}), ("copy", {"dst": _column(dst, 1), "src": mean}),
        ("copy", {"dst": _column(dst, 2), "src": m2})]})


def _bn_aggr_ir(dst, data):
    # k groups per partition, their columns copied into [P, k] temporaries,
    # which the interpreter makes contiguous too: every sum a contiguous row.
    k = math.prod(data.shape[1:]) // _BN_SLOTS
    if dst.ndim != 2 or dst.shape[0] > 128:
        return None
    gather = []
    if data.ndim != 2:  # free dims in row-major order: one row of 6k values
        if data.strides[1:] != _contiguous_strides(data.shape[1:]):
            # (a permuted view: the interpreter's reshape copies it in logical order, so does this copy)
            flat = _temp((data.shape[0], k * _BN_SLOTS))
            gather, data = [("copy", {"dst": flat, "src": data})], flat
        else:
            data = NkiTensor(data.storage, (data.shape[0], k * _BN_SLOTS), (data.strides[0], 1), data.offset,
                             _check=False)
    P = data.shape[0]
    total, s1, mu, q, var = (_temp((P, 1)) for _ in range(5))
    n, mean, m2, nm, dv, e = (_temp((P, k)) for _ in range(6))
    return ("seq", {"parts": gather + [
        ("copy", {"dst": n, "src": _column(data, 0, k, _BN_SLOTS)}),
        ("copy", {"dst": mean, "src": _column(data, 1, k, _BN_SLOTS)}),
        ("copy", {"dst": m2, "src": _column(data, 2, k, _BN_SLOTS)}),
        _sum(total, n), _tt(nm, n, mean, "multiply"), _sum(s1, nm), _ts(mu, s1, "divide", total),
        _ts(dv, mean, "subtract", mu), _tt(dv, dv, dv, "multiply"), _tt(dv, n, dv, "multiply"),
        _tt(e, m2, dv, "add"), _sum(q, e), _ts(var, q, "divide", total),
        ("copy", {"dst": _column(dst, 0), "src": mu}), ("copy", {"dst": _column(dst, 1), "src": var})]})


def tensor_partition_reduce(dst, op, data, name=None, **kw):
    """Reduces across partitions: [P, F] -> [1, F]."""
    instr = _name("tensor_partition_reduce")
    impl = _checks.op(instr, "op", op, 2)
    if impl.reduce is None:
        fail(instr, "op", f"nl.{impl.name} is not a reduction op")
    _checks.tile(instr, "dst", dst)
    _checks.tile(instr, "data", data)
    if dst.shape[0] != 1 or tuple(dst.shape[1:]) != tuple(data.shape[1:]):
        fail(instr, "dst", f"expected shape [1, {', '.join(map(str, data.shape[1:]))}], got {list(dst.shape)}")

    def run(env):
        if impl.kind == "bitvec":
            # Integer semantics: the partitions' int64 values folded in order
            # (no fp32 step), stored with the destination's wrapping.
            x = env.ints(data)
            r = x[0:1].clone()
            for p in range(1, x.shape[0]):
                r = impl.compute(r, x[p:p + 1])
            env.write(dst, r)
            return
        x = env.f32(data)
        if impl.name in ("add", "multiply"):
            # Partition by partition in order (the engine's accumulation; torch's
            # dim-0 reduction has an order of its own the executor would not share).
            r = x[0:1].clone()
            for p in range(1, x.shape[0]):
                r = impl.compute(r, x[p:p + 1])
        else:
            r = _reduce_fn(impl, x, (0,), True)
        env.write(dst, r)
    _trace.record(instr, run, dst, data,
                  ir=_partition_bits_ir(dst, data, impl) if impl.kind == "bitvec" else
                  ("partition_reduce", {"dst": dst, "data": data, "op": impl}))


def _partition_bits_ir(dst, data, impl):
    """A bitvector tensor_partition_reduce: ``data`` transposed into a
    [1, F, P] temporary of its dtype (a record run whole), whose rows the
    integer reduction record folds into dst (and/or: any order is exact)."""
    if data.shape[0] > 128 or data.ndim + 1 > 8:
        return None
    F = math.prod(data.shape[1:])
    shape = (1, F, data.shape[0])
    t = NkiTensor(_trace.current().new_storage(_sbuf, data.dtype, shape, "tmp"), shape, _check=False)
    return ("seq", {"parts": [
        ("transpose", {"dst": t, "src": data, "axes": tuple(range(1, data.ndim)) + (0,)}),
        ("bits", {"dst": dst, "data": t, "op0": impl, "axes": (2,), "negate": False, "form": 2})]})


# -- GpSimd ----------------------------------------------------------------
def _affine(pattern, offset, channel_multiplier, shape):
    """offset + p * channel_multiplier + sum(i_k * step_k) over a tile."""
    p = torch.arange(shape[0], dtype=torch.float64).reshape((-1,) + (1,) * len(pattern))
    v = offset + p * channel_multiplier
    for k, (step, num) in enumerate(pattern):
        idx = torch.arange(num, dtype=torch.float64) * step
        v = v + idx.reshape((1,) + (1,) * k + (num,) + (1,) * (len(pattern) - k - 1))
    return v


def _check_pattern(instr, pattern, shape):
    try:
        counts = [int(n) for _s, n in pattern]
    except (TypeError, ValueError):
        fail(instr, "pattern", f"expected [[step, count], ...] for the free dims, got {pattern!r}")
    if math.prod(counts) != math.prod(shape[1:]):
        fail(instr, "pattern", f"pattern {pattern} covers {math.prod(counts)} elements per partition, dst has "
                               f"{math.prod(shape[1:])}")


def iota(dst, pattern, offset, channel_multiplier=0, name=None, **kw):
    """GpSimd: ``dst[p, i...] = offset + p * channel_multiplier + sum(i_k *
    step_k)`` over ``pattern = [[step, count], ...]``."""
    instr = _name("iota")
    _checks.tile(instr, "dst", dst, _checks.SBUF)
    _check_pattern(instr, pattern, dst.shape)
    _trace.record(instr, lambda env: env.write(
        dst, _affine(pattern, offset, channel_multiplier, dst.shape).reshape(dst.shape).to(torch.float32)), dst,
        ir=("iota", {"dst": dst, "pattern": [tuple(p) for p in pattern], "offset": offset,
                     "channel_multiplier": channel_multiplier}))


def affine_select(dst, pattern, offset, channel_multiplier, on_true_tile, on_false_value, cmp_op=None,
                  name=None, **kw):
    """GpSimd: ``dst = on_true_tile where cmp_op(affine, 0) else
    on_false_value``, the affine value as in iota (``cmp_op`` defaults to
    nl.equal); causal and triangular masks."""
    from ._ops import OPS
    instr = _name("affine_select")
    impl = _checks.op(instr, "cmp_op", cmp_op if cmp_op is not None else OPS["equal"], 2)
    _checks.tile(instr, "dst", dst)
    _checks.tile(instr, "on_true_tile", on_true_tile)
    _checks.same_numel_per_partition(instr, ("dst", "on_true_tile"), dst, on_true_tile)
    _check_pattern(instr, pattern, dst.shape)
    if not isinstance(on_false_value, (int, float)):
        fail(instr, "on_false_value", f"expected a number, got {type(on_false_value).__name__}")

    def run(env):
        v = _affine(pattern, offset, channel_multiplier, dst.shape).reshape(dst.shape).to(torch.float32)
        cond = impl.compute(v, torch.zeros(())) != 0
        env.write(dst, torch.where(cond, env.f32(on_true_tile).reshape(dst.shape),
                                   torch.tensor(float(on_false_value))))
    # Natively: the affine values (iota) into an fp32 tile, compared with 0, then a select.
    ir = None
    if on_true_tile.shape[0] == dst.shape[0]:
        P, F = dst.shape[0], math.prod(dst.shape[1:])
        v = _temp((P, F))
        ir = ("seq", {"parts": [
            ("iota", {"dst": v, "pattern": [tuple(p) for p in pattern], "offset": offset,
                      "channel_multiplier": channel_multiplier}),
            ("tensor_scalar", {"dst": v, "data": v, "op0": impl, "operand0": 0.0, "reverse0": False, "op1": None,
                               "operand1": None, "reverse1": False}),
            ("select", {"dst": dst, "cond": v, "x": on_true_tile, "y": float(on_false_value)})]})
    _trace.record(instr, run, dst, on_true_tile, ir=ir)


def select_reduce(dst, predicate, on_true, on_false, reduce_res=None, reduce_cmd=reduce_cmd.idle, reduce_op=None,
                  reverse_pred=False, name=None, **kw):
    """Vector Engine: ``dst = where(predicate, on_true, on_false)`` with an
    integer predicate and ``on_false`` a number or [P, 1] tile; optionally
    max-reduces ``dst`` into the accumulator registers / ``reduce_res``."""
    from ._ops import OPS
    instr = _name("select_reduce")
    for nm, t in (("dst", dst), ("predicate", predicate), ("on_true", on_true)):
        _checks.tile(instr, nm, t)
    _checks.same_numel_per_partition(instr, ("dst", "predicate", "on_true"), dst, predicate, on_true)
    if predicate.dtype.is_floating_point or predicate.dtype == torch.int32 or predicate.dtype == torch.uint32:
        fail(instr, "predicate", f"dtype {_dtypes.name(predicate.dtype)}: the predicate is int8, uint8, int16 or "
                                 f"uint16")
    if _checks.kind(predicate) == "psum" and _checks.kind(on_true) == "psum":
        fail(instr, "on_true", "on_true and predicate cannot both be in PSUM")
    _checks.per_partition_scalar(instr, "on_false", on_false, dst.shape[0])
    rimpl = _check_reduce(instr, reduce_op or OPS["maximum"], reduce_res, dst, reduce_cmd, only=("maximum",))
    cmd = reduce_cmd

    def run(env):
        c = env.view(predicate) != 0
        if reverse_pred:
            c = ~c
        y = torch.where(c.reshape(dst.shape), env.f32(on_true).reshape(dst.shape),
                        env.scalar(on_false, dst.ndim))
        env.write(dst, y)
        if cmd.name != "idle" or reduce_res is not None:
            _accumulate(env, "vector", cmd, rimpl, y, reduce_res)
    ir = None
    y = _row_temp(on_true, materialize=True)  # (a maximum: any order of the rows gives it)
    if y is not None and predicate.shape[0] == on_true.shape[0] == dst.shape[0]:
        other = on_false if not isinstance(on_false, NkiTensor) else NkiTensor(
            on_false.storage, y.shape, (on_false.strides[0],) + (0,) * (y.ndim - 1), on_false.offset, _check=False)
        x_, y_ = (other, on_true) if reverse_pred else (on_true, other)
        ir = ("seq", {"parts": [("select", {"dst": y, "cond": predicate, "x": x_, "y": y_}),
                                ("copy", {"dst": dst, "src": y})] +
                      (_register_parts(y, rimpl, cmd, reduce_res, "vector")
                       if cmd.name != "idle" or reduce_res is not None else [])})
    _trace.record(instr, run, dst, predicate, on_true,
                  *[t for t in (on_false, reduce_res) if isinstance(t, NkiTensor)], ir=ir)


def max8(dst, src, name=None, **kw):
    """The 8 largest values of each partition, descending."""
    instr = _name("max8")
    _checks.tile(instr, "dst", dst)
    _checks.tile(instr, "src", src)
    free = math.prod(src.shape[1:])
    if free < 8 or free > 16384:
        fail(instr, "src", f"free size {free} is outside max8's range [8, 16384]")
    if dst.shape[0] != src.shape[0] or math.prod(dst.shape[1:]) != 8:
        fail(instr, "dst", f"expected shape [{src.shape[0]}, 8], got {list(dst.shape)}")
    _trace.record(instr, lambda env: env.write(
        dst, torch.topk(env.f32(src).reshape(src.shape[0], -1), 8, dim=1).values.reshape(dst.shape)), dst, src,
        ir=("topk", {"dst": dst, "data": src, "mode": 0}))


def nc_find_index8(dst, data, vals, name=None, **kw):
    """For each of the 8 values per partition in ``vals``, the index of its
    first occurrence in ``data`` (flattened free dims)."""
    instr = _name("nc_find_index8")
    for nm, t in (("dst", dst), ("data", data), ("vals", vals)):
        _checks.tile(instr, nm, t)
    if math.prod(vals.shape[1:]) != 8 or math.prod(dst.shape[1:]) != 8:
        fail(instr, "vals", "vals and dst hold 8 elements per partition")
    if dst.dtype.is_floating_point:
        fail(instr, "dst", f"dtype {_dtypes.name(dst.dtype)}: indices need an integer dst (uint32)")

    def run(env):
        d = env.f32(data).reshape(data.shape[0], 1, -1)
        v = env.f32(vals).reshape(vals.shape[0], 8, 1)
        hit = d == v
        idx = torch.where(hit.any(dim=2), hit.to(torch.int8).argmax(dim=2), torch.full((), -1))
        env.write(dst, idx.reshape(dst.shape))
    _trace.record(instr, run, dst, data, vals, ir=("topk", {"dst": dst, "data": data, "vals": vals, "mode": 1}))


def dropout(dst, data, prob, name=None, **kw):
    instr = _name("dropout")
    _checks.tile(instr, "dst", dst)
    _checks.tile(instr, "data", data)
    _checks.same_shape(instr, ("dst", "data"), dst, data)

    k, seed = _philox.stream(instr)

    def run(env):
        p = env.f32(prob).reshape(-1)[0].item() if isinstance(prob, NkiTensor) else float(prob)
        x = env.f32(data)
        env.write(dst, torch.where(_philox.uniform(env.key(), k, x.shape) >= p, x, torch.zeros(())))
    ir = ("random", {"dst": dst, "seed": seed, "data": data, "prob": prob, "mode": 1, "stream": k})
    _trace.record(instr, run, dst, data, seed, *[t for t in (prob,) if isinstance(t, NkiTensor)], ir=ir)


from ._ops import OPS as _OPS  # noqa: E402

_OPS_ADD = _OPS["add"]

__all__ = ["engine", "reduce_cmd", "nc_version", "get_nc_version", "tensor_scalar_reduce", "dma_copy", "tensor_copy", "memset", "dma_transpose", "nc_matmul", "nc_transpose",
           "tensor_tensor", "tensor_tensor_scan", "tensor_scalar", "scalar_tensor_tensor", "tensor_reduce", "activation",
           "activation_reduce", "exponential", "reciprocal", "bn_stats", "bn_aggr", "tensor_partition_reduce",
           "iota", "affine_select", "select_reduce", "max8", "nc_find_index8", "dropout"]
