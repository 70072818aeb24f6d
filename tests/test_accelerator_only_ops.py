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


# ---- attention kernels (csrc/aten/AttentionKernels.cpp) -------------------------------
# Reference: exact attention on CPU in float64 (scores, masks, softmax, and
# autograd for the gradients), compared in the input dtype.

_ATOL = {torch.float32: 2e-5, torch.bfloat16: 2e-2, torch.float16: 2e-3, torch.float64: 1e-6}  # float64: the float32 log-sum-exp bounds the backward


def _att_tol(dtype):
    return dict(atol=_ATOL[dtype], rtol=_ATOL[dtype])


def _reference_attention(q, k, v, bias=None, causal=None, scale=None, window=(-1, -1)):
    """q [B, H, L, E], k/v [B, Hk, S, E] (float64 leaves); causal None, "top-left" or "bottom-right";
    window (left, right) around the bottom-right diagonal. Returns (out, lse)."""
    h, hk = q.shape[1], k.shape[1]
    if hk != h:
        k, v = k.repeat_interleave(h // hk, 1), v.repeat_interleave(h // hk, 1)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    s = q @ k.transpose(-2, -1) * scale
    if bias is not None:
        s = s + bias
    L, S = s.shape[-2:]
    i, j = torch.arange(L)[:, None], torch.arange(S)[None, :]
    diagonal = 0 if causal == "top-left" else S - L
    allowed = torch.ones(L, S, dtype=torch.bool)
    if causal:
        allowed &= j <= i + diagonal
    if window[0] >= 0:
        allowed &= j >= i + diagonal - window[0]
    if window[1] >= 0:
        allowed &= j <= i + diagonal + window[1]
    s = s.masked_fill(~allowed, float("-inf"))
    lse = s.logsumexp(-1)
    p = torch.nan_to_num(torch.softmax(s, -1))
    return p @ v, lse


def _leaves(*ts):
    return [t.detach().double().requires_grad_() for t in ts]


def _ref_grads(out, leaves, grad):
    return torch.autograd.grad(out, leaves, grad.double(), allow_unused=True)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("case", ["plain", "causal", "bias", "bias-causal", "L!=S", "empty"])
def test_sdpa_efficient_attention_forward_backward(dtype, case):
    B, H, L, S, E = 2, 3, 37, 37, 16
    if case == "L!=S":
        L, S = 20, 45
    if case == "empty":
        L = 0
    causal = "causal" in case
    q, k, v = _randn(B, H, L, E, dtype=dtype), _randn(B, H, S, E, dtype=dtype, seed=1), \
        _randn(B, H, S, E, dtype=dtype, seed=2)
    bias = _randn(B, H, L, S, dtype=dtype, seed=3) if "bias" in case else None
    leaves = _leaves(q, k, v) + (_leaves(bias) if bias is not None else [])
    ref, ref_lse = _reference_attention(*leaves[:3], leaves[3] if bias is not None else None,
                                        "top-left" if causal else None)
    out, lse, seed, offset = torch.ops.aten._scaled_dot_product_efficient_attention(
        *_dev(q, k, v, bias), True, 0.0, causal)
    assert_same(out, ref.detach().to(dtype), **_att_tol(dtype))
    # The CUDA kernel's log-sum-exp: float32, padded to a multiple of 32 rows.
    assert lse.dtype == torch.float32 and lse.shape == (B, H, -(-L // 32) * 32)
    assert_same(lse[..., :L], ref_lse.detach().float(), **_att_tol(torch.float32 if dtype == torch.float64 else dtype))
    # Its output layout ([B, L, H, E] memory) and the meta kernel's agree.
    assert out.stride() == torch.empty(B, L, H, E).transpose(1, 2).stride()

    g = _randn(B, H, L, E, dtype=dtype, seed=4)
    ref_grads = _ref_grads(ref, leaves, g)
    grads = torch.ops.aten._scaled_dot_product_efficient_attention_backward(
        *_dev(g, q, k, v), bias.to(DEV) if bias is not None else None, out, lse, seed, offset, 0.0,
        [True, True, True, bias is not None], causal)
    for got, r in zip(grads, ref_grads):
        _same_or_none(got, None if r is None else r.to(dtype), **_att_tol(dtype))


def test_sdpa_efficient_attention_autograd_and_lse_off():
    q, k, v = (_randn(1, 2, 9, 8, seed=i) for i in range(3))
    dq, dk, dv = (t.to(DEV).requires_grad_() for t in (q, k, v))
    out, lse, _, _ = torch.ops.aten._scaled_dot_product_efficient_attention(dq, dk, dv, None, True, 0.0, True)
    leaves = _leaves(q, k, v)
    ref, _ = _reference_attention(*leaves, causal="top-left")
    g = _randn(1, 2, 9, 8, seed=5)
    out.backward(g.to(DEV))
    for got, r in zip((dq.grad, dk.grad, dv.grad), _ref_grads(ref, leaves, g)):
        assert_same(got, r.float(), **_att_tol(torch.float32))
    out, lse, _, _ = torch.ops.aten._scaled_dot_product_efficient_attention(*_dev(q, k, v), None, False)
    assert lse.shape == (1, 2, 0)


def test_attention_kernels_reject_dropout():
    q = torch.randn(1, 2, 4, 8, device=DEV)
    with pytest.raises(RuntimeError, match="dropout"):
        torch.ops.aten._scaled_dot_product_efficient_attention(q, q, q, None, True, 0.1)
    with pytest.raises(RuntimeError, match="dropout"):
        torch.ops.aten._flash_attention_forward(q, q, q, None, None, 4, 4, 0.1, False, False)


def _bhle(t):
    return t.transpose(1, 2)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("L,S,kv_heads", [(33, 33, 4), (17, 40, 4), (24, 24, 2)])
def test_flash_attention_forward_backward_dense(dtype, causal, L, S, kv_heads):
    B, H, E = 2, 4, 16
    q = _randn(B, L, H, E, dtype=dtype)
    k, v = _randn(B, S, kv_heads, E, dtype=dtype, seed=1), _randn(B, S, kv_heads, E, dtype=dtype, seed=2)
    leaves = _leaves(q, k, v)
    # Flash attention's causal mask is aligned to the bottom right.
    ref, ref_lse = _reference_attention(*(_bhle(t) for t in leaves), causal="bottom-right" if causal else None)
    out, lse, rng_state, unused, debug = torch.ops.aten._flash_attention_forward(
        *_dev(q, k, v), None, None, L, S, 0.0, causal, False)
    assert_same(out, _bhle(ref).detach().to(dtype), **_att_tol(dtype))
    assert lse.shape == (B, H, L) and lse.dtype == torch.float32
    assert_same(lse, ref_lse.detach().float(), **_att_tol(torch.float32 if dtype == torch.float64 else dtype))
    assert rng_state.dtype == torch.uint64 and rng_state.shape == (2,)
    g = _randn(B, L, H, E, dtype=dtype, seed=4)
    grads = torch.ops.aten._flash_attention_backward(*_dev(g, q, k, v), out, lse, None,
                                                     None, L, S, 0.0, causal, rng_state, unused)
    for got, r in zip(grads, _ref_grads(_bhle(ref), leaves, g)):
        assert_same(got, r.to(dtype), **_att_tol(dtype))


@pytest.mark.parametrize("window", [(3, 2), (0, 0), (5, -1), (-1, 4)])
def test_flash_attention_sliding_window(window):
    B, L, S, H, E = 1, 12, 15, 2, 8
    q, k, v = _randn(B, L, H, E), _randn(B, S, H, E, seed=1), _randn(B, S, H, E, seed=2)
    leaves = _leaves(q, k, v)
    ref, _ = _reference_attention(*(_bhle(t) for t in leaves), window=window)
    out, lse, rng_state, unused, _ = torch.ops.aten._flash_attention_forward(
        *_dev(q, k, v), None, None, L, S, 0.0, False, False, window_size_left=window[0], window_size_right=window[1])
    assert_same(out, _bhle(ref).detach().float(), **_att_tol(torch.float32))
    g = _randn(B, L, H, E, seed=4)
    grads = torch.ops.aten._flash_attention_backward(*_dev(g, q, k, v), out, lse, None, None, L, S, 0.0, False,
                                                     rng_state, unused, window_size_left=window[0],
                                                     window_size_right=window[1])
    for got, r in zip(grads, _ref_grads(_bhle(ref), leaves, g)):
        assert_same(got, r.float(), **_att_tol(torch.float32))


def _cu(lengths):
    return torch.tensor([0] + list(itertools.accumulate(lengths)), dtype=torch.int32)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("causal", [False, True])
def test_varlen_attn_matches_per_sequence_attention(dtype, causal):
    # torch.nn.attention.varlen.varlen_attn calls _flash_attention_forward and
    # _flash_attention_backward with packed sequences.
    from torch.nn.attention.varlen import varlen_attn
    lq, lk, H, E = [5, 0, 12, 7], [5, 3, 12, 9], 2, 8
    q = _randn(sum(lq), H, E, dtype=dtype)
    k, v = _randn(sum(lk), H, E, dtype=dtype, seed=1), _randn(sum(lk), H, E, dtype=dtype, seed=2)
    cq, ck = _cu(lq), _cu(lk)
    dq, dk, dv = (t.to(DEV).requires_grad_() for t in (q, k, v))
    # Causal is the window (-1, 0): is_causal plus that window reach the op.
    out = varlen_attn(dq, dk, dv, cq.to(DEV), ck.to(DEV), max(lq), max(lk),
                      window_size=(-1, 0) if causal else (-1, -1))
    g = _randn(sum(lq), H, E, dtype=dtype, seed=4)
    out.backward(g.to(DEV))

    leaves = _leaves(q, k, v)
    refs = []
    for b in range(len(lq)):
        qs, ks, vs = (t[c[b]:c[b + 1]].transpose(0, 1)[None] for t, c in zip(leaves, (cq, ck, ck)))
        refs.append(_reference_attention(qs, ks, vs, causal="bottom-right" if causal else None)[0][0].transpose(0, 1))
    ref = torch.cat(refs)
    assert_same(out, ref.detach().to(dtype), **_att_tol(dtype))
    for got, r in zip((dq.grad, dk.grad, dv.grad), _ref_grads(ref, leaves, g)):
        assert_same(got, r.to(dtype), **_att_tol(dtype))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("mask_type", [0, 1, 2])
@pytest.mark.parametrize("with_bias", [False, True])
def test_efficient_attention_forward_backward_dense(dtype, mask_type, with_bias):
    B, M, N, H, E = 2, 19, 26, 3, 8
    q = _randn(B, M, H, E, dtype=dtype)
    k, v = _randn(B, N, H, E, dtype=dtype, seed=1), _randn(B, N, H, E, dtype=dtype, seed=2)
    bias = _randn(1, H, M, N, dtype=dtype, seed=3) if with_bias else None
    leaves = _leaves(q, k, v) + (_leaves(bias) if with_bias else [])
    causal = {0: None, 1: "top-left", 2: "bottom-right"}[mask_type]
    ref, ref_lse = _reference_attention(*(_bhle(t) for t in leaves[:3]), leaves[3] if with_bias else None, causal)
    out, lse, seed, offset, max_q, max_k = torch.ops.aten._efficient_attention_forward(
        *_dev(q, k, v, bias), None, None, None, None, 0.0, mask_type, True)
    assert (max_q, max_k) == (M, N)
    assert_same(out, _bhle(ref).detach().to(dtype), **_att_tol(dtype))
    assert lse.shape == (B, H, 32)
    assert_same(lse[..., :M], ref_lse.detach().float(), **_att_tol(torch.float32 if dtype == torch.float64 else dtype))
    g = _randn(B, M, H, E, dtype=dtype, seed=4)
    grads = torch.ops.aten._efficient_attention_backward(
        *_dev(g, q, k, v, bias), out, None, None, M, N, lse, 0.0, seed, offset, mask_type, with_bias)
    ref_grads = _ref_grads(_bhle(ref), leaves, g)
    for got, r in zip(grads, ref_grads):
        assert_same(got, r.to(dtype), **_att_tol(dtype))
    if not with_bias:
        assert grads[3] is None


def test_efficient_attention_packed_sequences_match_per_sequence():
    lq, lk, H, E = [4, 9, 6], [7, 9, 3], 2, 8
    q = _randn(1, sum(lq), H, E)
    k, v = _randn(1, sum(lk), H, E, seed=1), _randn(1, sum(lk), H, E, seed=2)
    cq, ck = _cu(lq), _cu(lk)
    out, lse, seed, offset, max_q, max_k = torch.ops.aten._efficient_attention_forward(
        *_dev(q, k, v), None, cq.to(DEV), ck.to(DEV), max(lq), max(lk), 0.0, 2, True)
    assert lse.shape == (3, H, 32) and (max_q, max_k) == (9, 9)
    leaves = _leaves(q, k, v)
    refs, ref_lses = [], []
    for b in range(3):
        qs, ks, vs = (t[0, c[b]:c[b + 1]].transpose(0, 1)[None] for t, c in zip(leaves, (cq, ck, ck)))
        o, l = _reference_attention(qs, ks, vs, causal="bottom-right")
        refs.append(o[0].transpose(0, 1))
        ref_lses.append(l[0])
    ref = torch.cat(refs)[None]
    assert_same(out, ref.detach().float(), **_att_tol(torch.float32))
    for b in range(3):
        assert_same(lse[b, :, :lq[b]], ref_lses[b].detach().float(), **_att_tol(torch.float32))
    g = _randn(1, sum(lq), H, E, seed=4)
    grads = torch.ops.aten._efficient_attention_backward(
        *_dev(g, q, k, v), None, out, cq.to(DEV), ck.to(DEV), max(lq), max(lk), lse, 0.0, seed, offset, 2, False)
    for got, r in zip(grads, _ref_grads(ref, leaves, g)):
        assert_same(got, r.float(), **_att_tol(torch.float32))
