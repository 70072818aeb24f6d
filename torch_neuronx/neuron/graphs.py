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

__all__ = ["NeuronGraph", "graph", "graph_pool_handle", "is_current_stream_capturing"]

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
