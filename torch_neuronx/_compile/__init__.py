"""Every lever torch_neuronx pulls on torch (torch.compile's, and the one of
torch.distributed): ``LEVERS``, with the torch API each goes through, why,
the upstream issue if any, and how it retires: a probe (a function that
returns whether stock torch still needs the lever) or, without a cheap probe,
``retire`` naming what shows it. docs/compile.md has the same table.

``install(phase)`` pulls the levers of a phase that torch still needs:
``"import"`` at ``import torch_neuronx`` (stays light: no Dynamo/Inductor),
``"distributed"`` when the c10d backend is registered, ``"inductor"`` the
first time Inductor asks ``torch.neuron`` for the device's codegen classes.
The other levers are pulled where they apply (their ``phase`` says by what),
most scoped to one neuron graph.
"""
from __future__ import annotations

import dataclasses
import functools
import importlib

PHASES = ("import", "distributed", "inductor")


@dataclasses.dataclass(frozen=True)
class Lever:
    name: str
    pull_fn: str  # "<module>:<function>", the module relative to this package unless dotted
    phase: str  # one of PHASES (pulled by install), else what pulls it
    torch_api: str
    why: str
    upstream: str = ""
    probe: str = ""  # "<module>:<function>" returning True while torch needs the lever
    retire: str = ""  # without a probe: what shows the lever is no longer needed

    @staticmethod
    def resolve(ref: str):
        module, _, name = ref.partition(":")
        return getattr(importlib.import_module(module if "." in module else f"{__name__}.{module}"), name)

    def needed(self) -> bool:
        return self.resolve(self.probe)() if self.probe else True

    def pull(self) -> bool:
        """Pulls the lever if torch needs it; returns whether it did."""
        if self.needed():
            self.resolve(self.pull_fn)()
            return True
        return False


_INTENDED = "the API's intended use"

LEVERS = (
    Lever("flex_attention device check", "flex_device_check:install", "import",
          "torch.nn.attention.flex_attention._validate_device (module function replaced)",
          "flex_attention rejects every device outside {cuda, cpu, xpu, hpu, mps} before tracing; "
          "everything behind the check works for neuron",
          upstream="pytorch/pytorch#148656 (review asks for PrivateUse1; only hpu was added)",
          probe="flex_device_check:torch_rejects_neuron"),
    Lever("compile cache directory", "torch_neuronx._env:apply_cache_dir", "import",
          "TORCHINDUCTOR_CACHE_DIR (environment, only if unset)",
          "the vendor product's TORCH_NEURONX_NEFF_CACHE_DIR names Inductor's cache directory here",
          retire="a product variable, not a torch gap"),
    Lever("bare init_process_group binds neuron", "bare_init:install", "distributed",
          "torch.distributed.distributed_c10d._new_process_group_helper (wrapped)",
          "bare init_process_group() leaves GLOO the default backend of a group that has none",
          upstream="pytorch/pytorch#179901 (fixed in 2.14)", probe="bare_init:bare_init_needs_fix"),
    Lever("dynamo backend 'neuron'", "dynamo:neuron_backend", "by torch._dynamo.backends.registry.lookup_backend",
          "torch_dynamo_backends entry point (pyproject.toml); Dynamo registers it on first lookup",
          "torch.compile(backend='neuron'): Inductor with the product's modes and options", retire=_INTENDED),
    Lever("Inductor device backend", "device:register_backend", "inductor",
          "register_interface_for_device (dynamo.py), register_device_op_overrides, register_backend_for_device("
          "..., device_custom_pass=); the Python wrapper's async_compile subclasses CppPythonBindingsCodeCache "
          "(kernels.py)",
          "C++ kernels over device memory, each queued as a launch; device interface, wrappers, cache key",
          retire=_INTENDED),
    Lever("ATen device name", "device:add_aten_device_name", "inductor",
          "torch._inductor.codegen.cpp_utils.DEVICE_TO_ATEN['neuron'] (dict entry added)",
          "generated C++ names the device at::kPrivateUse1", probe="device:aten_device_name_missing"),
    Lever("no loop reindexing in neuron graphs", "fusion:enter_neuron_graph",
          "by the neuron wrappers' create() until their generate() returns",
          "torch._inductor.config.patch(loop_reindexing_after_fusion=False) while a neuron graph is scheduled",
          "the reindexing fusion step assumes Triton groups and raises on C++ kernels; it skips only 'cpu'",
          upstream="introduced by pytorch/pytorch#176927; none filed", probe="fusion:reindexing_raises_on_cpp_groups"),
    Lever("cat lowering", "cat:register", "inductor",
          "torch._inductor.lowering.user_lowerings[aten.cat] (chained, lowering.py)",
          "Inductor picks ConcatKernel over pointwise_cat by device type 'cpu'; the C++ backend needs it",
          upstream="pytorch/pytorch#116313 (pointwise_cat disabled for cpu only)",
          retire="tests/test_compile.py::test_cat_lowers_as_on_cpu without the lever"),
    Lever("fused SDPA in C++ wrappers", "attention:register", "inductor",
          "user_lowerings[aten._scaled_dot_product_fused_attention_overrideable(_backward)] (chained)",
          "the overrideable op's None outputs cannot pass AOTI's proxy executor; lowered to the flash ops",
          retire="tests/test_attention.py::test_sdpa_compiled_with_cpp_wrapper_matches_cpu without the lever"),
    Lever("FlexAttention lowerings", "flex:register", "inductor",
          "user_lowerings[higher_order.flex_attention(_backward)] (chained)",
          "Inductor's flex lowerings pick C++ for 'cpu' and Triton for every other device",
          retire="tests/test_flex_attention.py::test_compiled_forward_backward without the lever"),
    Lever("FlexAttention template renders on the host", "flex:_templates_render_on_host",
          "by flex.flex_attention (scoped to the call)",
          "GraphLowering.set_current_device, shadowed on the current graph during one lowering call",
          "the CPU template renders under the output's device; C++ codegen keys its semantics off 'cpu'",
          retire="tests/test_flex_attention.py::test_compiled_captured_buffer[inference] without the lever"),
    Lever("AOTI device header on the include path", "cpp_wrapper:add_aoti_include_dir",
          "by cpp_wrapper.NeuronCppWrapperCodegen (each neuron AOTI model)",
          "CPLUS_INCLUDE_PATH (appended; Inductor 2.13 has no include-directory setting)",
          "AOTI precompiles aoti_include/neuron.h, which torch does not ship",
          upstream="none found (per-device headers: pytorch/pytorch#143909)", probe="cpp_wrapper:aoti_header_missing"),
)


@functools.cache
def install(phase: str) -> tuple:
    """Pulls the levers of ``phase`` (one of ``PHASES``) that torch still
    needs; returns their names. Runs once per phase."""
    if phase not in PHASES:
        raise ValueError(f"unknown phase {phase!r}; expected one of {PHASES}")
    return tuple(lever.name for lever in LEVERS if lever.phase == phase and lever.pull())
