"""torch-neuronx: AWS Trainium-class NeuronCores as a native PyTorch device.

Importing this package (or just ``import torch``, through the autoload entry
point) makes ``neuron`` a PyTorch device: ``torch.ones(2, device="neuron")``,
``model.to("neuron")``, ``torch.neuron.*``, ``torch.autocast("neuron")``.
"""


def _autoload():
    """Entry point of the ``torch.backends`` group, run by ``import torch``.

    Importing the package is all it takes; it stays light (no Dynamo, Inductor
    or distributed imports). Defined before ``import torch``: when this package
    is imported first, torch's autoload finds it partially initialized and
    looks this name up on it.
    """


import torch  # noqa: E402

__version__ = "0.1.0"

_BACKEND = "neuron"


def _rename_backend():
    current = torch._C._get_privateuse1_backend_name()
    if current == _BACKEND:
        return
    if current != "privateuseone":
        raise ImportError(
            f"torch-neuronx cannot register the '{_BACKEND}' device: PyTorch's PrivateUse1 backend is already "
            f"claimed by '{current}'. Only one out-of-tree accelerator backend can be loaded per process "
            "(AWS TorchNeuron and torch-neuronx both claim 'neuron')."
        )
    torch.utils.rename_privateuse1_backend(_BACKEND)


_rename_backend()

from . import _C  # noqa: E402  (registers kernels, guard, hooks, allocators)
from . import neuron as _neuron_module  # noqa: E402

# bf16 is the NeuronCore's native low precision (ATen defaults PrivateUse1 to
# fp16). ATen keeps this default per thread: it applies to the importing
# thread, and autograd's worker threads inherit it; see docs/api.md.
torch.set_autocast_dtype(_BACKEND, torch.bfloat16)

if not hasattr(torch, _BACKEND):
    torch._register_device_module(_BACKEND, _neuron_module)
if not hasattr(torch.Tensor, "is_neuron"):
    torch.utils.generate_methods_for_privateuse1_backend(for_tensor=True, for_module=True, for_storage=True)

_SUPPORTED_OPS = tuple(sorted(_C._register_host_kernels()))

# The compile levers pulled at import (FlexAttention's device check, the
# product's cache directory): torch_neuronx/_compile lists every lever.
from . import _compile  # noqa: E402

_compile.install("import")

# The `neuron` torch.distributed backend (torch.distributed is already imported).
from . import distributed as _distributed  # noqa: E402

_distributed._register()

from . import utils  # noqa: E402,F401  (torch_neuronx.utils: product scripts import it)
from ._op_support import (  # noqa: E402,F401
    clear_op_tracking, fallback_report, get_executed_ops, get_fallback_ops, reset_fallback_report,
)
# The device module's API at the top level, as the vendor product has it
# (torch_neuronx.device_count(), torch_neuronx.memory_stats(), ...): the same
# functions as torch.neuron's.
from .neuron import (  # noqa: E402,F401
    Event, Stream, StreamContext, current_device, current_stream, default_stream, device, device_count,
    empty_cache, get_device_properties, max_memory_allocated, max_memory_reserved, memory_allocated,
    memory_reserved, memory_stats, memory_summary, reset_accumulated_memory_stats, reset_peak_memory_stats,
    set_device, set_stream, stream, synchronize,
)


def is_neuron_runtime_initialized() -> bool:
    """True once the runtime has been initialized in this process (first device use)."""
    return _neuron_module.is_initialized()


__all__ = [
    "Event", "Stream", "StreamContext", "__version__", "clear_op_tracking", "current_device", "current_stream",
    "default_stream", "device", "device_count", "empty_cache", "fallback_report", "get_device_properties",
    "get_dynamo_metrics", "get_executed_ops", "get_fallback_ops", "is_neuron_runtime_initialized",
    "max_memory_allocated", "max_memory_reserved", "memory_allocated", "memory_reserved", "memory_stats",
    "memory_summary", "nki_op", "reset_accumulated_memory_stats", "reset_dynamo_metrics", "reset_fallback_report",
    "reset_peak_memory_stats", "set_device", "set_stream", "stream", "supported_ops", "synchronize", "utils",
    "wrap_nki",
]

import atexit  # noqa: E402

# Before finalization: let the autograd engine's neuron threads go idle (see
# drain_autograd_device_threads in csrc/python/Module.cpp).
atexit.register(_C._drain_autograd_device_threads)


def __getattr__(name):
    # NKI (nki_op, wrap_nki, nki) loads on first use: `import torch` stays light.
    if name in ("nki_op", "wrap_nki"):
        from . import _nki
        return getattr(_nki, name)
    if name == "nki":
        import nki
        return nki
    # Compile metrics load torch._dynamo: only when asked for.
    if name in ("get_dynamo_metrics", "reset_dynamo_metrics"):
        from ._compile import dynamo
        return getattr(dynamo, name)
    raise AttributeError(f"module 'torch_neuronx' has no attribute '{name}'")


def supported_ops() -> tuple:
    """ATen op overloads registered as neuron device kernels (the host kernel table)."""
    return _SUPPORTED_OPS

