"""Inductor for the neuron device.

Registered through Inductor's device-backend API (``register_backend_for_device``,
``register_device_op_overrides``, the Dynamo ``DeviceInterface``), so every
route into Inductor -- default ``torch.compile``, ``backend="neuron"``, any
``compile_fx`` caller, ``cpp_wrapper=True`` -- lowers neuron graphs the same
way: buffers are allocated on ``neuron``, aten fallbacks run as neuron ops, and
fused kernels are Inductor's C++ (CppScheduling) code over the device memory,
which the host runtime can map (``host_accessible``). Each C++ kernel runs as
one runtime launch on the current neuron stream, so it touches device memory
only inside a launch (``NEURON_RT_PROTECT=1``). AOTInductor is not supported
yet (docs/compile.md).

Inductor chooses C++-kernel semantics (dtype propagation, vector codegen) by
the *current device* being ``cpu``, and treats every other device as a Triton
device. NeuronScheduling therefore generates its kernels with the current
device set to the host; everything around the kernels (buffers, fallbacks,
the wrapper) stays on neuron.
"""
from __future__ import annotations

import contextlib
import functools
from textwrap import dedent

import torch
from torch._inductor.codegen.common import DeviceOpOverrides, register_device_op_overrides
from torch._inductor.codegen.cpp import CppScheduling
from torch._inductor.codegen.cpp_wrapper_cpu import CppWrapperCpu
from torch._inductor.codegen.wrapper import PythonWrapperCodegen as _PythonWrapperCodegen
from torch._inductor.codegen.wrapper import SubgraphPythonWrapperCodegen
from torch._inductor.codegen.wrapper_fxir import WrapperFxCodegen
from torch._inductor.custom_graph_pass import CustomGraphModulePass, get_hash_for_files
from torch._inductor.virtualized import V

_HOST = torch.device("cpu")


def _is_neuron(device) -> bool:
    return device is not None and torch.device(device).type == "neuron"


# The neuron device whose kernels are being generated under _host_codegen:
# the kernel call the scheduler emits then still launches on it.
_kernel_device: list = []


@contextlib.contextmanager
def _host_codegen():
    # C++ kernel code generation keys its semantics off the current device
    # being "cpu" (torch._inductor.utils.get_current_backend).
    _kernel_device.append(V.graph.current_device)
    try:
        with V.graph.set_current_device(_HOST):
            yield
    finally:
        _kernel_device.pop()


def _call_device(device):
    if device is None:
        device = V.graph.get_current_device_or_throw()
        if device == _HOST and _kernel_device and _kernel_device[-1] is not None:
            device = _kernel_device[-1]
    return device


class NeuronScheduling(CppScheduling):
    """Inductor's C++ kernels, generated for device memory the host can map."""

    def codegen_node(self, node):
        with _host_codegen():
            super().codegen_node(node)

    def codegen_template(self, *args, **kwargs):
        with _host_codegen():
            super().codegen_template(*args, **kwargs)

    def flush(self):
        with _host_codegen():
            super().flush()


class NeuronDeviceOpOverrides(DeviceOpOverrides):
    def import_get_raw_stream_as(self, name):
        # Kernels take no stream handle: a launch goes to the current stream.
        return dedent(f"""
            def {name}(_):
                return 0
            """)

    def set_device(self, device_idx):
        return f"torch.neuron.set_device({device_idx})"

    def synchronize(self):
        return "torch.neuron.synchronize()"

    def device_guard(self, device_idx):
        return f"torch.neuron.device({device_idx})"

    def cpp_kernel_type(self):
        return "void*"


def launch_kernel(device_index: int, name: str, kernel, *args) -> None:
    """Runs a compiled C++ kernel as one launch on the current stream of
    ``neuron:device_index`` (called by the generated Python wrapper)."""
    from . import _C

    _C._launch(device_index, functools.partial(kernel, *args), name)


def _launch_line(kernel_name: str, call_args, device) -> str:
    index = device.index if device.index is not None else torch.neuron.current_device()
    args = "".join(f", {a}" for a in call_args)
    return f"neuron_launch_kernel({index}, {kernel_name!r}, {kernel_name}{args})"


class _NeuronKernelCalls:
    """Kernel calls of the wrappers: C++ kernels of neuron buffers launch on
    the neuron device (the rest is Inductor's)."""

    def generate_kernel_call(self, kernel_name, call_args, *, device=None, **kwargs):
        super().generate_kernel_call(kernel_name, call_args, device=_call_device(device), **kwargs)

    def _generate_kernel_call_helper(self, kernel_name, call_args, *, device=None, triton=True, **kwargs):
        if not triton and _is_neuron(device):
            self.writeline(_launch_line(kernel_name, call_args, device))
            return
        super()._generate_kernel_call_helper(kernel_name, call_args, device=device, triton=triton, **kwargs)


class NeuronPythonWrapperCodegen(_NeuronKernelCalls, _PythonWrapperCodegen):
    @staticmethod
    def create(is_subgraph, subgraph_name, parent_wrapper, partition_signatures=None):
        if is_subgraph:
            return NeuronSubgraphPythonWrapperCodegen(subgraph_name, parent_wrapper, partition_signatures)
        return NeuronPythonWrapperCodegen()

    def write_header(self) -> None:
        super().write_header()
        self.imports.writeline("from torch_neuronx._inductor import launch_kernel as neuron_launch_kernel")


class NeuronSubgraphPythonWrapperCodegen(_NeuronKernelCalls, SubgraphPythonWrapperCodegen):
    # Subgraphs (cond, while_loop, flex-attention masks) share the parent's imports.
    pass


class NeuronCppWrapperCodegen(CppWrapperCpu):
    """``cpp_wrapper=True``: the graph's C++ wrapper runs as one launch on the
    current neuron stream. Inside it, aten fallbacks use the CPU C shims
    (``aoti_torch_cpu_*``: host kernels over the host-mappable device memory,
    as the fused kernels are) and buffers are allocated on neuron.

    AOTInductor is not supported yet: a packaged model runs outside Python,
    so the launch would have to come from a neuron AOTI model runner
    (``RegisterAOTIModelRunner``), and AOTI builds per ``GraphLowering.device_type``
    (``aoti_include/neuron.h`` precompiled header, ``AOTI_DEVICE_KEY``)."""

    def __init__(self):
        if V.graph.aot_mode:
            raise NotImplementedError(
                "AOTInductor (aoti_compile_and_package) is not supported for neuron tensors yet: a packaged model "
                "needs a neuron AOTI model runner that launches it on the runtime (docs/compile.md)")
        super().__init__()

    @staticmethod
    def create(is_subgraph, subgraph_name, parent_wrapper, partition_signatures=None):
        return NeuronCppWrapperCodegen()

    @staticmethod
    def get_device_include_path_jit(device: str) -> str:
        return CppWrapperCpu.get_device_include_path_jit("cpu" if device == "neuron" else device)

    @staticmethod
    def get_device_include_path_aot(device: str) -> str:
        return CppWrapperCpu.get_device_include_path_aot("cpu" if device == "neuron" else device)

    @staticmethod
    def get_c_shim_func_name(kernel: str, device: str) -> str:
        return CppWrapperCpu.get_c_shim_func_name(kernel, "cpu" if device == "neuron" else device)

    def generate_c_shim_extern_kernel_call(self, kernel, args, device, **kwargs):
        super().generate_c_shim_extern_kernel_call(kernel, args, "cpu" if device == "neuron" else device, **kwargs)

    def generate_kernel_call(self, kernel_name, call_args, *, device=None, **kwargs):
        super().generate_kernel_call(kernel_name, call_args, device=_call_device(device), **kwargs)

    def _generate_kernel_call_helper(self, kernel_name, call_args, *, device=None, **kwargs):
        super()._generate_kernel_call_helper(kernel_name, call_args, device=_HOST if _is_neuron(device) else device,
                                             **kwargs)

    def _generate_end_jit(self, result):
        super()._generate_end_jit(result)
        devices = [getattr(v, "get_device", lambda: None)() for v in V.graph.graph_inputs.values()]
        index = next((d.index for d in devices if _is_neuron(d) and d.index is not None),
                     torch.neuron.current_device())
        result.splice(f"""
            from torch_neuronx._inductor import launched as neuron_launched
            call = neuron_launched(call, {index}, {V.graph.name!r})
            """)


def launched(call, device_index: int, name: str):
    """The C++-wrapper entry of a graph as one launch on the current stream
    of ``neuron:device_index``."""
    from . import _C

    def run(args):
        return _C._launch(device_index, functools.partial(call, args), f"cpp_wrapper {name}")

    return run


class _CodegenVersion(CustomGraphModulePass):
    """Keys Inductor's caches (FX graph, AOTAutograd) on this file and on
    _inductor_flex.py: the code generated for neuron graphs depends on them.
    Registered as neuron's post-grad pass; it changes nothing in the graph."""

    def __call__(self, gm: torch.fx.GraphModule) -> None:
        pass

    @functools.cache
    def uuid(self) -> bytes:
        from . import _inductor_flex

        return get_hash_for_files((__file__, _inductor_flex.__file__))


@functools.cache
def register() -> None:
    from torch._inductor import config
    from torch._inductor.codegen import cpp_utils
    from torch._inductor.codegen.common import get_scheduling_for_device, register_backend_for_device

    from ._dynamo import register_device_interface

    register_device_interface()
    register_device_op_overrides("neuron", NeuronDeviceOpOverrides())
    cpp_utils.DEVICE_TO_ATEN["neuron"] = "at::kPrivateUse1"
    if get_scheduling_for_device("neuron") is None:
        register_backend_for_device("neuron", NeuronScheduling, NeuronPythonWrapperCodegen, NeuronCppWrapperCodegen,
                                    WrapperFxCodegen, device_custom_pass=_CodegenVersion())
    # The scheduler's "reindex a pointwise loop to a reduction's groups"
    # fusion step assumes Triton's (numel, rnumel) groups and raises on C++
    # kernels; it skips "cpu" nodes, not other C++-generated devices. The
    # flag only affects GPU devices otherwise (CPU nodes are skipped).
    config.loop_reindexing_after_fusion = False
    # FlexAttention's HOPs (torch_neuronx/_inductor_flex.py).
    from ._inductor_flex import register as register_flex_attention

    register_flex_attention()


# What Inductor's init_backend_registration reads from ``torch.neuron`` (its
# first lookup runs register()). CppWrapperCodegen is None on purpose: Inductor
# then keeps register()'s registration (which has NeuronCppWrapperCodegen and
# the cache-key pass) instead of re-registering the device without the pass.
Scheduling = NeuronScheduling
PythonWrapperCodegen = NeuronPythonWrapperCodegen
CppWrapperCodegen = None
