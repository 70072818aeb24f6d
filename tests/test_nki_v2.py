"""NKI beta-2 calling conventions: kernels that write an output argument
(and may return it), and strided (non-contiguous) tensor arguments.

Every path runs the same kernels: eager on neuron tensors, CPU tensors and
NumPy arrays, nki.simulate, nki_op with mutates_args in eager mode and under
both torch.compile backends (neuron and the default Inductor), and
wrap_nki(kernel)[grid]. References are the same computation in plain
PyTorch on CPU."""
import numpy as np
import pytest
import torch

import nki
import nki.isa as nisa
import nki.language as nl
from torch_neuronx import nki_op, wrap_nki

from conftest import assert_same

DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.int32]


def _rand(shape, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    if dtype.is_floating_point:
        return torch.randn(shape, generator=g).to(dtype)
    return torch.randint(-1000, 1000, shape, generator=g, dtype=dtype)


def _check(got, want):
    """``got`` (any device) equals the CPU reference ``want``: exactly for
    integers, within the dtype's tolerance for floats."""
    got = got.cpu() if isinstance(got, torch.Tensor) else torch.from_numpy(np.asarray(got))
    torch.testing.assert_close(got, want)


# -- kernels -------------------------------------------------------------------

@nki.jit
def add_out(a, b, out):
    """out = a + b, row tiles of up to 128 partitions; the beta-2 style:
    the output is an argument, written with dma_copy and returned."""
    rows = min(a.shape[0], 128)
    for i in nl.affine_range(a.shape[0] // rows):
        x = nl.ndarray((rows, a.shape[1]), dtype=a.dtype, buffer=nl.sbuf)
        y = nl.ndarray((rows, a.shape[1]), dtype=a.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=x, src=a[i * rows:(i + 1) * rows])
        nisa.dma_copy(dst=y, src=b[i * rows:(i + 1) * rows])
        nisa.tensor_tensor(dst=x, data1=x, data2=y, op=nl.add)
        nisa.dma_copy(dst=out[i * rows:(i + 1) * rows], src=x)
    return out


@nki.jit
def axpy_(x, y):
    """y += 3 * x in place (reads and writes y); returns nothing."""
    tx = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
    ty = nl.ndarray(y.shape, dtype=y.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=tx, src=x)
    nisa.dma_copy(dst=ty, src=y)
    nisa.scalar_tensor_tensor(dst=ty, data=tx, op0=nl.multiply, operand0=3, op1=nl.add, operand1=ty)
    nisa.dma_copy(dst=y, src=ty)


@nki.jit
def double_and_copy(x, copy_out):
    """Returns (a new shared_hbm tensor 2*x, the argument copy_out = x)."""
    doubled = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    t = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x)
    nisa.dma_copy(dst=copy_out, src=t)
    nisa.tensor_tensor(dst=t, data1=t, data2=t, op=nl.add)
    nisa.dma_copy(dst=doubled, src=t)
    return doubled, copy_out


@nki.jit
def rows_scaled_into(x, out, factor):
    """out = x * factor, one 32-row slab per SPMD instance; returns out."""
    rows = nl.ds(nl.program_id(0) * 32, 32)
    t = nl.ndarray((32, x.shape[1]), dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x[rows])
    nisa.tensor_scalar(dst=t, data=t, op0=nl.multiply, operand0=factor)
    nisa.dma_copy(dst=out[rows], src=t)
    return out


@nki.jit
def matmul_lhsT(lhsT, rhs):
    """[K, M]^T @ [K, N]: K on the partitions of both operands, in chunks of
    128 accumulated in one PSUM tile (M <= 128, N <= 512)."""
    K, M = lhsT.shape
    N = rhs.shape[1]
    acc = nl.ndarray((M, N), dtype=nl.float32, buffer=nl.psum)
    for k in nl.affine_range(K // 128):
        a = nl.ndarray((128, M), dtype=lhsT.dtype, buffer=nl.sbuf)
        b = nl.ndarray((128, N), dtype=rhs.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=a, src=lhsT[k * 128:(k + 1) * 128])
        nisa.dma_copy(dst=b, src=rhs[k * 128:(k + 1) * 128])
        nisa.nc_matmul(dst=acc, stationary=a, moving=b)
    res = nl.ndarray((M, N), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=res, src=acc)
    out = nl.ndarray((M, N), dtype=nl.float32, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=res)
    return out


@nki.jit
def matmul_lhsT_into(lhsT, rhs, result):
    """The same product written into the argument ``result`` (beta-2 style)."""
    K, M = lhsT.shape
    N = rhs.shape[1]
    acc = nl.ndarray((M, N), dtype=nl.float32, buffer=nl.psum)
    for k in nl.affine_range(K // 128):
        a = nl.ndarray((128, M), dtype=lhsT.dtype, buffer=nl.sbuf)
        b = nl.ndarray((128, N), dtype=rhs.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=a, src=lhsT[k * 128:(k + 1) * 128])
        nisa.dma_copy(dst=b, src=rhs[k * 128:(k + 1) * 128])
        nisa.nc_matmul(dst=acc, stationary=a, moving=b)
    res = nl.ndarray((M, N), dtype=result.dtype, buffer=nl.sbuf)
    nisa.tensor_copy(dst=res, src=acc)
    nisa.dma_copy(dst=result, src=res)
    return result


# -- ops --------------------------------------------------------------------

@nki_op("nki_v2::add_ret", mutates_args={"out"})
def add_ret(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    return add_out(a, b, out)  # the kernel returns the argument it wrote


@nki_op("nki_v2::add_void", mutates_args={"out"})
def add_void(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor) -> None:
    add_out(a, b, out)


@nki_op("nki_v2::axpy_", mutates_args={"y"})
def axpy_op(x: torch.Tensor, y: torch.Tensor) -> None:
    wrap_nki(axpy_)(x, y)


@nki_op("nki_v2::scaled_into", mutates_args={"out"})
def scaled_into(x: torch.Tensor, out: torch.Tensor, factor: float) -> torch.Tensor:
    return wrap_nki(rows_scaled_into)[x.shape[0] // 32](x, out, factor)


@nki_op("nki_v2::add_fresh", mutates_args={})
def add_fresh(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    out = torch.empty_like(a)  # the vendor's documented pattern: the op allocates the output
    return add_out(a, b, out)


def _ref_add(a, b):
    return (a.float() + b.float()).to(a.dtype) if a.dtype.is_floating_point else a + b


# -- eager: the returned argument is the caller's tensor -----------------------

@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("device", ["neuron", "cpu"])
def test_eager_returns_written_argument(device, dtype):
    a, b = _rand((256, 64), dtype, 1), _rand((256, 64), dtype, 2)
    out = torch.zeros(256, 64, dtype=dtype, device=device)
    r = add_out(a.to(device), b.to(device), out)
    assert r is out
    _check(out, _ref_add(a, b))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_numpy_and_simulate_return_written_argument(dtype):
    if dtype == torch.bfloat16:
        pytest.skip("NumPy has no bfloat16")
    a, b = _rand((128, 32), dtype, 1), _rand((128, 32), dtype, 2)
    for run in (add_out, nki.simulate(add_out)):
        out = np.zeros((128, 32), a.numpy().dtype)
        r = run(a.numpy(), b.numpy(), out)
        assert r is out
        _check(out, _ref_add(a, b))
    # torch tensors through the simulator come back as the same tensor too
    out = torch.zeros(128, 32, dtype=dtype)
    assert nki.simulate(add_out)(a, b, out) is out
    _check(out, _ref_add(a, b))


@pytest.mark.parametrize("executor", ["native", "interpreter"])
def test_both_executors_keep_unwritten_argument_data(executor, monkeypatch):
    """A written argument is not an allocated output: neither executor fills
    it with the NaN sentinel, so elements the kernel does not write keep
    their values (here the kernel writes rows 0..127 of 192)."""
    monkeypatch.setenv("NKI_EXECUTOR", executor)
    a, b = torch.randn(128, 16), torch.randn(128, 16)
    out = torch.full((192, 16), 4.0, device="neuron")
    assert add_out(a.to("neuron"), b.to("neuron"), out[:128]) is not None
    assert_same(out[:128], a + b)
    assert_same(out[128:], torch.full((64, 16), 4.0))
    y, x = torch.randn(48, 32), torch.randn(32, 48)
    yn = y.to("neuron")
    axpy_(x.to("neuron"), yn.T)
    assert_same(yn, (y.T + 3 * x).T)


def test_in_place_without_return_and_mixed_result():
    x, y = torch.randn(64, 48), torch.randn(64, 48)
    yn = y.to("neuron")
    assert axpy_(x.to("neuron"), yn) is None
    assert_same(yn, y + 3 * x)
    c = torch.zeros(64, 48, device="neuron")
    doubled, same = double_and_copy(x.to("neuron"), c)
    assert same is c and doubled is not c
    assert_same(c, x)
    assert_same(doubled, x + x)


def test_spmd_grid_returns_argument():
    x = torch.randn(96, 40)
    out = torch.zeros(96, 40, device="neuron")
    assert rows_scaled_into[3](x.to("neuron"), out, 2.5) is out
    assert_same(out, x * 2.5)
    out2 = torch.zeros(96, 40, device="neuron")
    assert wrap_nki(rows_scaled_into)[3](x.to("neuron"), out2, 2.5) is out2
    assert_same(out2, x * 2.5)


# -- returning what does not outlive the kernel ----------------------------------

@pytest.mark.parametrize("buffer", ["sbuf", "psum"])
def test_returning_on_chip_tile_is_an_error(buffer):
    @nki.jit
    def k(x):
        t = nl.ndarray((x.shape[0], x.shape[1]), dtype=nl.float32, buffer=getattr(nl, buffer))
        if buffer == "sbuf":
            nisa.dma_copy(dst=t, src=x)
        else:
            nisa.memset(t, 0.0)
        return t

    with pytest.raises(nki.NKIError, match=f"returns a {buffer} tensor; returned tensors must be allocated "
                                           f"with buffer=nl.shared_hbm or be HBM arguments"):
        k(torch.zeros(16, 8, device="neuron"))
    with pytest.raises(nki.NKIError, match=f"returns a {buffer} tensor"):
        nki.simulate(k)(np.zeros((16, 8), np.float32))


def test_returning_a_view_of_an_argument_is_an_error():
    @nki.jit
    def k(x):
        return x[0:8]

    with pytest.raises(nki.NKIError, match="returns a view of argument 'x'; return the whole argument"):
        k(np.zeros((16, 8), np.float32))


# -- nki_op with mutates_args --------------------------------------------------

def test_op_schema_marks_mutated_argument():
    import re
    assert re.search(r"Tensor\(a\d*!\) out\) -> Tensor$", str(torch.ops.nki_v2.add_ret.default._schema))
    assert re.search(r"Tensor\(a\d*!\) y\) -> \(\)$", str(torch.ops.nki_v2.axpy_.default._schema))
    assert str(torch.ops.nki_v2.add_void.default._schema).endswith("-> ()")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_op_eager_returns_mutated_argument(dtype):
    a, b = _rand((128, 48), dtype, 3), _rand((128, 48), dtype, 4)
    out = torch.zeros(128, 48, dtype=dtype, device="neuron")
    r = add_ret(a.to("neuron"), b.to("neuron"), out)
    # the argument holds the result; the op returns a tensor with its values
    # (custom ops cannot return an alias of an input: see torch_neuronx/_nki/op.py)
    _check(out, _ref_add(a, b))
    _check(r, _ref_add(a, b))
    assert r.data_ptr() != out.data_ptr()
    out2 = torch.zeros(128, 48, dtype=dtype, device="neuron")
    assert add_void(a.to("neuron"), b.to("neuron"), out2) is None
    _check(out2, _ref_add(a, b))
    _check(add_fresh(a.to("neuron"), b.to("neuron")), _ref_add(a, b))
    # the CPU kernel of the op runs the same interpreter
    out3 = torch.zeros(128, 48, dtype=dtype)
    _check(add_ret(a, b, out3), _ref_add(a, b))
    _check(out3, _ref_add(a, b))


def _f_mutating(a, b, y):
    out = torch.zeros_like(a)
    r = add_ret(a * 1, b, out)       # returns the written argument
    axpy_op(r, y)                     # y += 3 * r, in place on a graph input
    return out + r


def _ref_mutating(a, b, y):
    s = _ref_add(a, b)
    y.copy_((y.float() + 3 * s.float()).to(y.dtype) if y.dtype.is_floating_point else y + 3 * s)
    return s + s


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("backend", ["neuron", "inductor"])
def test_op_mutation_under_compile(backend, dtype):
    """The mutation is functionalized: the caller's y holds the write and
    the written-and-returned intermediate feeds the rest of the graph."""
    a, b, y = _rand((64, 32), dtype, 5), _rand((64, 32), dtype, 6), _rand((64, 32), dtype, 7)
    torch._dynamo.reset()
    f = torch.compile(_f_mutating, backend=backend, fullgraph=True)
    yn = y.to("neuron")
    r = f(a.to("neuron"), b.to("neuron"), yn)
    y_ref = y.clone()
    want = _ref_mutating(a, b, y_ref)
    tol = {} if not dtype.is_floating_point else dict(atol=0.05, rtol=0.02) if dtype != torch.float32 else {}
    torch.testing.assert_close(r.cpu(), want, **tol)
    torch.testing.assert_close(yn.cpu(), y_ref, **tol)


@pytest.mark.parametrize("backend", ["neuron", "inductor"])
def test_op_grid_under_compile(backend):
    x = torch.randn(64, 24)
    torch._dynamo.reset()

    def f(x):
        out = torch.empty_like(x)
        r = scaled_into(x + 1, out, 0.5)
        return r * 2, out

    r, out = torch.compile(f, backend=backend, fullgraph=True)(x.to("neuron"))
    assert_same(r, (x + 1) * 0.5 * 2)
    assert_same(out, (x + 1) * 0.5)


def test_op_undeclared_write_is_an_error():
    @nki_op("nki_v2::undeclared", mutates_args={})
    def undeclared(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        return add_out(a, b, out)

    t = torch.zeros(8, 8, device="neuron")
    with pytest.raises(nki.NKIError, match="writes argument 'out', which mutates_args does not list"):
        undeclared(t, t, torch.zeros(8, 8, device="neuron"))


# -- strided arguments --------------------------------------------------------

def _copies(fn):
    nki.argument_copies(reset=True)
    fn()
    return nki.argument_copies()


@pytest.mark.parametrize("device", ["neuron", "cpu"])
def test_strided_inputs_are_materialized(device):
    b = torch.randn(128, 64)
    # (base on CPU, the view taken of it on the device, copies expected)
    cases = {
        "transposed": (torch.randn(64, 256), lambda t: t[:, :128].T, 1),        # strides (1, 256)
        "sliced": (torch.randn(128, 128), lambda t: t[:, ::2], 1),               # step 2 in the free dim
        "row_offset": (torch.randn(256, 64), lambda t: t[128:], 0),              # contiguous, offset
        "expanded": (torch.randn(1, 64), lambda t: t.expand(128, 64), 1),        # stride-0 rows
        "expanded_then_contiguous": (torch.randn(1, 64), lambda t: t.expand(128, 64).contiguous(), 0),
    }
    for name, (base, view, copies) in cases.items():
        a = view(base.to(device))
        out = torch.zeros(128, 64, device=device)
        counts = _copies(lambda: add_out(a, b.to(device), out))
        assert counts == {"materialized": copies, "copied_back": 0}, name
        _check(out, view(base) + b)


@pytest.mark.parametrize("device", ["neuron", "cpu"])
def test_written_strided_argument_gets_the_result(device):
    a, b = torch.randn(128, 64), torch.randn(128, 64)
    # a transposed output: out_t.T is a [128, 64] view of a [64, 128] tensor
    out_t = torch.zeros(64, 128, device=device)
    counts = _copies(lambda: add_out(a.to(device), b.to(device), out_t.T))
    assert counts == {"materialized": 1, "copied_back": 1}
    _check(out_t.T, a + b)
    # a column slice of a wider tensor: the other columns are untouched
    wide = torch.full((128, 96), 7.0, device=device)
    r = add_out(a.to(device), b.to(device), wide[:, 16:80])
    _check(wide[:, 16:80], a + b)
    _check(r, a + b)
    torch.testing.assert_close(wide[:, :16].cpu(), torch.full((128, 16), 7.0))
    torch.testing.assert_close(wide[:, 80:].cpu(), torch.full((128, 16), 7.0))
    # read-modify-write through a strided view starts from its current values
    x, y = torch.randn(32, 48), torch.randn(48, 32)
    yd = y.clone().to(device)  # on cpu, .to() alone would alias the reference
    axpy_(x.to(device), yd.T)
    _check(yd, (y.T + 3 * x).T)


def test_written_expanded_argument_is_an_error():
    out = torch.zeros(1, 64, device="neuron").expand(128, 64)
    t = torch.zeros(128, 64, device="neuron")
    with pytest.raises(nki.NKIError, match="argument 'out' is written by the kernel, but elements of it share memory"):
        add_out(t, t, out)


def test_simulate_on_numpy_views():
    a = np.random.default_rng(0).standard_normal((64, 128)).astype(np.float32)
    b = np.random.default_rng(1).standard_normal((128, 64)).astype(np.float32)
    out_t = np.zeros((64, 128), np.float32)
    counts = _copies(lambda: nki.simulate(add_out)(a.T, b, out_t.T))
    assert counts == {"materialized": 2, "copied_back": 1}
    np.testing.assert_array_equal(out_t.T, a.T + b)
    wide = np.full((128, 80), 5.0, np.float32)
    r = nki.simulate(add_out)(b, b[:, ::-1], wide[:, 8:72])
    np.testing.assert_array_equal(wide[:, 8:72], b + b[:, ::-1])
    np.testing.assert_array_equal(r, b + b[:, ::-1])
    np.testing.assert_array_equal(wide[:, :8], 5.0)


def test_strided_op_argument_under_compile():
    """A transposed view passed to an nki_op inside a compiled graph."""
    a, b = torch.randn(64, 128), torch.randn(128, 64)
    torch._dynamo.reset()

    def f(a, b):
        out = torch.zeros(64, 128, device=a.device)
        add_void(a.T, b, out.T)
        return out

    r = torch.compile(f, backend="neuron", fullgraph=True)(a.to("neuron"), b.to("neuron"))
    assert_same(r, (a.T + b).T)


# -- the vendor's matmul tutorial call: kernel(lhs.T, rhs) ------------------------

@pytest.mark.parametrize("device", ["neuron", "cpu", "numpy"])
def test_matmul_tutorial_transposed_call(device):
    g = torch.Generator().manual_seed(0)
    lhs, rhs = torch.randn(64, 256, generator=g), torch.randn(256, 512, generator=g)
    want = lhs @ rhs
    if device == "numpy":
        got = nki.simulate(matmul_lhsT)(lhs.numpy().T, rhs.numpy())
        result = np.zeros((64, 512), np.float32)
        assert nki.simulate(matmul_lhsT_into)(lhs.numpy().T, rhs.numpy(), result) is result
    else:
        l, r = lhs.to(device), rhs.to(device)
        nki.argument_copies(reset=True)
        got = matmul_lhsT(l.T, r)
        assert nki.argument_copies() == {"materialized": 1, "copied_back": 0}
        result = torch.zeros(64, 512, device=device)
        assert matmul_lhsT_into(l.T, r, result) is result
    _check(got, want)
    _check(result, want)
    # in bf16, the operands' precision
    if device != "numpy":
        lb, rb = lhs.bfloat16(), rhs.bfloat16()
        res16 = torch.zeros(64, 512, dtype=torch.bfloat16, device=device)
        matmul_lhsT_into(lb.to(device).T, rb.to(device), res16)
        torch.testing.assert_close(res16.cpu().float(), lb.float() @ rb.float(), atol=0.1, rtol=0.02)
