"""Errors raised by NKI kernels, located at the kernel's source line."""
import linecache
import os
import sys

_PKG_DIR = os.path.dirname(os.path.abspath(__file__))
_INTERNAL = (_PKG_DIR + os.sep, os.path.join("torch_neuronx", "_nki") + os.sep)


class NKIError(ValueError):
    """A kernel broke a rule of the NKI language or of the hardware (a tile
    limit, a buffer kind, a dtype). The message names the instruction, the
    operand, the limit and the kernel source line."""


def user_location():
    """``file:line: code`` of the innermost frame outside this package: the
    kernel line that issued the instruction being checked."""
    frame = sys._getframe(1)
    while frame is not None and any(p in frame.f_code.co_filename for p in _INTERNAL):
        frame = frame.f_back
    if frame is None:
        return "<unknown>"
    fn, line = frame.f_code.co_filename, frame.f_lineno
    code = linecache.getline(fn, line).strip()
    return f"{fn}:{line}" + (f": {code}" if code else "")


def fail(instr, operand, message):
    """Raises NKIError for ``instr`` (e.g. ``nki.isa.nc_matmul``) and its
    ``operand`` (None when the rule is not about one operand)."""
    where = user_location()
    subject = f"{instr}: operand '{operand}'" if operand else instr
    raise NKIError(f"{subject}: {message} (at {where})")
