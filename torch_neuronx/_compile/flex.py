"""Inductor lowerings of the FlexAttention HOPs for neuron tensors: the CPU
C++ template for inference, the HOPs' math inlined as IR otherwise
(docs/compile.md, "FlexAttention")."""
from __future__ import annotations

import contextlib
import copy

import sympy
import torch
from torch._higher_order_ops.flex_attention import sdpa_dense, sdpa_dense_backward
from torch._inductor import ir
from torch._inductor.virtualized import V

from .device import _host_codegen, _is_neuron


def _is_traced(value) -> bool:
    # Captured tensors and symbolic ints (e.g. a padding mask's length) are
    # inputs of the traced math; plain ints are constants.
    return isinstance(value, ir.IRNode) or (isinstance(value, sympy.Expr) and not value.is_Integer)


def _captured(score_buffers, mask_buffers):
    """The traced values among score_mod's and mask_mod's captured buffers,
    and a function that rebuilds both buffer tuples from those values."""
    score, mask = ([b if _is_traced(b) else int(b) if isinstance(b, sympy.Expr) else b for b in buffers]
                   for buffers in (score_buffers, mask_buffers))

    def rebuild(traced):
        values = iter(traced)  # in the order of the traced list
        return tuple(tuple(next(values) if _is_traced(b) else b for b in buffers) for buffers in (score, mask))

    return [b for b in score + mask if _is_traced(b)], rebuild


def _inline_math(name: str, impl, inputs: list):
    """Traces ``impl(*inputs)`` (IR nodes and symbolic ints, as fake values)
    with Inductor's decompositions and lowers the result as IR nodes of the
    current graph."""
    from torch._inductor.codegen.subgraph import inline_subgraph_to_ir_nodes
    from torch._inductor.decomposition import select_decomp_table
    from torch._inductor.lowering import validate_ir
    from torch._inductor.utils import convert_to_symint
    from torch.fx.experimental.proxy_tensor import make_fx

    with V.fake_mode:
        fake_inputs = [ir.ir_node_to_tensor(x) if isinstance(x, ir.IRNode) else convert_to_symint(x) for x in inputs]
        gm = make_fx(impl, decomposition_table=select_decomp_table(), tracing_mode="symbolic")(*fake_inputs)
    result = inline_subgraph_to_ir_nodes(gm, inputs, name)
    validate_ir(result)
    return result


def _batchable(subgraph: ir.Subgraph) -> torch.fx.GraphModule:
    """The subgraph's module, with ``prims.convert_element_type`` (in every
    low-precision score_mod and its joint graph) as ``aten._to_copy``: the
    math implementations vmap these graphs, and the prim has no batching
    rule, so functorch would run (and trace) it once per score element."""
    gm = subgraph.graph_module
    convert = torch.ops.prims.convert_element_type.default
    if not any(n.target is convert for n in gm.graph.nodes):
        return gm
    gm = copy.deepcopy(gm)
    for node in gm.graph.nodes:
        if node.target is convert:
            x, dtype = node.args
            node.target, node.args, node.kwargs = torch.ops.aten._to_copy.default, (x,), {"dtype": dtype}
    gm.recompile()
    return gm


def _mask_only(block_mask):
    # The math implementations read only the mask graph (last element) of
    # the block-mask tuple: they evaluate mask_mod on the dense score matrix.
    return (None,) * (len(block_mask) - 1) + (_batchable(block_mask[-1]),)


@contextlib.contextmanager
def _templates_render_on_host():
    """The C++ template renders its kernel once while lowering (to offer it
    as a choice) with the graph's current device set to the output's device.
    C++ codegen keys its semantics (dtype propagation, bounds checks) off
    that device being the host, so for neuron outputs the render runs with
    the host current, as NeuronScheduling does when it generates the kernel.
    Inductor has no hook there: this graph's ``set_current_device`` is
    shadowed for the duration of the one lowering call."""
    graph = V.graph
    set_current_device = graph.set_current_device
    shadowed = "set_current_device" in vars(graph)

    def render_device(device):
        return _host_codegen() if _is_neuron(device) else set_current_device(device)

    graph.set_current_device = render_device
    try:
        yield
    finally:
        if shadowed:
            graph.set_current_device = set_current_device
        else:
            del graph.set_current_device


def _uses_cpp_template(query, key, value, kernel_options) -> bool:
    from torch._inductor.kernel.flex.flex_cpu import check_cpu_supported

    dtype = query.get_dtype()
    return (not kernel_options.get("OUTPUT_LOGSUMEXP") and not kernel_options.get("OUTPUT_MAX")
            and key.get_dtype() == dtype and value.get_dtype() == dtype
            and dtype in (torch.float32, torch.bfloat16, torch.float16) and check_cpu_supported())


def flex_attention(query, key, value, subgraph, block_mask, scale, kernel_options, score_mod_other_buffers,
                   mask_mod_other_buffers):
    if not _is_neuron(query.get_device()):
        return None
    if _uses_cpp_template(query, key, value, kernel_options):
        from torch._inductor.kernel.flex.flex_cpu import lower_cpu

        with _templates_render_on_host():
            return lower_cpu(query, key, value, subgraph, block_mask, scale, kernel_options,
                             score_mod_other_buffers, mask_mod_other_buffers)

    traced, buffers = _captured(score_mod_other_buffers, mask_mod_other_buffers)
    score_mod, mask = _batchable(subgraph), _mask_only(block_mask)

    def math(q, k, v, *rest):
        return sdpa_dense(q, k, v, score_mod, mask, scale, kernel_options, *buffers(rest))

    return _inline_math("flex_attention_math", math, [query, key, value, *traced])


def flex_attention_backward(query, key, value, out, logsumexp, grad_out, grad_logsumexp, fw_graph, joint_graph,
                            block_mask, scale, kernel_options, score_mod_other_buffers, mask_mod_other_buffers):
    if not _is_neuron(query.get_device()):
        return None
    traced, buffers = _captured(score_mod_other_buffers, mask_mod_other_buffers)
    optional = [grad_out, grad_logsumexp]
    grads = [g for g in optional if g is not None]
    fw, joint, mask = _batchable(fw_graph), _batchable(joint_graph), _mask_only(block_mask)

    def math(q, k, v, o, lse, *rest):
        given = iter(rest[:len(grads)])
        d_out, d_lse = (next(given) if g is not None else None for g in optional)
        return sdpa_dense_backward(q, k, v, o, lse, d_out, d_lse, fw, joint, mask, scale, kernel_options,
                                   *buffers(rest[len(grads):]))

    return _inline_math("flex_attention_backward_math", math, [query, key, value, out, logsumexp, *grads, *traced])


def register() -> None:
    from .lowering import chain

    chain(torch.ops.higher_order.flex_attention, flex_attention)
    chain(torch.ops.higher_order.flex_attention_backward, flex_attention_backward)
