"""The random numbers of ``nl.rand``, ``nl.dropout`` and ``nisa.dropout``:
Philox4x32-10 (Salmon et al., SC'11), counter-based, so the interpreter
(here, NumPy uint64 arithmetic) and the native executor (the runtime's
csrc/runtime/Philox.h) produce the same bits.

Each kernel call draws one 64-bit key from torch's default CPU generator
(``torch.manual_seed`` makes kernels reproducible; two calls differ). The
k-th random instruction of a kernel reads subsequence k; element i of its
tile (row-major) is 32-bit word i % 4 of block i // 4, and the uniform value
is its top 24 bits times 2^-24, in [0, 1)."""
import numpy as np

import torch

_MASK = np.uint64(0xFFFFFFFF)
_M0, _M1 = np.uint64(0xD2511F53), np.uint64(0xCD9E8D57)
_W0, _W1 = np.uint64(0x9E3779B9), np.uint64(0xBB67AE85)


def draw_key():
    """One key per kernel call, from torch's default CPU generator."""
    lo, hi = torch.randint(0, 2 ** 32, (2,), dtype=torch.int64).tolist()
    return lo | (hi << 32)


def key_words(key):
    """The key as the two uint32 words the native program reads."""
    return [key & 0xFFFFFFFF, key >> 32]


def _blocks(key, blocks, stream):
    """Philox4x32-10 of counters (block, stream): four uint32 words each."""
    k0, k1 = np.uint64(key & 0xFFFFFFFF), np.uint64(key >> 32)
    c0, c1 = blocks & _MASK, blocks >> np.uint64(32)
    c2 = np.full_like(blocks, stream & 0xFFFFFFFF)
    c3 = np.full_like(blocks, stream >> 32)
    for _ in range(10):
        p0, p1 = _M0 * c0, _M1 * c2  # (32 x 32 bits: exact in uint64)
        c0, c1, c2, c3 = (p1 >> np.uint64(32)) ^ c1 ^ k0, p1 & _MASK, (p0 >> np.uint64(32)) ^ c3 ^ k1, p0 & _MASK
        k0, k1 = (k0 + _W0) & _MASK, (k1 + _W1) & _MASK
    return np.stack([c0, c1, c2, c3], axis=1)


def uniform(key, stream, shape):
    """fp32 uniform values in [0, 1) for a tile of ``shape`` (a torch tensor)."""
    n = int(np.prod(shape, dtype=np.int64))
    words = _blocks(key, np.arange((n + 3) // 4, dtype=np.uint64), stream).reshape(-1)[:n]
    u = (words >> np.uint64(8)).astype(np.float32) * np.float32(1.0 / 16777216.0)
    return torch.from_numpy(u).reshape(tuple(shape))


SEED = "nki.seed"  # the bound-dict key of a call's key (nki/_jit.py)


def stream(instr):
    """At trace time: the next subsequence of the kernel, and a view of the
    [1, 2] uint32 storage the native program reads the call's key from."""
    from . import _trace
    from ._tensor import NkiTensor, private_hbm
    tr = _trace.current(instr)
    k = getattr(tr, "nrandom", 0)
    tr.nrandom = k + 1
    st = getattr(tr, "seed_storage", None)
    if st is None:
        st = tr.seed_storage = tr.new_storage(private_hbm, torch.uint32, (1, 2), SEED)
    return k, NkiTensor(st, (1, 2), _check=False)


def seed_storage(program):
    """The key's storage of a traced program (None: it draws nothing)."""
    for st in program.storages.values():
        if st.name == SEED and st.dtype == torch.uint32 and st.arg is None:
            return st
    return None
