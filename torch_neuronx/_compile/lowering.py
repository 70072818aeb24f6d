"""Neuron lowerings chained in front of whatever
``torch._inductor.lowering.user_lowerings`` holds (docs/compile.md, "The levers")."""
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
