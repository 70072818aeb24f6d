"""``loop_reindexing_after_fusion`` off while a neuron graph is scheduled
(docs/compile.md, "The levers")."""
from __future__ import annotations

import functools
import types

_active: list = []


@functools.cache
def reindexing_raises_on_cpp_groups() -> bool:
    """Probe: stock Inductor's reindexing step fails on a non-cpu node pair
    grouped as C++ kernels are (``((sizes...), (reduction sizes...))``)."""
    from torch._inductor.scheduler import Scheduler

    def node(reduction):
        return types.SimpleNamespace(is_cpu=lambda: False, is_reduction=lambda: reduction,
                                     group=("neuron", ((4,), (8,))), get_nodes=lambda: [])

    try:
        Scheduler._try_reindex_pointwise_for_reduction(None, node(True), node(False))
    except TypeError:
        return True
    return False


def enter_neuron_graph() -> None:
    # Off from the creation of a neuron graph's top-level wrapper (just before
    # Inductor builds the scheduler) until it has generated its code; CPU and
    # GPU graphs keep the user's value. (A neuron compile that raises in
    # between leaves the flag off for the rest of the process.)
    from torch._inductor import config

    if reindexing_raises_on_cpp_groups():
        patch = config.patch(loop_reindexing_after_fusion=False)
        patch.__enter__()
        _active.append(patch)


class NeuronGraphWrapper:
    """Mixin of the neuron top-level wrapper codegens: their ``create()``
    calls ``enter_neuron_graph()``; generating their code ends the span."""

    def generate(self, is_inference):
        try:
            return super().generate(is_inference)
        finally:
            if _active:
                _active.pop().__exit__(None, None, None)

