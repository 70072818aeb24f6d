"""Dynamo integration: the ``neuron`` DeviceInterface and the ``"neuron"`` backend.

Nothing here is imported by ``import torch``; it loads on the first
``torch.compile`` that needs it (Inductor asks ``torch.neuron`` for its
codegen classes, which registers everything; the backend entry point imports
this module directly).
"""
from __future__ import annotations

import functools
import itertools
import logging

import torch
from torch._dynamo.device_interface import DeviceInterface, register_interface_for_device

log = logging.getLogger(__name__)


class NeuronInterface(DeviceInterface):
    device = torch.neuron.device  # type: ignore[assignment]
    Event = torch.neuron.Event  # type: ignore[assignment]
    Stream = torch.neuron.Stream  # type: ignore[assignment]

    class Worker:
        @staticmethod
        def set_device(device: int) -> None:
            torch.neuron.set_device(device)

        @staticmethod
        def current_device() -> int:
            return torch.neuron.current_device()

        @staticmethod
        def get_device_properties(device=None):
            return torch.neuron.get_device_properties(device)

    current_device = staticmethod(torch.neuron.current_device)
    set_device = staticmethod(torch.neuron.set_device)
    device_count = staticmethod(torch.neuron.device_count)
    is_available = staticmethod(torch.neuron.is_available)
    stream = staticmethod(torch.neuron.stream)
    current_stream = staticmethod(torch.neuron.current_stream)
    set_stream = staticmethod(torch.neuron.set_stream)
    synchronize = staticmethod(torch.neuron.synchronize)
    memory_allocated = staticmethod(torch.neuron.memory_allocated)

    @staticmethod
    def maybe_exchange_device(device: int) -> int:
        if device < 0 or device >= torch.neuron.device_count():
            return torch.neuron.current_device()
        return torch_neuronx_C()._exchange_device(device)

    @staticmethod
    def exchange_device(device: int) -> int:
        return torch_neuronx_C()._exchange_device(device)

    @staticmethod
    def _set_stream_by_id(stream_id: int, device_index: int, device_type: int) -> None:
        torch.accelerator.set_stream(torch.Stream(stream_id=stream_id, device_index=device_index,
                                                  device_type=device_type))

    @staticmethod
    def get_raw_stream(device_idx: int) -> int:
        # Host kernels take no stream handle; launches are ordered by the runtime.
        return 0

    @classmethod
    def get_device_properties(cls, device=None):
        return torch.neuron.get_device_properties(device)

    @staticmethod
    def get_compute_capability(device=None) -> str:
        major, minor = torch.neuron.get_device_capability(device)
        return f"neuron{major}{minor}"

    @staticmethod
    def is_bf16_supported(including_emulation: bool = False) -> bool:
        return True

    @staticmethod
    def is_triton_capable(device=None) -> bool:
        return False

    @classmethod
    def raise_if_triton_unavailable(cls, device=None) -> None:
        raise RuntimeError("neuron kernels are generated as C++ host kernels, not Triton")


def torch_neuronx_C():
    from . import _C

    return _C


@functools.cache
def register_device_interface() -> None:
    register_interface_for_device("neuron", NeuronInterface)
    for i in range(torch.neuron.device_count()):
        register_interface_for_device(f"neuron:{i}", NeuronInterface)


# Compile ids ("frame/attempt") of the neuron compilations of this process,
# noted by neuron_backend: torch 2.13 no longer counts recompiles, and counts
# frames only outside fullgraph=True.
_compile_ids: list = []
_last_context = None


def _note_compile() -> None:
    from torch._guards import CompileContext

    global _last_context
    context = CompileContext.try_get()
    # The graphs of one compilation (split by graph breaks) share its context.
    if context is not None and context is not _last_context and context.compile_id is not None:
        _last_context = context
        _compile_ids.append(str(context.compile_id))


def get_dynamo_metrics() -> dict:
    """Compile counters of this process, for frames with neuron graphs:
    compilations (``frames_total``/``frames_ok``; a failed one raises), of which
    ``recompiles`` were later compilations of an already compiled frame; and
    Dynamo's graph breaks and unique graphs."""
    import re

    from torch._dynamo.utils import counters

    attempts = [re.match(r"\[?(\d+)/(\d+)", c) for c in _compile_ids]
    attempts = [(int(m.group(1)), int(m.group(2))) for m in attempts if m]
    return {
        "frames_total": len(attempts),
        "frames_ok": len(attempts),
        "recompiles": sum(1 for _, a in attempts if a > 0),
        "graph_breaks": sum(counters["graph_break"].values()),
        "unique_graphs": counters["stats"]["unique_graphs"],
    }


# ---- the "neuron" backend -------------------------------------------------------

_MODES = {
    "default": {},
    # CUDA graphs do not apply to host kernels; reduce-overhead compiles like default.
    "reduce-overhead": {},
    "max-autotune": {"max_autotune": True},
    "max-autotune-no-cudagraphs": {"max_autotune": True},
}

def _is_neuron_device(d) -> bool:
    if isinstance(d, str):
        return d == "neuron" or d.startswith("neuron:")
    return isinstance(d, torch.device) and d.type == "neuron"


def _names_neuron(gm: torch.fx.GraphModule, example_inputs) -> bool:
    """Whether a graph touches the neuron device: an input, a constant, a
    device argument, or a traced value (Dynamo's ``example_value``,
    AOTAutograd's ``val``) on neuron. Graphs that do not are plain CPU graphs."""
    from torch.utils._pytree import tree_leaves

    def on_neuron(v):
        return isinstance(v, torch.Tensor) and v.device.type == "neuron"

    if any(on_neuron(t) for t in example_inputs):
        return True
    for node in gm.graph.nodes:
        if node.op == "get_attr":
            owner, _, name = node.target.rpartition(".")
            if on_neuron(getattr(gm.get_submodule(owner) if owner else gm, name, None)):
                return True
        traced = node.meta.get("val", node.meta.get("example_value"))
        if any(on_neuron(v) for v in tree_leaves(traced)):
            return True
        if any(_is_neuron_device(a) for a in tree_leaves((node.args, node.kwargs))):
            return True
    return False


def _output_devices(gm: torch.fx.GraphModule, example_inputs) -> list:
    """The eager device of each graph output (None for non-tensors), read
    from the traced fake values before ``_host_graph`` rewrites devices."""
    from torch._guards import detect_fake_mode
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp

    (outs,) = gm.graph.output_node().args
    outs = outs if isinstance(outs, (list, tuple)) else [outs]
    if any(isinstance(a, torch.fx.Node) and "val" not in a.meta for a in outs):
        FakeTensorProp(gm, mode=detect_fake_mode(example_inputs)).propagate_dont_convert_inputs(*example_inputs)
    vals = [a.meta.get("val") if isinstance(a, torch.fx.Node) else a for a in outs]
    return [v.device if isinstance(v, torch.Tensor) else None for v in vals]


def _host_graph(gm: torch.fx.GraphModule) -> int:
    """Rewrites ``gm`` for the host: neuron device constants become cpu and
    tensor constants (get_attr) become host aliases of their device memory.
    Returns the neuron device index the graph names, or None."""
    C = torch_neuronx_C()
    index = None
    for node in gm.graph.nodes:
        if node.op == "get_attr":
            owner, _, name = node.target.rpartition(".")
            mod = gm.get_submodule(owner) if owner else gm
            value = getattr(mod, name, None)
            if isinstance(value, torch.Tensor) and value.device.type == "neuron":
                index = value.device.index
                alias = C._host_alias(value)
                if isinstance(value, torch.nn.Parameter):
                    alias = torch.nn.Parameter(alias, requires_grad=value.requires_grad)
                if name in mod._buffers:
                    mod._buffers[name] = alias
                elif name in mod._parameters:
                    mod._parameters[name] = alias
                else:
                    setattr(mod, name, alias)
            continue
        if node.op != "call_function":
            continue
        devices = []

        def to_host(a):
            if isinstance(a, torch.device) and a.type == "neuron":
                devices.append(a)
                return torch.device("cpu")
            return a

        # Device arguments, positional (prims.device_put) or keyword (factories, _to_copy).
        node.args = torch.fx.node.map_aggregate(node.args, to_host)
        node.kwargs = torch.fx.node.map_aggregate(node.kwargs, to_host)
        for d in devices:
            index = d.index if d.index is not None else index
    gm.recompile()
    return index


def _host_inputs(example_inputs, fake_mode):
    out = []
    with fake_mode:
        for t in example_inputs:
            if isinstance(t, torch.Tensor) and t.device.type == "neuron":
                out.append(torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="cpu",
                                               requires_grad=t.requires_grad))
            else:
                out.append(t)
    return out


_graph_ids = itertools.count()


def _make_compiler(is_backward: bool, config_patches: dict):
    from torch._inductor.compile_fx import compile_fx_inner

    def compiler(gm: torch.fx.GraphModule, example_inputs):
        from torch._guards import detect_fake_mode
        from torch.fx.passes.fake_tensor_prop import FakeTensorProp

        if not _names_neuron(gm, example_inputs):
            # A CPU graph (e.g. the backward of CPU-only values): plain Inductor.
            with torch._inductor.config.patch(config_patches):
                return compile_fx_inner(gm, example_inputs, is_backward=is_backward)
        out_devices = _output_devices(gm, example_inputs)
        devices = {t.device.index for t in example_inputs
                   if isinstance(t, torch.Tensor) and t.device.type == "neuron"}
        index = _host_graph(gm)
        if devices:
            index = next(iter(devices))
        if index is None:
            index = torch.neuron.current_device()
        fake_mode = detect_fake_mode(example_inputs)
        host_inputs = _host_inputs(example_inputs, fake_mode)
        FakeTensorProp(gm, mode=fake_mode).propagate_dont_convert_inputs(*host_inputs)
        uses_rng = any(torch.Tag.nondeterministic_seeded in getattr(n.target, "tags", ())
                       for n in gm.graph.nodes if n.op == "call_function")
        # Random ops stay aten calls (no Inductor seed rewriting) so they can
        # be driven by the device generator at run time (see _on_device).
        with torch._inductor.config.patch({**config_patches, "fallback_random": True}):
            compiled = compile_fx_inner(gm, host_inputs, is_backward=is_backward)
        # The launch's name in the profiler: the graph Dynamo compiled.
        name = f"compiled {'backward' if is_backward else 'forward'} graph {next(_graph_ids)}"
        return _on_device(compiled, index, uses_rng, out_devices, name)

    return compiler


def _host_outputs(outs: list, on_host: list) -> list:
    """Copies the CPU outputs out of device memory (they were allocated under
    the staging scope, or alias a device input) into ordinary CPU tensors.
    Outputs sharing a storage keep sharing one copy."""
    C = torch_neuronx_C()
    copies = {}
    for i, o in enumerate(outs):
        if not on_host[i] or not isinstance(o, torch.Tensor):
            continue
        storage = o.untyped_storage()
        if C._is_neuron_ptr(storage.data_ptr()) < 0:
            continue
        key = storage.data_ptr()
        if key not in copies:
            copies[key] = storage.clone()
        outs[i] = torch.empty(0, dtype=o.dtype).set_(copies[key], o.storage_offset(), o.size(), o.stride())
    return outs


def _on_device(compiled, index: int, uses_rng: bool, out_devices: list, name: str = "compiled graph"):
    C = torch_neuronx_C()
    # Outputs eager puts on neuron become device tensors (without a copy); the
    # rest stay CPU tensors, as eager gives them.
    on_host = [d is not None and d.type != "neuron" for d in out_devices]

    def call(host):
        # One kernel launch: the host code and the copy of CPU outputs out of
        # device memory are device work (NEURON_RT_PROTECT enforces it).
        def kernel():
            with C._Staging(index):
                outs = list(compiled(host))
            if len(outs) != len(on_host):
                raise RuntimeError(f"neuron compile: the graph has {len(on_host)} outputs but its "
                                   f"compiled code returned {len(outs)}")
            return _host_outputs(outs, on_host)

        return C._launch(index, kernel, name)

    def run(args):
        host = [C._host_alias(a) if isinstance(a, torch.Tensor) else a for a in args]
        args.clear()
        if uses_rng:
            # The host code draws from the CPU engine: seed it from the device
            # generator's Philox stream (advancing it) and leave the caller's
            # CPU RNG state untouched.
            # (31 bits: int32-safe under NEURON_RT_STRICT; plenty of entropy for a seed)
            seed = int(torch.randint(0, 2**31 - 1, (1,), device=f"neuron:{index}").item())
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(seed)
                outs = call(host)
        else:
            outs = call(host)
        return [o if h or not isinstance(o, torch.Tensor) else C._device_tensor(o, index)
                for o, h in zip(outs, on_host)]

    run._boxed_call = True
    return run


def neuron_backend(gm: torch.fx.GraphModule, example_inputs, mode: str | None = None, options: dict | None = None):
    """``torch.compile(model, backend="neuron")``.

    Lowering: Dynamo -> AOTAutograd (forward and backward graphs, so training
    works) -> Inductor's C++ code generation for the host runtime. Each graph is
    compiled as host code over aliases of device memory: inputs are passed
    without copies and outputs are allocated in HBM. ``mode`` selects Inductor
    options (docs/compile.md); ``options`` are passed through to Inductor.
    """
    from torch._dynamo.backends.common import aot_autograd
    from torch._inductor.compile_fx import partition_fn, select_decomp_table

    register_device_interface()
    _note_compile()
    mode = mode or "default"
    if mode not in _MODES:
        raise ValueError(f"unknown torch.compile mode {mode!r} for backend 'neuron'; expected one of {list(_MODES)}")
    config_patches = {**_MODES[mode], **(options or {}), "triton.cudagraphs": False}
    if not _names_neuron(gm, example_inputs):
        # Nothing on neuron: compile exactly as CPU Inductor would.
        from torch._inductor.compile_fx import compile_fx

        return compile_fx(gm, example_inputs, config_patches=config_patches)
    backend = aot_autograd(fw_compiler=_make_compiler(False, config_patches),
                           bw_compiler=_make_compiler(True, config_patches),
                           inference_compiler=_make_compiler(False, config_patches),
                           decompositions=select_decomp_table(),
                           # Inductor's min-cut partitioner: recompute cheap ops, save fewer activations.
                           partition_fn=partition_fn,
                           keep_inference_input_mutations=True)
    return backend(gm, example_inputs)


def _register_backend() -> None:
    from torch._dynamo.backends.registry import _BACKENDS, register_backend

    if "neuron" not in _BACKENDS:
        register_backend(neuron_backend, name="neuron")


_register_backend()
