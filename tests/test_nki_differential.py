"""Differential test of the two NKI executors: every instruction of ``nki.isa``
and every ``nki.language`` op, over the dtypes it takes and a sample of tile
shapes, runs on the interpreter (the reference) and with
``NKI_EXECUTOR=native``, which must not fall back. Results must be equal bit
for bit (NaNs: in the same places), except the tolerance rows of docs/nki.md
(matmuls; transcendental functions, where libm meets torch's vectorised
approximations, plus one unit in the last place of a low-precision result).

The units (instruction x op) are enumerated from the modules themselves:
``nki.isa.__all__``, ``nki.language.__all__`` and the op table (``OPS``). A
unit is either in ``NATIVE`` or in ``INTERPRETER`` (with the reason), and the
test checks both ways: a native unit must run natively and agree, an
interpreter unit must be refused by ``NKI_EXECUTOR=native`` (so a new lowering
moves it to ``NATIVE``). A new instruction or op without a unit fails
``test_every_instruction_has_units``. Random instructions (``nl.rand``,
dropout) draw from a Philox key taken from torch's generator, which
``_execute`` seeds the same way for both executors.

The table in docs/nki.md ("Executor coverage") is this file's ``NATIVE`` and
``INTERPRETER``."""
import inspect
import math

import numpy as np
import pytest
import torch

import nki
import nki.isa as nisa
import nki.language as nl
from nki._errors import NKIError
from nki._ops import OPS

FP = [torch.float32, torch.bfloat16, torch.float16, torch.float8_e4m3fn, torch.float8_e5m2]
INT = [torch.int32, torch.int16, torch.int8, torch.uint8]
ODD = [torch.uint32, torch.bool]
ALL = FP + INT + ODD
SHAPES = [(1, 7), (64, 33), (128, 130)]

BINARY = sorted(n for n, o in OPS.items() if o.arity == 2)
UNARY = sorted(n for n, o in OPS.items() if o.arity == 1)
BITVEC = sorted(n for n, o in OPS.items() if o.kind == "bitvec")
REDUCING = sorted(n for n, o in OPS.items() if o.reduce is not None)
# Functions with libm/Sleef differences (docs/nki.md, "Agreement").
TRANSCENDENTAL = {"exp", "log", "tanh", "sigmoid", "silu", "gelu", "gelu_apprx_tanh", "softplus", "mish", "erf",
                  "sin", "cos", "tan", "arctan", "sqrt", "power"}


class Unit:
    """``body(*tiles)`` runs the instruction on SBUF tiles loaded from the
    inputs and returns the tile(s) to store. ``inputs``: how many tensors,
    and ``values`` how to draw them."""

    def __init__(self, body, dtypes, nin=1, values="any", shapes=SHAPES, tol=False):
        self.body, self.dtypes, self.nin, self.values, self.shapes, self.tol = body, dtypes, nin, values, shapes, tol


UNITS = {}


def unit(name, dtypes, nin=1, values="any", shapes=SHAPES, tol=False):
    def deco(body):
        UNITS[name] = Unit(body, dtypes, nin, values, shapes, tol)
        return body
    return deco


def _like(t, dtype=None, shape=None, buffer=nl.sbuf):
    return nl.ndarray(shape or t.shape, dtype=dtype or t.dtype, buffer=buffer)


# -- nki.isa ------------------------------------------------------------------------
@unit("nisa.dma_copy", ALL)
def _dma_copy(a):
    d = _like(a)
    nisa.dma_copy(dst=d, src=a)
    return d


@unit("nisa.dma_copy[dst_rmw_op]", ALL, nin=2)
def _dma_copy_rmw(a, b):
    d = _like(a)
    nisa.dma_copy(dst=d, src=a)
    nisa.dma_copy(dst=d, src=b, dst_rmw_op=nl.add)
    nisa.dma_copy(dst=d[:, 0:1], src=b[:, 1:2] if b.shape[1] > 1 else b, dst_rmw_op=nl.subtract)
    return d


def _copy_to(dtype):
    def body(a):
        d = _like(a, dtype)
        nisa.tensor_copy(dst=d, src=a)
        return d
    return body


for _dt in ALL:
    unit(f"nisa.tensor_copy->{str(_dt)[6:]}", ALL, shapes=[(64, 33)])(_copy_to(_dt))


@unit("nisa.memset", ALL)
def _memset(a):
    d = _like(a)
    v = True if a.dtype == torch.bool else (2.5 if a.dtype.is_floating_point else 7)
    nisa.memset(dst=d[:, : a.shape[1] // 2], value=v)
    nisa.memset(dst=d[:, a.shape[1] // 2:], value=0)
    return d


@unit("nisa.dma_transpose", ALL, shapes=[(1, 7), (64, 33), (128, 128)])
def _dma_transpose(a):
    d = _like(a, shape=(a.shape[1], a.shape[0]))
    nisa.dma_transpose(dst=d, src=a)
    return d


@unit("nisa.nc_transpose", FP, shapes=[(1, 7), (64, 33), (128, 128)])
def _nc_transpose(a):
    d = _like(a, nl.float32, (a.shape[1], a.shape[0]), nl.psum)
    nisa.nc_transpose(dst=d, data=a)
    return d


@unit("nisa.nc_matmul", FP, nin=2, values="small", shapes=[(1, 7), (64, 33), (128, 128)], tol=(1e-5, 1e-5))
def _nc_matmul(a, b):
    d = nl.ndarray((a.shape[1], b.shape[1]), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul(dst=d, stationary=a, moving=b)
    nisa.nc_matmul(dst=d, stationary=a, moving=b)  # accumulates
    return d


def _tensor_tensor(op):
    def body(a, b):
        d = _like(a)
        nisa.tensor_tensor(dst=d, data1=a, data2=b, op=OPS[op])
        return d
    return body


def _imm(op, dtype):
    if op in ("left_shift", "right_shift"):
        return 3
    return 5 if OPS[op].kind == "bitvec" else 1.5


def _tensor_scalar(op):
    def body(a, b):
        F = a.shape[1]
        d = _like(a, shape=(a.shape[0], 2 * F))
        nisa.tensor_scalar(dst=d[:, :F], data=a, op0=OPS[op], operand0=_imm(op, a.dtype))
        nisa.tensor_scalar(dst=d[:, F:], data=a, op0=OPS[op], operand0=b[:, 0:1], reverse0=True)
        return d
    return body


def _bitvec_dtypes(op):
    return INT + ODD if OPS[op].kind == "bitvec" else ALL


def _values_of(op):
    # power: integer tiles take bases and exponents in [-5, 5], whose powers
    # fp32 holds exactly; past 2^24 an ulp of libm against Sleef would move
    # the low bits an integer store keeps (wrapping).
    return "pow" if op == "power" else "any"


for _op in BINARY:
    _tol = _op in TRANSCENDENTAL
    unit(f"nisa.tensor_tensor[{_op}]", _bitvec_dtypes(_op), nin=2, values=_values_of(_op), tol=_tol)(
        _tensor_tensor(_op))
    unit(f"nisa.tensor_scalar[{_op}]", _bitvec_dtypes(_op), nin=2, values=_values_of(_op), tol=_tol)(
        _tensor_scalar(_op))


def _stt(op):
    def body(a, b):
        d = _like(a)
        nisa.scalar_tensor_tensor(dst=d, data=a, op0=OPS[op], operand0=b[:, 0:1], op1=nl.subtract, operand1=b)
        return d
    return body


for _op in BINARY:
    if OPS[_op].kind != "bitvec":
        unit(f"nisa.scalar_tensor_tensor[{_op}]", ALL, nin=2, values=_values_of(_op), tol=_op in TRANSCENDENTAL)(
            _stt(_op))


@unit("nisa.scalar_tensor_tensor+reduce", ALL, nin=2)
def _stt_reduce(a, b):
    d = _like(a, shape=(a.shape[0], a.shape[1] + 1))
    F = a.shape[1]
    nisa.scalar_tensor_tensor(dst=d[:, :F], data=a, op0=nl.multiply, operand0=b[:, 0:1], op1=nl.add, operand1=b,
                              reduce_op=nl.maximum, reduce_res=d[:, F:])
    return d


def _permuted(a):
    """``a`` [P, F] (F even) seen as [P, F/2, 2] with its free dims swapped:
    a permuted view, which the interpreter's reductions read in memory order."""
    return a.reshape((a.shape[0], a.shape[1] // 2, 2)).permute(0, 2, 1)


EVEN = [(1, 8), (64, 34), (128, 130)]


@unit("nisa.register_reductions[permuted]", ALL, nin=2, shapes=EVEN)
def _permuted_register_reductions(a, b):
    x, F = _permuted(a), a.shape[1]
    d = _like(a, nl.float32, (a.shape[0], F + 3))
    nisa.scalar_tensor_tensor(dst=d[:, :F], data=x, op0=nl.multiply, operand0=b[:, 0:1], op1=nl.add,
                              operand1=_permuted(b), reduce_op=nl.add, reduce_res=d[:, F:F + 1])
    nisa.tensor_scalar_reduce(dst=d[:, :F], data=x, op0=nl.add, operand0=0.5, reduce_op=nl.add,
                              reduce_res=d[:, F + 1:F + 2])
    nisa.activation(dst=d[:, :F], op=nl.abs, data=x, reduce_op=nl.add, reduce_res=d[:, F + 2:F + 3])
    return d


@unit("nisa.tensor_reduce[permuted]", FP + INT + ODD, shapes=EVEN)
def _permuted_tensor_reduce(a):
    x = _permuted(a)
    d = _like(a, nl.float32, (a.shape[0], 3))
    for i, op in enumerate((nl.add, nl.maximum, nl.minimum)):
        nisa.tensor_reduce(dst=d[:, i:i + 1], op=op, data=x, axis=(1, 2), keepdims=True)
    return d


@unit("nisa.register_reductions[broadcast]", FP + INT + ODD, nin=2, shapes=EVEN)
def _broadcast_register_reductions(a, b):
    # A broadcast data view (a zero stride): made contiguous first, its results
    # reduced in logical order (docs/nki.md, "Reduction order").
    P, F = a.shape
    x = a[:, 0:F // 2].expand_dim(1).broadcast(1, 2)  # [P, 2, F/2], stride 0
    d = _like(a, nl.float32, (P, F + 5))
    nisa.activation(dst=d[:, :F], op=nl.abs, data=x, reduce_op=nl.add, reduce_res=d[:, F:F + 1])
    nisa.tensor_scalar_reduce(dst=d[:, :F], data=x, op0=nl.add, operand0=0.5, reduce_op=nl.add,
                              reduce_res=d[:, F + 1:F + 2])
    nisa.tensor_scalar_reduce(dst=d[:, :F], data=x, op0=nl.multiply, operand0=1.5, reduce_op=nl.maximum,
                              reduce_res=d[:, F + 2:F + 3])
    nisa.scalar_tensor_tensor(dst=d[:, :F], data=x, op0=nl.subtract, operand0=1.0, op1=nl.multiply,
                              operand1=b, reduce_op=nl.add, reduce_res=d[:, F + 3:F + 4])
    nisa.activation(dst=d[:, :F], op=nl.square, data=x, reduce_op=nl.add, reduce_cmd=nisa.reduce_cmd.load_reduce,
                    reduce_res=d[:, F + 4:F + 5])
    pred = _like(a, nl.uint8, (P, 2, F // 2))
    nisa.tensor_scalar(dst=pred, data=b.reshape((P, 2, F // 2)), op0=nl.greater, operand0=0.0)
    e = _like(a, nl.float32, (P, F + 1))
    nisa.select_reduce(dst=e[:, :F], predicate=pred, on_true=x, on_false=-1.0, reduce_res=e[:, F:F + 1],
                       reduce_op=nl.maximum)
    return d, e


@unit("nisa.tensor_reduce[gathered]", FP + INT + ODD, shapes=EVEN)
def _gathered_tensor_reduce(a):
    # Views whose reduced elements are no contiguous run: a permuted view with
    # a dim kept, gaps between the reduced rows, a broadcast (zero stride) dim.
    # Reduced in their logical order (docs/nki.md, "Reduction order").
    P, F = a.shape
    x = _permuted(a)  # [P, 2, F/2]
    g = a.reshape((P, 2, F // 2))[:, :, 1:]
    d = _like(a, nl.float32, (P, 12))
    for i, op in enumerate((nl.add, nl.maximum, nl.minimum, nl.multiply)):
        nisa.tensor_reduce(dst=d[:, i:i + 1], op=op, data=x[:, 1, :] if op is nl.multiply else x, axis=(1, 2) if
                           op is not nl.multiply else 1, keepdims=True)
        nisa.tensor_reduce(dst=d[:, 4 + i:5 + i], op=op, data=g, axis=(1, 2), keepdims=True)
    nisa.tensor_reduce(dst=d[:, 8:10], op=nl.add, data=x, axis=2)
    nisa.tensor_reduce(dst=d[:, 10:12], op=nl.maximum, data=x, axis=2, negate=True)
    e = _like(a, nl.float32, (P, 1))
    nisa.tensor_reduce(dst=e, op=nl.add, data=x.permute(0, 2, 1)[:, 0:1, :], axis=(1, 2))
    return d, e


@unit("nisa.tensor_tensor_scan", ALL, nin=2, values="small")
def _scan(a, b):
    d = _like(a)
    nisa.tensor_tensor_scan(dst=d, data0=a, data1=b, initial=0.5, op0=nl.multiply, op1=nl.add)
    return d


def _tensor_reduce(op, negate):
    def body(a):
        d = _like(a, shape=(a.shape[0], 1))
        nisa.tensor_reduce(dst=d, op=OPS[op], data=a, axis=1, keepdims=True, negate=negate)
        return d
    return body


for _op in REDUCING:
    unit(f"nisa.tensor_reduce[{_op}]", _bitvec_dtypes(_op), values="small" if _op == "multiply" else "any")(
        _tensor_reduce(_op, _op == "maximum"))


def _activation(fn):
    def body(a, b):
        F = a.shape[1]
        d = _like(a, shape=(a.shape[0], F + 1))
        nisa.activation(dst=d[:, :F], op=OPS[fn], data=a, scale=0.75, bias=b[:, 0:1], reduce_op=nl.add,
                        reduce_res=d[:, F:])
        return d
    return body


for _fn in UNARY:
    unit(f"nisa.activation[{_fn}]", ALL, nin=2, tol=_fn in TRANSCENDENTAL)(_activation(_fn))


@unit("nisa.activation[reduce_cmd]", ALL, nin=2)
def _activation_cmds(a, b):
    F = a.shape[1]
    d = _like(a, nl.float32, (a.shape[0], F + 3))
    nisa.activation(dst=d[:, :F], op=nl.abs, data=a, reduce_op=nl.add, reduce_cmd=nisa.reduce_cmd.reset)
    nisa.activation(dst=d[:, :F], op=nl.abs, data=a, reduce_op=nl.add, reduce_cmd=nisa.reduce_cmd.reduce)
    nisa.activation(dst=d[:, :F], op=nl.relu, data=b, reduce_op=nl.add, reduce_cmd=nisa.reduce_cmd.reduce,
                    reduce_res=d[:, F:F + 1])
    return d


@unit("nisa.activation[load_reduce]", FP, nin=2)
def _activation_load(a, b):
    F = a.shape[1]
    d = _like(a, nl.float32, (a.shape[0], F + 1))
    nisa.activation(dst=d[:, :F], op=nl.abs, data=a, reduce_op=nl.add, reduce_cmd=nisa.reduce_cmd.load_reduce,
                    reduce_res=d[:, F:])
    return d


@unit("nisa.activation_reduce", ALL)
def _activation_reduce(a):
    F = a.shape[1]
    d = _like(a, nl.float32, (a.shape[0], F + 1))
    nisa.activation_reduce(dst=d[:, :F], op=nl.square, data=a, reduce_op=nl.add, reduce_res=d[:, F:])
    return d


@unit("nisa.reciprocal", ALL)
def _reciprocal(a):
    d = _like(a)
    nisa.reciprocal(dst=d, data=a)
    return d


@unit("nisa.exponential", FP, nin=2, tol=True)
def _exponential(a, b):
    F = a.shape[1]
    d = _like(a, nl.float32, (a.shape[0], F + 1))
    nisa.exponential(dst=d[:, :F], src=a, max_value=b[:, 0:1], reduce_res=d[:, F:],
                     reduce_cmd=nisa.reduce_cmd.reset_reduce)
    return d


@unit("nisa.tensor_scalar_reduce", ALL, nin=2)
def _tensor_scalar_reduce(a, b):
    F = a.shape[1]
    d = _like(a, nl.float32, (a.shape[0], F + 1))
    nisa.tensor_scalar_reduce(dst=d[:, :F], data=a, op0=nl.multiply, operand0=b[:, 0:1], reduce_op=nl.maximum,
                              reduce_res=d[:, F:])
    return d


@unit("nisa.bn_stats", FP + INT)
def _bn(a):
    s = _like(a, nl.float32, (a.shape[0], 6))
    nisa.bn_stats(dst=s, data=a)
    d = _like(a, nl.float32, (a.shape[0], 2))
    nisa.bn_aggr(dst=d, data=s)
    return s, d


UNITS["nisa.bn_aggr"] = UNITS["nisa.bn_stats"]


def _bn_groups(k):
    def body(a):
        F = a.shape[1]
        cuts = [F * i // k for i in range(k + 1)]
        s = _like(a, nl.float32, (a.shape[0], 6 * k))
        for i in range(k):
            nisa.bn_stats(dst=s[:, 6 * i:6 * i + 6], data=a[:, cuts[i]:cuts[i + 1]])
        d = _like(a, nl.float32, (a.shape[0], 2))
        nisa.bn_aggr(dst=d, data=s)
        return d
    return body


for _k in (2, 7):  # several bn_stats groups per partition
    unit(f"nisa.bn_aggr[{_k} groups]", FP + INT)(_bn_groups(_k))
for _k in (8, 20):  # 8+: the count column summed as a contiguous row on both (docs/nki.md)
    unit(f"nisa.bn_aggr[{_k} groups]", FP + INT, shapes=[(1, 24), (64, 40), (128, 130)])(_bn_groups(_k))


@unit("nisa.bn_aggr[raw data]", FP, shapes=[(1, 48), (64, 96), (128, 126)])
def _bn_aggr_raw(a):
    # Any values in the slots (not bn_stats output: counts that are not small integers).
    d = _like(a, nl.float32, (a.shape[0], 4))
    nisa.bn_aggr(dst=d[:, 0:2], data=a)
    nisa.bn_aggr(dst=d[:, 2:4], data=a.reshape((a.shape[0], 6, a.shape[1] // 6)).permute(0, 2, 1))  # permuted
    return d


@unit("nisa.tensor_partition_reduce", FP + INT)
def _partition_reduce(a):
    d = _like(a, shape=(1, a.shape[1]))
    nisa.tensor_partition_reduce(dst=d, op=nl.add, data=a)
    return d


@unit("nisa.tensor_partition_reduce[bitvec]", INT + ODD)
def _partition_reduce_bits(a):
    # Integer semantics (int64, no fp32 step: int32 values past 2^24 stay exact).
    d = _like(a, shape=(1, a.shape[1]))
    e = _like(a, shape=(1, a.shape[1]))
    nisa.tensor_partition_reduce(dst=d, op=nl.bitwise_and, data=a)
    nisa.tensor_partition_reduce(dst=e, op=nl.bitwise_or, data=a)
    return d, e


@unit("nisa.iota", [torch.float32, torch.int32])
def _iota(a):
    d = _like(a)
    nisa.iota(dst=d, pattern=[[1, a.shape[1]]], offset=3, channel_multiplier=a.shape[1])
    return d


@unit("nisa.affine_select", ALL)
def _affine_select(a):
    d = _like(a)
    nisa.affine_select(dst=d, pattern=[[-1, a.shape[1]]], offset=0, channel_multiplier=1, on_true_tile=a,
                       on_false_value=-9, cmp_op=nl.greater_equal)
    return d


@unit("nisa.select_reduce", FP, nin=2)
def _select_reduce(a, b):
    F = a.shape[1]
    pred = _like(a, nl.uint8)
    nisa.tensor_scalar(dst=pred, data=b, op0=nl.greater, operand0=0.0)
    d = _like(a, nl.float32, (a.shape[0], F + 1))
    nisa.select_reduce(dst=d[:, :F], predicate=pred, on_true=a, on_false=-1.0, reduce_res=d[:, F:],
                       reduce_op=nl.maximum)
    return d


@unit("nisa.max8", FP + INT, shapes=[(1, 8), (64, 33), (128, 130)])
def _max8(a):
    d = _like(a, nl.float32, (a.shape[0], 8))
    nisa.max8(dst=d, src=a)
    i = _like(a, nl.uint32, (a.shape[0], 8))
    nisa.nc_find_index8(dst=i, data=a, vals=d)
    return d, i


UNITS["nisa.nc_find_index8"] = UNITS["nisa.max8"]


@unit("nisa.dropout", ALL)
def _dropout(a):
    # (both executors draw from the same Philox key: _execute seeds torch's generator)
    d = _like(a)
    nisa.dropout(dst=d, data=a, prob=0.3)
    return d


# -- nki.language -------------------------------------------------------------------
def _nl_binary(op):
    def body(a, b):
        f = OPS[op]
        return f(a, b), f(a, b[:, 0:1]), f(a, _imm(op, a.dtype)), f(_imm(op, a.dtype), a)
    return body


def _nl_unary(op):
    def body(a):
        return OPS[op](a)
    return body


for _op in BINARY:
    unit(f"nl.{_op}", _bitvec_dtypes(_op), nin=2, values=_values_of(_op), tol=_op in TRANSCENDENTAL)(
        _nl_binary(_op))
for _op in UNARY:
    unit(f"nl.{_op}", ALL, tol=_op in TRANSCENDENTAL)(_nl_unary(_op))


@unit("nl.full", ALL)
def _nl_full(a):
    v = True if a.dtype == torch.bool else (-1.5 if a.dtype.is_floating_point else 3)
    return (nl.full(a.shape, v, a.dtype), nl.zeros(a.shape, a.dtype), nl.ones(a.shape, a.dtype),
            nl.zeros_like(a), nl.ones_like(a), nl.full_like(a, v))


for _n in ("zeros", "ones", "zeros_like", "ones_like", "full_like"):
    UNITS[f"nl.{_n}"] = UNITS["nl.full"]


@unit("nl.load", ALL)
def _nl_load(a):
    # (every unit loads its inputs with nl.load; this one also converts)
    h = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.hbm)
    nl.store(h, a)
    return nl.load(h), nl.load(h, dtype=nl.float32)


@unit("nl.store", ALL)
def _nl_store(a):
    # (every unit loads with nl.load and stores with nl.store; this one also
    # stores a number and assigns a tile.)
    d = _like(a)
    d[...] = a
    h = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.hbm)
    nl.store(h, d)
    nl.store(h[:, 0:1], 1)
    return nl.load(h)


@unit("nl.copy", ALL)
def _nl_copy(a):
    return nl.copy(a), nl.copy(a, dtype=nl.float32)


@unit("nl.load_transpose2d", ALL, shapes=[(1, 7), (64, 33), (128, 128)])
def _nl_load_transpose2d(a):
    h = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.hbm)
    nl.store(h, a)
    return nl.load_transpose2d(h)


@unit("nl.transpose", ALL, shapes=[(1, 7), (64, 33), (128, 128)])
def _nl_transpose(a):
    return nl.transpose(a)


@unit("nl.matmul", FP, nin=2, values="small", shapes=[(1, 7), (64, 33), (128, 128)], tol=(1e-5, 1e-5))
def _nl_matmul(a, b):
    return nl.matmul(a, b, transpose_x=True), nl.matmul(nl.transpose(a), b)


def _nl_reduction(name):
    def body(a):
        f = getattr(nl, name)
        return f(a, axis=1), f(a, axis=1, keepdims=True, dtype=nl.float32)
    return body


for _n in ("sum", "max", "min", "mean", "var", "prod", "all"):
    unit(f"nl.{_n}", ALL, values="small" if _n == "prod" else "any")(_nl_reduction(_n))


def _nl_reduction_other_axes(name):
    # The partition axis, a non-trailing free axis, both, and trailing axes
    # of a view with gaps: the reduced axes moved last (docs/nki.md).
    def body(a):
        f = getattr(nl, name)
        x = a.reshape((a.shape[0], 2, a.shape[1] // 2))
        return (f(a, axis=0, keepdims=True), f(x, axis=1, keepdims=True, dtype=nl.float32), f(x, axis=(0, 2)),
                f(x[:, :, 1:], axis=(1, 2)), f(x, axis=(0, 1, 2), keepdims=True))
    return body


for _n in ("sum", "max", "min", "mean", "var", "prod", "all"):
    unit(f"nl.{_n}[other axes]", ALL, values="small" if _n == "prod" else "any",
         shapes=[(1, 8), (64, 34), (128, 130)])(_nl_reduction_other_axes(_n))


@unit("nl.softmax", ALL, tol=True)
def _nl_softmax(a):
    return nl.softmax(a, axis=1)


@unit("nl.softmax[axis=0]", ALL, tol=True)
def _nl_softmax_partitions(a):
    return nl.softmax(a, axis=0)


@unit("nl.softmax[3-D]", ALL, tol=True, shapes=[(1, 8), (64, 34), (128, 130)])
def _nl_softmax_3d(a):
    x = a.reshape((a.shape[0], 2, a.shape[1] // 2))
    return nl.softmax(x, axis=1), nl.softmax(x, axis=-1)


@unit("nl.rms_norm", ALL, nin=2)
def _nl_rms_norm(a, b):
    return nl.rms_norm(a, b[0:1, :], axis=1, n=a.shape[1])


@unit("nl.rms_norm[3-D]", ALL, nin=2, shapes=[(1, 8), (64, 34), (128, 130)])
def _nl_rms_norm_3d(a, b):
    x = a.reshape((a.shape[0], 2, a.shape[1] // 2))
    w = b[0:1, :].reshape((1, 2, a.shape[1] // 2))
    return nl.rms_norm(x, w, axis=(1, 2), n=a.shape[1]), nl.rms_norm(x, w, axis=2, n=a.shape[1] // 2)


@unit("nl.rms_norm[other axes]", ALL, nin=2, shapes=[(1, 8), (64, 34), (128, 130)])
def _nl_rms_norm_other_axes(a, b):
    x = a.reshape((a.shape[0], 2, a.shape[1] // 2))
    w = b[0:1, :].reshape((1, 2, a.shape[1] // 2))
    return (nl.rms_norm(a, b[:, 0:1], axis=0, n=a.shape[0]), nl.rms_norm(x, w, axis=1, n=2),
            nl.rms_norm(x, b[:, 0:2].reshape((a.shape[0], 2, 1)), axis=(0, 2), n=a.shape[1]),
            nl.rms_norm(x, w, axis=2, n=np.int64(a.shape[1] // 2), epsilon=np.float32(1e-5)))  # numpy numbers


@unit("nl.where", ALL, nin=2)
def _nl_where(a, b):
    return nl.where(a, a, b), nl.where(b, 2.0, a)


@unit("nl.where[wide ints]", ALL)
def _nl_where_wide_ints(a):
    # Integers past fp32's exact range: the interpreter's torch.where is int64.
    return nl.where(a, 2**31 - 1, -(2**31) + 5), nl.where(a, 3 * 2**30 + 7, 2**25 + 1, dtype=nl.uint32)


@unit("nl.where[wider ints]", ALL)
def _nl_where_wider_ints(a):
    # Past 2^53 and past int32: the interpreter's int64 values, stored wrapped.
    return (nl.where(a, 2**60 + 2**33 + 9, -(2**55) - 3, dtype=nl.int32),
            nl.where(a, 2**53 + 1, 2**40 - 1, dtype=nl.uint32), nl.where(a, -(2**62), 2**31 + 5, dtype=nl.int32),
            nl.where(a, 2**40 + 2**15 + 3, -(2**33) - 1, dtype=nl.int16), nl.where(a, 2**54 + 3, 1, dtype=nl.float32))


@unit("nl.where[number condition]", ALL, nin=2)
def _nl_where_number_condition(a, b):
    return nl.where(1, a, b), nl.where(0, a, 2.5), nl.where(0.0, a, -7), nl.where(True, -0.0, b)


@unit("nl.broadcast_to", ALL)
def _nl_broadcast_to(a):
    return nl.broadcast_to(a[:, 0:1], a.shape)


@unit("nl.broadcast_to[new dims]", ALL, shapes=[(1, 7), (64, 33)])
def _nl_broadcast_to_new_dims(a):
    return nl.broadcast_to(a, (2,) + tuple(a.shape))  # torch's expand: a new leading dim


@unit("nl.shared_identity_matrix", [torch.float32, torch.bfloat16], shapes=[(1, 7), (64, 33)])
def _nl_identity(a):
    return nl.shared_identity_matrix(a.shape[0], dtype=a.dtype)


@unit("nl.rand", FP)
def _nl_rand(a):
    return nl.rand(a.shape, dtype=a.dtype), nl.rand((a.shape[0], 3))  # two streams


@unit("nl.dropout", ALL)
def _nl_dropout(a):
    return nl.dropout(a, 0.25)


@unit("nl.device_print", [torch.float32], shapes=[(1, 7)])
def _nl_device_print(a):
    nl.device_print("differential test:", a)
    return nl.copy(a)


@unit("nl.while_loop", [torch.float32, torch.int32], shapes=[(1, 7)])
def _nl_while_loop(a):
    n = nl.full((1, 1), 3, nl.float32)
    acc = nl.copy(a)

    def cond(state):
        return nl.greater(state[0], 0.0)

    def body(state):
        cnt, x = state
        nisa.tensor_scalar(dst=cnt, data=cnt, op0=nl.subtract, operand0=1.0)
        nisa.tensor_tensor(dst=x, data1=x, data2=a, op=nl.add)
        return state
    nl.while_loop(cond, body, (n, acc))
    return acc


# Names of nki.language that are not instructions: allocation without a write,
# views, dtypes, buffers, SPMD ids, trace-time loops and constants.
NOT_INSTRUCTIONS = {
    "ndarray", "empty_like", "expand_dims", "program_id", "num_programs", "program_ndim", "range", "affine_range",
    "sequential_range", "static_range", "ds", "fori_loop", "tile_size", "sbuf", "psum", "hbm", "private_hbm",
    "shared_hbm", "bool_", "int8", "int16", "int32", "uint8", "uint16", "uint32", "float16", "bfloat16",
    "tfloat32", "float32", "float8_e4m3", "float8_e4m3fn", "float8_e5m2", "ElementwiseOp", "NkiTensor",
    "get_nc_version", "engine", "reduce_cmd", "nc_version",
}

# -- coverage -------------------------------------------------------------------------
# Units the interpreter runs and the native executor refuses, with the reason
# (none: a new instruction the executor cannot lower goes here until it can).
INTERPRETER = {}

NATIVE = set(UNITS) - set(INTERPRETER)


def _native_expected(name, dtype):
    return name in NATIVE and not _fp8_to_int(name, dtype)


# maximum/minimum of +0 and -0: torch returns either zero, by position (its
# vectorised loop returns the second operand, its scalar tail the first).
# (The same for the units whose register reduction is a maximum, and max8:
# torch.topk orders equal values either way.)
SIGNED_ZERO = {n for n in UNITS if n.endswith(("[maximum]", "[minimum]")) or n in ("nl.maximum", "nl.minimum")} | {
    "nisa.tensor_scalar_reduce", "nisa.scalar_tensor_tensor+reduce", "nisa.select_reduce", "nisa.max8",
    "nisa.nc_find_index8", "nisa.tensor_reduce[permuted]", "nisa.register_reductions[broadcast]"}


def _fp8_to_int(name, dtype):
    # torch's round has no fp8 kernel: the interpreter raises (so does native).
    if dtype not in (torch.float8_e4m3fn, torch.float8_e5m2) or "->" not in name:
        return False
    dst = getattr(torch, name.split("->")[1])
    return not dst.is_floating_point and dst != torch.bool


# -- the kernel ------------------------------------------------------------------------
@nki.jit
def _run_unit(name, a, b=None):
    tiles = [nl.load(t) for t in (a, b) if t is not None]
    r = UNITS[name].body(*tiles)
    outs = []
    for t in r if isinstance(r, tuple) else (r,):
        o = nl.ndarray(t.shape, dtype=t.dtype, buffer=nl.shared_hbm)
        nl.store(o, t)
        outs.append(o)
    return tuple(outs)


def _values(dtype, shape, how, seed):
    g = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        return torch.rand(shape, generator=g) < 0.5
    if not dtype.is_floating_point:
        info = torch.iinfo(dtype)
        lo, hi = (max(info.min, -9), min(info.max, 9)) if how == "small" else \
            (max(info.min, -5), min(info.max, 5)) if how == "pow" else (info.min, info.max)
        x = torch.randint(max(lo, -(2**31)), min(hi, 2**31 - 1) + 1, shape, generator=g, dtype=torch.int64)
        if dtype == torch.uint32 and how not in ("small", "pow"):
            x = x * 2 + 1
        k = 5 if how == "pow" else 9
        x[:, :: 3] = torch.randint(max(lo, -k), min(hi, k) + 1, x[:, ::3].shape, generator=g)  # some small ones
        flat = x.reshape(-1)
        flat[:2] = torch.tensor([lo, hi])[: flat.numel()]
        return x.to(dtype)
    scale = 1.0 if how == "small" else 4.0
    x = torch.randn(shape, generator=g) * scale
    if how != "small":
        special = torch.tensor([0.0, -0.0, 0.5, -2.5, 1e-3, 300.0, float("inf"), -float("inf"), float("nan")])
        flat = x.reshape(-1)
        n = min(flat.numel(), special.numel())
        flat[:n] = special[:n]
    return x.to(dtype)


def _bits(t):
    t = t.contiguous()
    if t.dtype == torch.bool:
        return t.to(torch.uint8)
    return t.view({1: torch.uint8, 2: torch.int16, 4: torch.int32}[t.element_size()])


def _agree(out, ref, tol, label, signed_zero=False):
    assert out.dtype == ref.dtype and out.shape == ref.shape, label
    if out.dtype.is_floating_point:
        nan = ref.isnan()
        assert torch.equal(out.isnan(), nan), f"{label}: NaNs differ"
    else:
        nan = torch.zeros(out.shape, dtype=torch.bool)
    o, r = out[~nan], ref[~nan]
    if signed_zero and out.dtype.is_floating_point:
        o, r = o.float() + 0, r.float() + 0  # -0 + 0 is +0
    if not tol:
        bad = _bits(o) != _bits(r)
        assert not bad.any(), f"{label}: {int(bad.sum())} elements differ, e.g. native {o[bad][:4]} vs " \
                              f"interpreter {r[bad][:4]}"
        return
    # Tolerance rows: a few fp32 ulp (docs/nki.md), plus one unit in the last
    # place of a low-precision (or integer) result they round into.
    of, rf = o.double(), r.double()
    inf = rf.isinf()
    assert torch.equal(of[inf], rf[inf]), f"{label}: infinities differ"
    ulp = 1.0 if not out.dtype.is_floating_point else torch.finfo(out.dtype).eps
    rtol, atol = (4e-6, 2e-5) if tol is True else tol
    d = (of - rf).abs()[~inf]
    lim = max(rtol, 2 * ulp) * rf.abs()[~inf] + max(atol, ulp)
    assert (d <= lim).all(), f"{label}: max difference {d.max()} over the tolerance"


def _execute(mode, name, args, monkeypatch):
    monkeypatch.setenv("NKI_EXECUTOR", mode)
    torch.manual_seed(23)  # the same Philox key for both executors (nl.rand, dropout)
    return _run_unit(name, *args)


@pytest.mark.parametrize("name,dtype", [(n, d) for n in sorted(UNITS) for d in UNITS[n].dtypes],
                         ids=lambda v: str(v).replace("torch.", "") if isinstance(v, torch.dtype) else v)
def test_executors_agree(name, dtype, monkeypatch):
    u = UNITS[name]
    if name == "nisa.exponential":
        monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", "trn3")
    for i, shape in enumerate(u.shapes):
        shape2 = (shape[0], shape[1]) if name not in ("nisa.nc_matmul", "nl.matmul") else (shape[0], 19)
        args = [_values(dtype, shape, u.values, 1 + i)] + ([_values(dtype, shape2, u.values, 100 + i)]
                                                             if u.nin == 2 else [])
        if name.startswith("nl.rms_norm"):
            args[1] = args[1].abs() if dtype.is_floating_point else args[1]
        label = f"{name} {dtype} {list(shape)}"
        if _fp8_to_int(name, dtype):
            for mode in ("interpreter", "native"):
                with pytest.raises(NKIError):
                    _execute(mode, name, args, monkeypatch)
            continue
        ref = _execute("interpreter", name, args, monkeypatch)
        if not _native_expected(name, dtype):
            with pytest.raises(NKIError, match="does not cover"):
                _execute("native", name, args, monkeypatch)
            continue
        out = _execute("native", name, args, monkeypatch)
        for k, (o, r) in enumerate(zip(out, ref)):
            _agree(o, r, u.tol, f"{label} output {k}", name in SIGNED_ZERO)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int32])
def test_product_over_several_axes(dtype, monkeypatch):
    # The interpreter multiplies one axis at a time (the last first): natively
    # one tensor_reduce record per axis, through fp32 temporaries.
    x = _values(dtype, (96, 6 * 40), "small", 9).reshape(96, 6, 40)

    @nki.jit
    def kernel(a):
        t = nl.load(a)
        d = nl.ndarray((a.shape[0], 1, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_reduce(dst=d, op=nl.multiply, data=t, axis=(1, 2), keepdims=True)
        outs = []
        for r in (d, nl.prod(t, axis=(1, 2)), nl.prod(t, axis=2)):
            o = nl.ndarray(r.shape, dtype=r.dtype, buffer=nl.shared_hbm)
            nl.store(o, r)
            outs.append(o)
        return tuple(outs)
    monkeypatch.setenv("NKI_EXECUTOR", "interpreter")
    ref = kernel(x)
    monkeypatch.setenv("NKI_EXECUTOR", "native")
    out = kernel(x)
    for k, (o, r) in enumerate(zip(out, ref)):
        _agree(o, r, False, f"prod {dtype} output {k}")


@pytest.mark.parametrize("device", ["cpu", "neuron"])
def test_device_print_same_text(device, capsys, monkeypatch):
    # The native executor prints its snapshots after the launch: the same lines, in order.
    a = _values(torch.float32, (4, 6), "any", 5).to(device)
    b = _values(torch.bfloat16, (4, 6), "any", 6).to(device)

    @nki.jit
    def kernel(x, y):
        t = nl.load(x)
        nl.device_print("x:", t)
        u = nl.multiply(t, 2.0)
        nl.device_print("2x:", u)
        nl.device_print("y:", nl.load(y))
        o = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        nl.store(o, u)
        return o
    text = {}
    for mode in ("interpreter", "native"):
        monkeypatch.setenv("NKI_EXECUTOR", mode)
        capsys.readouterr()
        kernel(a, b)
        text[mode] = capsys.readouterr().out
    assert text["native"] == text["interpreter"]
    assert text["native"].index("x:") < text["native"].index("2x:") < text["native"].index("y:")
    assert "nan" in text["native"] and "inf" in text["native"]  # the special values printed


def test_every_instruction_has_units():
    isa = {n for n in nisa.__all__ if inspect.isfunction(getattr(nisa, n))} - NOT_INSTRUCTIONS
    lang = set(nl.__all__) - NOT_INSTRUCTIONS
    def has(n):  # "nisa.tensor_tensor[add]", "nisa.tensor_copy->int8", ...
        return any(u == n or u.startswith((n + "[", n + "->", n + "+")) for u in UNITS)
    missing = sorted(f"nisa.{n}" for n in isa if not has(f"nisa.{n}")) + \
        sorted(f"nl.{n}" for n in lang if not has(f"nl.{n}"))
    assert not missing, f"instructions without a differential unit: {missing}"
    # Every op of the table is an nl elementwise op and an op= of the engines.
    for op in OPS:
        assert f"nl.{op}" in UNITS
        kind = "activation" if OPS[op].arity == 1 else "tensor_tensor"
        assert f"nisa.{kind}[{op}]" in UNITS


def test_every_unit_is_classified():
    assert set(INTERPRETER) <= set(UNITS), sorted(set(INTERPRETER) - set(UNITS))
    assert NATIVE | set(INTERPRETER) == set(UNITS)


def coverage_table():
    """docs/nki.md's coverage table, one row per instruction or op with its
    units (forms) and (unit, dtype) cases (``python -c "import
    tests.test_nki_differential as t; print(t.coverage_table())"``)."""
    groups = {}
    for n in sorted(UNITS):
        groups.setdefault(n.split("[")[0].split("->")[0].split("+")[0], []).append(n)
    rows = ["| instruction | units | cases | executor |", "|---|---|---|---|"]
    for base, names in groups.items():
        how = "; ".join(f"`{n}` interpreter: {INTERPRETER[n]}" for n in names if n in INTERPRETER) or "native"
        rows.append(f"| `{base}` | {len(names)} | {sum(len(UNITS[n].dtypes) for n in names)} | {how} |")
    return "\n".join(rows)


def test_docs_show_the_coverage_table():
    import pathlib
    doc = (pathlib.Path(__file__).parent.parent / "docs" / "nki.md").read_text()
    assert coverage_table() in doc, "docs/nki.md's coverage table is stale: paste coverage_table()"
