"""FlexAttention's device check accepts neuron (torch releases that reject it).

``torch.nn.attention.flex_attention.flex_attention`` checks the query's device
against a fixed set (``_validate_device``: cuda, cpu, xpu, hpu, mps in torch
2.13) before doing anything else, eager or under ``torch.compile``, and no
registration API extends that set. Everything behind the check works for
neuron: the eager path runs the HOP's math implementation on neuron tensors,
and Inductor lowers the HOP through flex.py.

The step replaces the module's ``_validate_device`` with one that accepts
neuron (forward and backward, as on CUDA) and defers to torch's check for
every other device. It is applied only while torch's own check rejects
neuron (probed, not version-matched), so it retires itself when upstream
accepts PrivateUse1 devices. tests/test_flex_attention.py::test_validate_device_step
fails if the step is removed while torch still needs it.
"""
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
