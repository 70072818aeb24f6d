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
        """The tensors the kernel allocated (shared_hbm) and returns, in the
        order of its result structure. Returned arguments are not outputs:
        the caller's tensor comes back."""
        out = []

        def walk(r):
            if isinstance(r, NkiTensor):
                if r.storage.arg is None:
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


def written_args(program):
    """Names of the HBM arguments the kernel may write: the destination
    (first tensor) of every instruction; every argument a device loop
    touches (its body is not looked into)."""
    names = set()
    for ins in program.instrs:
        touched = ins.tensors if ins.name == "nki.language.while_loop" else ins.tensors[:1]
        names.update(t.storage.arg for t in touched if t.storage.arg is not None)
    return names


def record(name, run, *tensors, ir=None):
    current(name).record(name, run, tensors, ir)


def check_returned(result):
    """A kernel returns what outlives it: tensors it allocated with
    ``buffer=nl.shared_hbm`` and its HBM arguments (the NKI beta-2 style
    writes an output argument and returns it). On-chip tiles and private
    HBM are gone when the kernel ends."""
    def walk(r):
        if isinstance(r, NkiTensor):
            st = r.storage
            whole = (r.shape, r.offset) == (st.shape, 0) and r.is_contiguous()
            if st.arg is not None:
                if not whole:
                    raise NKIError(f"nki.jit: the kernel returns a view of argument '{st.arg}'; return the whole "
                                   f"argument (the caller's tensor is what comes back)")
                return
            if st.buffer is not shared_hbm:
                hint = ("copy it out through SBUF (nisa.tensor_copy, then nisa.dma_copy)"
                        if st.buffer.name == "psum" else "copy it out with nisa.dma_copy")
                raise NKIError(f"nki.jit: the kernel returns a {st.buffer.name} tensor; returned tensors must be "
                               f"allocated with buffer=nl.shared_hbm or be HBM arguments ({st.buffer.name} "
                               f"tensors do not outlive the kernel): {hint} and return that")
            if not whole:
                raise NKIError("nki.jit: the kernel returns a view; return the whole shared_hbm tensor")
        elif isinstance(r, (tuple, list)):
            for x in r:
                walk(x)
        elif r is not None:
            raise NKIError(f"nki.jit: kernels return shared_hbm tensors or their HBM arguments (or tuples of them), "
                           f"not {type(r).__name__}")
    walk(result)
