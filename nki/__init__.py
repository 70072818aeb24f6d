"""NKI (Neuron Kernel Interface) for torch-neuronx: the current ``nki.*``
API (destination-first ISA calls), traced once per specialisation and
executed on whole tiles by our NeuronCore simulator.

    import nki, nki.language as nl, nki.isa as nisa

    @nki.jit
    def add(a, b):
        out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
        ...
        return out

Kernels take torch tensors on ``neuron`` (zero-copy views of device memory),
CPU torch tensors or NumPy arrays. See docs/nki.md.
"""
import os as _os

from . import isa, language, typing  # noqa: F401
from ._errors import NKIError
from ._jit import Kernel, argument_copies, jit, simulate

__version__ = "0.6.0+torchneuronx"

# NKI_SIMULATOR=1 reroutes @nki.jit to the simulator; without hardware both
# names run the same interpreter, so the switch is accepted and has no effect.
simulator_enabled = _os.environ.get("NKI_SIMULATOR", "0") == "1"

__all__ = ["jit", "simulate", "argument_copies", "Kernel", "NKIError", "isa", "language", "typing"]
