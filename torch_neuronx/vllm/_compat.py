"""The version-gated steps of the plugin, in one place (tests/test_vllm.py checks them)."""

from __future__ import annotations

import contextlib
import sys

# The vLLM release the plugin is written against (scripts/install.sh installs it).
VLLM_VERSION = "0.32.0"


# vLLM 0.32's vllm/v1/worker/cpu/shm.py, imported first by its CPU worker module (which
# ours subclasses), replaces process-wide torch functions with CPU stand-ins: among them
# torch.accelerator.synchronize/empty_cache (no-ops) and get_memory_info (host memory).
# In an engine process the accelerator is our device: these go back to its own.
def restore_accelerator_functions() -> None:
    import torch

    torch.accelerator.synchronize = lambda device=None: torch.neuron.synchronize(device)
    torch.accelerator.empty_cache = torch.neuron.empty_cache
    torch.accelerator.get_memory_info = lambda device=None: torch.neuron.mem_get_info(device)
    # Its pin_memory() returns the tensor unpinned and record_stream does nothing; the
    # tensor methods are torch's own C ones again (pinned memory is what makes the runner's
    # non_blocking copies queued instead of waiting for the device: platform.py).
    for name in ("pin_memory", "record_stream"):
        if name in vars(torch.Tensor):
            delattr(torch.Tensor, name)


# vLLM 0.32's GPU model runner (NeuronModelRunner builds on it) makes its streams and events
# with torch.cuda.Stream / torch.cuda.Event / torch.Event and switches streams with
# torch.cuda.current_stream / torch.cuda.stream, also in AsyncGPUModelRunnerOutput (async
# scheduling: the sampled tokens' copy to the host on a side stream, and the event that keeps
# the next step from rewriting host input buffers a queued copy still reads). vLLM offers no
# platform hook for them; its CPU worker module (shm.py, above) replaces them process-wide
# with no-op placeholders, and its XPU runner maps them to torch.xpu. In an engine process
# they are the neuron device's, so these events and stream switches order real device work.
def neuron_streams_for_cuda_calls() -> None:
    import torch

    torch.Event = torch._C.Event  # torch's own; its default device is the accelerator (neuron)
    # Functions of their own, not torch.neuron's objects: Dynamo keys its handlers on them.
    torch.cuda.Stream = torch.neuron.Stream
    torch.cuda.Event = lambda *args, **kwargs: torch.neuron.Event(*args, **kwargs)
    torch.cuda.current_stream = lambda device=None: torch.neuron.current_stream(device)
    torch.cuda.default_stream = lambda device=None: torch.neuron.default_stream(device)
    torch.cuda.stream = lambda stream: torch.neuron.stream(stream)
    torch.cuda.set_stream = lambda stream: torch.neuron.set_stream(stream)


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
