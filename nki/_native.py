"""Native execution of traced programs.

The runtime's NKI executor (csrc/runtime/nki, C++ without torch) runs a
lowered program: a table of instruction records (opcode, ALU/activation
function, strided views of the buffers), partition row by partition row with
vectorised inner loops, all instructions in one kernel launch on the current
neuron stream. This module is the lowering, a pass in Python at a program's
first launch; the device executor's ``native_program`` (``torch_neuronx._C._NkiProgram``) checks the table once and
runs it over the tensors' memory.

Results are bit-identical to the interpreter (nki/_exec.py), which stays the
reference and the fallback: a program with an instruction the executor does
not cover (see ``_lower_instr``) runs on the interpreter. ``NKI_EXECUTOR``
chooses: ``auto`` (default), ``native`` (an uncovered program raises) or
``interpreter``.

On-chip buffers live in one arena: each storage gets an offset that no other
storage uses during its lifetime, so a loop's tiles reuse the same (cached)
memory. A buffer whose first use does not overwrite all of it is filled with
the NaN sentinel first, as the interpreter's fresh buffers are (outputs too,
unless the kernel writes all of them); a destination nothing reads afterwards
is not stored.

One module over 600 lines on purpose: the lowering is one pass over the
program whose cases share the buffer, dtype and arena bookkeeping; the record
layout it writes is checked against the runtime's at first use."""
import math
import os
import platform
import re
import struct

import numpy as np

import torch

from . import _device, _dtypes, _philox
from ._errors import NKIError
from ._tensor import NkiTensor, _contiguous_strides

MAX_DIMS, MAX_VIEWS, HEADER = 8, 5, 16
VIEW_WORDS = 3 + 2 * MAX_DIMS
RECORD = HEADER + MAX_VIEWS * VIEW_WORDS
(OP_FILL, OP_COPY, OP_TT, OP_TS, OP_STT, OP_ACT, OP_TRED, OP_NOP, OP_MM, OP_SEL, OP_IOTA, OP_SCAN,
 OP_REG, OP_VAR, OP_BITS, OP_PRED, OP_TOPK, OP_RAND) = range(18)
# Control records (Program.h, numbered apart): a device loop's head and back-edge.
OP_WHILE, OP_END = 64, 65
_CONTROL = ("while", "end")
# Bitvector ops of OP_BITS (Program.h BitOp): integer rows computed in int64, as the interpreter does.
_BIT = {"bitwise_and": 0, "bitwise_or": 1, "bitwise_xor": 2, "left_shift": 3, "right_shift": 4}
# Buffer element types (csrc/runtime/nki/Program.h DType): rows load as fp32
# and store back with torch's conversions (rounding, saturation, wrapping).
_DTYPES = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2, torch.float8_e4m3fn: 3, torch.float8_e5m2: 4,
           torch.int32: 5, torch.int16: 6, torch.int8: 7, torch.uint8: 8, torch.uint16: 9, torch.uint32: 10,
           torch.bool: 11}
_FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)
_ALU = {n: i for i, n in enumerate(["add", "subtract", "multiply", "divide", "maximum", "minimum", "equal",
                                      "not_equal", "greater", "greater_equal", "less", "less_equal", "fmod",
                                      "logical_and", "logical_or", "logical_xor", "power"])}
# Activation functions (csrc/runtime/nki/Program.h). EXACT_FN are bit-identical
# to the interpreter; the others use libm (sqrt: correctly rounded, which torch's
# vectorised sqrt is not always) and agree within a few ulp (docs/nki.md).
_FN_NAMES = ["copy", "square", "relu", "rsqrt", "sqrt", "reciprocal", "abs", "negative", "ceil", "floor", "trunc",
             "exp", "log", "tanh", "sigmoid", "silu", "gelu", "gelu_apprx_tanh", "softplus", "mish", "erf", "sin",
             "cos", "tan", "arctan", "sign", "logical_not"]
_FN = {n: i for i, n in enumerate(_FN_NAMES)}
_FN["identity"] = 0
EXACT_FN = (set(_FN_NAMES[:11]) | {"identity", "sign", "logical_not"}) - {"sqrt"}
_CMD = {"idle": 0, "reduce": 2, "reset_reduce": 3, "reset": 4}
_ENGINE = {"vector": 0, "scalar": 1}
_ALIGN = 64
_LOOP_CAP = re.compile(r"nki\.language\.while_loop: more than \d+ iterations")


class Unsupported(Exception):
    """The executor does not cover this program (the interpreter runs it)."""


def mode():
    m = os.environ.get("NKI_EXECUTOR", "auto")
    if m not in ("auto", "native", "interpreter"):
        raise NKIError(f"NKI_EXECUTOR={m!r}: expected auto, native or interpreter")
    return m


def _check_machine():
    # torch's CPU sum accumulates Vectorized<float>::size() lanes: its order
    # is part of the result, and the executor reproduces it. Its sum kernel
    # has no AVX512 build (REGISTER_DISPATCH), so x86 runs the 8-lane one,
    # which the executor implements; other machines use the interpreter.
    if platform.machine().lower() not in ("x86_64", "amd64"):
        raise Unsupported(f"{platform.machine()} (the executor reproduces x86 sums)")


def _executor():
    ex = _device.native_executor()
    if ex is None:
        raise Unsupported("no device backend with a native executor is registered (nki/_device.py)")
    if tuple(ex.native_layout) != (MAX_DIMS, MAX_VIEWS, HEADER, RECORD):
        raise RuntimeError(f"the runtime's NKI record layout {ex.native_layout} does not match nki/_native.py")
    return ex


# -- lowering --------------------------------------------------------------
def _is_tensor(x):
    return hasattr(x, "storage") and hasattr(x, "strides")


class _Lowering:
    def __init__(self, program, precise):
        self.program = program
        self.dtypes = {}
        for st in program.storages.values():
            if getattr(st, "reinterpret_of", None) is not None:
                raise Unsupported("dtype-reinterpreting views")
            dtype = st.dtype
            if not precise and st.buffer.on_chip and dtype.is_floating_point:
                dtype = torch.float32
            if dtype not in _DTYPES:
                raise Unsupported(f"{_dtypes.name(st.dtype)} tensors")
            self.dtypes[st.id] = dtype
        self.words, self.imms = [], []
        self.access = []  # per record: (written views, read views)
        self.psum = {}  # PSUM storage id -> which elements were written

    def view(self, v):
        if v.ndim > MAX_DIMS or v.ndim == 0:
            raise Unsupported(f"a {v.ndim}-D view")
        shape = list(v.shape) + [1] * (MAX_DIMS - v.ndim)
        strides = list(v.strides) + [0] * (MAX_DIMS - v.ndim)
        return [v.storage.id, v.ndim, v.offset] + shape + strides

    def emit(self, opcode, views, header=(), imms=(0.0, 0.0), written=1):
        self.access.append((list(views[:written]), list(views[written:])))
        w = [opcode] + list(header)
        w += [-1] * (HEADER - len(w))
        for v in views:
            w += self.view(v)
        w += [0] * (RECORD - len(w))
        self.words.append(w)
        self.imms.append(list(imms) + [0.0] * (2 - len(imms)))


def _alu(impl):
    if impl is None or impl.name not in _ALU:
        raise Unsupported(f"op nl.{getattr(impl, 'name', None)}")
    return _ALU[impl.name]


def _same_view(a, b):
    return a.storage.id == b.storage.id and (a.shape, a.strides, a.offset) == (b.shape, b.strides, b.offset)


def _rows_ok(v):
    """Free dims in row-major order: the interpreter's fp32 intermediate of
    this operand is then laid out row-major too (what its sums iterate)."""
    free = [(s, n) for s, n in zip(v.strides[1:], v.shape[1:]) if n > 1]
    return all(s > 0 for s, _n in free) and all(a[0] >= b[0] * b[1] for a, b in zip(free, free[1:]))


def _operand(low, x, views):
    """A per-partition operand: (slot word, immediate)."""
    if _is_tensor(x):
        views.append(x)
        return len(views) - 1, 0.0
    return -1, float(torch.tensor(float(x), dtype=torch.float32))


def _elements(v):
    """Flat element indices of a view (numpy), to track PSUM writes."""
    base = np.arange(v.storage.numel, dtype=np.int64)
    return np.lib.stride_tricks.as_strided(base[v.offset:], v.shape, [s * 8 for s in v.strides]).reshape(-1)


def _permuted(v, axes):
    """``v`` with its dims reordered: an on-chip view may then cross
    partitions, which only a record run whole may read."""
    return NkiTensor(v.storage, tuple(v.shape[d] for d in axes), tuple(v.strides[d] for d in axes), v.offset,
                     _check=False)


def _check_copy(low, dst, src):
    # torch cannot round fp8 values (the interpreter's float -> integer store raises).
    if low.dtypes[src.storage.id] in _FP8 and not low.dtypes[dst.storage.id].is_floating_point and \
            low.dtypes[dst.storage.id] != torch.bool:
        raise Unsupported("an fp8 -> integer copy")


def _lower_matmul(low, a):
    dst, st, mv = a["dst"], a["stationary"], a["moving"]
    if a.get("transpose_stationary"):  # nl.matmul(x, y): x is [M, K], the record takes [K, M]
        st = _permuted(st, (1, 0))
    add = a["accumulate"]
    if add is None:
        # The first write to a PSUM element since its allocation overwrites,
        # later ones add: decided here, per instruction, from the trace (on
        # the PSUM tile itself, which DMA elision may have mapped onto HBM).
        odst = low.orig[1]["dst"]
        written = low.psum.get(odst.storage.id)
        hit = written[_elements(odst)] if written is not None else np.zeros(1, bool)
        if hit.all() != hit.any():
            raise Unsupported("a matmul into a partly written PSUM tile")
        if low.depth and not hit.any():
            # (the interpreter overwrites in the first iteration and accumulates in the next)
            raise Unsupported("a matmul into a fresh PSUM tile inside a device loop")
        add = bool(hit.all())
    low.emit(OP_MM, [dst, st, mv], [0, 0, int(add)])
    return dst, [st, mv]


def _lower_instr(low, ins, ir, dead):
    kind, a = ir
    if kind == "matmul":
        return _lower_matmul(low, a)
    if kind == "copy":
        dst, src = a["dst"], a["src"]
        _check_copy(low, dst, src)
        low.emit(OP_COPY, [dst, src])
        return dst, [src]
    if kind == "transpose":
        # A flat copy from the permuted source: row p of dst reads across the
        # source's partitions, so threads meet where it is written or read
        # (_schedule).
        dst, src = a["dst"], _permuted(a["src"], a["axes"])
        _check_copy(low, dst, src)
        low.emit(OP_COPY, [dst, src])
        return dst, [src]
    if kind == "memset":
        dst, value = a["dst"], a["value"]
        if not isinstance(value, (int, float)):
            raise Unsupported("memset of a non-number")
        try:  # the interpreter's fill_: its conversion, and its overflow error
            v = torch.empty(1, dtype=low.dtypes[dst.storage.id]).fill_(value)
        except RuntimeError as e:
            raise Unsupported(f"memset: {e}") from None
        low.emit(OP_FILL, [dst], imms=(float(v.item() if not v.dtype.is_floating_point else v.float().item()),))
        return dst, []
    if kind == "iota":
        return _lower_iota(low, a)
    if kind == "select":
        return _lower_select(low, a, dead)
    if kind == "scan":
        return _lower_scan(low, a, dead)
    if kind == "registers":
        return _lower_registers(low, a)
    if kind == "bits":
        return _lower_bits(low, a, dead)
    if kind == "random":
        return _lower_random(low, a, dead)
    if kind == "topk":
        # max8 / nc_find_index8: a row of 8 per partition from the whole data row.
        dst, data = a["dst"], a["data"]
        views = [dst, data] + ([a["vals"]] if a["mode"] == 1 else [])
        if dst.shape[0] != data.shape[0] or dst.shape[0] > 128 or any(v.shape[0] != dst.shape[0] for v in views):
            raise Unsupported("partition mismatch")
        if any(v.storage.id == dst.storage.id for v in views[1:]):
            raise Unsupported("a top-8 into its own input")
        low.emit(OP_TOPK, views, [int(dead), 0, a["mode"]])
        return dst, views[1:]
    if kind == "partition_reduce":
        return _lower_partition_reduce(low, a)
    if kind == "variance":
        dst, data = a["dst"], a["data"]
        _rowwise_operands(dst, [])
        if data.shape[0] != dst.shape[0] or dst.storage.id == data.storage.id:
            raise Unsupported("a variance into its own input")
        m = _trailing_group(data, a["axes"])
        _check_sum(data, m)
        low.emit(OP_VAR, [dst, data], [int(dead), 0, m])
        return dst, [data]
    dst, data = a["dst"], a["data"]
    if data.shape[0] != dst.shape[0] or data.shape[0] > 128:
        raise Unsupported("partition mismatch")
    views = [dst, data]
    if kind == "tensor_tensor":
        op = _alu(a["op"])
        views.append(a["data2"])
        header = [op]
        imms = ()
    elif kind == "tensor_scalar":
        s0, i0 = _operand(low, a["operand0"], views)
        header = [_alu(a["op0"]), int(a["reverse0"]), s0]
        i1 = 0.0
        if a["op1"] is not None:
            s1, i1 = _operand(low, a["operand1"], views)
            header += [_alu(a["op1"]), int(a["reverse1"]), s1]
        else:
            header += [-1, 0, -1]
        imms = (i0, i1)
    elif kind == "scalar_tensor_tensor":
        if a["reduce"]:
            raise Unsupported("scalar_tensor_tensor with a reduction")
        views.append(a["operand1"])
        s0, i0 = _operand(low, a["operand0"], views)
        header = [_alu(a["op0"]), int(a["reverse0"]), s0, _alu(a["op1"]), int(a["reverse1"])]
        imms = (i0,)
    elif kind == "activation":
        fn = a["op"]
        if fn.name not in _FN:
            raise Unsupported(f"activation nl.{fn.name}")
        cmd, res = a["cmd"], a["reduce_res"]
        cmd = "reset_reduce" if cmd == "idle" and res is not None else cmd
        if cmd not in _CMD:
            raise Unsupported(f"reduce_cmd {cmd}")
        if cmd in ("reduce", "reset_reduce"):
            if a["reduce_op"] is None or a["reduce_op"].name != "add":
                raise Unsupported("activation reduction other than add")
            _check_sum(data)
        ss, iscale = _operand(low, a["scale"], views)
        if a["bias"] is None:
            sb, ibias = -2, 0.0
        else:
            sb, ibias = _operand(low, a["bias"], views)
        rslot = -1
        if res is not None:
            views.append(res)
            rslot = len(views) - 1
        header = [_FN[fn.name], 0, ss, sb, _CMD[cmd], rslot, _ENGINE[a["engine"]]]
        imms = (iscale, ibias)
    elif kind == "tensor_reduce":
        op = a["op"]
        if op.name not in ("add", "maximum", "minimum", "multiply"):
            raise Unsupported(f"tensor_reduce nl.{op.name}")
        m = _trailing_group(data, a["axes"])
        if op.name in ("add", "multiply"):
            _check_sum(data, m)
        if op.name == "multiply" and sum(data.shape[d] > 1 for d in a["axes"]) > 1:
            # (the interpreter multiplies one axis at a time, the last first: isa._product_parts)
            raise Unsupported("a product over several axes in one record")
        header = [_alu(op), m, int(a["negate"])]
        imms = ()
    else:
        raise Unsupported(ins.name)
    if len(views) > MAX_VIEWS:
        raise Unsupported("too many operands")
    # Stage the result when dst shares memory with a source, unless the source
    # is read at the same position it is written (the same view, elementwise).
    # (Per-partition operands are read per row, after the row's first store.)
    elementwise = views[1:3] if kind == "tensor_tensor" else views[1:2]
    staged = any(v.storage.id == dst.storage.id and not (kind != "scalar_tensor_tensor" and any(
        v is e for e in elementwise) and _same_view(v, dst)) for v in views[1:])
    header = [int(dead), int(staged)] + header
    low.emit({"tensor_tensor": OP_TT, "tensor_scalar": OP_TS, "scalar_tensor_tensor": OP_STT,
              "activation": OP_ACT, "tensor_reduce": OP_TRED}[kind], views, header, imms)
    if kind == "activation" and a["reduce_res"] is not None:
        low.access[-1][0].append(a["reduce_res"])
    return dst, views[1:]


def _f32(x):
    return float(torch.tensor(float(x), dtype=torch.float32))


def _rowwise_operands(dst, views):
    """Operands read element by element at dst's positions (each row is read
    whole before it is stored: in place only as the same view)."""
    P = dst.shape[0]
    if P > 128 or any(v.shape[0] != P or v.size // max(P, 1) != dst.size // max(P, 1) for v in views):
        raise Unsupported("partition mismatch")
    if any(v.storage.id == dst.storage.id and not _same_view(v, dst) for v in views):
        raise Unsupported("a destination overlapping a source")


def _lower_iota(low, a):
    """GpSimd iota (and affine_select's affine values): the interpreter's
    float64 sum, term by term, rounded to fp32 (exact: integer steps)."""
    dst, pattern = a["dst"], a["pattern"]
    if len(pattern) > 4 or dst.shape[0] > 128:
        raise Unsupported("an iota pattern of more than 4 terms")
    nums = (a["offset"], a["channel_multiplier"]) + tuple(s for s, _n in pattern)
    if not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in nums):
        raise Unsupported("an iota pattern of non-numbers")
    counts = [int(n) for _s, n in pattern]
    steps = [struct.unpack("<q", struct.pack("<d", float(s)))[0] for s, _n in pattern]
    pad = [0] * (4 - len(pattern))
    low.emit(OP_IOTA, [dst], [0, 0, len(pattern)] + counts + pad + steps + pad,
             (float(a["offset"]), float(a["channel_multiplier"])))
    return dst, []


def _lower_select(low, a, dead):
    """``dst = cond != 0 ? x : y`` (nl.where, affine_select): x and y are
    elementwise views or numbers (what torch.where gives them in fp32)."""
    dst, cond = a["dst"], a["cond"]
    views, slots, imms = [dst, cond], [], [0.0, 0.0]
    for i, key in enumerate(("x", "y")):
        v = a[key]
        if _is_tensor(v):
            views.append(v)
            slots.append(len(views) - 1)
        else:
            slots.append(-1)
            imms[i] = _f32(v)
    if not any(_is_tensor(a[k]) for k in ("x", "y")) and not all(
            isinstance(a[k], float) or _f32(a[k]) == a[k] for k in ("x", "y")):
        # Two integers: the interpreter's int64 result converted by the store.
        # Into a float tile, that conversion made here (torch's, once) gives an
        # fp32-exact value; into an integer tile its wrapped value must be.
        dt = low.dtypes[dst.storage.id]
        for i, key in enumerate(("x", "y")):
            if abs(a[key]) >= 2 ** 63:
                raise Unsupported("a select of an integer past int64")
            v = torch.tensor(a[key], dtype=torch.int64)
            imms[i] = float(v.to(dt).float()) if dt.is_floating_point else float(
                int(v) % 2 ** 32 if dt == torch.uint32 else int(v.to(dt)))
            if _f32(imms[i]) != imms[i]:
                raise Unsupported("a select of two integers fp32 cannot hold into a 32-bit integer tile")
    _rowwise_operands(dst, views[1:])
    low.emit(OP_SEL, views, [int(dead), 0] + slots, imms)
    return dst, views[1:]


def _lower_scan(low, a, dead):
    """tensor_tensor_scan: one sequential recurrence per partition row."""
    dst = a["dst"]
    views = [dst, a["data0"], a["data1"]]
    _rowwise_operands(dst, views[1:])
    slot, imm = _operand(low, a["initial"], views)
    if slot >= 0 and (views[slot].storage.id == dst.storage.id):
        raise Unsupported("a scan whose initial value is in its destination")
    low.emit(OP_SCAN, views, [int(dead), 0, _alu(a["op0"]), int(a["reverse0"]), _alu(a["op1"]), int(a["reverse1"]),
                              slot], (imm,))
    return dst, views[1:]


def _bit(impl):
    if impl is None or impl.name not in _BIT:
        raise Unsupported(f"op nl.{getattr(impl, 'name', None)} on integer rows")
    return _BIT[impl.name]


def _int_operand(x, views):
    """A per-partition operand of a bitvector op: a tile, or a number as
    torch.tensor(x, dtype=int64) makes it (truncated)."""
    if _is_tensor(x):
        views.append(x)
        return len(views) - 1, 0.0
    v = int(x)
    if abs(v) >= 2 ** 53:
        raise Unsupported("a bitvector immediate past 2^53")
    return -1, float(v)


def _lower_bits(low, a, dead):
    """Bitvector ops (tensor_tensor, tensor_scalar, the and/or reductions,
    nl.bitwise_*, shifts): integer rows in int64, stored with copy_'s
    wrapping. Integer tiles only (the interpreter's env.ints truncates floats)."""
    dst, data, form = a["dst"], a["data"], a["form"]
    views, imms = [dst, data], [0.0, 0.0]
    header = [int(dead), 0, form, _bit(a["op0"])]
    if form == 0:
        views.append(a["data2"])
        _rowwise_operands(dst, views[1:])
        header += [0, -1, -1, 0, -1, 0]
    elif form == 1:
        _rowwise_operands(dst, [data])
        s0, imms[0] = _int_operand(a["operand0"], views)
        header += [int(a["reverse0"]), s0]
        if a["op1"] is not None:
            s1, imms[1] = _int_operand(a["operand1"], views)
            header += [_bit(a["op1"]), int(a["reverse1"]), s1, 0]
        else:
            header += [-1, 0, -1, 0]
    else:
        if a["negate"]:
            raise Unsupported("a negated bitvector reduction")
        if data.shape[0] != dst.shape[0] or dst.storage.id == data.storage.id or dst.shape[0] > 128:
            raise Unsupported("a bitvector reduction into its input")
        header += [0, -1, -1, 0, -1, _trailing_group(data, a["axes"])]
    if any(low.dtypes[v.storage.id].is_floating_point for v in views):
        raise Unsupported("a bitvector op on a float tile")
    if form == 1 and any(v.storage.id == dst.storage.id for v in views[2:]):
        raise Unsupported("a per-partition operand in the destination")
    low.emit(OP_BITS, views, header, imms)
    return dst, views[1:]


def _lower_random(low, a, dead):
    """nl.rand, nisa.dropout, nl.dropout: Philox (nki/_philox.py) of the
    call's key (the bound [1, 2] uint32 seed storage), subsequence ``stream``,
    counter = the element's row-major index in dst."""
    dst, seed, data, prob = a["dst"], a["seed"], a["data"], a["prob"]
    if dst.shape[0] > 128:
        raise Unsupported("partition mismatch")
    views = [dst, seed]
    if data is not None:
        _rowwise_operands(dst, [data])
        views.append(data)
    rate_slot, imms = -1, (0.0, 1.0)
    if _is_tensor(prob):  # the rate is the tile's first element, read at run time
        views.append(prob)
        rate_slot = len(views) - 1
    else:
        # The interpreter compares fp32 values with the rate, and divides by 1 - rate in fp32.
        imms = (_f32(prob), _f32(1 - prob) if a["mode"] == 2 else 1.0)
    low.emit(OP_RAND, views, [int(dead), 0, a["mode"], a["stream"], int(data is not None), rate_slot], imms)
    return dst, views[1:]


def _lower_partition_reduce(low, a):
    """tensor_partition_reduce: [P, F] -> [1, F], one thread (it reads every
    partition); sums and products fold the partitions in order, as the
    interpreter does."""
    dst, data, op = a["dst"], a["data"], a["op"]
    if op.name not in ("add", "multiply", "maximum", "minimum"):
        raise Unsupported(f"tensor_partition_reduce nl.{op.name}")
    if data.shape[0] > 128:
        raise Unsupported("partition mismatch")
    low.emit(OP_PRED, [dst, data], [0, 0, _alu(op)])
    return dst, [data]


def _lower_registers(low, a):
    """The accumulator-register update of a reducing instruction (nki/isa.py
    _accumulate) from its row reductions ([P, 1], already computed), and
    reduce_res."""
    dst, r = a["dst"], a["r"]
    if a["op"].name not in ("add", "maximum", "minimum"):
        raise Unsupported(f"a register reduction with nl.{a['op'].name}")
    if dst.shape[0] != r.shape[0] or r.shape[0] > 128:
        raise Unsupported("partition mismatch")
    views = [dst, r]
    slot, imm = _operand(low, a["init"], views)
    low.emit(OP_REG, views, [0, 0, a["cmd"], _alu(a["op"]), _ENGINE[a["engine"]], int(a["res"]), int(a["negate"]),
                             slot], (imm,))
    return dst, views[1:]


def _trailing_group(data, axes):
    """Elements per reduction over trailing ``axes``: the interpreter reduces
    contiguous runs in torch's order; other layouts fall back."""
    m = math.prod(data.shape[d] for d in axes)
    inner = [(data.strides[d], data.shape[d]) for d in axes if data.shape[d] > 1]
    expect = 1
    for s, n in reversed(inner):
        if s != expect:
            raise Unsupported("tensor_reduce over non-contiguous axes")
        expect *= n
    return m


def _check_sum(data, m=None):
    """torch splits one huge row across threads (two-pass reduction), in an
    order that depends on the thread count: not reproduced."""
    n = math.prod(data.shape[1:]) if m is None else m
    rows = math.prod(data.shape) // n if n else 0
    if rows == 1 and n >= 32768:
        raise Unsupported("a single-row sum of 32K+ elements")
    if m is None and not _rows_ok(data):
        raise Unsupported("a reduction over a permuted view")


def _writes(ir):
    kind, a = ir
    if kind in _CONTROL:
        return []
    out = [a["dst"]]
    if kind == "activation" and a["reduce_res"] is not None:
        out.append(a["reduce_res"])
    return out


def _reads(ir):
    kind, a = ir
    return [v for k, v in a.items() if k not in ("dst", "reduce_res") and _is_tensor(v)]


def _whole(v):
    return v.is_contiguous() and v.offset == 0 and v.size == v.storage.numel


def _forward(instrs, first, last, bound, dtypes, looped=()):
    """DMA elision. A tile loaded whole from another tensor and never written
    again, while that tensor is not written either, reads the tensor in place
    (``subst``: storage -> (storage, offset)); a tile written whole, then
    stored whole by a copy that is its last use, is written at the copy's
    destination directly. The elided copies are ``skip``ped."""
    subst, skip = {}, set()
    rw = [(_writes(ins.ir), _reads(ins.ir)) for ins in instrs]

    def touches(j, sid, span=None, writes_only=False):
        views = rw[j][0] if writes_only else rw[j][0] + rw[j][1]
        return any(v.storage.id == sid and (span is None or _overlaps([span], _span(v))) for v in views)

    for k, ins in enumerate(instrs):
        kind, a = ins.ir
        if kind != "copy":
            continue
        dst, src = a["dst"], a["src"]
        d, s = dst.storage.id, src.storage.id
        if d == s or dtypes[d] != dtypes[s] or d in subst or s in subst or d in looped or s in looped:
            continue
        if d not in bound and first[d] == k and _whole(dst) and not any(
                touches(j, d, writes_only=True) or touches(j, s, writes_only=True)
                for j in range(k + 1, last[d] + 1)):
            if src.is_contiguous():
                subst[d] = (src.storage, src.offset, None)
                skip.add(k)
                last[s] = max(last[s], last[d])  # the source's memory now lives as long as the tile
                continue
            # A strided source (a broadcast weight, say): views of the tile
            # that are boxes of it map coordinate by coordinate.
            # (Not under a row reduction: it needs its row contiguous.)
            box = _contiguous_strides(dst.storage.shape)
            if tuple(src.shape) == tuple(dst.storage.shape) and all(
                    v.strides == box for j in range(k + 1, last[d] + 1) for v in rw[j][0] + rw[j][1]
                    if v.storage.id == d) and not any(
                    instrs[j].ir[0] in _ROW_REDUCTIONS and any(v.storage.id == d for v in rw[j][1])
                    for j in range(k + 1, last[d] + 1)):
                subst[d] = (src.storage, src.offset, (dst.storage.shape, box, src.strides))
                skip.add(k)
                last[s] = max(last[s], last[d])
                continue
        f = first.get(s)
        # (Only into a kernel argument or output: their memory exists from the start.)
        # (Not a tile another tile reads in place: substitutions do not chain.)
        if s not in bound and d in bound and last[s] == k and _whole(src) and dst.is_contiguous() and \
                f is not None and f < k and not any(t[0].id == s for t in subst.values()):
            fw = instrs[f].ir[1]["dst"]
            span = (dst.offset, dst.offset + dst.size - 1)
            if fw.storage.id == s and _whole(fw) and not any(v.storage.id == s for v in rw[f][1]) and not any(
                    touches(j, d, span) for j in range(f, k)):
                subst[s] = (dst.storage, dst.offset, None)
                skip.add(k)
    return subst, skip


_ROW_REDUCTIONS = ("tensor_reduce", "variance", "bits", "topk")


def _mapped(ir, subst):
    def m(v):
        if _is_tensor(v) and v.storage.id in subst:
            st, delta, box = subst[v.storage.id]
            if box is None:
                return NkiTensor(st, v.shape, v.strides, v.offset + delta, _check=False)
            shape, strides, src_strides = box
            off = delta + sum((v.offset // cs) % n * ss for n, cs, ss in zip(shape, strides, src_strides))
            return NkiTensor(st, v.shape, src_strides, off, _check=False)
        return v
    kind, a = ir
    return kind, {k: m(v) for k, v in a.items()}


class _Part:
    """One executor record's worth of an instruction that lowers to several
    (``("seq", {"parts": [ir, ...]})``): the lowering sees each as its own
    instruction, so lifetimes, DMA elision and NaN fills work per record.
    The parts pass values through fp32 temporaries the instruction allocated
    while tracing (storages no interpreter instruction touches)."""
    __slots__ = ("name", "tensors", "ir")

    def __init__(self, name, ir):
        self.name, self.ir = name, ir
        self.tensors = tuple(_writes(ir)) + tuple(_reads(ir))


class _Mark:
    """A device loop (nl.while_loop with a tile condition) in the expanded
    instruction list: its head (``while``, the first test) before the body's
    instructions and its back-edge (``end``, the test re-traced after the
    body) after them. Each lowers to a control record (OP_WHILE / OP_END)."""
    __slots__ = ("name", "tensors", "ir", "loc")

    def __init__(self, kind, cond, max_iterations, loc):
        self.name, self.loc = "nki.language.while_loop", loc
        self.tensors = (cond,)
        if type(max_iterations) is not int or abs(max_iterations) >= 1 << 62:
            raise Unsupported(f"max_iterations={max_iterations!r} (the executor counts in int64)")
        self.ir = (kind, {"cond": cond, "max": max_iterations})


def _loops(instrs, first, last, program):
    """The device loops' (head, back-edge) positions in ``instrs``. Every
    storage a loop touches lives from its head to its back-edge at least (a
    later iteration reads what an earlier one wrote), so the arena, DMA
    elision and dead stores, which look at first and last uses, see the
    whole loop."""
    loops, heads = [], []
    for i, ins in enumerate(instrs):
        if isinstance(ins, _Mark):
            if ins.ir[0] == "while":
                heads.append(i)
            else:
                loops.append((heads.pop(), i))
    for h, e in loops:
        for ins in instrs[h:e + 1]:
            for t in ins.tensors:
                sid = t.storage.id
                if program.storages.get(sid) is not None and program.storages[sid].name == "nki.print":
                    # (the interpreter prints every iteration; the executor's snapshot holds one)
                    raise Unsupported("nl.device_print inside a device loop")
                first[sid], last[sid] = min(first[sid], h), max(last[sid], e)
    return loops


def _expand(instrs):
    out = []
    for ins in instrs:
        if ins.ir is not None and ins.ir[0] == "seq":
            out.extend(_Part(ins.name, ir) for ir in ins.ir[1]["parts"])
        elif ins.ir is not None and ins.ir[0] == "while":
            a = ins.ir[1]
            out.append(_Mark("while", a["cond"], a["max"], ins.loc))
            out.extend(_expand(a["body"]))
            out.append(_Mark("end", a["again"], a["max"], ins.loc))
        else:
            out.append(ins)
    return out


def _lower_mark(low, ins, i, instrs, loops, skip_fill, filled, subst):
    """A loop's head or back-edge record. At the head, the NaN fill of every
    fresh buffer the loop touches comes first: a fill inside the body would
    run again in every iteration (the interpreter fills a buffer once)."""
    kind, a = _mapped(ins.ir, subst)
    if kind == "while":
        e = next(e for h, e in loops if h == i)
        for body in instrs[i:e + 1]:
            for t in body.tensors:
                st = t.storage
                if st.id in skip_fill or st.id in filled:
                    continue
                filled.add(st.id)
                _fill_sentinel(low, st)
        low.depth += 1
    else:
        low.depth -= 1
    # w[3], the partner record, is set once the records have their final order (_link_loops).
    low.emit(OP_WHILE if kind == "while" else OP_END, [a["cond"]], [0, 0, -1, a["max"]], written=0)


def _writes_whole(ins, sid, srcs):
    """Whether ``ins`` writes all of storage ``sid`` and reads none of it (``srcs``):
    a fresh buffer first used so needs no NaN fill."""
    return any(v.storage.id == sid and _whole(v) for v in _writes(ins.ir)) and \
        all(v.storage.id != sid for v in srcs)


def _never_read_unwritten(instrs, skip, exempt):
    """Fresh buffers whose first write is partial but which no instruction reads
    where nothing wrote before it: they need no NaN fill (a [128, H] tile
    written and read on its first p rows, as a partial last tile is: without
    this, every launch of a few-row RMSNorm filled five 1 MiB tiles). Reads
    come before the instruction's own writes; buffers a matmul touches keep
    their fill (a fresh PSUM tile's first matmul overwrites, later ones add)."""
    written, out, seen = {}, set(), set()
    for i, ins in enumerate(instrs):
        if i in skip or isinstance(ins, _Mark):
            continue
        dst, srcs = _peek(ins)
        for t in ins.tensors:
            sid = t.storage.id
            if sid in exempt or sid in seen:
                continue
            seen.add(sid)
            if not _writes_whole(ins, sid, srcs) and ins.ir[0] != "matmul":
                written[sid] = np.zeros(t.storage.numel, bool)
                out.add(sid)
        if ins.ir[0] == "matmul":
            out -= {t.storage.id for t in ins.tensors}
        for v in srcs:
            sid = v.storage.id
            if sid in out and not written[sid][_elements(v)].all():
                out.discard(sid)
        for v in _writes(ins.ir):
            if v.storage.id in out:
                written[v.storage.id][_elements(v)] = True
    return out


def _fill_sentinel(low, st):
    """A fresh buffer filled with the NaN sentinel, as the interpreter's are."""
    shape = (st.shape[0], st.row) if st.buffer.on_chip and st.shape else (st.numel,)
    low.emit(OP_FILL, [NkiTensor(st, shape, _check=False)], imms=(_dtypes.sentinel(st.dtype),))


def _storage_refs(low):
    """How many records touch each storage (a record reading and writing it counts once)."""
    refs = {}
    for outs, ins in low.access:
        for sid in {v.storage.id for v in outs + ins}:
            refs[sid] = refs.get(sid, 0) + 1
    return refs


def _fuse_activation(low, bound):
    """Folds ``activation(s, fn, g)`` into the ``scalar_tensor_tensor`` right
    after it that reads s as its data, when nothing else touches s: one record
    computing ``op1(op0(fn(g), operand0), operand1)`` (w[8] = fn), so s (an fp32
    tile, scale 1, no bias or reduction) never goes to memory. Its rows are the
    fp32 values the activation would have stored: the same bits. SwiGLU's silu
    and multiply become one pass over memory (csrc/runtime/nki/Kernels.inc
    stt_act_run)."""
    refs = _storage_refs(low)
    k = 0
    while k + 1 < len(low.words):
        a, b = low.words[k], low.words[k + 1]
        if not (a[0] == OP_ACT and b[0] == OP_STT and a[1:3] == [0, 0] and a[5:9] == [-1, -2, _CMD["idle"], -1]
                and low.imms[k][0] == 1.0 and b[2] == 0 and b[8] == -1 and len(low.access[k][1]) == 1):
            k += 1
            continue
        (s,), (g,) = low.access[k]
        (y,), (d, *rest) = low.access[k + 1]
        sid = s.storage.id
        if not (_same_view(d, s) and sid not in bound and low.dtypes[sid] == torch.float32 and refs[sid] == 2
                and y.storage.id != g.storage.id and s.shape[0] == g.shape[0] and s.size == g.size
                and all(v.storage.id != sid for v in rest)):
            k += 1
            continue
        fused = list(b)
        fused[HEADER + VIEW_WORDS:HEADER + 2 * VIEW_WORDS] = a[HEADER + VIEW_WORDS:HEADER + 2 * VIEW_WORDS]
        fused[8] = a[3]
        low.words[k:k + 2] = [fused]
        low.imms[k:k + 2] = [low.imms[k + 1]]
        low.access[k:k + 2] = [([y], [g] + rest)]
        k += 1


_EXACT_IN_F32 = (torch.float32, torch.bfloat16, torch.float16, torch.float8_e4m3fn, torch.float8_e5m2)


def _fuse_copies(low, bound, apart):
    """Folds a copy into an fp32 tile t followed by the copy of t that is t's
    only other use (``nc_transpose`` into PSUM, then ``tensor_copy`` to SBUF)
    into one copy from the first source to the last destination. The source
    is a float type, which fp32 holds exactly, so converting it to fp32 and
    then to the destination's dtype is the one conversion the fused copy
    makes (every float copy goes through fp32): the same bits. The source and
    the destination must not share memory (an arena slot the destination took
    over when the source died at the first copy). An attention
    head's transposes of its probabilities then write the bf16 tile the
    matmul reads directly, with no fp32 tile in between."""
    refs = _storage_refs(low)
    k = 0
    while k + 1 < len(low.words):
        a, b = low.words[k], low.words[k + 1]
        if not (a[0] == OP_COPY and b[0] == OP_COPY and len(low.access[k][1]) == 1 and len(low.access[k + 1][1]) == 1):
            k += 1
            continue
        (t,), (x,) = low.access[k]
        (y,), (t2,) = low.access[k + 1]
        sid = t.storage.id
        if not (_same_view(t, t2) and _whole(t) and sid not in bound and refs[sid] == 2
                and low.dtypes[sid] == torch.float32 and low.dtypes[x.storage.id] in _EXACT_IN_F32
                and t.size == y.size and apart(y.storage.id, x.storage.id)):
            k += 1
            continue
        fused = list(a)
        fused[HEADER:HEADER + VIEW_WORDS] = b[HEADER:HEADER + VIEW_WORDS]
        low.words[k:k + 2] = [fused]
        low.imms[k:k + 2] = [low.imms[k]]
        low.access[k:k + 2] = [([y], [x])]
        k += 1


def _fuse_matmul_operands(low, bound, apart):
    """A chain of copies (up to three) whose tiles are each read only by the
    next, the last by the matmul right after it as its stationary or moving
    operand: the matmul reads the first copy's source instead, through its
    view (a transposed view, say). Each copy is flat and keeps the shape, so
    the operand's elements are the source view's; every tile of the chain
    holds the source's values exactly (its dtype, or fp32 for a float
    source), so the matmul sees the same values (it gathers its operands as
    fp32 rows anyway). The source must not share memory with the matmul's
    destination (an arena slot taken over when the source died). An attention
    head's ``nc_transpose`` of its probabilities into PSUM and the copy back to
    SBUF then cost no pass of their own: the matmul packs the transposed view
    directly (Kernels.inc)."""
    refs = _storage_refs(low)
    m = 1
    while m < len(low.words):
        if low.words[m][0] != OP_MM:
            m += 1
            continue
        (d,), ops = low.access[m]
        for i, op in enumerate(ops):
            chain, cur, j = [], op, m - 1
            while j >= 0 and len(chain) < 3 and low.words[j][0] == OP_COPY and len(low.access[j][1]) == 1:
                (t,), (x,) = low.access[j]
                sid = t.storage.id
                if not (_same_view(t, cur) and _whole(t) and sid not in bound and refs[sid] == 2
                        and tuple(t.shape) == tuple(x.shape) and sum(v.storage.id == sid for v in ops) == (cur is op)):
                    break
                chain.append((j, x))
                cur, j = x, j - 1
            for n in range(len(chain), 0, -1):
                x = chain[n - 1][1]
                xd = low.dtypes[x.storage.id]
                tiles = [op] + [chain[q][1] for q in range(n - 1)]
                if all(low.dtypes[v.storage.id] == xd or (low.dtypes[v.storage.id] == torch.float32
                                                         and xd in _EXACT_IN_F32) for v in tiles) \
                        and apart(x.storage.id, d.storage.id) and all(v.storage.id != x.storage.id for v in ops):
                    break
            else:
                continue
            first = m - n
            fused = list(low.words[m])
            at = HEADER + (1 + i) * VIEW_WORDS
            src = low.words[first]
            fused[at:at + VIEW_WORDS] = src[HEADER + VIEW_WORDS:HEADER + 2 * VIEW_WORDS]
            ops = list(ops)
            ops[i] = x
            low.words[first:m + 1] = [fused]
            low.imms[first:m + 1] = [low.imms[m]]
            low.access[first:m + 1] = [([d], ops)]
            m = first
            break
        m += 1


def _fold_packed_operands(low, bound):
    """A copy of an HBM argument into a tile that only matmuls read, each
    through the tile's whole view (K^T of an attention head, the moving
    operand of every query tile's QK^T): the matmuls read the argument
    through the copy's source view instead, and the copy goes. A moving
    operand of an argument no record writes is prepared once per launch
    (Kernels.inc kept_moving: packed in bf16 pairs, or gathered as fp32 rows
    when its columns are strided), so K^T costs one pass either way, and no
    thread waits for a tile another one wrote. The tile must hold the
    argument's values exactly (its dtype) and nothing may write the
    argument."""
    if any(w[0] in (OP_WHILE, OP_END) for w in low.words):
        return
    written = {v.storage.id for outs, _ins in low.access for v in outs}
    k = 0
    while k < len(low.words):
        outs, ins = low.access[k]
        if low.words[k][0] != OP_COPY or len(outs) != 1 or len(ins) != 1:
            k += 1
            continue
        (t,), (x,) = outs, ins
        sid, xid = t.storage.id, x.storage.id
        users = [m for m in range(k + 1, len(low.words))
                 if any(v.storage.id == sid for v in low.access[m][0] + low.access[m][1])]
        if not (users and sid not in bound and xid in bound and xid not in written and _whole(t)
                and tuple(t.shape) == tuple(x.shape) and low.dtypes[sid] == low.dtypes[xid]
                and all(low.words[m][0] == OP_MM and low.access[m][0][0].storage.id not in (sid, xid)
                        and all(_same_view(v, t) for v in low.access[m][1] if v.storage.id == sid)
                        for m in users)):
            k += 1
            continue
        for m in users:
            (d,), ops = low.access[m]
            for i, op in enumerate(ops):
                if op.storage.id == sid:
                    at = HEADER + (1 + i) * VIEW_WORDS
                    low.words[m][at:at + VIEW_WORDS] = low.words[k][HEADER + VIEW_WORDS:HEADER + 2 * VIEW_WORDS]
            low.access[m] = ([d], [x if op.storage.id == sid else op for op in ops])
        del low.words[k], low.imms[k], low.access[k]


def _link_loops(words):
    heads = []
    for r, w in enumerate(words):
        if w[0] == OP_WHILE:
            heads.append(r)
        elif w[0] == OP_END:
            h = heads.pop()
            words[h][3], w[3] = r, h


class NativeProgram:
    def __init__(self, program, precise):
        low = _Lowering(program, precise)
        instrs = _expand(program.instrs)
        for ins in instrs:
            if ins.ir is None:
                raise Unsupported(ins.name)
            # A dtype view (NkiTensor.view) is a Storage sharing the id of the one
            # it reinterprets, not listed in program.storages: found only here.
            if any(getattr(t.storage, "reinterpret_of", None) is not None for t in ins.tensors):
                raise Unsupported("dtype-reinterpreting views")
        first, last = {}, {}
        for i, ins in enumerate(instrs):
            for t in ins.tensors:
                first.setdefault(t.storage.id, i)
                last[t.storage.id] = i
        loops = _loops(instrs, first, last, program)
        looped = {t.storage.id for h, e in loops for ins in instrs[h:e + 1] for t in ins.tensors}
        bound = {st.id for st in program.storages.values() if st.arg is not None}
        bound |= {t.storage.id for t in program.outputs()}
        seed = _philox.seed_storage(program)
        self.seed = seed.id if seed is not None and seed.id in first else None
        if self.seed is not None:  # the call's Philox key, bound at each run
            bound.add(self.seed)
        # nl.device_print snapshots: bound buffers, printed after the launch in program order.
        self.prints = [st for st in program.storages.values() if st.name == "nki.print" and st.id in first]
        bound |= {st.id for st in self.prints}
        self.bound = sorted(bound)
        on_chip = {sid for sid, st in program.storages.items() if st.buffer.on_chip}
        end = len(instrs)
        for sid in first:
            if sid not in bound and sid not in on_chip:
                last[sid] = end  # private HBM lives for the whole launch
        subst, skip = _forward(instrs, first, last, bound, low.dtypes, looped)
        # Arena offsets: reuse a slot once its previous storage is dead.
        # Only a storage of the same layout (partitions x row bytes) reuses a slot:
        # partition p then stays in the same bytes, owned by the same thread.
        slots = []  # [offset, layout, busy_until]
        self.offsets, top = {}, 0
        for sid in sorted((s for s in first if s not in bound and s not in subst), key=lambda s: first[s]):
            st = program.storages[sid]
            size = -(-st.numel * low.dtypes[sid].itemsize // _ALIGN) * _ALIGN
            layout = (st.shape[0] if st.shape else 1, st.row * low.dtypes[sid].itemsize, size)
            best = None
            for slot in slots:
                if slot[2] < first[sid] and slot[1] == layout:
                    best = slot
                    break
            if best is None:
                best = [top, layout, -1]
                slots.append(best)
                top += size
            best[2] = last[sid]
            self.offsets[sid] = best[0]
        self.arena_bytes = max(top, _ALIGN)
        filled = set()
        unread = _never_read_unwritten(instrs, skip, bound | set(subst)) if not loops else set()
        low.depth = 0  # device loops around the instruction
        for i, ins in enumerate(instrs):
            if i in skip:
                continue
            if isinstance(ins, _Mark):
                _lower_mark(low, ins, i, instrs, loops, bound | set(subst), filled, subst)
                continue
            # Fresh buffers read before a whole write get the NaN sentinel.
            dst, srcs = _peek(ins)
            if ins.ir[0] == "matmul" and ins.ir[1]["accumulate"] is None and dst.storage.id not in filled:
                # The first write to a fresh PSUM tile overwrites it (_lower_matmul): no read.
                srcs = [s for s in srcs if s is not dst]
            for t in ins.tensors:
                sid = t.storage.id
                if sid in bound or sid in filled or sid in subst:
                    continue
                filled.add(sid)
                if not _writes_whole(ins, sid, srcs) and sid not in unread:
                    _fill_sentinel(low, t.storage)
            ir = _mapped(ins.ir, subst)
            d = ir[1]["dst"].storage.id
            dead = d not in bound and last[d] == i
            low.orig = ins.ir
            _lower_instr(low, ins, ir, dead)
            for v in _writes(ins.ir):
                if v.storage.buffer.name == "psum":
                    m = low.psum.setdefault(v.storage.id, np.zeros(v.storage.numel, bool))
                    m[_elements(v)] = True
        # Outputs every element of which the kernel writes need no NaN fill first.
        spans = {}
        depth = 0
        for w, (outs, _ins) in zip(low.words, low.access):
            depth += (w[0] == OP_WHILE) - (w[0] == OP_END)
            if depth:
                continue  # (a loop may run zero times)
            for v in outs:
                if v.storage.id in bound and v.is_contiguous():
                    spans.setdefault(v.storage.id, []).append((v.offset, v.offset + v.size))
        self.covered, done_fill = set(), set()
        for sid, sp in spans.items():
            end = 0
            for a, b in sorted(sp):
                if a > end:
                    break
                end = max(end, b)
            if end >= program.storages[sid].numel:
                self.covered.add(sid)
        # The others hold the NaN sentinel where the kernel does not write, as
        # on the interpreter: filled first, in the same launch.
        fills = 0
        for t in program.outputs():
            st = t.storage
            if st.id not in self.covered and st.id not in done_fill:
                done_fill.add(st.id)
                low.emit(OP_FILL, [NkiTensor(st, (st.numel,), _check=False)], imms=(_dtypes.sentinel(st.dtype),))
                fills += 1
        if fills:
            for lst in (low.words, low.imms, low.access):
                lst[:] = lst[-fills:] + lst[:-fills]
        _fuse_activation(low, bound)
        def apart(a, b):  # storages a and b never share memory in this launch
            if a in bound or b in bound:
                return not (a in bound and b in bound)
            if a not in self.offsets or b not in self.offsets:
                return False
            sa, sb = (self.offsets[x] for x in (a, b))
            na, nb = (program.storages[x].numel * low.dtypes[x].itemsize for x in (a, b))
            return sa + na <= sb or sb + nb <= sa
        _fuse_copies(low, bound, apart)
        _fuse_matmul_operands(low, bound, apart)
        _fold_packed_operands(low, bound)
        _link_loops(low.words)
        _schedule(low, self.offsets)
        # Records of one barrier-free stretch run row-interleaved (csrc/runtime/nki/Executor.cpp); a
        # loop's next iteration (a record writing an arena slot that another
        # storage used in this stretch) starts a new group (w[15]), so rows of
        # different iterations (a fixed stride apart in memory) do not compete
        # for the same cache sets.
        owner = {}
        for w, (outs, _ins) in zip(low.words, low.access):
            if w[13] or w[14]:
                owner = {}
            w[15] = 0
            for v in outs:
                off = self.offsets.get(v.storage.id)
                if off is not None and owner.get(off, v.storage.id) != v.storage.id:
                    w[15], owner = 1, {}
            for v in outs:
                if v.storage.id in self.offsets:
                    owner[self.offsets[v.storage.id]] = v.storage.id
        self.ninstr = len(low.words)
        self.words = torch.tensor(low.words, dtype=torch.int64).reshape(-1)
        imms = torch.tensor(low.imms, dtype=torch.float64).reshape(-1)
        nbuf = max(program.storages) + 1 if program.storages else 1
        buffers = []
        for sid in range(nbuf):
            st = program.storages.get(sid)
            if sid in bound:
                buffers.append((_DTYPES[low.dtypes[sid]], st.numel, -1))
            elif sid in self.offsets:
                buffers.append((_DTYPES[low.dtypes[sid]], st.numel, self.offsets[sid]))
            else:  # unused, or replaced by the tensor it was loaded from
                buffers.append((0, 0, 0))
        self.prog = _executor().native_program(self.words, imms, buffers, self.arena_bytes,
                                                getattr(program, "name", "kernel"))

    def run(self, bound):
        """Runs the program over ``bound`` (storage id -> contiguous tensor): one
        launch on the current stream of their neuron device, or in place on
        CPU memory."""
        tensors = [bound.get(sid) for sid in self.bound]
        dev = next((t.device for t in tensors if t is not None), torch.device("cpu"))
        snaps = {}
        for st in self.prints:
            snaps[st.id] = tensors[self.bound.index(st.id)] = torch.empty(st.numel, dtype=st.dtype, device=dev)
        if self.seed is not None:
            key = torch.tensor(_philox.key_words(bound[_philox.SEED]), dtype=torch.uint32)
            tensors[self.bound.index(self.seed)] = key.to(dev)
        self.launch(tensors)
        for st in self.prints:
            print(st.print_prefix, snaps[st.id].cpu().reshape(st.shape))


    def launch(self, tensors):
        """One launch over ``tensors``, in the order of ``self.bound``."""
        try:
            self.prog.run(tensors, torch.get_num_threads())
        except RuntimeError as e:
            # The executor's iteration-cap error is the interpreter's NKIError.
            cap = _LOOP_CAP.search(str(e))
            if cap is None:
                raise
            raise NKIError(cap.group(0)) from None


def _owned(v, d):
    """Whether index i of dim ``d`` of ``v`` lies in row i of its on-chip
    storage, every other dim inside that row: the thread owning partition i
    is then the only one touching those elements (dim 0 of a tile view; dim 1
    of a transposed view read by a matmul)."""
    st = v.storage
    if not st.buffer.on_chip or v.ndim <= d or not 0 <= v.offset < st.row:
        return False
    if v.shape[d] > 1 and v.strides[d] != st.row:
        return False
    rest = [(n, s) for e, (n, s) in enumerate(zip(v.shape, v.strides)) if e != d and n > 1]
    return all(s >= 0 for _n, s in rest) and v.offset + sum((n - 1) * s for n, s in rest) < st.row


def _span(v):
    last = v.offset + sum((n - 1) * s for n, s in zip(v.shape, v.strides))
    return v.offset, last


def _overlaps(spans, span):
    return any(a <= span[1] and span[0] <= b for a, b in spans)


def _index_dims(w, outs, ins):
    """How a record runs split: per view (outs + ins), the dim its thread's
    partition range [lo, hi) indexes (None: every thread reads all of it),
    or None when one thread runs the record whole. Each thread computes the
    rows [lo, hi) of the destination, so a record splits when those rows
    depend on nothing but its reads: a matmul's rows on their stationary
    columns (and the whole moving operand), a copy's on the same rows of its
    (permuted) source, every other record's on the same partition of each
    operand."""
    op = w[0]
    if op in (OP_PRED, OP_WHILE, OP_END) or not outs or outs[0].ndim == 0:
        return None  # (a partition reduction reads every partition into one row)
    dst = outs[0]
    if op == OP_MM:
        if any(v.storage.id == dst.storage.id for v in ins):
            return None
        return [0, 1, None]
    P = dst.shape[0]
    if P > 128 or any(v.ndim == 0 or v.shape[0] != P for v in outs + ins):
        return None  # (a flat fill; a [1, 1] operand broadcast by the row loops)
    if op == OP_COPY and dst.storage.id == ins[0].storage.id:
        return None  # (the interpreter's copy_ from a clone)
    return [0] * (len(outs) + len(ins))


def _schedule(low, offsets):
    """Marks each record: run whole by one thread (w[13]) when its rows
    cannot be split (_index_dims), and a barrier before it (w[14]) when a
    thread could touch memory another thread touched since the last barrier.
    An access is owned when its elements lie in the partitions of the thread
    touching them (_owned); owned accesses of two records never meet. Any
    other access (HBM, a transposed read, the moving operand of a matmul)
    is shared: it meets every overlapping write since the barrier, and a
    shared write every overlapping access. Memory is tracked per HBM
    storage and, for on-chip tiles, by arena bytes (a slot is reused by the
    next storage of its layout). A record whose own write meets its own
    access this way runs whole. Threads therefore meet only where data crosses
    partitions: an attention head's query tiles run split with one barrier
    (after K^T), where whole matmuls and transposes met twice each."""
    seen = {}  # memory -> [(span, owned, write)] since the last barrier

    def where(v):
        sid = v.storage.id
        if v.storage.buffer.on_chip and sid in offsets:
            size = low.dtypes[sid].itemsize
            a, b = _span(v)
            return "arena", (offsets[sid] + a * size, offsets[sid] + (b + 1) * size - 1)
        return sid, _span(v)

    for w, (outs, ins) in zip(low.words, low.access):
        dims = _index_dims(w, outs, ins)
        acc = []
        if dims is not None:
            for k, v in enumerate(outs + ins):
                key, sp = where(v)
                acc.append((key, sp, dims[k] is not None and _owned(v, dims[k]), k < len(outs)))
            if any(wr and not (o and o2) and key == k2 and _overlaps([s2], sp)
                   for n, (key, sp, o, wr) in enumerate(acc) for k2, s2, o2, _w2 in acc[n + 1:]):
                dims = None
        if dims is None:
            w[13], w[14] = 1, 0
            seen = {}
            continue
        conflict = any(any((wr or w2) and not (o and o2) and _overlaps([s2], sp) for s2, o2, w2 in seen.get(key, ()))
                       for key, sp, o, wr in acc)
        if conflict:
            seen = {}
        w[13], w[14] = 0, int(conflict)
        for key, sp, o, wr in acc:
            seen.setdefault(key, []).append((sp, o, wr))


def _peek(ins):
    if ins.ir is None:
        raise Unsupported(ins.name)
    kind, a = ins.ir
    if kind in ("copy",):
        return a["dst"], [a["src"]]
    if kind == "matmul":  # an accumulating matmul reads its destination
        return a["dst"], [a["stationary"], a["moving"]] + ([a["dst"]] if a["accumulate"] is not False else [])
    srcs = [v for k, v in a.items() if k not in ("dst", "reduce_res") and _is_tensor(v)]  # reduce_res: written
    return a["dst"], srcs


def plan(program, precise):
    """The NativeProgram for ``program``, or None to interpret it."""
    m = mode()
    if m == "interpreter":
        return None
    cache = program.__dict__.setdefault("_native", {})
    key = bool(precise)
    if key not in cache:
        try:
            _check_machine()
            cache[key] = NativeProgram(program, precise)
        except Unsupported as e:
            cache[key] = e
    r = cache[key]
    if isinstance(r, Unsupported):
        if m == "native":
            raise NKIError(f"NKI_EXECUTOR=native: the native executor does not cover this kernel ({r})")
        return None
    return r
