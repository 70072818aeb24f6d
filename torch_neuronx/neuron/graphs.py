"""Device graphs (``torch.neuron.NeuronGraph``, ``torch.neuron.graph``): the
``torch.cuda`` graph API over ``torch.accelerator.Graph``, which the native
core implements for ``neuron`` (csrc/aten/NeuronGraph.cpp, docs/graphs.md).

A capture records the kernels queued on the capturing stream without running
them; ``replay()`` runs them again, in order, as one launch on the current
stream. Tensors made during capture live in the graph's private memory pool
and are the static outputs each replay overwrites.
"""
import torch

from .. import _C

__all__ = ["NeuronGraph", "graph", "graph_pool_handle", "is_current_stream_capturing", "make_graphed_callables"]

_CAPTURE_ERROR_MODES = ("default", "global", "thread_local", "relaxed")


def is_current_stream_capturing() -> bool:
    """True while the current neuron stream is capturing a graph."""
    return _C._is_current_stream_capturing()


def graph_pool_handle() -> tuple[int, int]:
    """An opaque id of a new memory pool: pass it as ``pool=`` to several
    captures to let their graphs share memory (replay them in capture order)."""
    return tuple(_C._graph_pool_handle())


def _check_mode(capture_error_mode: str) -> None:
    if capture_error_mode not in _CAPTURE_ERROR_MODES:
        raise ValueError(f"capture_error_mode must be one of {_CAPTURE_ERROR_MODES}, got {capture_error_mode!r}")


class NeuronGraph(torch.accelerator.Graph):
    """A neuron graph with ``torch.cuda.CUDAGraph``'s methods.

    ``keep_graph`` is accepted for parity: the recorded kernels are the
    executable form, so there is nothing to instantiate beyond marking the
    graph ready (``keep_graph=True`` defers that to ``instantiate()`` or the
    first ``replay()``).
    """

    def __new__(cls, keep_graph: bool = False):
        return super().__new__(cls, keep_graph)

    def __init__(self, keep_graph: bool = False) -> None:
        super().__init__(keep_graph)

    def capture_begin(self, pool: tuple[int, int] | None = None, capture_error_mode: str = "global") -> None:
        """Begins capturing the current stream (not the default stream).
        Usually called by :class:`graph`."""
        _check_mode(capture_error_mode)
        if pool is None:  # `with g:` (torch.accelerator.Graph's protocol) passes none
            pool = getattr(self, "graph_pool", None)
        torch._C._acceleratorGraph.capture_begin(self, pool=pool, capture_error_mode=capture_error_mode)


class graph:
    """Context manager that captures the work issued in its body into
    ``neuron_graph``, on ``stream`` (default: a side stream shared by all
    ``graph`` contexts), drawing memory from ``pool`` if given (a
    :func:`graph_pool_handle` or another graph's ``pool()``).

    If the body raises, the capture is discarded (the graph holds none) and the
    body's exception propagates.
    """

    default_capture_stream = None

    def __init__(self, neuron_graph: NeuronGraph, pool: tuple[int, int] | None = None, stream=None,
                 capture_error_mode: str = "global"):
        if not isinstance(neuron_graph, torch.accelerator.Graph):
            raise TypeError(f"graph() needs a torch.neuron.NeuronGraph, got {type(neuron_graph).__name__}")
        _check_mode(capture_error_mode)
        if stream is None:
            if graph.default_capture_stream is None:
                graph.default_capture_stream = torch.neuron.Stream()
            stream = graph.default_capture_stream
        self.neuron_graph = neuron_graph
        self.pool = pool
        self.capture_stream = stream
        self.capture_error_mode = capture_error_mode
        self._stream_ctx = None

    def __enter__(self) -> None:
        # Captured work runs at replays only: settle everything before it.
        torch.neuron.synchronize()
        torch.neuron.empty_cache()
        self._stream_ctx = torch.neuron.stream(self.capture_stream)
        self._stream_ctx.__enter__()
        try:
            if isinstance(self.neuron_graph, NeuronGraph):
                self.neuron_graph.capture_begin(pool=self.pool, capture_error_mode=self.capture_error_mode)
            else:
                torch._C._acceleratorGraph.capture_begin(self.neuron_graph, pool=self.pool,
                                                         capture_error_mode=self.capture_error_mode)
        except BaseException:
            self._stream_ctx.__exit__(None, None, None)
            raise

    def __exit__(self, exc_type, exc, tb) -> None:
        try:
            if exc_type is None:
                self.neuron_graph.capture_end()
            else:
                # The body's error is the one to report (a capture-rule
                # violation already says so); the capture is dropped.
                self.neuron_graph.reset()
        finally:
            self._stream_ctx.__exit__(exc_type, exc, tb)


def make_graphed_callables(callables, sample_args, num_warmup_iters: int = 3, allow_unused_input: bool = False,
                           pool: tuple[int, int] | None = None):
    """Graphed versions of ``callables`` (modules or functions), as
    ``torch.cuda.make_graphed_callables``: each one's forward and backward run
    as two neuron graph replays inside one autograd node.

    ``sample_args`` are the tensor arguments of each callable (a tuple of
    tuples for a tuple of callables); their ``requires_grad`` must match the
    real inputs'. A tuple of callables shares one memory pool (``pool`` or a
    new one) and must run in the order given: forwards 1..N, backwards N..1.
    Calls must pass tensors of the sample args' shapes and dtypes; a module's
    parameters are used in place (not copied), so the optimizer may update
    them between calls. A module whose ``training`` flag differs from the one
    at capture runs its original forward.
    """
    single = not isinstance(callables, tuple)
    if single:
        callables, sample_args = (callables,), (sample_args,)
    if not isinstance(sample_args, tuple) or len(sample_args) != len(callables):
        raise TypeError("sample_args must be a tuple of tensors (one callable) or a tuple of such tuples, one per "
                        "callable")
    if torch.is_autocast_enabled("neuron") and torch.is_autocast_cache_enabled():
        raise RuntimeError("make_graphed_callables needs autocast's cache disabled: "
                           "torch.autocast('neuron', cache_enabled=False)")
    flat_args = []
    for fn, args in zip(callables, sample_args):
        if isinstance(fn, torch.nn.Module):
            if fn._backward_hooks or fn._forward_hooks or fn._forward_pre_hooks:
                raise RuntimeError("make_graphed_callables: modules must have no hooks when they are graphed "
                                   "(hooks registered afterwards are allowed)")
            if any(b.requires_grad for b in fn.buffers()):
                raise RuntimeError("make_graphed_callables: only parameters may require grad, not buffers")
        leaves = tuple(torch.utils._pytree.arg_tree_leaves(*args))
        if not all(isinstance(t, torch.Tensor) for t in leaves):
            raise TypeError("make_graphed_callables: sample_args may contain only tensors")
        flat_args.append(leaves)

    # The graph's inputs: the user's tensors, then a module's parameters.
    params = [tuple(fn.parameters()) if isinstance(fn, torch.nn.Module) else () for fn in callables]
    surfaces = [a + p for a, p in zip(flat_args, params)]
    pool = graph_pool_handle() if pool is None else pool

    def grads_of(outputs, surface, grad_outputs):
        # Differentiates the outputs that require grad w.r.t. the inputs that do.
        wanted = tuple(t for t in surface if t.requires_grad)
        diff = [(o, g) for o, g in zip(outputs, grad_outputs) if o.requires_grad]
        if not diff or not wanted:
            return None
        return torch.autograd.grad(tuple(o for o, _ in diff), wanted, tuple(g for _, g in diff),
                                   only_inputs=True, allow_unused=allow_unused_input)

    # Warm-up on a side stream: first-call work (lazy init, autograd's
    # buffers) must not end up in a capture.
    torch.neuron.synchronize()
    with torch.neuron.stream(torch.neuron.Stream()):
        for fn, args, surface in zip(callables, sample_args, surfaces):
            for _ in range(num_warmup_iters):
                outs = torch.utils._pytree.tree_leaves(fn(*args))
                grads_of(outs, surface, [torch.empty_like(o) for o in outs])
                del outs
    torch.neuron.synchronize()

    # Capture in the order of a training step, all in one pool: forwards
    # 1..N, then backwards N..1, so that replays in that order never
    # overwrite memory a later replay still reads.
    fwd_graphs, static_outs, specs = [], [], []
    for fn, args in zip(callables, sample_args):
        g = NeuronGraph()
        with graph(g, pool=pool):
            outs = fn(*args)
        flat, spec = torch.utils._pytree.tree_flatten(outs)
        fwd_graphs.append(g), static_outs.append(tuple(flat)), specs.append(spec)

    bwd_graphs, static_grad_outs, static_grad_ins = [None] * len(callables), [None] * len(callables), \
        [None] * len(callables)
    for i in reversed(range(len(callables))):
        grad_outs = tuple(torch.empty_like(o) if o.requires_grad else None for o in static_outs[i])
        g = NeuronGraph()
        grads = None
        if any(o.requires_grad for o in static_outs[i]) and any(t.requires_grad for t in surfaces[i]):
            with graph(g, pool=pool):
                grads = grads_of(static_outs[i], surfaces[i], grad_outs)
        it = iter(grads or ())
        # One slot per graph input: None where the input needs no grad.
        static_grad_ins[i] = tuple(next(it) if t.requires_grad and grads is not None else None
                                   for t in surfaces[i])
        bwd_graphs[i], static_grad_outs[i] = (g if grads is not None else None), grad_outs

    # Drop the captured autograd graphs: they would keep the parameters'
    # AccumulateGrad nodes bound to the capture stream.
    static_outs = [tuple(o.detach() for o in outs) for outs in static_outs]
    graphed = []
    for i, fn in enumerate(callables):
        f = _graphed_function(fwd_graphs[i], bwd_graphs[i], len(flat_args[i]), params[i], surfaces[i],
                              static_outs[i], specs[i], static_grad_outs[i], static_grad_ins[i])
        if isinstance(fn, torch.nn.Module):
            fn.forward = _graphed_forward(fn, fn.training, f, fn.forward)
            graphed.append(fn)
        else:
            graphed.append(f)
    return graphed[0] if single else tuple(graphed)


def _graphed_function(fwd_graph, bwd_graph, n_user_args, params, surface, static_outs, spec, static_grad_outs,
                      static_grad_ins):
    class Graphed(torch.autograd.Function):
        @staticmethod
        def forward(ctx, *inputs):
            # Only the user's tensors can be new; parameters are the captured ones.
            for static, new in zip(surface[:n_user_args], inputs[:n_user_args]):
                if static.data_ptr() != new.data_ptr():
                    static.copy_(new)
            fwd_graph.replay()
            return tuple(o.detach() for o in static_outs)

        @staticmethod
        @torch.autograd.function.once_differentiable
        def backward(ctx, *grads):
            if bwd_graph is None:
                return tuple(None for _ in static_grad_ins)
            for static, new in zip(static_grad_outs, grads):
                if static is not None and new is not None and static.data_ptr() != new.data_ptr():
                    static.copy_(new)
                elif static is not None and new is None:
                    static.zero_()  # autograd passes None for an output that got no gradient
            bwd_graph.replay()
            return tuple(g.detach() if g is not None else None for g in static_grad_ins)

    def run(*user_args):
        flat = tuple(torch.utils._pytree.arg_tree_leaves(*user_args))
        if len(flat) != n_user_args:
            raise TypeError(f"the graphed callable takes {n_user_args} tensors (as its sample_args), got {len(flat)}")
        for static, new in zip(surface, flat):
            if not isinstance(new, torch.Tensor) or new.shape != static.shape or new.dtype != static.dtype \
                    or new.device != static.device:
                raise ValueError(f"the graphed callable was captured for {tuple(static.shape)} {static.dtype} on "
                                 f"{static.device}, got {_describe(new)}")
        return torch.utils._pytree.tree_unflatten(Graphed.apply(*(flat + params)), spec)

    return run


def _describe(t) -> str:
    return f"{tuple(t.shape)} {t.dtype} on {t.device}" if isinstance(t, torch.Tensor) else type(t).__name__


def _graphed_forward(module, training: bool, graphed, eager_forward):
    def forward(*args, **kwargs):
        # The graph holds the mode it was captured in (dropout, batch norm).
        if module.training == training:
            return graphed(*args, **kwargs)
        return eager_forward(*args, **kwargs)

    return forward
