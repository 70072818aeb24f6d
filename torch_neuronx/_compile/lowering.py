"""Neuron lowerings chained in front of whatever is registered.

Inductor tries ``torch._inductor.lowering.user_lowerings[op]`` (the table
custom-op lowerings use) before its own lowering and falls back to that when
it returns ``None``. The table holds one function per op, so writing into it
would drop another package's lowering of the same op. ``chain`` wraps the
entry present at install time: the neuron lowering runs first and returns
``None`` for other devices, and the previous entry (if any) then runs as
before, so CPU and GPU graphs see exactly what they saw without torch_neuronx.
"""
from __future__ import annotations


def chain(op, lowering) -> None:
    from torch._inductor.lowering import user_lowerings

    previous = user_lowerings.get(op)
    if getattr(previous, "neuron_lowering", None) is lowering:
        return

    def chained(*args, **kwargs):
        out = lowering(*args, **kwargs)
        if out is None and previous is not None:
            out = previous(*args, **kwargs)
        return out

    chained.neuron_lowering = lowering
    chained.previous = previous
    user_lowerings[op] = chained
