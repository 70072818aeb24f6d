"""torch.compile for the neuron device: every lever torch_neuronx pulls on torch.

``LEVERS`` lists each change this package makes to torch's state, with the
torch API it goes through, why, the upstream issue if any, and the probe
that retires it: a function that returns whether stock torch still needs
the lever (``None``: the lever is the API's intended use, or no cheap probe
exists and ``retire`` names what does). ``install(phase)`` pulls the levers
of a phase, each only if its probe says so:

- ``"import"``, at ``import torch_neuronx`` (stays light: no Dynamo/Inductor);
- ``"inductor"``, the first time Inductor asks ``torch.neuron`` for the
  device's codegen classes (``torch.neuron.Scheduling``...).

The other levers are listed here so the list is complete and pulled where
they apply (``pulled_by``): ``"per-graph"`` ones by the code generating a
neuron graph, scoped to it; ``"elsewhere"`` ones by Dynamo (the backend
entry point) or ``torch_neuronx.distributed`` (the bare-init step).
docs/compile.md has the same table.
"""
from __future__ import annotations

import dataclasses
import functools
import importlib


@dataclasses.dataclass(frozen=True)
class Lever:
    name: str
    module: str  # where it lives: "<module>:<function that pulls it>"
    torch_api: str
    why: str
    phase: str  # "import", "inductor" (by install), "per-graph" or "elsewhere" (by `pulled_by`)
    upstream: str = ""
    probe: str = ""  # "<module>:<function>" returning True while torch needs the lever
    retire: str = ""  # without a probe: what shows the lever is no longer needed
    pulled_by: str = ""

    def _resolve(self, ref: str):
        module, _, name = ref.partition(":")
        package = __name__ if not module.startswith("torch_neuronx") else None
        target = importlib.import_module(module if package is None else f".{module}", package)
        return getattr(target, name)

    def needed(self) -> bool:
        return self._resolve(self.probe)() if self.probe else True

    def pull(self) -> bool:
        """Pulls the lever if torch needs it; returns whether it did."""
        if not self.needed():
            return False
        self._resolve(self.module)()
        return True


LEVERS = (
    # ---- at import ------------------------------------------------------------------------------
    Lever("flex_attention device check", "flex_device_check:install",
          "torch.nn.attention.flex_attention._validate_device (module function replaced)",
          "flex_attention rejects every device outside {cuda, cpu, xpu, hpu, mps} before tracing; "
          "everything behind the check works for neuron",
          phase="import", upstream="pytorch/pytorch#148656 (review asks for PrivateUse1; only hpu was added)",
          probe="flex_device_check:torch_rejects_neuron_now"),
    Lever("compile cache directory", "torch_neuronx._env:apply_cache_dir",
          "TORCHINDUCTOR_CACHE_DIR (environment, only if unset)",
          "the vendor product's TORCH_NEURONX_NEFF_CACHE_DIR names Inductor's cache directory here",
          phase="import", retire="a product variable, not a torch gap"),
    # ---- pulled elsewhere -----------------------------------------------------------------------
    Lever("dynamo backend 'neuron'", "dynamo:neuron_backend",
          "torch_dynamo_backends entry point (pyproject.toml); Dynamo registers it on first lookup",
          "torch.compile(backend='neuron'): Inductor with the product's modes and options",
          phase="elsewhere", pulled_by="torch._dynamo.backends.registry.lookup_backend",
          retire="the API's intended use"),
    Lever("bare init_process_group binds neuron", "torch_neuronx._distributed_compat:install",
          "torch.distributed.distributed_c10d._new_process_group_helper (wrapped)",
          "bare init_process_group() leaves GLOO the default backend of a group that has none",
          phase="elsewhere", upstream="pytorch/pytorch#179901 (fixed in 2.14)",
          probe="torch_neuronx._distributed_compat:bare_init_needs_fix",
          pulled_by="torch_neuronx.distributed._register"),
    # ---- the first time Inductor compiles for neuron --------------------------------------------
    Lever("device interface", "dynamo:register_device_interface",
          "torch._dynamo.device_interface.register_interface_for_device('neuron', 'neuron:N')",
          "Dynamo and Inductor ask the device interface for streams, devices, properties",
          phase="inductor", retire="the API's intended use"),
    Lever("device op overrides", "device:register_op_overrides",
          "torch._inductor.codegen.common.register_device_op_overrides('neuron')",
          "the wrapper's set_device/synchronize/device_guard lines; kernels take no stream handle",
          phase="inductor", retire="the API's intended use"),
    Lever("ATen device name", "device:add_aten_device_name",
          "torch._inductor.codegen.cpp_utils.DEVICE_TO_ATEN['neuron'] (dict entry added)",
          "generated C++ names the device at::kPrivateUse1",
          phase="inductor", probe="device:aten_device_name_missing"),
    Lever("scheduling and wrapper codegen", "device:register_backend",
          "torch._inductor.codegen.common.register_backend_for_device('neuron', ..., device_custom_pass=)",
          "C++ kernels over device memory, each queued as a launch; cpp_wrapper/AOTI wrapper; cache key",
          phase="inductor", retire="the API's intended use"),
    Lever("no loop reindexing in neuron graphs", "fusion:enter_neuron_graph",
          "torch._inductor.config.patch(loop_reindexing_after_fusion=False) while a neuron graph is scheduled",
          "the reindexing fusion step assumes Triton groups and raises on C++ kernels; it skips only 'cpu'",
          phase="per-graph", pulled_by="the neuron wrappers' create() until their generate() returns",
          upstream="introduced by pytorch/pytorch#176927; none filed",
          probe="fusion:reindexing_raises_on_cpp_groups"),
    Lever("cat lowering", "cat:register",
          "torch._inductor.lowering.user_lowerings[aten.cat] (chained, lowering.py)",
          "Inductor picks ConcatKernel over pointwise_cat by device type 'cpu'; the C++ backend needs it",
          phase="inductor", upstream="pytorch/pytorch#116313 (pointwise_cat disabled for cpu only)",
          retire="tests/test_compile.py::test_cat_lowers_as_on_cpu without the lever"),
    Lever("fused SDPA in C++ wrappers", "attention:register",
          "user_lowerings[aten._scaled_dot_product_fused_attention_overrideable(_backward)] (chained)",
          "the overrideable op's None outputs cannot pass AOTI's proxy executor; lowered to the flash ops",
          phase="inductor", retire="tests/test_attention.py cpp_wrapper tests without the lever"),
    Lever("FlexAttention lowerings", "flex:register",
          "user_lowerings[higher_order.flex_attention(_backward)] (chained)",
          "Inductor's flex lowerings pick C++ for 'cpu' and Triton for every other device",
          phase="inductor", retire="tests/test_flex_attention.py compiled tests without the lever"),
    Lever("FlexAttention template renders on the host", "flex:_templates_render_on_host",
          "GraphLowering.set_current_device, shadowed on the current graph during one lowering call",
          "the CPU template renders under the output's device; C++ codegen keys its semantics off 'cpu'",
          phase="per-graph", pulled_by="flex.flex_attention (scoped to the call)",
          retire="tests/test_flex_attention.py C++-template tests without the lever"),
    Lever("AOTI device header on the include path", "cpp_wrapper:add_aoti_include_dir",
          "CPLUS_INCLUDE_PATH (appended; Inductor 2.13 has no include-directory setting)",
          "AOTI precompiles aoti_include/neuron.h, which torch does not ship",
          phase="per-graph", pulled_by="cpp_wrapper.NeuronCppWrapperCodegen (each neuron AOTI model)",
          upstream="none found (per-device headers: pytorch/pytorch#143909)",
          probe="cpp_wrapper:aoti_header_missing"),
    Lever("kernel launch bindings", "kernels:NeuronKernelBindings",
          "torch._inductor.codecache.CppPythonBindingsCodeCache (subclassed; the wrapper's async_compile)",
          "each C++ kernel is queued as one runtime launch instead of running on the caller",
          phase="per-graph", pulled_by="device.NeuronPythonWrapperCodegen (its generated code)",
          retire="the API's intended use"),
)


@functools.cache
def install(phase: str) -> tuple:
    """Pulls the levers of ``phase`` ("import" or "inductor") that torch
    still needs; returns their names. Runs once per phase."""
    if phase not in ("import", "inductor"):
        raise ValueError(f"unknown phase {phase!r}; expected 'import' or 'inductor'")
    return tuple(lever.name for lever in LEVERS if lever.phase == phase and lever.pull())
