"""Tensors seen by a kernel while it is traced: a storage (one allocation in
a memory) and a strided view of it. Views never copy; instructions record
the views they read and write, and the executor resolves them to torch
strided views of the real buffers."""
import math

import torch

from . import _dtypes
from ._errors import fail


class Buffer:
    """A memory: ``nl.sbuf``, ``nl.psum``, ``nl.hbm`` (= ``private_hbm``),
    ``nl.shared_hbm``."""

    def __init__(self, name, on_chip):
        self.name = name
        self.on_chip = on_chip

    def __repr__(self):
        return f"nl.{self.name}"

    def __reduce__(self):
        return (_buffer_by_name, (self.name,))


sbuf = Buffer("sbuf", True)
psum = Buffer("psum", True)
private_hbm = Buffer("private_hbm", False)
hbm = private_hbm
shared_hbm = Buffer("shared_hbm", False)
_BUFFERS = {b.name: b for b in (sbuf, psum, private_hbm, shared_hbm)}
_BUFFERS["hbm"] = private_hbm


def _buffer_by_name(name):
    return _BUFFERS[name]


def buffer_of(buffer):
    if isinstance(buffer, Buffer):
        return buffer
    if isinstance(buffer, str) and buffer in _BUFFERS:
        return _BUFFERS[buffer]
    fail("nki.language.ndarray", "buffer", f"unknown buffer {buffer!r} (use nl.sbuf, nl.psum, nl.hbm, "
                                           f"nl.private_hbm or nl.shared_hbm)")


class Storage:
    """One allocation. ``arg`` is the kernel argument index for HBM inputs,
    None for buffers the kernel allocates."""

    def __init__(self, sid, buffer, dtype, shape, name="", arg=None):
        self.id = sid
        self.buffer = buffer
        self.dtype = dtype
        self.shape = tuple(shape)
        self.numel = math.prod(self.shape)
        self.name = name
        self.arg = arg
        # Elements of one partition row (on-chip) — the unit views may not cross.
        self.row = math.prod(self.shape[1:]) if self.shape else 1


def _contiguous_strides(shape):
    strides, acc = [], 1
    for s in reversed(shape):
        strides.append(acc)
        acc *= s
    return tuple(reversed(strides))


def _index_parts(idx):
    return idx if isinstance(idx, tuple) else (idx,)


class NkiTensor:
    """A view: ``shape``/``strides``/``offset`` in elements of ``storage``.
    Dim 0 of an on-chip tensor is the partition axis."""

    __slots__ = ("storage", "shape", "strides", "offset")

    def __init__(self, storage, shape, strides=None, offset=0, _check=True, _op="view"):
        self.storage = storage
        self.shape = tuple(int(s) for s in shape)
        self.strides = tuple(strides) if strides is not None else _contiguous_strides(self.shape)
        self.offset = int(offset)
        if _check:
            self._check_view(_op)

    # -- properties -------------------------------------------------------
    @property
    def dtype(self):
        return self.storage.dtype

    @property
    def buffer(self):
        return self.storage.buffer

    @property
    def ndim(self):
        return len(self.shape)

    @property
    def size(self):
        return math.prod(self.shape)

    @property
    def name(self):
        return self.storage.name

    @property
    def on_chip(self):
        return self.storage.buffer.on_chip

    def __len__(self):
        return self.shape[0]

    def __repr__(self):
        return f"NkiTensor(shape={list(self.shape)}, dtype={_dtypes.name(self.dtype)}, buffer={self.buffer})"

    def get_pattern(self):
        """The access pattern ``[[stride, count], ...]``, partition first."""
        return [[st, n] for st, n in zip(self.strides, self.shape)]

    def is_contiguous(self):
        return self.strides == _contiguous_strides(self.shape)

    # -- view rules -------------------------------------------------------
    def _check_view(self, op):
        st = self.storage
        if any(s < 0 for s in self.shape):
            fail(f"NkiTensor.{op}", None, f"negative size in shape {list(self.shape)}")
        if self.size == 0:
            return
        if any(s < 0 for s in self.strides):
            fail(f"NkiTensor.{op}", None, "negative strides are not supported")
        last = self.offset + sum((n - 1) * s for n, s in zip(self.shape, self.strides))
        if self.offset < 0 or last >= st.numel:
            fail(f"NkiTensor.{op}", None, f"view of shape {list(self.shape)} reaches element {last} "
                                          f"outside its {st.numel}-element {st.buffer.name} tensor")
        if not st.buffer.on_chip or not self.shape:
            return
        # On-chip memory is 2-D: a view keeps dim 0 on whole partitions and its
        # free dims inside one partition row (the hardware cannot address across).
        row = st.row
        p_stride = self.strides[0]
        in_row = self.offset % row
        free_extent = sum((n - 1) * s for n, s in zip(self.shape[1:], self.strides[1:]))
        if (self.shape[0] > 1 and (p_stride == 0 or p_stride % row)) or in_row + free_extent >= row:
            fail(f"NkiTensor.{op}", None, f"view {self.get_pattern()} (offset {self.offset}) of a "
                                          f"{list(st.shape)} {st.buffer.name} tensor crosses partitions: dim 0 "
                                          f"must step whole partitions and the free dims stay inside one")

    def _meta(self):
        base = torch.empty(self.storage.numel, device="meta", dtype=torch.int8)
        return base.as_strided(self.shape, self.strides, self.offset)

    def _from_meta(self, m, op):
        return NkiTensor(self.storage, m.shape, m.stride(), m.storage_offset(), _op=op)

    # -- views ------------------------------------------------------------
    def __getitem__(self, idx):
        parts = []
        for p in _index_parts(idx):
            if isinstance(p, DynSlice):
                p = slice(p.start, p.start + p.size * (p.step or 1), p.step)
            elif isinstance(p, NkiTensor):
                fail("NkiTensor.__getitem__", "index", "tensor (indirect) indexing is not supported; "
                                                        "use slices or nl.ds")
            elif p is not None and p is not Ellipsis and not isinstance(p, (int, slice)):
                try:
                    p = int(p)
                except TypeError:
                    fail("NkiTensor.__getitem__", "index", f"unsupported index {p!r}")
            if isinstance(p, slice) and p.step is not None and p.step <= 0:
                fail("NkiTensor.__getitem__", "index", "slice steps must be positive")
            parts.append(p)
        try:
            m = self._meta()[tuple(parts)]
        except IndexError as e:
            fail("NkiTensor.__getitem__", "index", f"{e} for shape {list(self.shape)}")
        return self._from_meta(m, "__getitem__")

    def __setitem__(self, idx, value):
        from . import language as nl
        nl._assign(self[idx], value)

    def slice(self, dim, start, end, step=1):
        parts = [slice(None)] * self.ndim
        parts[dim] = slice(start, end, step)
        return self[tuple(parts)]

    def select(self, dim, index):
        parts = [slice(None)] * self.ndim
        parts[dim] = index
        return self[tuple(parts)]

    def reshape(self, *shape):
        shape = tuple(shape[0]) if len(shape) == 1 and isinstance(shape[0], (tuple, list)) else shape
        if self.on_chip and shape and self.shape and shape[0] != self.shape[0]:
            fail("NkiTensor.reshape", None, f"reshape {list(self.shape)} -> {list(shape)} changes the partition "
                                            f"dimension of an on-chip tensor")
        try:
            m = self._meta().view(shape)
        except RuntimeError as e:
            fail("NkiTensor.reshape", None, f"cannot reshape {list(self.shape)} to {list(shape)} as a view: {e}")
        return self._from_meta(m, "reshape")

    def permute(self, *dims):
        dims = tuple(dims[0]) if len(dims) == 1 and isinstance(dims[0], (tuple, list)) else dims
        if self.on_chip and dims and dims[0] != 0:
            fail("NkiTensor.permute", None, "permute cannot move the partition dimension of an on-chip tensor "
                                            "(use nisa.nc_transpose)")
        return self._from_meta(self._meta().permute(dims), "permute")

    def expand_dim(self, dim):
        return self._from_meta(self._meta().unsqueeze(dim), "expand_dim")

    def squeeze_dim(self, dim):
        if self.shape[dim] != 1:
            fail("NkiTensor.squeeze_dim", None, f"dim {dim} has size {self.shape[dim]}, not 1")
        return self._from_meta(self._meta().squeeze(dim), "squeeze_dim")

    def broadcast(self, dim, size):
        if self.shape[dim] != 1:
            fail("NkiTensor.broadcast", None, f"dim {dim} has size {self.shape[dim]}, not 1")
        shape = list(self.shape)
        shape[dim] = size
        strides = list(self.strides)
        strides[dim] = 0
        if self.on_chip and dim == 0 and size > 1:
            fail("NkiTensor.broadcast", None, "an on-chip view cannot broadcast across partitions (broadcast the "
                                              "HBM tensor and DMA it, or copy with nl.broadcast_to)")
        return NkiTensor(self.storage, shape, strides, self.offset, _op="broadcast")

    def broadcast_to(self, shape):
        t = self
        for d, (have, want) in enumerate(zip(t.shape, shape)):
            if have != want:
                t = t.broadcast(d, want)
        return t

    def flatten_dims(self, start, end):
        shape = self.shape[:start] + (math.prod(self.shape[start:end + 1]),) + self.shape[end + 1:]
        return self.reshape(shape)

    def ap(self, pattern, offset=0, **_):
        """Raw access pattern: ``[[stride, count], ...]`` in elements, the first
        pair for the partition axis, ``offset`` from this view's start."""
        try:
            strides = tuple(int(s) for s, _n in pattern)
            shape = tuple(int(n) for _s, n in pattern)
        except (TypeError, ValueError):
            fail("NkiTensor.ap", "pattern", f"expected [[stride, count], ...], got {pattern!r}")
        return NkiTensor(self.storage, shape, strides, self.offset + int(offset), _op="ap")

    def view(self, dtype):
        dtype = _dtypes.check(dtype, "dtype", "NkiTensor.view")
        if dtype.itemsize != self.dtype.itemsize:
            fail("NkiTensor.view", "dtype", f"reinterpreting {_dtypes.name(self.dtype)} as "
                                            f"{_dtypes.name(dtype)} needs equal element sizes")
        st = Storage(self.storage.id, self.storage.buffer, dtype, self.storage.shape, self.storage.name,
                     self.storage.arg)
        st.reinterpret_of = self.storage
        return NkiTensor(st, self.shape, self.strides, self.offset, _check=False)

    reinterpret_cast = view

    @property
    def T(self):
        from . import language as nl
        return nl.transpose(self)

    # -- arithmetic builds nl ops ------------------------------------------
    def _bin(self, other, fn, reverse=False):
        from . import language as nl
        f = getattr(nl, fn)
        return f(other, self) if reverse else f(self, other)

    def __add__(self, o): return self._bin(o, "add")
    def __radd__(self, o): return self._bin(o, "add", True)
    def __sub__(self, o): return self._bin(o, "subtract")
    def __rsub__(self, o): return self._bin(o, "subtract", True)
    def __mul__(self, o): return self._bin(o, "multiply")
    def __rmul__(self, o): return self._bin(o, "multiply", True)
    def __truediv__(self, o): return self._bin(o, "divide")
    def __rtruediv__(self, o): return self._bin(o, "divide", True)
    def __pow__(self, o): return self._bin(o, "power")
    def __matmul__(self, o): return self._bin(o, "matmul")

    def __neg__(self):
        from . import language as nl
        return nl.negative(self)

    def __bool__(self):
        fail("NkiTensor.__bool__", None, "a tensor's value is not known while the kernel is traced; "
                                         "branch on shapes or constants, or use nl.where / nl.while_loop")

    __hash__ = object.__hash__


class DynSlice:
    """``nl.ds(start, size)``: ``size`` elements from ``start``."""

    __slots__ = ("start", "size", "step")

    def __init__(self, start, size, step=None):
        self.start, self.size, self.step = int(start), int(size), step

    def __repr__(self):
        return f"ds({self.start}, {self.size})"
