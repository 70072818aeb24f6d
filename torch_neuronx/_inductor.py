"""Inductor for neuron tensors.

Device memory is host memory, so the neuron device reuses Inductor's C++
(CppScheduling) code generation: fused kernels are compiled C++ that read and
write device buffers in place. The wrapper allocates buffers on ``neuron``,
calls kernels with the CPU calling convention and keeps device guards.
"""
from __future__ import annotations

from textwrap import dedent

import torch
from torch._inductor.codegen.common import DeviceOpOverrides, register_device_op_overrides
from torch._inductor.codegen.cpp import CppScheduling
from torch._inductor.codegen.cpp_wrapper_cpu import CppWrapperCpu
from torch._inductor.codegen.wrapper import PythonWrapperCodegen, SubgraphPythonWrapperCodegen
from torch._inductor.codegen.wrapper_fxir import WrapperFxCodegen


def _host(device):
    return torch.device("cpu") if device is not None and device.type == "neuron" else device


class NeuronDeviceOpOverrides(DeviceOpOverrides):
    def import_get_raw_stream_as(self, name):
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


class NeuronPythonWrapperCodegen(PythonWrapperCodegen):
    @staticmethod
    def create(is_subgraph, subgraph_name, parent_wrapper, partition_signatures=None):
        if is_subgraph:
            return SubgraphPythonWrapperCodegen(subgraph_name, parent_wrapper, partition_signatures)
        return NeuronPythonWrapperCodegen()

    def _generate_kernel_call_helper(self, kernel_name, call_args, *, device=None, **kwargs):
        from torch._inductor.virtualized import V

        device = device or V.graph.get_current_device_or_throw()
        super()._generate_kernel_call_helper(kernel_name, call_args, device=_host(device), **kwargs)


class NeuronCppWrapperCodegen(CppWrapperCpu):
    @staticmethod
    def create(is_subgraph, subgraph_name, parent_wrapper, partition_signatures=None):
        return NeuronCppWrapperCodegen()

    def _generate_kernel_call_helper(self, kernel_name, call_args, *, device=None, **kwargs):
        from torch._inductor.virtualized import V

        device = device or V.graph.get_current_device_or_throw()
        super()._generate_kernel_call_helper(kernel_name, call_args, device=_host(device), **kwargs)


def register() -> None:
    from torch._inductor.codegen import cpp_utils
    from torch._inductor.codegen.common import get_scheduling_for_device, register_backend_for_device

    from ._dynamo import register_device_interface

    register_device_interface()
    register_device_op_overrides("neuron", NeuronDeviceOpOverrides())
    cpp_utils.DEVICE_TO_ATEN["neuron"] = "at::kPrivateUse1"
    if get_scheduling_for_device("neuron") is None:
        register_backend_for_device("neuron", CppScheduling, NeuronPythonWrapperCodegen, NeuronCppWrapperCodegen,
                                    WrapperFxCodegen)


Scheduling = CppScheduling
PythonWrapperCodegen = NeuronPythonWrapperCodegen
CppWrapperCodegen = NeuronCppWrapperCodegen
