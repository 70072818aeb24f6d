"""NKI kernels as PyTorch operators (nki_op / wrap_nki): eager on neuron,
torch.compile(backend="neuron", fullgraph=True) keeping the op opaque, and
training through register_autograd."""
import pytest
import torch

import nki
import nki.isa as nisa
import nki.language as nl
from torch_neuronx import nki_op, wrap_nki

from conftest import assert_same


@nki.jit
def add_kernel(a, b, out):
    """out = a + b for [P <= 128, F] tensors, written into ``out``."""
    x, y = nl.load(a), nl.load(b)
    z = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=z, data1=x, data2=y, op=nl.add)
    nisa.dma_copy(dst=out, src=z)


@nki.jit
def scale_rows_kernel(x, factor):
    """Returns x * factor, one 32-row tile per SPMD instance."""
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    rows = nl.ds(nl.program_id(0) * 32, 32)
    t = nl.ndarray((32, x.shape[1]), dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x[rows])
    nisa.tensor_scalar(dst=t, data=t, op0=nl.multiply, operand0=factor)
    nisa.dma_copy(dst=out[rows], src=t)
    return out


@nki.jit
def square_kernel(x):
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    t = nl.load(x)
    nisa.activation(dst=t, op=nl.square, data=t)
    nl.store(out, t)
    return out


@nki_op("nki_test::add_into", mutates_args={"out"})
def add_into(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor) -> None:
    wrap_nki(add_kernel)(a, b, out)


@nki_op("nki_test::scale_rows", mutates_args={})
def scale_rows(x: torch.Tensor, factor: float) -> torch.Tensor:
    return wrap_nki(scale_rows_kernel)[x.shape[0] // 32](x, factor)


@nki_op("nki_test::add_new", mutates_args={})
def add_new(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    out = torch.empty_like(a)
    add_kernel(a, b, out)  # a raw @nki.jit kernel works too
    return out


@nki_op("nki_test::square", mutates_args={})
def square(x: torch.Tensor) -> torch.Tensor:
    return square_kernel(x)


def _square_setup(ctx, inputs, output):
    ctx.save_for_backward(inputs[0])


def _square_backward(ctx, grad):
    (x,) = ctx.saved_tensors
    return scale_rows(grad * x, 2.0) if x.shape[0] % 32 == 0 else grad * 2 * x


square.register_autograd(_square_backward, setup_context=_square_setup)


def test_eager_mutating_op():
    a, b = torch.randn(64, 48), torch.randn(64, 48)
    out = torch.zeros(64, 48, device="neuron")
    add_into(a.to("neuron"), b.to("neuron"), out)
    assert_same(out, a + b)
    # through the dispatcher by name, too
    out2 = torch.zeros(64, 48, device="neuron")
    torch.ops.nki_test.add_into(a.to("neuron"), b.to("neuron"), out2)
    assert_same(out2, a + b)


def test_eager_grid_and_constant():
    x = torch.randn(96, 40)
    assert_same(scale_rows(x.to("neuron"), 1.5), x * 1.5)
    assert_same(add_new(x.to("neuron"), x.to("neuron")), x + x)


def test_fake_shapes_from_trace():
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode():
        x = torch.empty(64, 16, dtype=torch.bfloat16)
        y = scale_rows(x, 2.0)
        assert y.shape == (64, 16) and y.dtype == torch.bfloat16


def test_compile_fullgraph_keeps_op():
    def f(a, b):
        s = scale_rows(torch.relu(a), 3.0)
        out = torch.empty_like(a)
        add_into(s, b, out)
        return out * 2

    seen = []

    def counting_backend(gm, example_inputs):
        seen.extend(n.target for n in gm.graph.nodes if n.op == "call_function")
        from torch_neuronx._compile.dynamo import neuron_backend
        return neuron_backend(gm, example_inputs)

    a, b = torch.randn(64, 32), torch.randn(64, 32)
    compiled = torch.compile(f, backend=counting_backend, fullgraph=True)
    r = compiled(a.to("neuron"), b.to("neuron"))
    assert_same(r, (torch.relu(a) * 3 + b) * 2)
    assert torch.ops.nki_test.scale_rows.default in seen and torch.ops.nki_test.add_into.default in seen
    # the registered name works with the "neuron" backend string as well
    r2 = torch.compile(f, backend="neuron", fullgraph=True)(a.to("neuron"), b.to("neuron"))
    assert_same(r2, (torch.relu(a) * 3 + b) * 2)


def test_backward_through_register_autograd():
    x = torch.randn(64, 16)
    xn = x.to("neuron").requires_grad_()
    y = square(xn)
    y.sum().backward()
    assert_same(y.detach(), x * x)
    assert_same(xn.grad, 2 * x)


def test_backward_under_compile():
    x = torch.randn(32, 8)
    xn = x.to("neuron").requires_grad_()
    f = torch.compile(lambda t: square(t).mul(3).sum(), backend="neuron", fullgraph=True)
    f(xn).backward()
    assert_same(xn.grad, 6 * x)


def test_from_torch_neuronx_import_nki():
    from torch_neuronx import nki as nki2
    assert nki2 is nki


def test_compile_dynamic_shapes_specialise():
    """Symbolic sizes are specialised (the trace unrolls over them): each new
    row count recompiles instead of failing."""
    f = torch.compile(lambda t: scale_rows(t, 2.0) + 1, backend="neuron", fullgraph=True, dynamic=True)
    for rows in (32, 64, 96):
        x = torch.randn(rows, 8)
        assert_same(f(x.to("neuron")), x * 2 + 1)


def test_raw_kernel_in_compiled_region():
    """Without nki_op a kernel call is a graph break (the rest still
    compiles); fullgraph=True says to use nki_op."""
    a = torch.randn(64, 16)

    def f(x):
        return square_kernel(x * 1) + 1

    def g(x):  # a separate code object: Dynamo caches per frame
        return square_kernel(x * 1) + 1

    assert_same(torch.compile(f, backend="neuron")(a.to("neuron")), a * a + 1)
    with pytest.raises(Exception, match="register it with torch_neuronx.nki_op"):
        torch.compile(g, backend="neuron", fullgraph=True)(a.to("neuron"))


@nki_op("nki_test::add_into_undeclared", mutates_args={})
def add_into_undeclared(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor) -> None:
    add_kernel(a, b, out)


def test_repeated_calls_report_the_written_argument():
    """From its second call with the same arguments' signature a kernel
    launch takes nki.jit's fast path; inside nki_op it still reports the
    arguments it writes: an undeclared write raises every time, a declared
    one gives the caller the written tensor."""
    a, b = torch.randn(4, 64), torch.randn(4, 64)
    an, bn = a.to("neuron"), b.to("neuron")
    for _ in range(3):
        with pytest.raises(nki.NKIError, match="mutates_args does not list"):
            add_into_undeclared(an, bn, torch.empty(4, 64, device="neuron"))
    for i in range(3):
        out = torch.empty(4, 64, device="neuron")
        add_into(an, bn * i, out)
        assert_same(out, a + b * i)
