"""Byte counts for people: the one formatter of the tools and of
``torch.neuron.memory_summary()`` (binary units, as PyTorch's summary)."""


def format_bytes(n: float, digits: int = 1) -> str:
    """``1536`` -> ``"1.5 KiB"``; whole bytes below 1 KiB."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.{digits}f} {unit}"
        n /= 1024
    return f"{n:.{digits}f} TiB"
