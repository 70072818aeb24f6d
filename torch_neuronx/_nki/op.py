"""``nki_op``: an NKI kernel as a PyTorch custom operator.

Built on ``torch.library.custom_op``: the eager kernel runs the user
function, whose NKI kernel calls execute on the tensors' memory (neuron
tensors in eager mode; host aliases when a compiled graph calls the op). The
fake kernel is the same function on FakeTensors, where a kernel call traces
the kernel shape-only and returns empty outputs of the traced shapes and
dtypes; so ``torch.compile(backend="neuron", fullgraph=True)`` keeps the op
as one opaque node. Training: ``op.register_autograd(backward,
setup_context=...)`` (the CustomOpDef API).
"""
import torch

import nki


def nki_op(name, fn=None, *, mutates_args=(), device_types=None, schema=None):
    """Registers ``fn`` (typed like any custom op: ``(x: Tensor, ...) ->
    Tensor``) as the operator ``name`` (``"lib::op"``). Use as a decorator
    or call directly. Returns the ``CustomOpDef``: call it like ``fn``, and
    ``register_autograd`` on it for training."""
    if fn is None:
        return lambda f: nki_op(name, f, mutates_args=mutates_args, device_types=device_types, schema=schema)
    op = torch.library.custom_op(name, fn, mutates_args=mutates_args, device_types=device_types, schema=schema)
    # FakeTensor arguments make every kernel call a shape-only trace.
    op.register_fake(fn)
    return op


class _NKICaller:
    """``wrap_nki(kernel)`` inside an nki_op function: ``[grid]`` and call."""

    def __init__(self, kernel, grid=None):
        if not isinstance(kernel, nki.Kernel):
            kernel = nki.jit(kernel)
        self.kernel = kernel
        self.grid = grid

    def __getitem__(self, grid):
        return _NKICaller(self.kernel, grid)

    def __call__(self, *args, **kwargs):
        k = self.kernel if self.grid is None else self.kernel[self.grid]
        return k(*args, **kwargs)

    def __repr__(self):
        return f"wrap_nki({self.kernel!r})"


def wrap_nki(kernel):
    """Wraps an ``@nki.jit`` kernel (or a plain kernel function) for use
    inside an ``nki_op`` function: ``wrap_nki(k)[grid](x, out)``."""
    return _NKICaller(kernel)
