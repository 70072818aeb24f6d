"""The device executors nki runs kernels with.

nki imports no device extension: it is a kernel language with an interpreter
(NumPy and CPU tensors need nothing else). A PyTorch backend provides an
executor for its device type, and nki finds it by the tensors' device: through
``register_executor`` or, without any import by the user, the ``nki.executors``
entry point group (torch-neuronx registers ``neuron`` there), loaded on the
first kernel call that needs it. So ``torch_neuronx`` imports ``nki`` (for
``nki_op``) and never the other way round.

An executor provides:

* ``current_device() -> int``: the device index of an index-less device;
* ``host_alias(tensor) -> Tensor``: a CPU tensor over the device tensor's
  memory, for the interpreter running inside a launch;
* ``launch(index, fn, name)``: runs ``fn()`` as device work, in order on the
  device's current stream;
* optionally ``native_layout`` (a tuple) and ``native_program(words, imms,
  buffers, arena_bytes, name)``: the compiled executor of nki/_native.py's
  record programs (``program.run(tensors, threads)``).
"""
from __future__ import annotations

import sys
import threading
from importlib import metadata

from ._errors import NKIError

_lock = threading.Lock()
_executors: dict = {}
_loaded = False


def register_executor(device_type: str, executor) -> None:
    """Makes ``executor`` run NKI kernels on ``device_type`` tensors."""
    with _lock:
        _executors[device_type] = executor


def _load_entry_points(imported_only: bool = False) -> None:
    """Registers the entry points' executors; with ``imported_only``, only
    those whose backend package is already imported (host work never imports
    a device extension)."""
    global _loaded
    if _loaded:
        return
    for ep in metadata.entry_points(group="nki.executors"):
        if ep.name in _executors:
            continue
        if imported_only and ep.module.split(".")[0] not in sys.modules:
            continue
        register_executor(ep.name, ep.load()())
    _loaded = not imported_only


def executor(device_type: str):
    """The executor of ``device_type``; NKIError if no backend provides one."""
    if device_type not in _executors:
        _load_entry_points()
    try:
        return _executors[device_type]
    except KeyError:
        raise NKIError(f"nki.jit: no NKI executor is registered for device '{device_type}' "
                       f"(registered: {sorted(_executors) or 'none'}); import the device's PyTorch backend "
                       f"or call nki._device.register_executor") from None


def native_executor():
    """The executor that compiles record programs (the first registered one
    with ``native_program``), or None: kernels are then interpreted. NumPy
    arrays and CPU tensors use it only when its backend is imported (with
    torch's autoload, ``import torch`` does that)."""
    _load_entry_points(imported_only=True)
    for ex in _executors.values():
        if hasattr(ex, "native_program"):
            return ex
    return None
