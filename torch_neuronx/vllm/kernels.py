"""Device kernels for vLLM's CPU custom ops (``torch.ops._C.*``).

vLLM registers some of its CPU kernels (paged-attention cache writes and
attention, slot mapping, the sampler's helpers) under the catch-all
``CompositeImplicitAutograd`` key instead of ``CPU``. On a neuron tensor such a
kernel does not reach our host fallback: it runs at once on the raw device
pointers, unordered with the kernels still queued on the device stream (it
read ``key``/``value`` before the matmul that writes them had run), and around
the runtime's protect mode. We register a ``PrivateUse1`` kernel for each of
them that does what the fallback does for the ``CPU`` ones: a launch on the
current stream (ordered after queued work) running the op on host aliases of
the device memory (zero copy, so in-place writes land in the KV cache).

Ops that only write into their arguments (schema ``-> ()``: the cache write,
the attention, the slot mapping) are queued by a C++ kernel of ours
(``csrc/aten/QueuedCustomOps.cpp``): the caller goes on at once, as for any
queued ATen op, so the model's Python runs ahead of the device through the
attention layers too. Ops with results launch synchronously from Python.
The paged attention itself runs a kernel of ours where it applies (float32
on x86; ``OURS``), which reads vLLM's cache layout in place.
"""

from __future__ import annotations

import torch
import torch_neuronx

NAMESPACE = "_C"
_LIBRARY = None
ROUTED: list[str] = []
QUEUED: list[str] = []  # the subset of ROUTED queued by the C++ kernel
# Ops with a kernel of ours (queued; vLLM's own kernel queued for the calls it
# does not cover): the paged attention (csrc/aten/PagedAttention.cpp).
OURS = {"cpu_attention_with_kv_cache": "_register_paged_attention"}


def _composite_ops() -> list[str]:
    """Overloads of vLLM's namespace that take tensors and have only a composite kernel."""
    names = []
    for name in torch._C._dispatch_get_all_op_names():
        if not name.startswith(NAMESPACE + "::"):
            continue
        packet = getattr(getattr(torch.ops, NAMESPACE), name.split("::", 1)[1])
        for overload in packet.overloads():
            full = name if overload == "default" else f"{name}.{overload}"
            if not torch._C._dispatch_has_kernel_for_dispatch_key(full, "CompositeImplicitAutograd"):
                continue
            if torch._C._dispatch_has_kernel_for_dispatch_key(full, "PrivateUse1"):
                continue
            schema = getattr(packet, overload)._schema
            if any("Tensor" in str(a.type) for a in schema.arguments):
                names.append((name.split("::", 1)[1], overload, schema))
    return names


def _alias(value):
    if isinstance(value, torch.Tensor):
        return torch_neuronx._C._host_alias(value) if value.device.type == "neuron" else value
    if isinstance(value, (list, tuple)):
        return type(value)(_alias(v) for v in value)
    return value


def _device_of(args) -> torch.device | None:
    for value in args:
        if isinstance(value, torch.Tensor) and value.device.type == "neuron":
            return value.device
        if isinstance(value, (list, tuple)):
            found = _device_of(value)
            if found is not None:
                return found
    return None


def _results(value, aliases: dict):
    # A result that is one of the aliases is that device tensor. A fresh one
    # stays on the host: vLLM's CPU ops return host-side metadata (the
    # attention scheduler's work plan holds pointers into its own buffer, so
    # a copy elsewhere is garbage), which their sibling ops then read as a
    # CPU operand.
    if isinstance(value, torch.Tensor):
        return aliases.get(value.data_ptr(), value)
    if isinstance(value, (list, tuple)):
        return type(value)(_results(v, aliases) for v in value)
    return value


def _make_kernel(op, name: str):
    label = f"vllm {name}"

    def kernel(*args, **kwargs):
        device = _device_of(list(args) + list(kwargs.values()))
        index = device.index if device is not None and device.index is not None else torch.neuron.current_device()
        host_args = _alias(args)
        host_kwargs = {k: _alias(v) for k, v in kwargs.items()}
        result = torch_neuronx._C._launch(index, lambda: op(*host_args, **host_kwargs), label)
        if result is None:
            return None
        aliases = {}
        for value in list(args) + list(kwargs.values()):
            if isinstance(value, torch.Tensor) and value.device.type == "neuron":
                aliases[value.data_ptr()] = value
        return _results(result, aliases)

    return kernel


def register() -> list[str]:
    """Registers the kernels once per process (after vLLM has loaded its ``_C``); returns the op names."""
    global _LIBRARY
    if _LIBRARY is not None:
        return ROUTED
    library = torch.library.Library(NAMESPACE, "IMPL")
    for name, overload, schema in _composite_ops():
        op = getattr(getattr(torch.ops, NAMESPACE), name)
        op = getattr(op, overload)
        qualified = name if overload == "default" else f"{name}.{overload}"
        ROUTED.append(qualified)
        if qualified in OURS:
            getattr(torch_neuronx._C, OURS[qualified])(f"{NAMESPACE}::{qualified}")
            QUEUED.append(qualified)
            continue
        if not schema.returns:
            torch_neuronx._C._register_queued_custom_op(f"{NAMESPACE}::{qualified}")
            QUEUED.append(qualified)
            continue
        kernel = _make_kernel(op, qualified)
        # Autograd's key too: under no_grad the composite kernel would still
        # be picked there, before PrivateUse1 is reached.
        for key in ("PrivateUse1", "AutogradPrivateUse1"):
            library.impl(qualified, kernel, key)
    _LIBRARY = library
    return ROUTED
