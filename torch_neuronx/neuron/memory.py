"""Memory statistics of the caching allocator, torch.cuda-style.

The numbers come from the runtime allocator through torch.accelerator's
generic DeviceAllocator interface, so both APIs always agree.
"""
import collections
import pickle
import sys

import torch

from neuron_tools._units import format_bytes

from .. import _C
from ._utils import _get_device_index


def _index(device):
    return _get_device_index(device, optional=True)


def memory_stats(device=None) -> "collections.OrderedDict[str, int]":
    """torch.cuda's statistics ("allocated_bytes.all.current", ...), plus the
    vendor TorchNeuron's keys over the same numbers: ``allocated_bytes``,
    ``reserved_bytes`` and ``active_bytes`` (each ``{"current", "peak",
    "allocated", "freed"}``), ``allocation_requests`` and ``num_tensor_frees``."""
    stats = torch.accelerator.memory_stats(_index(device))
    for kind in ("allocated_bytes", "reserved_bytes", "active_bytes"):
        stats[kind] = {field: stats.get(f"{kind}.all.{field}", 0) for field in ("current", "peak", "allocated", "freed")}
    stats["allocation_requests"] = stats.get("allocation.all.allocated", 0)
    stats["num_tensor_frees"] = stats.get("allocation.all.freed", 0)
    return stats


def memory_allocated(device=None) -> int:
    return torch.accelerator.memory_allocated(_index(device))


def max_memory_allocated(device=None) -> int:
    return torch.accelerator.max_memory_allocated(_index(device))


def memory_reserved(device=None) -> int:
    return torch.accelerator.memory_reserved(_index(device))


def max_memory_reserved(device=None) -> int:
    return torch.accelerator.max_memory_reserved(_index(device))


def reset_peak_memory_stats(device=None) -> None:
    torch.accelerator.reset_peak_memory_stats(_index(device))


def reset_max_memory_allocated(device=None) -> None:
    reset_peak_memory_stats(device)


def reset_accumulated_memory_stats(device=None) -> None:
    torch.accelerator.reset_accumulated_memory_stats(_index(device))


def empty_cache() -> None:
    """Returns cached, unused device blocks of every device to the system."""
    _C._empty_cache()


def mem_get_info(device=None) -> tuple:
    """``(free, total)`` bytes of the device's HBM budget."""
    return tuple(_C._mem_get_info(_index(device)))


def memory_summary(device=None, abbreviated: bool = False) -> str:
    idx = _index(device)
    s = memory_stats(idx)
    free, total = mem_get_info(idx)

    def fmt(n):
        return format_bytes(n, digits=2)

    rows = [("Allocated memory", "allocated_bytes.all"), ("Active memory", "active_bytes.all"),
            ("Requested memory", "requested_bytes.all"), ("Reserved memory", "reserved_bytes.all")]
    lines = [f"neuron:{idx} memory summary (capacity {fmt(total)}, free {fmt(free)})",
             f"{'metric':<20}{'current':>14}{'peak':>14}{'allocated':>14}{'freed':>14}"]
    for label, key in rows:
        lines.append(f"{label:<20}" + "".join(f"{fmt(s.get(f'{key}.{k}', 0)):>14}"
                                               for k in ("current", "peak", "allocated", "freed")))
    lines.append(f"{'Allocations':<20}{s.get('allocation.all.current', 0):>14}{s.get('allocation.all.peak', 0):>14}")
    lines.append(f"{'Segments':<20}{s.get('segment.all.current', 0):>14}{s.get('segment.all.peak', 0):>14}")
    lines.append(f"alloc retries: {s.get('num_alloc_retries', 0)}   OOMs: {s.get('num_ooms', 0)}")
    return "\n".join(lines)


# ---- memory debugging: history and snapshots in CUDA's format ---------------------------------------------------

def _record_memory_history(enabled="all", context="all", stacks="python", max_entries=sys.maxsize,
                           device=None, **kwargs) -> None:
    """Starts (or, with ``enabled=None``, stops) recording allocator history, as
    ``torch.cuda.memory._record_memory_history``: ``enabled="state"`` keeps the
    Python stack of every live allocation, ``"all"`` also keeps a trace of
    allocations and frees (at most ``max_entries`` per device). ``stacks``
    other than ``"python"`` are accepted; C++ frames are not recorded."""
    if stacks not in ("python", "all"):
        raise ValueError(f"stacks must be 'python' or 'all', got {stacks!r}")
    _C._record_memory_history(enabled, context, int(min(max_entries, 2**62)))


def _snapshot(device=None) -> dict:
    """The allocator's state (and trace, if recorded) as a dict in the format
    of ``torch.cuda.memory._snapshot()``: ``segments`` and ``device_traces``.
    ``torch.cuda._memory_viz`` and pytorch.org/memory_viz render it."""
    return _C._memory_snapshot()


def _dump_snapshot(filename="dump_snapshot.pickle") -> None:
    """Pickles ``_snapshot()`` to ``filename`` (open it in pytorch.org/memory_viz
    or ``python -m torch.cuda._memory_viz trace_plot filename -o out.html``)."""
    with open(filename, "wb") as f:
        pickle.dump(_snapshot(), f)


def memory_snapshot() -> list:
    """The allocator's segments (``_snapshot()["segments"]``), as ``torch.cuda.memory_snapshot``."""
    return _snapshot()["segments"]


def set_per_process_memory_fraction(fraction: float, device=None) -> None:
    """Caps this process's use of ``device`` at ``fraction`` of its HBM capacity;
    allocations beyond it raise ``torch.OutOfMemoryError``."""
    if not isinstance(fraction, float) and not isinstance(fraction, int):
        raise TypeError("fraction must be a float")
    _C._set_memory_fraction(float(fraction), _index(device))


def caching_allocator_alloc(size: int, device=None, stream=None) -> int:
    """Allocates ``size`` bytes of device memory from the caching allocator; returns the address."""
    if stream is not None and not isinstance(stream, (int, torch.Stream)):
        raise TypeError("stream must be a torch.Stream or an int")
    return _C._caching_allocator_alloc(int(size), _index(device))


def caching_allocator_delete(mem_ptr: int) -> None:
    """Returns memory from ``caching_allocator_alloc`` to the cache."""
    _C._caching_allocator_delete(int(mem_ptr))
