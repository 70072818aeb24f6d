"""``torch_neuronx.utils``: the configuration queries and small helpers that
scripts written for the vendor's TorchNeuron import (docs/compat.md).

Each query reports this backend's real configuration; where the product has a
compiler path we do not (MLIR ATen ops, StableHLO, NEFFs), it says so.
"""
import contextlib
import warnings

import torch

from . import _C, _env

__all__ = [
    "flatten_tensors", "get_device_from_tensors", "get_logical_neuron_cores", "get_neuron_registered_ops",
    "get_platform_target", "is_neff_cache_disabled", "is_stablehlo_enabled", "is_sync_mode_enabled",
    "log_executed_op", "log_offloaded_op", "move_pytree_to_cpu", "move_pytree_to_neuron", "suppress_specific_warnings",
    "use_mlir_aten_ops",
]


def is_sync_mode_enabled() -> bool:
    """True when every launch runs synchronously: ``NEURON_RT_LAUNCH_BLOCKING=1``
    or the product's ``NEURON_LAUNCH_BLOCKING=1`` (read once, by the runtime)."""
    return bool(_C._launch_blocking())


def use_mlir_aten_ops() -> bool:
    """Always False: ops run the host runtime's kernels, not MLIR-compiled ATen ops."""
    return False


def is_stablehlo_enabled() -> bool:
    """Always False: torch.compile lowers through Inductor, not StableHLO."""
    return False


def is_neff_cache_disabled() -> bool:
    """True when ``TORCH_NEURONX_DISABLE_NEFF_CACHE`` or ``TORCH_NEURONX_NEFF_DISABLE_CACHE``
    is set: neuron graphs then skip Inductor's persistent compile cache."""
    return _env.neff_cache_disabled()


# NeuronCore generation -> the Trainium that carries it (NEURON_RT_TARGET's names).
_TARGETS = {2: "trn1", 3: "trn2", 4: "trn3"}


def get_platform_target() -> str:
    """The Trainium generation the device models: ``trn1``, ``trn2`` or ``trn3``
    (``NEURON_RT_TARGET``; without it the NeuronCore-v3 default, trn2's core)."""
    major = torch.neuron.get_device_properties(0).major if torch.neuron.device_count() else 3
    return _TARGETS.get(major, "trn2")


def get_logical_neuron_cores() -> str:
    """Physical NeuronCores per logical device, as a string ("1": one device is one core)."""
    return "1"


def get_neuron_registered_ops(as_sorted: bool = False, keep_variant: bool = False):
    """ATen ops with a neuron kernel (no ``aten::`` prefix). By default one name
    per op ("add"); ``keep_variant=True`` keeps overloads ("add.Tensor")."""
    from . import _op_support

    names = {n if keep_variant else n.split(".")[0] for n in _op_support.neuron_kernels()}
    return sorted(names) if as_sorted else names


def log_executed_op(name: str) -> None:
    """Adds ``name`` to the executed-op record (``torch_neuronx.get_executed_ops()``)."""
    _C._note_executed_op(str(name))


def log_offloaded_op(name: str) -> None:
    """Adds one call of ``name`` to the fallback record (``torch_neuronx.get_fallback_ops()``)."""
    _C._note_fallback_op(str(name))


def flatten_tensors(obj) -> list:
    """The tensors in a nested structure of lists, tuples and dicts, in order."""
    return [leaf for leaf in torch.utils._pytree.tree_leaves(obj) if isinstance(leaf, torch.Tensor)]


def get_device_from_tensors(obj):
    """The device of the first neuron tensor in ``obj``, else of its first tensor, else None."""
    tensors = flatten_tensors(obj)
    return next((t.device for t in tensors if t.device.type == "neuron"), tensors[0].device if tensors else None)


def _move(obj, device):
    return torch.utils._pytree.tree_map(lambda x: x.to(device) if isinstance(x, torch.Tensor) else x, obj)


def move_pytree_to_cpu(obj):
    """``obj`` with every tensor moved to the CPU."""
    return _move(obj, "cpu")


def move_pytree_to_neuron(obj, device="neuron"):
    """``obj`` with every tensor moved to ``device`` (the current neuron device by default)."""
    return _move(obj, device)


@contextlib.contextmanager
def suppress_specific_warnings(patterns):
    """Ignores warnings whose message matches any of ``patterns`` (regular expressions) inside the block."""
    if isinstance(patterns, str):
        patterns = [patterns]
    with warnings.catch_warnings():
        for pattern in patterns:
            warnings.filterwarnings("ignore", message=pattern)
        yield
