"""Inductor's ``aten.cat`` lowering for neuron: CPU's rule, a ConcatKernel
rather than a scalar ``pointwise_cat`` (docs/compile.md, "What the lowering does")."""
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
    from torch._inductor.lowering import ELEMENTWISE_TYPE_PROMOTION_KIND, _validate_dim, get_promoted_dtype, to_dtype

    # Other devices, and the cats CPU's rule leaves to pointwise_cat, go on to the previous lowering.
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
