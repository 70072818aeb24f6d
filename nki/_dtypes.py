"""NKI dtypes. They are torch dtypes, so kernels can compare ``x.dtype ==
nl.bfloat16`` whatever framework passed the arguments; NumPy dtypes are
translated at the kernel boundary."""
import numpy as np
import torch

from ._errors import NKIError

bool_ = torch.bool
int8, int16, int32 = torch.int8, torch.int16, torch.int32
uint8, uint16, uint32 = torch.uint8, torch.uint16, torch.uint32
float16, bfloat16, float32 = torch.float16, torch.bfloat16, torch.float32
# tf32 operands are fp32 values the PE truncates; we keep them as fp32.
tfloat32 = torch.float32
float8_e4m3fn = torch.float8_e4m3fn
# torch has no IEEE-style e4m3 (with infinities); the fn variant is the closest.
float8_e4m3 = torch.float8_e4m3fn
float8_e5m2 = torch.float8_e5m2

SUPPORTED = (bool_, int8, int16, int32, uint8, uint16, uint32, float16, bfloat16, float32,
             float8_e4m3fn, float8_e5m2)
_LOW_PRECISION = (float16, bfloat16, float8_e4m3fn, float8_e5m2)

_NUMPY = {np.dtype(np.bool_): bool_, np.dtype(np.int8): int8, np.dtype(np.int16): int16,
          np.dtype(np.int32): int32, np.dtype(np.uint8): uint8, np.dtype(np.uint16): uint16,
          np.dtype(np.uint32): uint32, np.dtype(np.float16): float16, np.dtype(np.float32): float32}
_TO_NUMPY = {v: k for k, v in _NUMPY.items()}


def name(dtype):
    return str(dtype).replace("torch.", "")


def check(dtype, what, instr="nki.language.ndarray"):
    """``dtype`` normalised to a supported torch dtype, or NKIError. NeuronCores
    have no float64, complex or 64-bit integer arithmetic."""
    if isinstance(dtype, (np.dtype, type)) or isinstance(dtype, str):
        try:
            dtype = _NUMPY[np.dtype(dtype)]
        except (KeyError, TypeError):
            from ._errors import fail
            fail(instr, what, f"dtype {dtype} is not supported on NeuronCores "
                              f"(no float64, complex or 64-bit integers)")
    if dtype not in SUPPORTED:
        from ._errors import fail
        fail(instr, what, f"dtype {name(dtype)} is not supported on NeuronCores "
                          f"(no float64, complex or 64-bit integers)")
    return dtype


def from_numpy(dtype):
    try:
        return _NUMPY[np.dtype(dtype)]
    except KeyError:
        raise NKIError(f"NumPy dtype {dtype} is not supported on NeuronCores "
                       f"(no float64, complex or 64-bit integers)") from None


def to_numpy(dtype):
    try:
        return _TO_NUMPY[dtype]
    except KeyError:
        raise NKIError(f"a kernel called with NumPy arrays returned a {name(dtype)} tensor, which NumPy "
                       f"cannot hold; call it with torch tensors instead") from None


def is_float(dtype):
    return dtype.is_floating_point


def is_low_precision(dtype):
    return dtype in _LOW_PRECISION


def sentinel(dtype):
    """Fill value of fresh buffers (as the vendor's simulator): NaN, so a read
    of unwritten memory shows up in results; integers get 4."""
    if dtype.is_floating_point:
        return float("nan")
    return True if dtype == torch.bool else 4
