"""``torch.compile(backend="neuron", mode="reduce-overhead")``: each compiled
graph is captured into a neuron graph and replayed (docs/compile.md,
docs/graphs.md).

Inductor's own CUDA-graph trees are CUDA-only; its documented hook for
another implementation is ``config.cudagraph_policy``, whose ``wrap_output``
gets every compiled graph after ``post_compile`` (fresh or from a cache). The
``neuron`` backend sets :class:`NeuronGraphPolicy` there for this mode.

The contract is the CUDA-graph trees' one:

- per compiled graph and input shapes (the int inputs of a dynamic graph and
  the shapes of the copied inputs), the first call runs the graph as
  compiled (warm-up), the second captures it and replays; later calls replay;
- static inputs (parameters, buffers, ``mark_static_address`` tensors such as
  Transformers' static KV cache) are used in place; the other tensor inputs
  are copied into the graph's own input buffers before each replay, and those
  the graph mutates are copied back after it;
- outputs are the graph's static buffers: the next replay of the same graph
  overwrites them (clone what must outlive the next call);
- a graph that cannot be captured (an op that cannot be recorded, CPU tensors,
  training graphs, ...) runs as compiled from then on, with one logged reason.
"""
from __future__ import annotations

import logging

import torch
from torch._inductor.cudagraph_utils import CUDAGraphPolicy
from torch._inductor.output_code import CompiledFxGraph

from .._C import _tensors_data_ptrs_at_indices_equal

log = logging.getLogger(__name__)

_stats = {"captures": 0, "replays": 0, "fallbacks": 0}


def graph_stats() -> dict:
    """Counts of this process: ``captures``, ``replays``, and ``fallbacks``
    (compiled graphs that run without a neuron graph)."""
    return dict(_stats)


def reset_graph_stats() -> None:
    for k in _stats:
        _stats[k] = 0


class NeuronGraphPolicy(CUDAGraphPolicy):
    """Inductor's CUDA-graph policy hook, implemented with neuron graphs."""

    def should_wrap(self, compiled_graph) -> bool:
        return False  # never Inductor's CUDA path (the backend keeps triton.cudagraphs off)

    def wrap_output(self, output_code):
        if isinstance(output_code, CompiledFxGraph) and output_code.current_callable is not None \
                and not isinstance(output_code.current_callable, GraphedCompiledFn):
            output_code.current_callable = GraphedCompiledFn(output_code)
        return output_code


def _static_reason(output_code) -> str | None:
    """Why a compiled graph cannot be captured, known before any call."""
    kwargs = output_code.fx_kwargs or {}
    if not kwargs.get("is_inference", False):
        return ("it is a training graph (forward/backward); only inference graphs (no input requires grad, "
                "or under torch.no_grad()) are captured")
    if "cpu" in output_code.device_types:
        return "it computes on CPU tensors, whose kernels run at capture and are not replayed"
    if not output_code.device_types & {"neuron"}:
        return "it has no neuron tensors"
    return None


class _Captured:
    """One captured graph: its input buffers, static outputs and replay."""

    def __init__(self, graph, inputs, copied, static_ptrs, outputs):
        self.graph = graph
        self.inputs = inputs  # the arguments of the capture (buffers for copied inputs)
        self.copied = copied  # indices of inputs copied into self.inputs
        # Inputs used in place: their indices and data_ptrs at capture.
        self.static_idxs = list(static_ptrs)
        self.static_ptrs = list(static_ptrs.values())
        self.outputs = outputs


class GraphedCompiledFn:
    """The callable of one compiled graph (Inductor's boxed calling
    convention: one list of inputs, cleared by the call)."""

    def __init__(self, output_code):
        self.fn = output_code.current_callable
        kwargs = output_code.fx_kwargs or {}
        self.static_idxs = frozenset(kwargs.get("static_input_idxs") or ())
        self.mutated_idxs = frozenset(output_code.mutated_input_idxs)
        self.reason = _static_reason(output_code)
        self.reported = False
        self.graphs: dict = {}
        self.warm: set = set()
        self.recaptures = 0
        # (input count, positions of the inputs that choose the graph: all but
        # the static tensors): a decode step's hundreds of parameters are not
        # looked at per call beyond one pointer each.
        self.keyed_idxs: tuple | None = None

    def __call__(self, inputs: list):
        if self.reason is None:
            key = self._key(inputs)
            entry = self.graphs.get(key)
            if entry is not None and _tensors_data_ptrs_at_indices_equal(inputs, entry.static_ptrs, entry.static_idxs):
                return self._replay(entry, inputs)
            if entry is not None:
                # A static input moved (e.g. a new KV cache): the graph reads
                # the old address, so capture again (no warm-up needed).
                del self.graphs[key]
                self.recaptures += 1
                limit = torch._inductor.config.triton.cudagraph_unexpected_rerecord_limit
                if self.recaptures > limit:
                    self._fall_back(f"its static inputs changed address more than {limit} times "
                                    "(torch._inductor.config.triton.cudagraph_unexpected_rerecord_limit)")
            elif key not in self.warm:
                self.warm.add(key)  # lazy first-call work must not be captured
                return self.fn(inputs)
            if self.reason is None:
                entry = self._capture(inputs)
                if entry is not None:
                    self.graphs[key] = entry
                    return self._replay(entry, inputs)
        self._report()
        return self.fn(inputs)

    def _key(self, inputs) -> tuple:
        # Ints are the sizes of a dynamic graph: one neuron graph per value.
        if self.keyed_idxs is None or self.keyed_idxs[0] != len(inputs):
            self.keyed_idxs = (len(inputs), *(i for i in range(len(inputs)) if i not in self.static_idxs))
        key = [len(inputs)]
        for i in self.keyed_idxs[1:]:
            x = inputs[i]
            key.append((x.shape, x.stride()) if isinstance(x, torch.Tensor) else x)
        return tuple(key)

    def _fall_back(self, reason: str) -> None:
        self.reason = reason
        self.graphs.clear()

    def _report(self) -> None:
        if not self.reported and self.reason is not None:
            self.reported = True
            _stats["fallbacks"] += 1
            from torch._dynamo.utils import counters

            counters["inductor"]["cudagraph_skips"] += 1
            log.warning("torch.compile(backend='neuron', mode='reduce-overhead'): a compiled graph runs without "
                        "a neuron graph: %s", self.reason)

    def _capture(self, inputs) -> _Captured | None:
        devices = {x.device for x in inputs if isinstance(x, torch.Tensor)}
        bad = [(i, type(x).__name__) for i, x in enumerate(inputs)
               if not isinstance(x, (torch.Tensor, int, float, bool, torch.SymInt))]
        if bad:
            self._fall_back(f"input {bad[0][0]} is a {bad[0][1]}")
            return None
        if len(devices) != 1 or next(iter(devices)).type != "neuron":
            self._fall_back(f"its tensor inputs are on {sorted(map(str, devices))}, not one neuron device")
            return None
        device = next(iter(devices))
        args, copied, static_ptrs = [], [], {}
        for i, x in enumerate(inputs):
            if isinstance(x, torch.Tensor) and i not in self.static_idxs:
                buf = torch.empty_strided(x.size(), x.stride(), dtype=x.dtype, device=device)
                buf.copy_(x)
                args.append(buf), copied.append(i)
            else:
                if isinstance(x, torch.Tensor):
                    static_ptrs[i] = x.data_ptr()
                args.append(x)
        graph = torch.neuron.NeuronGraph()
        try:
            with torch.neuron.device(device), torch.neuron.graph(graph, stream=_capture_stream(device)):
                outputs = self.fn(list(args))
        except RuntimeError as e:
            # e.g. an op that cannot be recorded; the device is usable again.
            self._fall_back(f"capture failed: {str(e).splitlines()[0]}")
            return None
        buffers = {args[i].untyped_storage().data_ptr() for i in copied}
        if any(isinstance(o, torch.Tensor) and o.untyped_storage().data_ptr() in buffers for o in outputs):
            self._fall_back("an output aliases a copied (non-static) input")
            return None
        _stats["captures"] += 1
        return _Captured(graph, args, tuple(copied), static_ptrs, list(outputs))

    def _replay(self, entry: _Captured, inputs: list):
        for i in entry.copied:
            buf, x = entry.inputs[i], inputs[i]
            if buf.data_ptr() != x.data_ptr():
                buf.copy_(x)
        entry.graph.replay()
        _stats["replays"] += 1
        for i in entry.copied:
            if i in self.mutated_idxs and entry.inputs[i].data_ptr() != inputs[i].data_ptr():
                inputs[i].copy_(entry.inputs[i])  # the graph mutated our copy: the caller's tensor too
        inputs.clear()
        # New tensor objects over the static outputs (the caller may set their autograd state).
        return [o.detach() if isinstance(o, torch.Tensor) else o for o in entry.outputs]


_streams: dict = {}


def _capture_stream(device: torch.device):
    if device not in _streams:
        _streams[device] = torch.neuron.Stream(device)
    return _streams[device]
