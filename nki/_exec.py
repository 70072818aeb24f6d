"""Executes a traced Program with whole-tile torch operations.

Buffers are flat torch tensors: kernel arguments and shared_hbm outputs are
bound to the caller's memory (host aliases of neuron storage, or NumPy
memory), on-chip buffers are allocated at first use, filled with the NaN
sentinel, and dropped after their last use. Every instruction computes in
fp32 and rounds when it stores, as the Vector/Scalar engines do."""
import torch

from . import _dtypes, _philox
from ._errors import NKIError


class Env:
    def __init__(self, program, bound, precise=True):
        self.program = program
        self.bufs = dict(bound)
        self.seed = self.bufs.pop(_philox.SEED, None)
        self.written = {}
        self.precise = precise
        self.regs = {}

    def key(self):
        """This call's Philox key (nki/_philox.py), drawn once."""
        if self.seed is None:
            self.seed = _philox.draw_key()
        return self.seed

    def registers(self, engine):
        """The engine's accumulator registers (one fp32 per partition)."""
        r = self.regs.get(engine)
        if r is None:
            r = self.regs[engine] = torch.zeros(128)
        return r

    def flat(self, st):
        t = self.bufs.get(st.id)
        if t is None:
            # A dtype view shares its storage: allocate in the storage's own dtype.
            dtype = getattr(st, "reinterpret_of", st).dtype
            if not self.precise and st.buffer.on_chip and dtype.is_floating_point and dtype != torch.float32:
                # NKI_PRECISE_FP=0: on-chip tiles keep fp32 values (no rounding).
                dtype = torch.float32
            t = torch.full((st.numel,), _dtypes.sentinel(dtype), dtype=dtype)
            self.bufs[st.id] = t
        reinterpret = getattr(st, "reinterpret_of", None)
        if reinterpret is not None and t.dtype != st.dtype:
            t = t.view(st.dtype)
        return t

    def view(self, v):
        flat = self.flat(v.storage)
        return flat.as_strided(v.shape, v.strides, flat.storage_offset() + v.offset)

    def f32(self, v):
        """The operand's values in fp32 (the engines' internal precision)."""
        x = self.view(v)
        return x if x.dtype == torch.float32 else x.to(torch.float32)

    def ints(self, v):
        x = self.view(v)
        return x.to(torch.int64)

    def scalar(self, s, ndim, ints=False):
        """A per-partition operand: a Python number, or a [P, 1] tile that
        broadcasts along the free dims of an ``ndim``-D tile (its integers
        for a bitvector op)."""
        if hasattr(s, "storage"):
            x = self.ints(s) if ints else self.f32(s)
            return x.reshape((x.shape[0],) + (1,) * (ndim - 1))
        return float(s)

    def write(self, v, value):
        dst = self.view(v)
        if isinstance(value, torch.Tensor):
            if value.dtype.is_floating_point and not dst.dtype.is_floating_point and dst.dtype != torch.bool:
                # Float to integer conversion rounds to nearest.
                value = torch.round(value)
                if dst.dtype == torch.uint32:
                    # Through int64, then the low 32 bits: torch's own float -> uint32 copy
                    # gives out-of-range values differently in its vector and scalar loops.
                    value = value.to(torch.int64)
            if value.untyped_storage().data_ptr() == dst.untyped_storage().data_ptr():
                value = value.clone()
        dst.copy_(value)
        if v.storage.buffer.name == "psum":
            self.mask(v).fill_(True)

    def mask(self, v):
        """Which PSUM elements were written since allocation (first matmul
        write overwrites, later ones accumulate)."""
        m = self.written.get(v.storage.id)
        if m is None:
            m = torch.zeros(v.storage.numel, dtype=torch.bool)
            self.written[v.storage.id] = m
        return m.as_strided(v.shape, v.strides, v.offset)


def execute(program, bound, precise=True):
    env = Env(program, bound, precise)
    for ins, release in zip(program.instrs, program.release):
        try:
            ins.run(env)
        except NKIError:
            raise
        except Exception as e:  # a runtime failure still names the kernel line
            raise NKIError(f"{ins.name}: failed while executing: {e} (at {ins.loc})") from e
        for sid in release:
            env.bufs.pop(sid, None)
            env.written.pop(sid, None)
    return env


def run_subprogram(env, instrs):
    for ins in instrs:
        try:
            ins.run(env)
        except NKIError:
            raise
        except Exception as e:
            raise NKIError(f"{ins.name}: failed while executing: {e} (at {ins.loc})") from e
