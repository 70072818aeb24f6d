"""The issue-23 benchmark kernels (tests/nki_kernels.py: silu_mul,
softmax_fused, attention_head) against the same PyTorch code on CPU, in fp32
and bf16, on both executors. NKI_EXECUTOR=native raises when the executor
does not cover a program, so the native runs also check that none of them
falls back to the interpreter."""
import os
import sys

import pytest
import torch

import torch_neuronx  # noqa: F401

from conftest import assert_same

sys.path.insert(0, os.path.dirname(__file__))
import nki_kernels as K  # noqa: E402

# fp32: the engines compute in fp32 (libm's exp on the native executor, a few ulp from
# torch's); bf16: the kernels round once at the output, the PyTorch code after every op.
TOL = {torch.float32: dict(atol=2e-5, rtol=2e-5), torch.bfloat16: dict(atol=2e-2, rtol=2e-2)}
DTYPES = [torch.float32, torch.bfloat16]


@pytest.fixture(params=["native", "interpreter"])
def executor(request, monkeypatch):
    monkeypatch.setenv("NKI_EXECUTOR", request.param)
    return request.param


def _randn(*shape, dtype, seed=0, scale=1.0, shift=0.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g) * scale + shift).to(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows,cols", [(128, 512), (300, 96)])  # 300: a partial last tile
def test_silu_mul(executor, dtype, rows, cols):
    gate = _randn(rows, cols, dtype=dtype, scale=4.0)  # both tails of silu
    up = _randn(rows, cols, dtype=dtype, seed=1)
    out = K.silu_mul(gate.to("neuron"), up.to("neuron"))
    assert out.dtype == dtype and out.shape == gate.shape
    assert_same(out, K.silu_mul_ref(gate, up), **TOL[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows,cols", [(128, 2048), (300, 96), (5, 1)])
def test_softmax(executor, dtype, rows, cols):
    x = _randn(rows, cols, dtype=dtype, scale=3.0)
    out = K.softmax_fused(x.to("neuron"))
    assert out.dtype == dtype
    assert_same(out, K.softmax_ref(x), **TOL[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
def test_softmax_is_stable_for_large_logits(executor, dtype):
    """exp(x - max): logits around 1e3 (exp overflows fp32 past 88) and a row
    of equal values give the softmax, not inf/nan."""
    x = _randn(130, 64, dtype=dtype, scale=20.0, shift=1000.0)
    x[3] = 500.0
    out = K.softmax_fused(x.to("neuron")).cpu()
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, K.softmax_ref(x), **TOL[dtype])
    torch.testing.assert_close(out[3].float(), torch.full((64,), 1 / 64), **TOL[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("sq,sk,d", [(128, 128, 64), (200, 512, 64), (512, 256, 32), (1, 128, 128)])
def test_attention_head(executor, dtype, sq, sk, d):
    q = _randn(sq, d, dtype=dtype, seed=0)
    k = _randn(sk, d, dtype=dtype, seed=1)
    v = _randn(sk, d, dtype=dtype, seed=2)
    scale = d ** -0.5
    out = K.attention_head(q.to("neuron"), k.to("neuron"), v.to("neuron"), scale)
    assert out.dtype == dtype and out.shape == (sq, d)
    # the fp32 reference for bf16 too: the PyTorch code in bf16 rounds P before P @ V
    # (the kernel keeps E in bf16 as well, but normalises after the matmul)
    ref = K.attention_ref(q.float(), k.float(), v.float(), scale)
    assert_same(out.float(), ref, **TOL[dtype])
    if dtype == torch.bfloat16:
        assert_same(out.float(), K.attention_ref(q, k, v, scale).float(), atol=3e-2, rtol=3e-2)


def test_attention_head_large_scores(executor):
    """Scores near 1e3 (exp would overflow without the max) stay finite."""
    q = _randn(128, 64, dtype=torch.float32, scale=6.0)
    k = _randn(128, 64, dtype=torch.float32, seed=1, scale=6.0)
    v = _randn(128, 64, dtype=torch.float32, seed=2)
    out = K.attention_head(q.to("neuron"), k.to("neuron"), v.to("neuron"), 1.0).cpu()
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, K.attention_ref(q, k, v, 1.0), atol=1e-4, rtol=1e-4)


def test_attention_head_limits():
    q = torch.randn(128, 64)
    k = torch.randn(640, 64)  # more keys than one PSUM bank of fp32 scores
    with pytest.raises(AssertionError, match="multiple of 128, <= 512"):
        K.attention_head(q, k, k, 0.125)
    with pytest.raises(AssertionError, match="want"):
        K.attention_head(q, k[:128], k[:128, :32], 0.125)


@pytest.mark.parametrize("name", ["silu_mul", "softmax", "attention"])
def test_native_matches_interpreter(monkeypatch, name):
    """Both executors on the same neuron inputs: libm's exp against torch's
    (docs/nki.md, "Contract with the interpreter")."""
    x = _randn(256, 128, dtype=torch.float32, scale=3.0).to("neuron")
    y = _randn(256, 128, dtype=torch.float32, seed=1).to("neuron")
    run = {"silu_mul": lambda: K.silu_mul(x, y), "softmax": lambda: K.softmax_fused(x),
           "attention": lambda: K.attention_head(x[:, :64], y[:, :64], y[:, 64:], 0.125)}[name]
    monkeypatch.setenv("NKI_EXECUTOR", "native")
    native = run().cpu()
    monkeypatch.setenv("NKI_EXECUTOR", "interpreter")
    interp = run().cpu()
    torch.testing.assert_close(native, interp, atol=2e-5, rtol=4e-6)
