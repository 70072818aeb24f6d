"""Tracing: a kernel runs once per specialisation (argument shapes and
dtypes, constants, grid, target) with symbolic tensors; every instruction is
checked then and recorded into a tile-level Program. Python loops unroll and
branches resolve during the trace, as in the NKI compiler."""
import threading

from ._errors import NKIError, fail, user_location
from ._tensor import NkiTensor, Storage, shared_hbm

_state = threading.local()


class Instr:
    """One recorded instruction: ``run(env)`` executes it on whole tiles.
    ``tensors`` are the views it touches (for buffer lifetimes). ``ir`` is
    ``(kind, operands)`` for the instructions the native executor lowers
    (nki/_native.py), None for the others."""

    __slots__ = ("name", "run", "tensors", "loc", "ir")

    def __init__(self, name, run, tensors, loc, ir=None):
        self.name, self.run, self.tensors, self.loc, self.ir = name, run, tensors, loc, ir


class Program:
    """A traced kernel: instructions, storages, and the returned structure."""

    def __init__(self, storages, instrs, result, target):
        self.storages = storages
        self.instrs = instrs
        self.result = result
        self.target = target
        # Drop each kernel-allocated on-chip buffer after its last use, so a
        # long unrolled loop does not hold every tile it ever allocated.
        last = {}
        for i, ins in enumerate(instrs):
            for t in ins.tensors:
                last[t.storage.id] = i
        self.release = [[] for _ in instrs]
        for sid, i in last.items():
            st = storages[sid]
            if st.arg is None and st.buffer.on_chip:
                self.release[i].append(sid)

    def outputs(self):
        """Storages the kernel returns, in the order of its result structure."""
        out = []

        def walk(r):
            if isinstance(r, NkiTensor):
                out.append(r)
            elif isinstance(r, (tuple, list)):
                for x in r:
                    walk(x)
        walk(self.result)
        return out


class Tracer:
    def __init__(self, target, grid):
        self.target = target
        self.grid = grid
        self.program_id = (0,) * len(grid)
        self.storages = {}
        self.instrs = []
        self.shared = []          # shared_hbm allocations, in order (instance 0)
        self.shared_cursor = 0    # position in ``shared`` for the current instance
        self.instance = 0

    def new_storage(self, buffer, dtype, shape, name="", arg=None):
        if buffer is shared_hbm and arg is None:
            # shared_hbm is one tensor for all SPMD instances: the k-th allocation
            # of every instance is the k-th allocation of instance 0.
            if self.instance > 0:
                if self.shared_cursor >= len(self.shared):
                    fail("nki.language.ndarray", "buffer", "SPMD instances allocate different shared_hbm tensors")
                st = self.shared[self.shared_cursor]
                self.shared_cursor += 1
                if st.shape != tuple(shape) or st.dtype != dtype:
                    fail("nki.language.ndarray", "buffer", "SPMD instances allocate different shared_hbm tensors")
                return st
        st = Storage(len(self.storages), buffer, dtype, shape, name, arg)
        self.storages[st.id] = st
        if buffer is shared_hbm and arg is None:
            self.shared.append(st)
        return st

    def record(self, name, run, tensors, ir=None):
        self.instrs.append(Instr(name, run, tuple(t for t in tensors if isinstance(t, NkiTensor)),
                                 user_location(), ir))


def current(instr="nki.language"):
    tracer = getattr(_state, "tracer", None)
    if tracer is None:
        raise NKIError(f"{instr} can only be used inside an @nki.jit kernel (called while the kernel runs)")
    return tracer


def active():
    return getattr(_state, "tracer", None)


class tracing:
    def __init__(self, tracer):
        self.tracer = tracer

    def __enter__(self):
        self.prev = getattr(_state, "tracer", None)
        _state.tracer = self.tracer
        return self.tracer

    def __exit__(self, *exc):
        _state.tracer = self.prev


def record(name, run, *tensors, ir=None):
    current(name).record(name, run, tensors, ir)


def check_returned(result):
    """Kernel outputs are new ``shared_hbm`` tensors: other buffers do not
    outlive the kernel."""
    def walk(r):
        if isinstance(r, NkiTensor):
            if r.storage.buffer is not shared_hbm or r.storage.arg is not None:
                what = "a kernel argument" if r.storage.arg is not None else f"a {r.storage.buffer.name} tensor"
                raise NKIError(f"nki.jit: the kernel returns {what}; returned tensors must be allocated with "
                               f"buffer=nl.shared_hbm (other buffers do not outlive the kernel)")
            if (r.shape, r.offset) != (r.storage.shape, 0) or not r.is_contiguous():
                raise NKIError("nki.jit: the kernel returns a view; return the whole shared_hbm tensor")
        elif isinstance(r, (tuple, list)):
            for x in r:
                walk(x)
        elif r is not None:
            raise NKIError(f"nki.jit: kernels return shared_hbm tensors (or tuples of them), not {type(r).__name__}")
    walk(result)

