"""FlexAttention (torch.nn.attention.flex_attention) on neuron: eager and
compiled (default Inductor and backend="neuron"), forward and backward, and
Transformers' attn_implementation="flex_attention". References are computed
on CPU: a dense attention written out here (CPU's own flex_attention has no
backward), or the model with CPU sdpa."""
import copy
import math
import re

import pytest
import torch
from torch.nn.attention.flex_attention import AuxRequest, create_block_mask, flex_attention

from conftest import assert_same, run_python, run_python_timeout

B, HQ, HKV, L, D = 2, 4, 2, 40, 16
TOL = {torch.float32: dict(atol=2e-5, rtol=1e-5), torch.bfloat16: dict(atol=4e-2, rtol=2e-2)}


def causal(b, h, q_idx, kv_idx):
    return q_idx >= kv_idx


def softcap_relative(score, b, h, q_idx, kv_idx):
    return 8 * torch.tanh(score / 8) + 0.02 * (q_idx - kv_idx)


def dense_reference(q, k, v, head_bias=None):
    """causal + softcap_relative (+ a per-head bias) attention in plain ops,
    with GQA; returns (out, logsumexp)."""
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1).float(), v.repeat_interleave(group, 1).float()
    scores = q.float() @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    q_idx, kv_idx = torch.arange(q.shape[2]).view(-1, 1), torch.arange(k.shape[2]).view(1, -1)
    scores = softcap_relative(scores, None, None, q_idx, kv_idx)
    if head_bias is not None:
        scores = scores + head_bias.view(1, -1, 1, 1)
    scores = scores.masked_fill(q_idx < kv_idx, float("-inf"))
    return (scores.softmax(-1) @ v).to(q.dtype), scores.logsumexp(-1)


def _inputs(dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(B, HQ, L, D, generator=g).to(dtype), torch.randn(B, HKV, L, D, generator=g).to(dtype),
            torch.randn(B, HKV, L, D, generator=g).to(dtype))


def _loss(out):
    # Not just sum(): a gradient that differs per output element.
    return (out.float() * torch.linspace(-1, 1, out.shape[-1], device=out.device)).sum() + out.float().pow(2).sum()


def _check_forward_backward(fn, dtype):
    q, k, v = _inputs(dtype)
    cpu = [t.clone().requires_grad_() for t in (q, k, v)]
    ref, ref_lse = dense_reference(*cpu)
    _loss(ref).backward()

    dev = [t.to("neuron").requires_grad_() for t in (q, k, v)]
    block_mask = create_block_mask(causal, B, None, L, L, device="neuron")
    out, aux = fn(*dev, score_mod=softcap_relative, block_mask=block_mask, enable_gqa=True,
                  return_aux=AuxRequest(lse=True))
    lse = aux.lse
    _loss(out).backward()

    assert_same(out.detach(), ref.detach(), **TOL[dtype])
    assert_same(lse.detach(), ref_lse.detach(), **TOL[torch.float32])
    for d, c in zip(dev, cpu):
        assert_same(d.grad, c.grad, **TOL[dtype])


def test_validate_device_step():
    """Why torch_neuronx/_compile/flex_device_check.py exists: this torch's
    flex_attention rejects every device outside a fixed set, neuron included.
    The step is applied exactly when it is needed, and with it flex_attention
    accepts neuron tensors (without it, the call below raises ValueError)."""
    import torch.nn.attention.flex_attention as flex

    from torch_neuronx._compile import flex_device_check as compat

    # Applied by `import torch_neuronx`, exactly when torch's check rejects neuron.
    applied = hasattr(flex._validate_device, "_neuron_compat_original")
    original = getattr(flex._validate_device, "_neuron_compat_original", flex._validate_device)
    assert applied == compat.torch_rejects_neuron(original)
    assert not compat.torch_rejects_neuron(flex._validate_device)

    q, k, v = (t.to("neuron") for t in _inputs(torch.float32))
    out = flex_attention(q, k, v, enable_gqa=True)
    assert out.device.type == "neuron"
    # Other devices still get torch's own check (CPU has no flex backward).
    with pytest.raises(NotImplementedError, match="backward on CPU"):
        flex_attention(*(t.requires_grad_() for t in _inputs(torch.float32)), enable_gqa=True)


def test_eager_forward_backward():
    _check_forward_backward(flex_attention, torch.float32)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("backend", ["inductor", "neuron"])
def test_compiled_forward_backward(backend, dtype):
    torch._dynamo.reset()
    _check_forward_backward(torch.compile(flex_attention, backend=backend, fullgraph=True), dtype)


@pytest.mark.parametrize("backend", ["inductor", "neuron"])
def test_compiled_inference_uses_cpp_template(backend):
    """Inference (no logsumexp) lowers to Inductor's C++ flex template, which
    runs as a neuron kernel launch; the result matches the CPU reference."""
    from torch._inductor.utils import run_and_get_code

    torch._dynamo.reset()
    q, k, v = _inputs(torch.float32)
    ref, _ = dense_reference(q, k, v)
    block_mask = create_block_mask(causal, B, None, L, L, device="neuron")
    fn = torch.compile(flex_attention, backend=backend, fullgraph=True)
    with torch.no_grad():
        out, code = run_and_get_code(fn, *(t.to("neuron") for t in (q, k, v)), score_mod=softcap_relative,
                                     block_mask=block_mask, enable_gqa=True)
    assert_same(out, ref, **TOL[torch.float32])
    # The template's kernel is built by the neuron bindings and called with
    # its name, i.e. queued as a runtime launch like any fused kernel.
    assert any("NeuronAsyncCompile()" in c and re.search(r"(cpp_fused_flex_attention\w*)\(.*'\1'\)", c)
               for c in code), code


@pytest.mark.parametrize("grad", [False, True], ids=["inference", "training"])
def test_compiled_captured_buffer(grad):
    """A score_mod that captures a neuron tensor (per-head bias): the buffer
    is an input of the C++ template (inference) and of the math lowering
    (training)."""
    torch._dynamo.reset()
    q, k, v = _inputs(torch.float32, seed=1)
    bias = torch.linspace(-0.5, 0.5, HQ)
    cpu = [t.clone().requires_grad_(grad) for t in (q, k, v)]
    ref, _ = dense_reference(*cpu, head_bias=bias)

    dev_bias = bias.to("neuron")

    def biased(score, b, h, q_idx, kv_idx):
        return softcap_relative(score, b, h, q_idx, kv_idx) + dev_bias[h]

    dev = [t.to("neuron").requires_grad_(grad) for t in (q, k, v)]
    block_mask = create_block_mask(causal, B, None, L, L, device="neuron")
    fn = torch.compile(flex_attention, fullgraph=True)
    with torch.set_grad_enabled(grad):
        out = fn(*dev, score_mod=biased, block_mask=block_mask, enable_gqa=True)
    assert_same(out.detach(), ref.detach(), **TOL[torch.float32])
    if grad:
        _loss(ref).backward()
        _loss(out).backward()
        for d, c in zip(dev, cpu):
            assert_same(d.grad, c.grad, **TOL[torch.float32])


def test_compiled_protect_mode():
    """Compiled forward and backward touch device memory only inside runtime
    launches (NEURON_RT_PROTECT=1 faults otherwise)."""
    proc = run_python("""
        import torch, torch_neuronx
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention
        g = torch.Generator().manual_seed(0)
        q, k, v = (torch.randn(1, 2, 32, 16, generator=g) for _ in range(3))
        causal = lambda b, h, q_idx, kv_idx: q_idx >= kv_idx
        fn = torch.compile(flex_attention, fullgraph=True)
        cpu = [t.clone().requires_grad_() for t in (q, k, v)]
        ref = torch.nn.functional.scaled_dot_product_attention(*cpu, is_causal=True)
        ref.pow(2).sum().backward()
        dev = [t.to("neuron").requires_grad_() for t in (q, k, v)]
        out = fn(*dev, block_mask=create_block_mask(causal, 1, None, 32, 32, device="neuron"))
        out.pow(2).sum().backward()
        with torch.no_grad():
            inf = fn(*dev, block_mask=create_block_mask(causal, 1, None, 32, 32, device="neuron"))
        for a, b in [(out, ref), (inf, ref)] + [(d.grad, c.grad) for d, c in zip(dev, cpu)]:
            torch.testing.assert_close(a.detach().cpu(), b.detach(), atol=2e-5, rtol=1e-5)
        print("ok")
        """, env={"NEURON_RT_PROTECT": "1"})
    assert proc.stdout.strip().endswith("ok"), proc.stdout + proc.stderr


def test_compiled_bf16_backward_compiles_promptly():
    """A bf16 score_mod's joint graph converts dtypes with
    prims.convert_element_type, which has no vmap batching rule: the math
    lowering must not vmap it as is (functorch would trace it once per score
    element, over ten minutes for this 40x40 case instead of seconds).
    Fresh process and caches so the lowering really runs."""
    proc = run_python_timeout("""
        import torch, torch_neuronx
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention
        q, k, v = (torch.randn(1, 2, 40, 16, dtype=torch.bfloat16, device="neuron", requires_grad=True)
                   for _ in range(3))
        softcap = lambda score, b, h, q_idx, kv_idx: 8 * torch.tanh(score / 8)
        block_mask = create_block_mask(lambda b, h, q_idx, kv_idx: q_idx >= kv_idx, 1, None, 40, 40, device="neuron")
        out = torch.compile(flex_attention, fullgraph=True)(q, k, v, score_mod=softcap, block_mask=block_mask)
        out.float().sum().backward()
        print("ok", q.grad.shape == q.shape)
        """, timeout=240, env={"TORCHINDUCTOR_FORCE_DISABLE_CACHES": "1"})
    assert proc is not None, "compiling the bf16 flex_attention backward did not finish in 240 s"
    assert proc.stdout.strip().endswith("ok True"), proc.stdout + proc.stderr


def _tiny_llama(transformers):
    cfg = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, vocab_size=128, max_position_embeddings=256)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg)
    model.config._attn_implementation = "sdpa"
    return model


def test_transformers_flex_attention_matches_cpu_sdpa():
    """attn_implementation="flex_attention" on neuron (Transformers compiles
    flex_attention itself): logits and the gradients of one backward equal
    the CPU sdpa model's, and greedy generate() with left padding gives the
    CPU tokens."""
    transformers = pytest.importorskip("transformers")
    torch._dynamo.reset()
    cpu = _tiny_llama(transformers)
    dev = copy.deepcopy(cpu).to("neuron")
    dev.set_attn_implementation("flex_attention")
    assert dev.config._attn_implementation == "flex_attention"

    ids = torch.randint(0, 128, (2, 12), generator=torch.Generator().manual_seed(1))
    ref = cpu(ids, labels=ids)
    ref.loss.backward()
    out = dev(ids.to("neuron"), labels=ids.to("neuron"))
    out.loss.backward()
    assert_same(out.logits.detach(), ref.logits.detach(), atol=1e-5, rtol=1e-5)
    for (name, p_dev), (_, p_cpu) in zip(dev.named_parameters(), cpu.named_parameters()):
        assert_same(p_dev.grad, p_cpu.grad, atol=1e-5, rtol=1e-4, msg=name)

    cpu.eval()
    dev.eval()
    mask = torch.ones_like(ids)
    mask[1, :3] = 0  # left padding: the mask_mod captures the padding mask
    kw = dict(max_new_tokens=8, do_sample=False)
    expected = cpu.generate(ids, attention_mask=mask, **kw)
    tokens = dev.generate(ids.to("neuron"), attention_mask=mask.to("neuron"), **kw)
    assert torch.equal(tokens.cpu(), expected)


def test_cpu_graphs_keep_inductors_lowering():
    """Neuron's lowerings decline other devices: a CPU flex_attention still
    compiles to Inductor's own CPU kernel and matches CPU eager."""
    torch._dynamo.reset()
    q, k, v = _inputs(torch.float32, seed=2)
    block_mask = create_block_mask(causal, B, None, L, L, device="cpu")
    kwargs = dict(score_mod=softcap_relative, block_mask=block_mask, enable_gqa=True)
    with torch.no_grad():
        out = torch.compile(flex_attention, fullgraph=True)(q, k, v, **kwargs)
        ref = flex_attention(q, k, v, **kwargs)
    assert out.device.type == "cpu"
    torch.testing.assert_close(out, ref, **TOL[torch.float32])
