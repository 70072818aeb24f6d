"""Every lever torch_neuronx pulls on torch (torch.compile's, and the one of
torch.distributed), one ``LEVERS`` row each; docs/compile.md ("The levers")
explains them."""
from __future__ import annotations

import functools
import importlib
from typing import NamedTuple

# install(phase) pulls a phase's levers: "import" at `import torch_neuronx`
# (stays light: no Dynamo/Inductor), "distributed" when the c10d backend is
# registered, "inductor" the first time Inductor asks torch.neuron for the
# device's codegen classes. The other levers are pulled where they apply.
PHASES = ("import", "distributed", "inductor")
_PROBE = "probe "


def resolve(ref: str):
    """The function ``"<module>:<name>"``, the module relative to this package unless dotted."""
    module, _, name = ref.partition(":")
    return getattr(importlib.import_module(module if "." in module else f"{__name__}.{module}"), name)


class Lever(NamedTuple):
    name: str
    pull_fn: str  # "<module>:<function>" that pulls it
    phase: str  # one of PHASES (pulled by install), else what pulls it
    torch_api: str
    why: str
    upstream: str  # the upstream issue, "" if none
    retired: str  # "probe <module>:<function>" (True while torch needs the lever), else what shows it is not

    @property
    def probe(self) -> str:
        return self.retired[len(_PROBE):] if self.retired.startswith(_PROBE) else ""

    def needed(self) -> bool:
        return resolve(self.probe)() if self.probe else True

    def pull(self) -> bool:
        """Pulls the lever if torch needs it; returns whether it did."""
        if self.needed():
            resolve(self.pull_fn)()
            return True
        return False


_INTENDED = "the API's intended use"

LEVERS = (
    Lever("flex_attention device check", "flex_device_check:install", "import",
          "flex_attention._validate_device (module function replaced)", "rejects devices outside a fixed set",
          "pytorch/pytorch#148656 (only hpu was added)", "probe flex_device_check:torch_rejects_neuron"),
    Lever("compile cache directory", "torch_neuronx._env:apply_cache_dir", "import",
          "TORCHINDUCTOR_CACHE_DIR (environment, only if unset)", "set by the product's TORCH_NEURONX_NEFF_CACHE_DIR",
          "", "a product variable, not a torch gap"),
    Lever("bare init_process_group binds neuron", "bare_init:install", "distributed",
          "distributed_c10d._new_process_group_helper (wrapped)", "bare init leaves GLOO a group's default backend",
          "pytorch/pytorch#179901 (fixed in 2.14)", "probe bare_init:bare_init_needs_fix"),
    Lever("dynamo backend 'neuron'", "dynamo:neuron_backend", "by torch._dynamo.backends.registry.lookup_backend",
          "torch_dynamo_backends entry point (pyproject.toml)", "torch.compile(backend='neuron')", "", _INTENDED),
    Lever("reduce-overhead replays neuron graphs", "graphs:NeuronGraphPolicy",
          "by the neuron backend for mode='reduce-overhead'",
          "config.cudagraph_policy (patched into the backend's compile_fx call)",
          "Inductor's CUDA-graph trees are CUDA-only", "", _INTENDED),
    Lever("Inductor device backend", "device:register_backend", "inductor",
          "register_interface_for_device (dynamo.py), register_device_op_overrides, register_backend_for_device; "
          "CppPythonBindingsCodeCache subclassed (kernels.py)", "C++ kernels over device memory, queued", "",
          _INTENDED),
    Lever("ATen device name", "device:add_aten_device_name", "inductor",
          "cpp_utils.DEVICE_TO_ATEN['neuron'] (entry added)", "generated C++ names at::kPrivateUse1", "",
          "probe device:aten_device_name_missing"),
    Lever("no loop reindexing in neuron graphs", "fusion:enter_neuron_graph", "by the neuron wrappers' create()",
          "config.patch(loop_reindexing_after_fusion=False)", "the step raises on C++ kernels' groups",
          "introduced by pytorch/pytorch#176927; none filed", "probe fusion:reindexing_raises_on_cpp_groups"),
    Lever("cat lowering", "cat:register", "inductor", "user_lowerings[aten.cat] (chained, lowering.py)",
          "ConcatKernel is chosen by device type 'cpu'", "pytorch/pytorch#116313",
          "tests/test_compile.py::test_cat_lowers_as_on_cpu without the lever"),
    Lever("fused SDPA in C++ wrappers", "attention:register", "inductor",
          "user_lowerings[aten._scaled_dot_product_fused_attention_overrideable(_backward)] (chained)",
          "its None outputs cannot pass AOTI's proxy executor", "",
          "tests/test_attention.py::test_sdpa_compiled_with_cpp_wrapper_matches_cpu without the lever"),
    Lever("FlexAttention lowerings", "flex:register", "inductor",
          "user_lowerings[higher_order.flex_attention(_backward)] (chained)", "Triton for every device but cpu", "",
          "tests/test_flex_attention.py::test_compiled_forward_backward without the lever"),
    Lever("FlexAttention template renders on the host", "flex:_templates_render_on_host", "by flex.flex_attention",
          "GraphLowering.set_current_device (shadowed for one call)", "C++ codegen keys off the device 'cpu'", "",
          "tests/test_flex_attention.py::test_compiled_captured_buffer[inference] without the lever"),
    Lever("AOTI device header on the include path", "cpp_wrapper:add_aoti_include_dir",
          "by cpp_wrapper.NeuronCppWrapperCodegen", "CPLUS_INCLUDE_PATH (appended)",
          "AOTI precompiles aoti_include/neuron.h", "none found (pytorch/pytorch#143909)",
          "probe cpp_wrapper:aoti_header_missing"),
)


@functools.cache
def install(phase: str) -> tuple:
    """Pulls the levers of ``phase`` that torch still needs; returns their names. Runs once per phase."""
    if phase not in PHASES:
        raise ValueError(f"unknown phase {phase!r}; expected one of {PHASES}")
    return tuple(lever.name for lever in LEVERS if lever.phase == phase and lever.pull())
