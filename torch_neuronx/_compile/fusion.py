"""``loop_reindexing_after_fusion`` off while a neuron graph is scheduled.

The scheduler's step that reindexes a pointwise loop to a reduction's
iteration groups (``Scheduler._try_reindex_pointwise_for_reduction``, added by
pytorch/pytorch#176927) assumes Triton's ``(numel, rnumel)`` groups and raises
a ``TypeError`` on C++ kernels' groups; it skips nodes on ``cpu``, not other
devices whose kernels are generated as C++.

The flag is switched off (``config.patch``) only from the creation of a neuron
graph's top-level wrapper, just before Inductor builds the graph's scheduler
(``GraphLowering.codegen``), until that wrapper has generated its code: the
scheduler's fusion and any subgraph's run inside that span; CPU and GPU graphs
keep the user's value. (A neuron compile that raises in between leaves the
flag off for the rest of the process, as it was before this scoping.)
"""
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

