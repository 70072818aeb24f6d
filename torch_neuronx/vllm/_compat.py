"""The version-gated steps of the plugin, in one place (tests/test_vllm.py checks them).

vLLM's GPU model runner creates CUDA streams and events in its constructor
(``torch.cuda.Stream()``, ``torch.Event()``); on a CPU-only torch they cannot be
built. vLLM's CPU runner stubs them for the duration of the constructor with a
private helper (``vllm.v1.worker.cpu_model_runner._torch_cuda_wrapper``); we reuse
it, and fail with a clear message when a vLLM version no longer has it.
"""

from __future__ import annotations

import contextlib
import sys

# The vLLM release the plugin is written against (scripts/install.sh installs it).
VLLM_VERSION = "0.32.0"


def no_cuda_streams() -> contextlib.AbstractContextManager:
    from vllm.v1.worker import cpu_model_runner

    wrapper = getattr(cpu_model_runner, "_torch_cuda_wrapper", None)
    if wrapper is None:
        raise RuntimeError(
            "torch-neuronx's vLLM plugin needs vllm.v1.worker.cpu_model_runner._torch_cuda_wrapper "
            f"(vLLM {VLLM_VERSION}); this vLLM does not have it.")
    return wrapper()


# vLLM 0.32's vllm/v1/worker/cpu/shm.py, imported first by its CPU worker module (which
# ours subclasses), replaces process-wide torch functions with CPU stand-ins: among them
# torch.accelerator.synchronize/empty_cache (no-ops) and get_memory_info (host memory).
# In an engine process the accelerator is our device: these go back to its own.
def restore_accelerator_functions() -> None:
    import torch

    torch.accelerator.synchronize = lambda device=None: torch.neuron.synchronize(device)
    torch.accelerator.empty_cache = torch.neuron.empty_cache
    torch.accelerator.get_memory_info = lambda device=None: torch.neuron.mem_get_info(device)


# vLLM 0.32's triton_utils.dispatcher rebinds its kernel overrides by scanning every
# loaded module and calling vars(value).get(...) on each attribute; llvmlite's ctypes
# wrappers (loaded with numba, e.g. by an earlier import in the same process) have a
# __dict__ that is not a dict, and the scan raises AttributeError. llvmlite's modules
# never hold vLLM kernels: they are left out of the scan (engine start is one thread).
@contextlib.contextmanager
def llvmlite_hidden():
    hidden = {name: module for name, module in sys.modules.items()
              if name == "llvmlite" or name.startswith("llvmlite.")}
    for name in hidden:
        del sys.modules[name]
    try:
        yield
    finally:
        sys.modules.update(hidden)
