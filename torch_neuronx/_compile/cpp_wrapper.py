"""The C++ wrapper of neuron graphs: ``cpp_wrapper=True`` and AOTInductor
(docs/compile.md, "cpp_wrapper=True" and "AOTInductor")."""
from __future__ import annotations

import os
import re

import torch
from torch._inductor import ir
from torch._inductor.codegen.cpp_wrapper_cpu import CppWrapperCpu
from torch._inductor.virtualized import V

from . import fusion
from .device import _HOST, _is_neuron, _NeuronKernelCalls

# torch_neuronx/include: AOTInductor's header for the neuron device
# (torch/csrc/inductor/aoti_include/neuron.h).
AOTI_INCLUDE = os.path.join(os.path.dirname(os.path.dirname(__file__)), "include")
_HEADER = os.path.join("torch", "csrc", "inductor", "aoti_include", "neuron.h")
AOTI_HEADER = os.path.join(AOTI_INCLUDE, _HEADER)


def _cplus_include_path() -> list:
    return [p for p in os.environ.get("CPLUS_INCLUDE_PATH", "").split(os.pathsep) if p]


def aoti_header_missing() -> bool:
    """Probe: Inductor's compile command cannot find ``aoti_include/neuron.h``
    (in torch's include directories or, searched last, CPLUS_INCLUDE_PATH)."""
    from torch.utils.cpp_extension import include_paths

    return not any(os.path.isfile(os.path.join(d, _HEADER)) for d in [*include_paths("neuron"), *_cplus_include_path()])


def add_aoti_include_dir() -> None:
    # AOTInductor precompiles `<torch/csrc/inductor/aoti_include/{device}.h>`
    # with only torch's include directories on the command line, and Inductor
    # (2.13: cpp_builder, cpp_extension.include_paths) has no setting for
    # more. The compiler's own search path (CPLUS_INCLUDE_PATH, searched after
    # every -I) lets it find ours without shadowing any torch header.
    if aoti_header_missing():
        os.environ["CPLUS_INCLUDE_PATH"] = os.pathsep.join([*_cplus_include_path(), AOTI_INCLUDE])


# Helpers of neuron AOTI models: an input's rank check, and a neuron copy of
# a host tensor (a constant read by a neuron op).
_NEURON_AOTI_HELPERS = """
    static void neuron_check_input_dim(AtenTensorHandle* input_handles, int64_t idx, int64_t expected) {
        int64_t dim;
        AOTI_TORCH_ERROR_CODE_CHECK(aoti_torch_get_dim(input_handles[idx], &dim));
        if (dim != expected) {
            throw std::runtime_error("input_handles[" + std::to_string(idx) + "]: expected a " +
                                     std::to_string(expected) + "-dimensional tensor, but got " +
                                     std::to_string(dim) + " dimensions");
        }
    }

    static torch::aot_inductor::RAIIAtenTensorHandle neuron_device_copy(AtenTensorHandle host, int32_t device_index) {
        int64_t dim;
        int64_t* sizes;
        int64_t* strides;
        int32_t dtype;
        AOTI_TORCH_ERROR_CODE_CHECK(aoti_torch_get_dim(host, &dim));
        AOTI_TORCH_ERROR_CODE_CHECK(aoti_torch_get_sizes(host, &sizes));
        AOTI_TORCH_ERROR_CODE_CHECK(aoti_torch_get_strides(host, &strides));
        AOTI_TORCH_ERROR_CODE_CHECK(aoti_torch_get_dtype(host, &dtype));
        AtenTensorHandle device;
        AOTI_TORCH_ERROR_CODE_CHECK(aoti_torch_empty_strided(
            dim, sizes, strides, dtype, aoti_torch_device_type_privateuse1(), device_index, &device));
        torch::aot_inductor::RAIIAtenTensorHandle result(device);
        AOTI_TORCH_ERROR_CODE_CHECK(aoti_torch_copy_(device, host, 0));
        return result;
    }
    """


class NeuronCppWrapperCodegen(fusion.NeuronGraphWrapper, _NeuronKernelCalls, CppWrapperCpu):
    """One launch on the current neuron stream; buffers on neuron, ``_out``
    fallbacks through the CPU C shims, other fallbacks as neuron ops, AOTI
    constants in the model's host memory (docs/compile.md)."""

    def __init__(self):
        if V.graph.aot_mode:
            add_aoti_include_dir()
        super().__init__()
        self._constants_on_host = False

    def codegen_model_constructor(self):
        # AOTI: the model's constants are recorded as cpu constants, which the
        # container loads into the model's host memory (a cpu model refuses
        # constants of any other device). The wrapper's device reads "neuron"
        # meanwhile: Inductor's check that constants are on the model's device
        # or the host then accepts the neuron ones.
        self._constants_on_host = True
        device, self.device = self.device, "neuron"
        try:
            super().codegen_model_constructor()
        finally:
            self.device = device
            self._constants_on_host = False

    def codegen_device(self, device):
        if self._constants_on_host and _is_neuron(device):
            device = _HOST
        return super().codegen_device(device)

    @staticmethod
    def create(is_subgraph, subgraph_name, parent_wrapper, partition_signatures=None):
        if not is_subgraph:
            fusion.enter_neuron_graph()
        return NeuronCppWrapperCodegen()

    @staticmethod
    def get_device_include_path_jit(device: str) -> str:
        return CppWrapperCpu.get_device_include_path_jit("cpu" if device == "neuron" else device)

    @staticmethod
    def get_c_shim_func_name(kernel: str, device: str) -> str:
        return CppWrapperCpu.get_c_shim_func_name(kernel, "cpu" if device == "neuron" else device)

    def generate_fallback_kernel(self, node):
        # A CPU C shim that returns new tensors allocates them on the host
        # (at::cpu:: kernels), next to neuron inputs: wrong device, and ops
        # built on TensorIterator refuse the mix. Aten fallbacks with neuron
        # outputs therefore call the op through the dispatcher (a neuron op,
        # run inside the model's launch): the AOTI proxy executor / Inductor's
        # runtime lookup, as for ops without a C shim.
        op = node.op_overload
        if _is_neuron(node.get_device()) and isinstance(op, torch._ops.OpOverload):
            exported_args = node.export_extern_kernel_node()
            self.generate_fallback_kernel_with_runtime_lookup(
                node.get_name(), node.python_kernel_name, lambda: [*node.codegen_args(), *node.codegen_kwargs()], op,
                exported_args, node.outputs if node.outputs else node.mutation_outputs)
            return
        super().generate_fallback_kernel(node)

    def generate_fallback_kernel_with_runtime_lookup(self, buf_name, python_kernel_name, get_args, op_overload,
                                                    raw_args, outputs):
        if (V.graph.aot_mode and op_overload is torch.ops.prims.device_put.default and len(outputs) == 1
                and _is_neuron(raw_args[1])):
            # A device_put onto neuron that Inductor keeps as a fallback (of a
            # complex tensor, e.g. a RoPE table held as a constant). AOTI's
            # proxy executor would replace its device argument with the
            # model's, which is "cpu" for neuron models: the copy is made here.
            self.writeline(f"RAIIAtenTensorHandle {outputs[0].get_name()} = "
                           f"neuron_device_copy({get_args()[0]}, this->device_idx_);")
            return
        super().generate_fallback_kernel_with_runtime_lookup(buf_name, python_kernel_name, get_args, op_overload,
                                                             raw_args, outputs)

    def _codegen_entry_impl_prologue(self):
        super()._codegen_entry_impl_prologue()
        if V.graph.aot_mode and not V.graph.is_const_graph:
            # AOTI checks inputs against the exported dtypes, shapes and
            # strides only under AOTI_RUNTIME_CHECK_INPUTS=1; unchecked, a
            # wrong shape runs and returns garbage. Neuron models always check.
            # (Their shape checks index the sizes without checking the rank.)
            for idx, value in enumerate(V.graph.graph_inputs.values()):
                if isinstance(value, ir.TensorBox):
                    self.prefix.writeline(f"neuron_check_input_dim(input_handles, {idx}, {len(value.get_size())});")
                self.prefix.writeline(f"check_input_{idx}(input_handles);")

    def _device_copies(self, args):
        # AOTI keeps the model's constants in its host memory (CPU tensors).
        # A neuron op refuses host tensors, so a fallback that runs as one
        # (through the dispatcher) gets a device copy of each constant it
        # reads, made inside the model's launch.
        if not V.graph.aot_mode or not V.graph.constants:
            return list(args)
        constant = re.compile(r"\b(?:%s)\b" % "|".join(map(re.escape, V.graph.constants)))
        result = []
        for arg in args:
            if isinstance(arg, str) and constant.search(arg):
                name = f"neuron_constant_{next(self.arg_var_id)}"
                self.writeline(f"RAIIAtenTensorHandle {name} = neuron_device_copy({arg}, this->device_idx_);")
                arg = f"{name}.get()"
            result.append(arg)
        return result

    def codegen_runtime_lookup_tensor_call_args(self, tensor_call_args):
        # Fallbacks through the dispatcher (generate_fallback_kernel).
        return self._device_copies(super().codegen_runtime_lookup_tensor_call_args(tensor_call_args))

    def generate_c_shim_extern_kernel_alloc(self, extern_kernel, args):
        # A shim that returns a new tensor (convolution) is a composite op: it
        # dispatches to neuron ops. `_out` shims (mm, addmm) are host kernels
        # writing into neuron buffers and read the constants in place.
        if _is_neuron(extern_kernel.get_device()):
            args = self._device_copies(args)
        super().generate_c_shim_extern_kernel_alloc(extern_kernel, args)

    def write_header(self):
        super().write_header()
        if V.graph.aot_mode and not V.graph.is_const_graph:
            self.header.splice(_NEURON_AOTI_HELPERS)

    def generate_c_shim_extern_kernel_call(self, kernel, args, device, **kwargs):
        super().generate_c_shim_extern_kernel_call(kernel, args, "cpu" if device == "neuron" else device, **kwargs)

    def _generate_kernel_call_helper(self, kernel_name, call_args, *, device=None, **kwargs):
        # Called in the model's code: the kernel runs on the host, inside the wrapper's launch.
        super()._generate_kernel_call_helper(kernel_name, call_args, device=_HOST if _is_neuron(device) else device,
                                             **kwargs)

    def _generate_end_jit(self, result):
        super()._generate_end_jit(result)
        devices = [getattr(v, "get_device", lambda: None)() for v in V.graph.graph_inputs.values()]
        index = next((d.index for d in devices if _is_neuron(d) and d.index is not None),
                     torch.neuron.current_device())
        result.splice(f"""
            from torch_neuronx._compile.device import launched as neuron_launched
            call = neuron_launched(call, {index}, {V.graph.name!r})
            """)


