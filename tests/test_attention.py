"""scaled_dot_product_attention on neuron: eager SDPA takes the fused
(``overrideable``) path wherever CPU would take its flash kernel, so results
equal CPU's bit for bit, and traced graphs keep that one fused op."""
import pytest
import torch
import torch.nn.functional as F
from conftest import assert_same


def _qkv(shape, dtype, seed=0, kv_heads=None):
    g = torch.Generator().manual_seed(seed)
    b, h, s, d = shape
    q = torch.randn(b, h, s, d, generator=g).to(dtype)
    k, v = (torch.randn(b, kv_heads or h, s, d, generator=g).to(dtype) for _ in range(2))
    return q, k, v


def _ops(fn):
    with torch.autograd.profiler.profile() as prof:
        fn()
    return {e.name for e in prof.function_events}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("case", ["plain", "causal", "float-mask", "bool-mask"])
def test_sdpa_eager_uses_fused_path_and_equals_cpu(dtype, case):
    q, k, v = _qkv((2, 4, 48, 16), dtype)
    kwargs = {"causal": dict(is_causal=True),
              "float-mask": dict(attn_mask=torch.randn(48, 48, generator=torch.Generator().manual_seed(1)).to(dtype)),
              "bool-mask": dict(attn_mask=torch.rand(2, 1, 48, 48, generator=torch.Generator().manual_seed(1)) > 0.3),
              "plain": {}}[case]
    ref = F.scaled_dot_product_attention(q, k, v, **kwargs)
    dev_args = [t.to("neuron") for t in (q, k, v)]
    dev_kwargs = {n: t.to("neuron") if isinstance(t, torch.Tensor) else t for n, t in kwargs.items()}
    ops = _ops(lambda: F.scaled_dot_product_attention(*dev_args, **dev_kwargs))
    assert "aten::_scaled_dot_product_fused_attention_overrideable" in ops, sorted(ops)
    assert "aten::bmm" not in ops
    # Same host flash kernel as CPU: identical bits.
    assert_same(F.scaled_dot_product_attention(*dev_args, **dev_kwargs), ref, atol=0, rtol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_sdpa_fused_backward_equals_cpu(dtype):
    q, k, v = _qkv((2, 2, 32, 8), dtype)
    grads = {}
    for device in ("cpu", "neuron"):
        leaves = [t.detach().to(device).requires_grad_() for t in (q, k, v)]
        out = F.scaled_dot_product_attention(*leaves, is_causal=True)
        out.float().square().sum().backward()
        grads[device] = [t.grad for t in leaves]
    for got, want in zip(grads["neuron"], grads["cpu"]):
        assert_same(got, want, atol=0, rtol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_sdpa_grouped_query_attention_is_fused_and_equals_cpu(dtype):
    # Fewer key/value heads (Mistral, Qwen, Llama text encoders): CPU's flash kernel maps the heads itself.
    q, k, v = _qkv((1, 4, 16, 8), dtype, kv_heads=2)
    grads = {}
    for device in ("cpu", "neuron"):
        leaves = [t.detach().to(device).requires_grad_() for t in (q, k, v)]
        ops = _ops(lambda: F.scaled_dot_product_attention(*leaves, enable_gqa=True))
        assert device == "cpu" or "aten::_scaled_dot_product_fused_attention_overrideable" in ops, sorted(ops)
        out = F.scaled_dot_product_attention(*leaves, enable_gqa=True)
        out.float().square().sum().backward()
        grads[device] = [out] + [t.grad for t in leaves]
    for got, want in zip(grads["neuron"], grads["cpu"]):
        assert_same(got.detach(), want.detach(), atol=0, rtol=0)


def test_sdpa_dropout_takes_math_path():
    # The fused host kernel has no dropout RNG: SDPA with dropout decomposes into device ops.
    dev = [t.to("neuron") for t in _qkv((1, 2, 16, 8), torch.float32)]
    ops = _ops(lambda: F.scaled_dot_product_attention(*dev, dropout_p=0.5))
    assert "aten::_scaled_dot_product_fused_attention_overrideable" not in ops
    torch.neuron.manual_seed(0)
    out = F.scaled_dot_product_attention(*dev, dropout_p=0.5)
    no_drop = F.scaled_dot_product_attention(*dev)
    assert out.device.type == "neuron" and torch.isfinite(out).all()
    assert not torch.equal(out.cpu(), no_drop.cpu())


@pytest.mark.parametrize("backend", ["neuron", "inductor"])
def test_sdpa_compiled_uses_fused_op(backend):
    # The fused choice reads only metadata, so traced graphs keep the one fused
    # op (as CPU graphs do) instead of the math decomposition, forward and backward.
    from torch._inductor.utils import fresh_cache, run_and_get_code

    torch._dynamo.reset()
    q, k, v = _qkv((2, 2, 32, 8), torch.float32)
    dev = [t.to("neuron").requires_grad_() for t in (q, k, v)]
    ref = [t.clone().requires_grad_() for t in (q, k, v)]
    # Inputs laid out as [B, S, H, D] and transposed, as attention layers pass them.
    fn = torch.compile(lambda q, k, v: F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                                                      v.transpose(1, 2), is_causal=True),
                       backend=backend, fullgraph=True)
    with fresh_cache():  # the generated code is read from compiles, not cache hits
        got, (fwd_code, *_) = run_and_get_code(fn, *(t.transpose(1, 2) for t in dev))
        want = F.scaled_dot_product_attention(*ref, is_causal=True)
        assert "_scaled_dot_product_fused_attention_overrideable" in fwd_code
        assert_same(got, want, atol=1e-6, rtol=1e-6)
        grad = torch.randn(want.shape)
        _, (bwd_code,) = run_and_get_code(lambda: got.backward(grad.to("neuron")))
    want.backward(grad)
    assert "_scaled_dot_product_fused_attention_overrideable_backward" in bwd_code
    for d, r in zip(dev, ref):
        assert_same(d.grad, r.grad, atol=1e-6, rtol=1e-6)


def test_sdpa_choice_follows_cpu_for_a_mask_strided_in_its_last_dim():
    # Wan's attention passes a mask whose last dimension is strided: CPU takes
    # its flash kernel, and so must neuron, eager and traced (the CPU choice
    # is asked about CPU stand-ins of the tensors).
    from torch._inductor.utils import fresh_cache, run_and_get_code

    q, k, v = _qkv((1, 4, 16, 8), torch.bfloat16)
    mask = torch.randn(1, 16, 4, 16).to(torch.bfloat16).permute(0, 2, 3, 1)
    assert mask.stride(-1) != 1
    flash = int(torch.nn.attention.SDPBackend.FLASH_ATTENTION)
    assert torch._fused_sdp_choice(q, k, v, mask) == flash
    dev = [t.to("neuron") for t in (q, k, v, mask)]
    assert torch._fused_sdp_choice(*dev) == int(torch.nn.attention.SDPBackend.OVERRIDEABLE)
    torch._dynamo.reset()
    fn = torch.compile(lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m), backend="neuron")
    with fresh_cache():
        got, (code,) = run_and_get_code(fn, *dev)
    assert "_scaled_dot_product_fused_attention_overrideable" in code
    assert_same(got, F.scaled_dot_product_attention(q, k, v, attn_mask=mask), atol=1e-2, rtol=2**-7)


def test_sdpa_compiled_with_cpp_wrapper_matches_cpu():
    # C++ wrappers call the host flash kernels by name in place of the fused
    # ops (torch_neuronx/_compile/attention.py), forward and backward.
    import torch._inductor.config as inductor_config

    torch._dynamo.reset()
    q, k, v = _qkv((2, 2, 16, 8), torch.float32)
    ref = [t.transpose(1, 2).clone().requires_grad_() for t in (q, k, v)]
    dev = [t.detach().to("neuron").requires_grad_() for t in ref]

    def attention(q, k, v):
        return F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                              is_causal=True)

    with inductor_config.patch(cpp_wrapper=True):
        got = torch.compile(attention, backend="neuron", fullgraph=True)(*dev)
        want = attention(*ref)
        grad = torch.randn(want.shape)
        got.backward(grad.to("neuron"))
    want.backward(grad)
    assert_same(got, want, atol=1e-6, rtol=1e-6)
    for d, r in zip(dev, ref):
        assert_same(d.grad, r.grad, atol=1e-6, rtol=1e-6)


def test_flash_attention_op_forward_and_backward_match_cpu():
    # aten::_scaled_dot_product_flash_attention, called directly (Diffusers' ring
    # attention needs its logsumexp), against CPU's flash op (the CUDA-named op
    # has no CPU kernel).
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, 5, 8, generator=g, requires_grad=True) for _ in range(3))
    dq, dk, dv = (t.detach().neuron().requires_grad_() for t in (q, k, v))
    for causal in (False, True):
        want = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, is_causal=causal)
        got = torch.ops.aten._scaled_dot_product_flash_attention(dq, dk, dv, is_causal=causal)
        assert_same(got[0], want[0], rtol=1e-5, atol=1e-6)
        assert_same(got[1], want[1], rtol=1e-5, atol=1e-6)  # logsumexp, [B, H, L]
        (want[0] * want[0]).sum().backward()
        (got[0] * got[0]).sum().backward()
        for a, b in ((dq, q), (dk, k), (dv, v)):
            assert_same(a.grad, b.grad, rtol=1e-4, atol=1e-5)
            a.grad = b.grad = None
