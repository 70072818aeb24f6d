"""scaled_dot_product_attention on neuron: eager SDPA takes the fused
(``overrideable``) path wherever CPU would take its flash kernel, so results
equal CPU's bit for bit, and traced graphs keep that one fused op. A single
query position (decode) takes a direct kernel within float tolerances of CPU
(csrc/aten/DecodeAttention.cpp; the tests at the end)."""
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


# ---- one query position (decode): the direct kernel of csrc/aten/DecodeAttention.cpp ----

_DECODE = "neuron::decode_attention"


def _decode_run(q, k, v, **kwargs):
    """SDPA on neuron copies of the CPU tensors; returns the output and
    whether the single-query kernel ran."""
    import torch_neuronx

    dev = {n: t.to("neuron") if isinstance(t, torch.Tensor) else t for n, t in kwargs.items()}
    torch_neuronx.clear_op_tracking()
    out = F.scaled_dot_product_attention(q.to("neuron"), k.to("neuron"), v.to("neuron"), **dev)
    return out, _DECODE in torch_neuronx.get_executed_ops()


_TOL = {torch.float32: dict(atol=1e-5, rtol=1e-5), torch.bfloat16: dict(atol=2e-2, rtol=2e-2),
        torch.float16: dict(atol=2e-3, rtol=2e-3)}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("case", ["plain", "bool-mask", "float-mask", "gqa", "scale", "batch-mask"])
@pytest.mark.parametrize("d", [24, 64])  # 64: the kernel's fixed-size weighted sum
def test_sdpa_single_query_uses_decode_kernel_and_matches_cpu(dtype, case, d):
    g = torch.Generator().manual_seed(2)
    b, h, s = (2, 6, 37)
    kv = 2 if case == "gqa" else h
    q = torch.randn(b, h, 1, d, generator=g).to(dtype)
    k, v = (torch.randn(b, kv, s, d, generator=g).to(dtype) for _ in range(2))
    kwargs = {"plain": {}, "gqa": dict(enable_gqa=True), "scale": dict(scale=0.37),
              "bool-mask": dict(attn_mask=torch.rand(1, h, 1, s, generator=g) > 0.4),
              "float-mask": dict(attn_mask=torch.randn(1, s, generator=g).to(dtype)),
              "batch-mask": dict(attn_mask=torch.randn(b, 1, 1, s, generator=g))}[case]
    if case == "batch-mask" and dtype != torch.float32:
        kwargs["attn_mask"] = kwargs["attn_mask"].to(dtype)
    got, ran = _decode_run(q, k, v, **kwargs)
    assert ran
    assert_same(got, F.scaled_dot_product_attention(q, k, v, **kwargs), **_TOL[dtype])


def test_sdpa_single_query_static_cache_views_and_expanded_heads():
    # A static cache read through a slice (K/V strided in the key dimension),
    # key/value heads expanded as HF's repeat_kv views them, a query laid out
    # [B, L, H, D] and transposed: all read through their strides.
    g = torch.Generator().manual_seed(3)
    cache_k, cache_v = (torch.randn(1, 3, 64, 16, generator=g) for _ in range(2))
    q = torch.randn(1, 1, 9, 16, generator=g).transpose(1, 2)
    mask = torch.zeros(1, 1, 1, 40)
    mask[..., 30:] = float("-inf")
    k, v = cache_k[:, :, :40], cache_v[:, :, :40]
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
    dk, dv = (c.to("neuron")[:, :, :40] for c in (cache_k, cache_v))
    import torch_neuronx

    for kk, vv, gqa in ((dk, dv, True),
                        (dk[:, :, None].expand(1, 3, 3, 40, 16).flatten(1, 2),
                         dv[:, :, None].expand(1, 3, 3, 40, 16).flatten(1, 2), False)):
        torch_neuronx.clear_op_tracking()
        got = F.scaled_dot_product_attention(q.to("neuron"), kk, vv, attn_mask=mask.to("neuron"), enable_gqa=gqa)
        assert _DECODE in torch_neuronx.get_executed_ops()
        assert_same(got, want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("mask_dtype", [torch.bool, torch.float32])
def test_sdpa_single_query_fully_masked_row_matches_cpu(mask_dtype):
    q, k, v = _qkv((2, 3, 1, 8), torch.float32)
    k, v = (torch.randn(2, 3, 5, 8, generator=torch.Generator().manual_seed(4)) for _ in range(2))
    keep = torch.ones(2, 3, 1, 5, dtype=torch.bool)
    keep[0, 1] = False  # one (batch, head) row sees no key
    mask = keep if mask_dtype == torch.bool else torch.zeros(keep.shape).masked_fill(~keep, float("-inf"))
    got, ran = _decode_run(q, k, v, attn_mask=mask)
    assert ran
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    assert_same(got, want, atol=1e-6, rtol=1e-5)
    assert (got[0, 1].cpu() == 0).all()
    # The log-sum-exp too, as the flash op returns it.
    fmask = torch.zeros(keep.shape).masked_fill(~keep, float("-inf"))
    dev = [t.to("neuron") for t in (q, k, v)]
    got_lse = torch.ops.aten._scaled_dot_product_flash_attention(*dev)[1]
    assert_same(got_lse, torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v)[1], atol=1e-5, rtol=1e-5)
    got_out, got_lse = torch.ops.aten._scaled_dot_product_fused_attention_overrideable(
        *dev, attn_bias=fmask.to("neuron"))[:2]
    want_out, want_lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, attn_mask=fmask)
    assert_same(got_out, want_out, atol=1e-6, rtol=1e-5)
    assert_same(got_lse, want_lse, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("case", ["two-queries", "causal", "requires-grad", "dropout"])
def test_sdpa_single_query_kernel_leaves_other_calls_to_the_flash_path(case):
    q, k, v = _qkv((1, 2, 2 if case == "two-queries" else 1, 8), torch.float32)
    k, v = (torch.randn(1, 2, 6, 8, generator=torch.Generator().manual_seed(5)) for _ in range(2))
    kwargs = {"causal": dict(is_causal=True), "dropout": dict(dropout_p=0.5)}.get(case, {})
    if case == "requires-grad":
        q.requires_grad_()
    got, ran = _decode_run(q, k, v, **kwargs)
    assert not ran
    if case != "dropout":
        assert_same(got, F.scaled_dot_product_attention(q, k, v, **kwargs), atol=0, rtol=0)


def test_sdpa_single_query_is_captured_and_replayed():
    # One queued launch: a graph records it and replays it over new inputs copied into the static ones.
    g = torch.Generator().manual_seed(6)
    q, k, v = (torch.randn(1, 4, n, 16, generator=g).to("neuron") for n in (1, 12, 12))
    mask = torch.zeros(1, 1, 1, 12, device="neuron")
    F.scaled_dot_product_attention(q, k, v, attn_mask=mask)  # warm-up outside the capture
    graph = torch.neuron.NeuronGraph()
    with torch.neuron.graph(graph):
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    for seed in (7, 8):
        g = torch.Generator().manual_seed(seed)
        new = [torch.randn(t.shape, generator=g) for t in (q, k, v)]
        new_mask = torch.where(torch.rand(1, 1, 1, 12, generator=g) > 0.3, 0.0, float("-inf"))
        for dst, src in zip((q, k, v, mask), (*new, new_mask)):
            dst.copy_(src)
        graph.replay()
        assert_same(out, F.scaled_dot_product_attention(*new, attn_mask=new_mask), atol=1e-5, rtol=1e-5)
