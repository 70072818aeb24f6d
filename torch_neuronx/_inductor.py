"""Inductor for the neuron device.

Registered through Inductor's device-backend API (``register_backend_for_device``,
``register_device_op_overrides``, the Dynamo ``DeviceInterface``), so every
route into Inductor -- default ``torch.compile``, ``backend="neuron"``, any
``compile_fx`` caller, ``cpp_wrapper=True`` -- lowers neuron graphs the same
way: buffers are allocated on ``neuron``, aten fallbacks run as neuron ops, and
fused kernels are Inductor's C++ (CppScheduling) code over the device memory,
which the host runtime can map (``host_accessible``). Each C++ kernel is
queued as one runtime launch on the current neuron stream
(_inductor_kernels.py), so it touches device memory only inside a launch
(``NEURON_RT_PROTECT=1``) and the wrapper runs ahead of the kernels.
AOTInductor packages the same C++ wrapper; the neuron AOTI model runner
(csrc/python/AotiRunner.cpp) runs a loaded package as one launch per call
(docs/compile.md).

Inductor chooses C++-kernel semantics (dtype propagation, vector codegen) by
the *current device* being ``cpu``, and treats every other device as a Triton
device. NeuronScheduling therefore generates its kernels with the current
device set to the host; everything around the kernels (buffers, fallbacks,
the wrapper) stays on neuron.
"""
from __future__ import annotations

import contextlib
import functools
import os
import re
from textwrap import dedent

import torch
from torch._inductor import ir
from torch._inductor.codegen.common import DeviceOpOverrides, register_device_op_overrides
from torch._inductor.codegen.cpp import CppScheduling
from torch._inductor.codegen.cpp_wrapper_cpu import CppWrapperCpu
from torch._inductor.codegen.wrapper import PythonWrapperCodegen as _PythonWrapperCodegen
from torch._inductor.codegen.wrapper import SubgraphPythonWrapperCodegen
from torch._inductor.codegen.wrapper_fxir import WrapperFxCodegen
from torch._inductor.custom_graph_pass import CustomGraphModulePass, get_hash_for_files
from torch._inductor.virtualized import V

from . import _inductor_kernels

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
    # device (_inductor_kernels.py); the name labels the launch.
    return f"{kernel_name}({''.join(f'{a}, ' for a in call_args)}{kernel_name!r})"


class _NeuronKernelCalls:
    """Kernel calls of the wrappers: C++ kernels of neuron buffers launch on
    the neuron device (the rest is Inductor's)."""

    def generate_kernel_call(self, kernel_name, call_args, *, device=None, **kwargs):
        super().generate_kernel_call(kernel_name, call_args, device=_call_device(device), **kwargs)

    def _generate_kernel_call_helper(self, kernel_name, call_args, *, device=None, triton=True, **kwargs):
        if not triton and _is_neuron(device):
            self.writeline(_launch_line(kernel_name, call_args))
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
        # C++ kernels get bindings that launch them asynchronously.
        self.imports.writeline("from torch_neuronx._inductor_kernels import NeuronAsyncCompile")
        self.header.writeline("async_compile = NeuronAsyncCompile()")


class NeuronSubgraphPythonWrapperCodegen(_NeuronKernelCalls, SubgraphPythonWrapperCodegen):
    # Subgraphs (cond, while_loop, flex-attention masks) share the parent's imports.
    pass


# torch_neuronx/include: AOTInductor's header for the neuron device
# (torch/csrc/inductor/aoti_include/neuron.h).
_AOTI_INCLUDE = os.path.join(os.path.dirname(__file__), "include")
_AOTI_HEADER = os.path.join(_AOTI_INCLUDE, "torch", "csrc", "inductor", "aoti_include", "neuron.h")


def _add_aoti_include_dir() -> None:
    # AOTInductor precompiles `<torch/csrc/inductor/aoti_include/{device}.h>`
    # with only torch's include directories on the command line, and Inductor
    # has no setting for more. The compiler's own search path
    # (CPLUS_INCLUDE_PATH, searched after every -I) lets it find ours without
    # shadowing any torch header.
    paths = [p for p in os.environ.get("CPLUS_INCLUDE_PATH", "").split(os.pathsep) if p]
    if _AOTI_INCLUDE not in paths:
        os.environ["CPLUS_INCLUDE_PATH"] = os.pathsep.join([*paths, _AOTI_INCLUDE])


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


class NeuronCppWrapperCodegen(CppWrapperCpu):
    """The C++ wrapper of neuron graphs: ``cpp_wrapper=True`` and AOTInductor.

    The wrapper runs as one launch on the current neuron stream: under
    ``cpp_wrapper=True`` its Python entry is wrapped in ``C._launch``; an AOTI
    package (``AOTI_DEVICE_KEY`` "neuron") is run by the neuron AOTI model
    runner. Inside, buffers are allocated on neuron, ``_out`` aten fallbacks
    use the CPU C shims (``aoti_torch_cpu_*``: host kernels over the
    host-mappable device memory, as the fused kernels are), and fallbacks that
    return new tensors are called through the dispatcher as neuron ops.

    AOTI specifics: the generated model only knows AOTI's own devices and is
    created as a cpu model, so its constants live in its host memory (CPU
    tensors) and a neuron fallback reading one gets a device copy; AOTI
    includes and precompiles ``torch/csrc/inductor/aoti_include/neuron.h``,
    which torch_neuronx ships (``_AOTI_INCLUDE``)."""

    def __init__(self):
        if V.graph.aot_mode:
            _add_aoti_include_dir()
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
    """Keys Inductor's caches (FX graph, AOTAutograd) on this file, the
    kernel bindings, the flex, SDPA and cat lowerings and the AOTI device header: the code
    generated for neuron graphs depends on them.
    Registered as neuron's post-grad pass; it changes nothing in the graph."""

    def __call__(self, gm: torch.fx.GraphModule) -> None:
        pass

    @functools.cache
    def uuid(self) -> bytes:
        from . import _inductor_attention, _inductor_cat, _inductor_flex

        return get_hash_for_files((__file__, _inductor_kernels.__file__, _inductor_flex.__file__,
                                   _inductor_attention.__file__, _inductor_cat.__file__, _AOTI_HEADER))


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
    # The fused SDPA ops in C++ wrappers and AOTI models (torch_neuronx/_inductor_attention.py).
    from ._inductor_attention import register as register_attention

    register_attention()
    # Cats follow CPU's rule, as the C++ backend needs (torch_neuronx/_inductor_cat.py).
    from ._inductor_cat import register as register_cat

    register_cat()


# What Inductor's init_backend_registration reads from ``torch.neuron`` (its
# first lookup runs register()). CppWrapperCodegen is None on purpose: Inductor
# then keeps register()'s registration (which has NeuronCppWrapperCodegen and
# the cache-key pass) instead of re-registering the device without the pass.
Scheduling = NeuronScheduling
PythonWrapperCodegen = NeuronPythonWrapperCodegen
CppWrapperCodegen = None
