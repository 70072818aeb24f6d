"""Memory statistics of the caching allocator, torch.cuda-style.

The numbers come from the runtime allocator through torch.accelerator's
generic DeviceAllocator interface, so both APIs always agree.
"""
import collections

import torch

from .. import _C
from ._utils import _get_device_index


def _index(device):
    return _get_device_index(device, optional=True)


def memory_stats(device=None) -> "collections.OrderedDict[str, int]":
    return torch.accelerator.memory_stats(_index(device))


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
        for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
            if abs(n) < 1024 or unit == "TiB":
                return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
            n /= 1024

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
