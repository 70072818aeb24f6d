"""ATen ops PyTorch implements for accelerators but not for the CPU
(tools/sweep_accelerator_only_ops.py): their neuron kernels against CPU
references (the op's meaning written with CPU ops, or torch._decomp's
decomposition run on CPU), and the sweep's classification kept true."""
import importlib.util
import itertools
import pathlib

import pytest
import torch
import torch.nn.functional as F
from conftest import assert_same
from torch._decomp import decompositions as decomp

DEV = "neuron"
FLOATS = [torch.float32, torch.bfloat16, torch.float64, torch.float16]


def _tol(dtype):
    return {torch.bfloat16: dict(atol=2e-2, rtol=2e-2), torch.float16: dict(atol=2e-3, rtol=2e-3)}.get(dtype, {})


def _randn(*shape, dtype=torch.float32, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


def _dev(*ts):
    return [t.to(DEV) if isinstance(t, torch.Tensor) else t for t in ts]


def _same_or_none(got, ref, **tol):
    if ref is None:
        assert got is None
    else:
        assert_same(got, ref, **tol)


# ---- the sweep ----------------------------------------------------------------

def _sweep_tool():
    path = pathlib.Path(__file__).resolve().parents[1] / "tools" / "sweep_accelerator_only_ops.py"
    spec = importlib.util.spec_from_file_location("sweep_accelerator_only_ops", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_sweep_classifies_every_accelerator_only_op():
    # A new torch with a new accelerator-only op fails here until the op is
    # implemented or listed as skipped with a reason; an op listed as
    # implemented must have a neuron kernel.
    tool = _sweep_tool()
    entries = tool.sweep()
    assert entries, "the sweep found nothing: it no longer reads the registry"
    assert tool.problems(entries) == []
    implemented = {e.op for e in entries if e.decision == tool.IMPLEMENTED}
    assert {"linear_backward", "mm.dtype", "_fused_rms_norm_backward"} <= implemented


# ---- linear_backward ------------------------------------------------------------

@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("shape", [(5,), (4, 5), (2, 3, 5), (0, 5), (2, 0, 5)])
@pytest.mark.parametrize("mask", list(itertools.product([True, False], repeat=3)))
def test_linear_backward_matches_linear_gradients(dtype, shape, mask):
    out_features = 7
    x = _randn(*shape, dtype=dtype)
    w = _randn(out_features, shape[-1], dtype=dtype, seed=1)
    g = _randn(*shape[:-1], out_features, dtype=dtype, seed=2)
    # Reference: the gradients of linear itself, on CPU.
    xr, wr, br = (t.clone().requires_grad_() for t in (x, w, torch.zeros(out_features, dtype=dtype)))
    ref = torch.autograd.grad(F.linear(xr, wr, br), (xr, wr, br), g)
    got = torch.ops.aten.linear_backward(*_dev(x, g, w), list(mask))
    for m, a, b in zip(mask, got, ref):
        _same_or_none(a if m else None, b if m else None, **_tol(dtype))
        if not m:
            assert a is None


def test_linear_backward_rejects_mismatched_shapes():
    x, g, w = _dev(torch.randn(3, 5), torch.randn(3, 7), torch.randn(7, 4))
    with pytest.raises(RuntimeError, match="linear_backward"):
        torch.ops.aten.linear_backward(x, g, w, [True, True, True])


# ---- matmuls with out_dtype ------------------------------------------------------

_MM = {
    "mm": (lambda s: [_randn(3, 4, dtype=s), _randn(4, 5, dtype=s, seed=1)], {}),
    "bmm": (lambda s: [_randn(2, 3, 4, dtype=s), _randn(2, 4, 5, dtype=s, seed=1)], {}),
    "addmm": (lambda s: [_randn(5, dtype=s, seed=2), _randn(3, 4, dtype=s), _randn(4, 5, dtype=s, seed=1)],
              dict(beta=0.5, alpha=2.0)),
    "baddbmm": (lambda s: [_randn(2, 3, 5, dtype=s, seed=2), _randn(2, 3, 4, dtype=s),
                           _randn(2, 4, 5, dtype=s, seed=1)], dict(beta=0.5, alpha=2.0)),
}


def _mm_reference(op, args, out_dtype, kwargs):
    # CUDA's kernels accumulate in fp32: the product of the upcast inputs.
    return getattr(torch, op)(*[a.to(out_dtype) for a in args], **kwargs)


@pytest.mark.parametrize("op", list(_MM))
@pytest.mark.parametrize("in_dtype,out_dtype", [(torch.bfloat16, torch.float32), (torch.float16, torch.float32),
                                                (torch.float32, torch.float32), (torch.bfloat16, torch.bfloat16)])
def test_matmul_out_dtype_matches_upcast_cpu(op, in_dtype, out_dtype):
    make, kwargs = _MM[op]
    args = make(in_dtype)
    ref = _mm_reference(op, args, out_dtype, kwargs)
    got = getattr(torch, op)(*_dev(*args), out_dtype=out_dtype, **kwargs)
    assert got.dtype == out_dtype
    assert_same(got, ref, **_tol(out_dtype))
    # out= variant, into a wrongly sized buffer (resized like any out= op).
    out = torch.empty(0, dtype=out_dtype, device=DEV)
    res = getattr(torch, op)(*_dev(*args), out_dtype=out_dtype, out=out, **kwargs)
    assert res.data_ptr() == out.data_ptr()
    assert_same(out, ref, **_tol(out_dtype))


@pytest.mark.parametrize("op", list(_MM))
def test_matmul_out_dtype_rejects_what_cuda_rejects(op):
    make, kwargs = _MM[op]
    args = _dev(*make(torch.float32))
    with pytest.raises(RuntimeError, match="out_dtype"):
        getattr(torch, op)(*args, out_dtype=torch.float16, **kwargs)
    with pytest.raises(RuntimeError, match="out"):
        getattr(torch, op)(*args, out_dtype=torch.float32, out=torch.empty(0, dtype=torch.float64, device=DEV),
                           **kwargs)


# ---- _fused_rms_norm_backward ---------------------------------------------------

@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("shape,norm", [((4, 8), [8]), ((2, 3, 8), [8]), ((2, 3, 4), [3, 4]), ((8,), [8]),
                                        ((0, 8), [8])])
@pytest.mark.parametrize("mask", [(True, True), (True, False), (False, True)])
@pytest.mark.parametrize("with_weight", [True, False])
def test_fused_rms_norm_backward_matches_decomposition(dtype, shape, norm, mask, with_weight):
    x = _randn(*shape, dtype=dtype)
    w = _randn(*norm, dtype=dtype, seed=1) if with_weight else None
    g = _randn(*shape, dtype=dtype, seed=2)
    _, rstd = torch.ops.aten._fused_rms_norm(x, norm, w, 1e-6)
    ref = list(decomp._fused_rms_norm_backward(g, x, norm, rstd, w, list(mask)))
    if w is None:
        # Without a weight there is no weight gradient (the decomposition's
        # empty-input shortcut returns zeros for it regardless).
        ref[1] = None
    got = torch.ops.aten._fused_rms_norm_backward(*_dev(g, x), norm, rstd.to(DEV), *_dev(w), list(mask))
    for m, a, b in zip(mask, got, ref):
        _same_or_none(a if m else None, b, **_tol(dtype))


# ---- dropout helpers -------------------------------------------------------------

@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("mask_dtype", [torch.uint8, torch.bool])
def test_masked_scale_matches_cpu(dtype, mask_dtype):
    x = _randn(3, 17, dtype=dtype)
    mask = (torch.rand(3, 17, generator=torch.Generator().manual_seed(3)) > 0.4).to(mask_dtype)
    ref = x * mask * 2.5
    assert_same(torch.ops.aten._masked_scale(*_dev(x, mask), 2.5), ref, **_tol(dtype))


def test_masked_scale_rejects_float_masks():
    with pytest.raises(RuntimeError, match="mask"):
        torch.ops.aten._masked_scale(*_dev(torch.ones(3), torch.ones(3)), 2.0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_dropout_keeps_with_probability_p_and_scales(dtype):
    x = _randn(64, 64, dtype=dtype).to(DEV)
    torch.manual_seed(0)
    out, mask = torch._fused_dropout(x, 0.75)
    assert mask.dtype == torch.uint8 and mask.device.type == DEV
    m = mask.cpu()
    assert set(m.unique().tolist()) <= {0, 1}
    assert abs(m.float().mean().item() - 0.75) < 0.03
    # The op's meaning (torch._decomp's): x * mask / p, from the mask it drew.
    assert_same(out, (x.cpu() * m * (1 / 0.75)).to(dtype), **_tol(dtype))
    # Drawn from the device generator: reseeding repeats the mask.
    torch.manual_seed(0)
    assert torch.equal(torch._fused_dropout(x, 0.75)[1].cpu(), m)
    assert torch.equal(torch._fused_dropout(x, 1.0)[0].cpu(), x.cpu())


def test_fused_dropout_backward_is_the_masked_scale():
    x = _randn(8, 9).to(DEV).requires_grad_()
    out, mask = torch._fused_dropout(x, 0.5)
    g = _randn(8, 9, seed=4)
    out.backward(g.to(DEV))
    assert_same(x.grad, g * mask.cpu() * 2.0)


# ---- max_pool2d_backward ----------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("shape,kernel,stride,padding,dilation,ceil",
                         [((2, 3, 9, 8), [3, 3], [2, 2], [1, 1], [1, 1], False),
                          ((3, 10, 10), [2, 3], [], [0, 1], [2, 1], True),
                          ((1, 2, 7, 7), [2, 2], [1, 2], [0, 0], [1, 1], True)])
def test_max_pool2d_backward_matches_max_pool_gradient(dtype, shape, kernel, stride, padding, dilation, ceil):
    x = _randn(*shape, dtype=dtype)
    xr = x.clone().requires_grad_()
    y = F.max_pool2d(xr, kernel, stride or None, padding, dilation, ceil_mode=ceil)
    g = _randn(*y.shape, dtype=dtype, seed=5)
    (ref,) = torch.autograd.grad(y, xr, g)
    got = torch.ops.aten.max_pool2d_backward(*_dev(g, x), kernel, stride, padding, dilation, ceil)
    assert_same(got, ref, **_tol(dtype))


# ---- depthwise convolutions ----------------------------------------------------------

# Forward only: PyTorch's derivative formula for these ops passes groups=1 to
# convolution_backward, which rejects any depthwise weight with more than one
# input channel (on every device); F.conv2d/conv3d never record these ops.
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("dims,multiplier,with_bias", [(2, 1, True), (2, 2, False), (3, 1, True), (3, 2, True)])
def test_depthwise_convolution_matches_grouped_conv(dtype, dims, multiplier, with_bias):
    c = 3
    spatial = (9, 8) if dims == 2 else (5, 6, 4)
    kernel = [3] * dims
    stride, padding, dilation = [2] + [1] * (dims - 1), [1] * dims, [1] * (dims - 1) + [2]
    x = _randn(2, c, *spatial, dtype=dtype)
    w = _randn(c * multiplier, 1, *kernel, dtype=dtype, seed=1)
    b = _randn(c * multiplier, dtype=dtype, seed=2) if with_bias else None
    conv = F.conv2d if dims == 2 else F.conv3d
    op = torch._C._nn._conv_depthwise2d if dims == 2 else torch._C._nn.conv_depthwise3d
    ref = conv(x, w, b, stride, padding, dilation, groups=c)
    got = op(*_dev(x, w), kernel, *_dev(b), stride, padding, dilation)
    tol = _tol(dtype)
    assert_same(got, ref, **tol)
    if dims == 2:
        out = torch.empty(0, dtype=dtype, device=DEV)
        torch._C._nn._conv_depthwise2d(*_dev(x, w), kernel, *_dev(b), stride, padding, dilation, out=out)
        assert_same(out, ref, **tol)


# ---- batch_norm_elemt.out ------------------------------------------------------------------

def test_batch_norm_elemt_out_matches_cpu():
    x = _randn(4, 3, 5)
    w, b, mean = _randn(3, seed=1), _randn(3, seed=2), _randn(3, seed=3)
    invstd = torch.rand(3, generator=torch.Generator().manual_seed(4)) + 0.5
    ref = (x - mean[:, None]) * invstd[:, None] * w[:, None] + b[:, None]
    out = torch.empty(0, device=DEV)
    torch.batch_norm_elemt(*_dev(x, w, b, mean, invstd), 1e-5, out=out)
    assert_same(out, ref, atol=1e-5, rtol=1e-5)
