"""``nki_op``: an NKI kernel as a PyTorch custom operator.

Built on ``torch.library.custom_op``: the eager kernel runs the user
function, whose NKI kernel calls execute on the tensors' memory (neuron
tensors in eager mode; host aliases when a compiled graph calls the op). The
fake kernel is the same function on FakeTensors, where a kernel call traces
the kernel shape-only and returns empty outputs of the traced shapes and
dtypes; so ``torch.compile(backend="neuron", fullgraph=True)`` keeps the op
as one opaque node. Training: ``op.register_autograd(backward,
setup_context=...)`` (the CustomOpDef API).

Kernels that write an argument: list it in ``mutates_args`` (its schema
type becomes ``Tensor(a!)``, so functionalization under torch.compile sees
the write). A custom operator may not return an alias of an input, so when
the function returns a mutated (or any) input, as an NKI beta-2 kernel's
``return out`` does, the operator returns a copy of it: the argument holds
the result and the returned tensor has the same values. Annotate ``-> None``
and use the argument to avoid that copy.
"""
import functools
import inspect

import torch
import torch.utils._pytree as pytree

import nki
from nki._jit import observe_writes


def nki_op(name, fn=None, *, mutates_args=(), device_types=None, schema=None):
    """Registers ``fn`` (typed like any custom op: ``(x: Tensor, ...) ->
    Tensor``) as the operator ``name`` (``"lib::op"``). Use as a decorator
    or call directly. Returns the ``CustomOpDef``: call it like ``fn``, and
    ``register_autograd`` on it for training."""
    if fn is None:
        return lambda f: nki_op(name, f, mutates_args=mutates_args, device_types=device_types, schema=schema)
    if schema is None:  # from the user's function (annotations resolve in its module)
        schema = torch.library.infer_schema(fn, mutates_args=mutates_args)
    body = _body(name, fn, mutates_args)
    op = torch.library.custom_op(name, body, mutates_args=mutates_args, device_types=device_types, schema=schema)
    # FakeTensor arguments make every kernel call a shape-only trace.
    op.register_fake(body)
    return op


def _body(name, fn, mutates_args):
    """``fn`` as the operator's kernel: a returned input comes back as a
    copy, and a kernel writing an input that ``mutates_args`` does not list
    is an error (its write would be lost under functionalization)."""
    sig = inspect.signature(fn)
    declared = None if mutates_args == "unknown" else frozenset(mutates_args)

    @functools.wraps(fn)
    def body(*args, **kwargs):
        with observe_writes() as written:
            result = fn(*args, **kwargs)
        if not written and not isinstance(result, (torch.Tensor, tuple, list)):
            return result
        bound = sig.bind(*args, **kwargs)
        inputs = [(n, t) for n, v in bound.arguments.items() for t in pytree.tree_leaves(v)
                  if isinstance(t, torch.Tensor)]
        if declared is not None:
            for w in written:
                for n, t in inputs:
                    if n not in declared and torch._C._is_alias_of(w, t):
                        raise nki.NKIError(f"nki_op {name}: a kernel writes argument '{n}', which mutates_args does "
                                           f"not list; add it (mutates_args={{'{n}', ...}}) so PyTorch knows of the "
                                           f"write")
        return pytree.tree_map_only(torch.Tensor, lambda r: _fresh(r, inputs), result)
    return body


def _fresh(r, inputs):
    return r.clone() if any(torch._C._is_alias_of(r, t) for _n, t in inputs) else r


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
