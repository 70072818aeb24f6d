"""Inductor for the neuron device: its registrations, the scheduling that
generates C++ kernels with the host current, and the Python wrapper
(docs/compile.md, "One route")."""
from __future__ import annotations

import contextlib
import functools
from textwrap import dedent

import torch
from torch._inductor.codegen.common import DeviceOpOverrides
from torch._inductor.codegen.cpp import CppScheduling
from torch._inductor.codegen.wrapper import PythonWrapperCodegen as _PythonWrapperCodegen
from torch._inductor.codegen.wrapper import SubgraphPythonWrapperCodegen
from torch._inductor.custom_graph_pass import CustomGraphModulePass, get_hash_for_files
from torch._inductor.virtualized import V

from . import fusion

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


def _launch_line(kernel_name: str, call_args) -> str:
    # The kernel's binding queues it on the current stream of its tensors'
    # device (kernels.py); the name labels the launch.
    return f"{kernel_name}({''.join(f'{a}, ' for a in call_args)}{kernel_name!r})"


class _NeuronKernelCalls:
    """Kernel calls of the wrappers: C++ kernels of neuron buffers launch on
    the neuron device (the rest is Inductor's); the Python wrapper queues
    each through its binding (the C++ wrapper calls them in its launch)."""

    def generate_kernel_call(self, kernel_name, call_args, *, device=None, **kwargs):
        super().generate_kernel_call(kernel_name, call_args, device=_call_device(device), **kwargs)

    def _generate_kernel_call_helper(self, kernel_name, call_args, *, device=None, triton=True, **kwargs):
        if not triton and _is_neuron(device):
            self.writeline(_launch_line(kernel_name, call_args))
            return
        super()._generate_kernel_call_helper(kernel_name, call_args, device=device, triton=triton, **kwargs)


class NeuronPythonWrapperCodegen(fusion.NeuronGraphWrapper, _NeuronKernelCalls, _PythonWrapperCodegen):
    @staticmethod
    def create(is_subgraph, subgraph_name, parent_wrapper, partition_signatures=None):
        if is_subgraph:
            return NeuronSubgraphPythonWrapperCodegen(subgraph_name, parent_wrapper, partition_signatures)
        fusion.enter_neuron_graph()
        return NeuronPythonWrapperCodegen()

    def write_header(self) -> None:
        super().write_header()
        # C++ kernels get bindings that launch them asynchronously.
        self.imports.writeline("from torch_neuronx._compile.kernels import NeuronAsyncCompile")
        self.header.writeline("async_compile = NeuronAsyncCompile()")


class NeuronSubgraphPythonWrapperCodegen(_NeuronKernelCalls, SubgraphPythonWrapperCodegen):
    # Subgraphs (cond, while_loop, flex-attention masks) share the parent's imports.
    pass


def launched(call, device_index: int, name: str):
    """The C++-wrapper entry of a graph as one launch on the current stream
    of ``neuron:device_index``."""
    from .. import _C

    def run(args):
        return _C._launch(device_index, functools.partial(call, args), f"cpp_wrapper {name}")

    return run


class _CodegenVersion(CustomGraphModulePass):
    """Keys Inductor's caches (FX graph, AOTAutograd) on this package's files
    and the AOTI device header: the code generated for neuron graphs depends
    on them. Registered as neuron's post-grad pass; it changes nothing in the
    graph."""

    def __call__(self, gm: torch.fx.GraphModule) -> None:
        pass

    @functools.cache
    def uuid(self) -> bytes:
        import glob
        import os

        from .cpp_wrapper import AOTI_HEADER

        files = sorted(glob.glob(os.path.join(os.path.dirname(__file__), "*.py")))
        return get_hash_for_files((*files, AOTI_HEADER))


def register_backend() -> None:
    """Neuron as an Inductor device: its Dynamo device interface, wrapper op
    overrides, scheduling and wrapper codegens, and the cache-key pass."""
    from torch._inductor.codegen.common import (
        get_scheduling_for_device, register_backend_for_device, register_device_op_overrides,
    )
    from torch._inductor.codegen.wrapper_fxir import WrapperFxCodegen

    from .cpp_wrapper import NeuronCppWrapperCodegen
    from .dynamo import register_device_interface

    register_device_interface()
    register_device_op_overrides("neuron", NeuronDeviceOpOverrides())
    if get_scheduling_for_device("neuron") is None:
        register_backend_for_device("neuron", NeuronScheduling, NeuronPythonWrapperCodegen, NeuronCppWrapperCodegen,
                                    WrapperFxCodegen, device_custom_pass=_CodegenVersion())


def aten_device_name_missing() -> bool:
    """Probe: Inductor's C++ codegen has no ATen device name for neuron."""
    from torch._inductor.codegen import cpp_utils

    return "neuron" not in cpp_utils.DEVICE_TO_ATEN


def add_aten_device_name() -> None:
    from torch._inductor.codegen import cpp_utils

    cpp_utils.DEVICE_TO_ATEN["neuron"] = "at::kPrivateUse1"


# What Inductor's init_backend_registration reads from ``torch.neuron`` (its
# first lookup installs the compile levers). CppWrapperCodegen is None on
# purpose: Inductor then keeps register_backend()'s registration (which has
# NeuronCppWrapperCodegen and the cache-key pass) instead of re-registering
# the device without the pass.
Scheduling = NeuronScheduling
PythonWrapperCodegen = NeuronPythonWrapperCodegen
CppWrapperCodegen = None
