"""FlexAttention's device check accepts neuron, while torch's rejects it
(docs/compile.md, "FlexAttention")."""
from __future__ import annotations

import functools
import types


def torch_rejects_neuron(validate_device=None) -> bool:
    """Probe: ``validate_device`` (this process's ``_validate_device`` by
    default) rejects neuron tensors."""
    if validate_device is None:
        import torch.nn.attention.flex_attention as flex

        validate_device = flex._validate_device
    # _validate_device reads only .device.type and .requires_grad.
    probe = types.SimpleNamespace(device=types.SimpleNamespace(type="neuron"), requires_grad=False)
    try:
        validate_device(probe, probe, probe)
    except ValueError:
        return True
    return False


def install() -> None:
    import torch.nn.attention.flex_attention as flex

    original = flex._validate_device

    @functools.wraps(original)
    def _validate_device(query, key, value):
        # q, k and v share a device (checked before this by flex_attention).
        if query.device.type == "neuron":
            return
        original(query, key, value)

    _validate_device._neuron_compat_original = original  # type: ignore[attr-defined]
    flex._validate_device = _validate_device
