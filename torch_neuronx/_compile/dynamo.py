"""Dynamo integration: the ``neuron`` DeviceInterface, compile metrics and
the ``"neuron"`` backend (docs/compile.md; its options: docs/compat.md)."""
from __future__ import annotations

import functools
import logging

import torch
from torch._dynamo.device_interface import DeviceInterface, register_interface_for_device
# Imported with this module, i.e. when torch.compile(backend="neuron") looks up
# the backend, as Inductor's own backend imports it at torch.compile(): not in
# the first call, which would pay the import (0.6 s) inside the first step.
from torch._inductor.compile_fx import compile_fx

from .. import _C, _env

log = logging.getLogger(__name__)


def _torch_neuron(*names) -> dict:
    return {name: staticmethod(getattr(torch.neuron, name)) for name in names}


class NeuronInterface(DeviceInterface):
    device = torch.neuron.device  # type: ignore[assignment]
    Event = torch.neuron.Event  # type: ignore[assignment]
    Stream = torch.neuron.Stream  # type: ignore[assignment]
    Worker = type("Worker", (DeviceInterface.Worker,),
                  _torch_neuron("set_device", "current_device", "get_device_properties"))

    @staticmethod
    def maybe_exchange_device(device: int) -> int:
        if device < 0 or device >= torch.neuron.device_count():
            return torch.neuron.current_device()
        return _C._exchange_device(device)

    exchange_device = staticmethod(_C._exchange_device)

    @staticmethod
    def _set_stream_by_id(stream_id: int, device_index: int, device_type: int) -> None:
        torch.accelerator.set_stream(torch.Stream(stream_id=stream_id, device_index=device_index,
                                                  device_type=device_type))

    @staticmethod
    def get_raw_stream(device_idx: int) -> int:
        # Host kernels take no stream handle; launches are ordered by the runtime.
        return 0

    @staticmethod
    def get_compute_capability(device=None) -> str:
        major, minor = torch.neuron.get_device_capability(device)
        return f"neuron{major}{minor}"

    @staticmethod
    def is_bf16_supported(including_emulation: bool = False) -> bool:
        return True

    @classmethod
    def raise_if_triton_unavailable(cls, device=None) -> None:
        raise RuntimeError("neuron kernels are generated as C++ host kernels, not Triton")


for _name, _fn in _torch_neuron("current_device", "set_device", "device_count", "is_available", "stream",
                                "current_stream", "set_stream", "synchronize", "memory_allocated").items():
    setattr(NeuronInterface, _name, _fn)


@functools.cache
def register_device_interface() -> None:
    register_interface_for_device("neuron", NeuronInterface)
    for i in range(torch.neuron.device_count()):
        register_interface_for_device(f"neuron:{i}", NeuronInterface)


# (frame, attempt) of the neuron compilations of this process,
# noted by neuron_backend: torch 2.13 no longer counts recompiles, and counts
# frames only outside fullgraph=True.
_compile_ids: list = []
_last_context = None


def _note_compile() -> None:
    from torch._guards import CompileContext

    global _last_context
    context = CompileContext.try_get()
    # The graphs of one compilation (split by graph breaks) share its context.
    compile_id = context.compile_id if context is not None and context is not _last_context else None
    # Compiled-autograd graphs are not frames.
    if compile_id is not None and compile_id.compiled_autograd_id is None and compile_id.frame_id is not None:
        _last_context = context
        _compile_ids.append((compile_id.frame_id, compile_id.frame_compile_id))


def reset_dynamo_metrics() -> None:
    """Starts get_dynamo_metrics() over: forgets this process's neuron
    compilations and clears Dynamo's graph-break and graph counters."""
    from torch._dynamo.utils import counters

    global _last_context
    _compile_ids.clear()
    _last_context = None
    counters["graph_break"].clear()
    counters["stats"].pop("unique_graphs", None)


def get_dynamo_metrics() -> dict:
    """Compile counters of this process, for frames with neuron graphs:
    compilations (``frames_total``/``frames_ok``; a failed one raises), of which
    ``recompiles`` were later compilations of an already compiled frame; and
    Dynamo's graph breaks and unique graphs."""
    from torch._dynamo.utils import counters

    return {
        "frames_total": len(_compile_ids),
        "frames_ok": len(_compile_ids),
        "recompiles": sum(1 for _, attempt in _compile_ids if attempt > 0),
        "graph_breaks": sum(counters["graph_break"].values()),
        "unique_graphs": counters["stats"]["unique_graphs"],
    }


# ---- the "neuron" backend -------------------------------------------------------

_MODES = {
    "default": {},
    # Neuron graphs through Inductor's CUDA-graph policy hook (graphs.py); filled in by _mode_patches.
    "reduce-overhead": {},
    "max-autotune": {"max_autotune": True},
    "max-autotune-no-cudagraphs": {"max_autotune": True},
}


def neuron_backend(gm: torch.fx.GraphModule, example_inputs, mode: str | None = None, options: dict | None = None):
    """``torch.compile(model, backend="neuron")``: Inductor, with ``mode``
    mapped to Inductor options (docs/compile.md) and the product's options and
    variables applied (docs/compat.md)."""
    register_device_interface()
    _note_compile()
    mode = mode or "default"
    if mode not in _MODES:
        raise ValueError(f"unknown torch.compile mode {mode!r} for backend 'neuron'; expected one of {list(_MODES)}")
    options = dict(options or {})
    fallback_execution = options.pop("fallback_execution", not _env.flag("TORCH_NEURONX_DISABLE_FALLBACK_EXECUTION"))
    config_patches = {**_MODES[mode], **_mode_patches(mode), **_env_patches(), **options, "triton.cudagraphs": False}
    try:
        return compile_fx(gm, example_inputs, config_patches=config_patches)
    except Exception as e:  # noqa: BLE001  (any compile failure: the graph runs eagerly, if asked)
        if not fallback_execution:
            raise
        log.warning("torch.compile(backend='neuron') failed to compile a graph; running it eagerly "
                    "(fallback_execution): %s: %s", type(e).__name__, e)
        return gm.forward


def _mode_patches(mode: str) -> dict:
    if mode == "reduce-overhead":
        from .graphs import NeuronGraphPolicy

        return {"cudagraph_policy": NeuronGraphPolicy()}
    return {}


def _env_patches() -> dict:
    """Inductor config for the product's artifact and cache variables, scoped to neuron graphs."""
    patches = {}
    debug_dir = _env.path("TORCH_NEURONX_DEBUG_DIR")
    if debug_dir:
        patches.update({"trace.enabled": True, "trace.debug_dir": debug_dir})
    if _env.neff_cache_disabled():
        patches.update({"fx_graph_cache": False, "autotune_local_cache": False})
    return patches
