"""Inductor's ``aten.cat`` lowering for neuron: CPU's rule.

Inductor lowers a cat either to ``pointwise_cat`` (one kernel computing each
output element from whichever input covers it, through a masked index
expression) or to a ``ConcatKernel`` (each input written into its slice of
the output, usually fused into the kernel that produces it). For device
``"cpu"`` it always takes the ConcatKernel: its C++ backend does not
vectorize the masked index expressions, so a pointwise cat runs scalar code
(``lowering.cat``). Neuron kernels come from that same C++ backend, but the
rule tests the device type, so neuron cats took the GPU heuristics and ran
scalar loops: in a FLUX transformer, GELU's tanh and a concatenation then
cost 15 % of a compiled step that CPU runs vectorized.

This lowering (chained into Inductor's user lowerings, lowering.py) applies
CPU's rule to neuron cats; the generated graph is then the one Inductor
generates for CPU. Everything else (other devices, one input, empty 1-D
inputs skipped by ATen, all-int8 cats, ``force_pointwise_cat``) goes on to
the previous lowering unchanged.
"""
from __future__ import annotations

import torch

from .device import _is_neuron

aten = torch.ops.aten


def _statically_empty_1d(x) -> bool:
    from torch._inductor.virtualized import V

    size = x.get_size()
    return len(size) == 1 and V.graph.sizevars.statically_known_equals(size[0], 0)


def cat(inputs, dim=0):
    from torch._inductor import config, ir
    from torch._inductor.lowering import (
        ELEMENTWISE_TYPE_PROMOTION_KIND,
        _validate_dim,
        get_promoted_dtype,
        to_dtype,
    )

    if (not inputs or not _is_neuron(inputs[0].get_device()) or config.force_pointwise_cat or len(inputs) < 2
            or any(_statically_empty_1d(x) for x in inputs)
            or all(x.get_dtype() in (torch.int8, torch.uint8) for x in inputs)):
        return None
    dim = _validate_dim(inputs[0], dim, 0)
    dtype = get_promoted_dtype(*inputs, type_promotion_kind=ELEMENTWISE_TYPE_PROMOTION_KIND.DEFAULT)
    return ir.TensorBox(ir.ConcatKernel.create([to_dtype(x, dtype) for x in inputs], dim))


def register() -> None:
    from .lowering import chain

    chain(aten.cat.default, cat)
