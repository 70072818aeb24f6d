"""``torch.neuron``: the device module, with the torch.cuda-parity API that
PyTorch (checkpointing, FSDP2, DeviceMesh, torch.accelerator) and the Hugging
Face libraries call."""
from dataclasses import dataclass
import threading

import torch

from .. import _C, _env
from . import _utils
from ._utils import _get_device_index
from .memory import (  # noqa: F401
    caching_allocator_alloc, caching_allocator_delete, empty_cache, max_memory_allocated, max_memory_reserved,
    mem_get_info, memory_allocated, memory_reserved, memory_snapshot, memory_stats, memory_summary,
    reset_accumulated_memory_stats, reset_max_memory_allocated, reset_peak_memory_stats,
    set_per_process_memory_fraction,
)
from . import memory  # noqa: F401  (torch.neuron.memory._record_memory_history, ...)
from .random import (  # noqa: F401
    default_generators, get_rng_mode, get_rng_state, get_rng_state_all, initial_seed, manual_seed, manual_seed_all,
    seed, seed_all, set_rng_mode, set_rng_state, set_rng_state_all,
)
from .streams import Event, Stream, StreamContext, current_stream, default_stream, set_stream, stream  # noqa: F401
from .graphs import (  # noqa: F401
    NeuronGraph, graph, graph_pool_handle, is_current_stream_capturing, make_graphed_callables,
)

_initialized = False
_init_lock = threading.Lock()


def is_available() -> bool:
    """True if at least one NeuronCore is visible. Creates no device context.

    Raises ValueError naming the variable when ``NEURON_RT_NUM_CORES``,
    ``NEURON_RT_VISIBLE_CORES`` or ``NEURON_RT_HBM_BYTES`` is malformed, rather
    than reporting no device (callers would silently fall back to the CPU).
    """
    _check_configuration()
    return _C._device_count() > 0


def device_count() -> int:
    """Number of visible NeuronCores; raises ValueError like ``is_available``."""
    _check_configuration()
    return _C._device_count()


def _check_configuration() -> None:
    # The runtime's variables, then the Python layer's (torch_neuronx/_env.py).
    _C._check_configuration()
    _env.check()


def is_initialized() -> bool:
    return _initialized and not _C._in_bad_fork()


def _lazy_init():
    """Called by PyTorch before the first neuron tensor is created from Python."""
    global _initialized
    if _initialized and not _C._in_bad_fork():
        return
    with _init_lock:
        if _C._in_bad_fork():
            raise RuntimeError(
                "Cannot re-initialize neuron in forked subprocess. To use neuron with multiprocessing, you must "
                "use the 'spawn' start method")
        _check_not_in_dataloader_worker()
        _check_configuration()
        _C._lazy_init()
        _initialized = True


def _check_not_in_dataloader_worker():
    # A neuron tensor cannot be sent between processes (device memory belongs
    # to the process's runtime), so a DataLoader worker that made one would
    # fail while pickling it in its queue's feeder thread, where the error is
    # lost and the main process waits forever. Refuse it here instead: the
    # worker re-raises in the main process.
    import sys

    worker = sys.modules.get("torch.utils.data._utils.worker")
    if worker is not None and worker.get_worker_info() is not None:
        raise RuntimeError(
            "neuron tensors cannot be created in a DataLoader worker process: they cannot be sent to the main "
            "process. Return CPU tensors from the dataset and move each batch to neuron in the main process "
            "(DataLoader(..., pin_memory=True) and batch.to('neuron', non_blocking=True)).")


def init():
    _lazy_init()


def _is_in_bad_fork() -> bool:
    """True in a child forked after the neuron runtime was initialized."""
    return _C._in_bad_fork()


def current_device() -> int:
    return _C._current_device()


def set_device(device) -> None:
    index = _get_device_index(device, optional=True)
    if index >= 0:
        # Choosing a device initializes it (as torch.cuda/torch.xpu do):
        # FakeTensor and DeviceMesh read is_initialized() to resolve a bare
        # "neuron" to the current device instead of neuron:0.
        _lazy_init()
        _C._set_device(index)


def _default_device_from_launcher() -> None:
    # Under a launcher (torchrun, accelerate launch) each process owns
    # LOCAL_RANK's NeuronCore: make it current, so bare torch.device("neuron")
    # and current_device() agree with device_ids=[LOCAL_RANK] (as Accelerate
    # and AWS's examples assume). Only a thread-local index: no runtime init.
    import os

    local_rank = os.environ.get("LOCAL_RANK")
    if not local_rank or not local_rank.lstrip("-").isdigit():
        return
    count = device_count()
    if count > 0 and int(local_rank) >= 0:
        _C._set_device(int(local_rank) % count)


_default_device_from_launcher()


class device:
    """Context manager that makes ``device`` current, as ``torch.cuda.device``."""

    def __init__(self, device):
        self.idx = _get_device_index(device, optional=True) if device is not None else -1
        self.prev_idx = -1

    def __enter__(self):
        if self.idx >= 0:
            self.prev_idx = _C._exchange_device(self.idx)

    def __exit__(self, *args):
        if self.idx >= 0:
            _C._set_device(self.prev_idx)
        return False


class device_of(device):
    """Context manager that makes the device of tensor ``obj`` current."""

    def __init__(self, obj):
        super().__init__(obj.get_device() if obj.device.type == "neuron" else None)


def synchronize(device=None) -> None:
    """Waits for all work on all streams of ``device``."""
    _C._synchronize(_get_device_index(device, optional=True))


@dataclass(frozen=True)
class _NeuronDeviceProperties:
    name: str
    total_memory: int
    major: int
    minor: int
    physical_core: int

    @property
    def multi_processor_count(self) -> int:  # NeuronCore engines: tensor, vector, scalar, gpsimd
        return 4


def get_device_properties(device=None) -> _NeuronDeviceProperties:
    return _NeuronDeviceProperties(*_C._get_device_properties(_get_device_index(device, optional=True)))


def get_device_name(device=None) -> str:
    return get_device_properties(device).name


def get_device_capability(device=None) -> tuple:
    p = get_device_properties(device)
    return (p.major, p.minor)


def get_amp_supported_dtype():
    return [torch.bfloat16, torch.float16]


def is_bf16_supported(including_emulation: bool = True) -> bool:
    return True


def get_arch_list() -> list:
    """Architectures this build targets: the NeuronCore generation of the host runtime."""
    p = get_device_properties(0) if device_count() else None
    return [f"neuroncore-v{p.major}" if p else "neuroncore-v3"]


__all__ = [
    "Event", "Stream", "StreamContext", "caching_allocator_alloc", "caching_allocator_delete", "current_device", "current_stream", "default_generators", "default_stream",
    "device", "device_count", "device_of", "empty_cache", "get_amp_supported_dtype", "get_device_capability",
    "get_arch_list", "get_device_name", "get_device_properties", "get_rng_mode", "get_rng_state", "get_rng_state_all", "init", "initial_seed",
    "is_available", "is_bf16_supported", "is_initialized", "manual_seed", "manual_seed_all", "max_memory_allocated",
    "max_memory_reserved", "mem_get_info", "memory_allocated", "memory_reserved", "memory_snapshot", "memory_stats", "memory_summary",
    "reset_accumulated_memory_stats", "reset_peak_memory_stats", "seed", "seed_all", "set_device", "set_per_process_memory_fraction", "set_rng_mode", "set_rng_state",
    "set_rng_state_all", "set_stream", "stream", "synchronize",
]


_COMPILER_ATTRS = {"Scheduling", "PythonWrapperCodegen", "CppWrapperCodegen", "WrapperFxCodegen"}


def __getattr__(name):
    # Inductor looks these up on the device module the first time it compiles
    # for `neuron`; importing the compiler integration only then keeps
    # `import torch` free of Dynamo/Inductor.
    if name in _COMPILER_ATTRS:
        from .. import _compile
        from .._compile import device

        _compile.install("inductor")
        return getattr(device, name)
    if name in ("get_dynamo_metrics", "reset_dynamo_metrics"):
        from .._compile import dynamo

        return getattr(dynamo, name)
    raise AttributeError(f"module 'torch.neuron' has no attribute {name!r}")

