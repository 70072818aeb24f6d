"""NKI kernels as PyTorch operators: ``nki_op`` and ``wrap_nki``."""
from .op import nki_op, wrap_nki

__all__ = ["nki_op", "wrap_nki"]
