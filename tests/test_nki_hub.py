"""An NKI kernel from the Hugging Face ``kernels`` Hub layout (kernels
0.17.2), loaded locally without network: get_local_kernel, and kernelize()
swapping a tiny Llama's RMSNorm for examples/kernels/rmsnorm-nki."""
import importlib.util
import os
from pathlib import Path

import pytest
import torch

from conftest import assert_same

kernels = pytest.importorskip("kernels")

REPO = Path(__file__).resolve().parent.parent / "examples" / "kernels" / "rmsnorm-nki"


def _llama_rms(x, w, eps):
    xf = x.float()
    return w * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def test_nki_satisfies_the_loader_dependency_check():
    spec = importlib.util.find_spec("nki")
    assert spec is not None and spec.origin.startswith(str(REPO.parent.parent.parent))


def test_get_local_kernel_runs_on_neuron():
    k = kernels.get_local_kernel(REPO)
    assert hasattr(k, "layers") and hasattr(k.layers, "RMSNorm")
    for dtype, tol in ((torch.float32, dict(atol=1e-6, rtol=1e-5)), (torch.bfloat16, dict(atol=2e-2, rtol=2e-2))):
        x, w = torch.randn(2, 150, 96, dtype=dtype), torch.randn(96, dtype=dtype)  # a partial 128-row tile
        assert_same(k.rms_norm(x.to("neuron"), w.to("neuron"), 1e-5), _llama_rms(x, w, 1e-5), **tol)


def test_get_local_kernel_backward():
    k = kernels.get_local_kernel(REPO)
    x, w = torch.randn(4, 32), torch.randn(32)
    xn, wn = x.to("neuron").requires_grad_(), w.to("neuron").requires_grad_()
    k.rms_norm(xn, wn, 1e-6).pow(2).sum().backward()
    xr, wr = x.clone().requires_grad_(), w.clone().requires_grad_()
    _llama_rms(xr, wr, 1e-6).pow(2).sum().backward()
    assert_same(xn.grad, xr.grad, atol=1e-5, rtol=1e-4)
    assert_same(wn.grad, wr.grad, atol=1e-5, rtol=1e-4)


def _tiny_llama():
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    return LlamaForCausalLM(cfg).eval().to("neuron")


@pytest.mark.parametrize("mode_name", ["INFERENCE", "INFERENCE_COMPILE"])
def test_kernelize_tiny_llama_generate(mode_name):
    from kernels import LocalLayerRepository, Mode, kernelize, use_kernel_mapping
    mode = Mode.INFERENCE if mode_name == "INFERENCE" else Mode.INFERENCE | Mode.TORCH_COMPILE
    model = _tiny_llama()
    ids = torch.tensor([[1, 5, 9, 17, 33, 2]], device="neuron")
    ref = model.generate(ids, max_new_tokens=8, do_sample=False)

    k = kernels.get_local_kernel(REPO)
    k.rms_norm_kernel._cache.clear()
    repo = LocalLayerRepository(REPO, layer_name="RMSNorm")
    with use_kernel_mapping({"RMSNorm": {"neuron": repo}}):
        model = kernelize(model, device="neuron", mode=mode)
    norm = model.model.norm
    x = torch.randn(1, 3, 64, device="neuron")
    # the same fp32 operations in the same order as LlamaRMSNorm: bit-identical
    assert_same(norm(x), _llama_rms(x.cpu(), norm.weight.detach().cpu(), norm.variance_epsilon),
                atol=0, rtol=0)
    if Mode.TORCH_COMPILE in mode:
        compiled = torch.compile(norm, backend="neuron", fullgraph=True)
        assert_same(compiled(x), norm(x).cpu(), atol=0, rtol=0)
    out = model.generate(ids, max_new_tokens=8, do_sample=False)
    assert k.rms_norm_kernel._cache, "generate() did not run the NKI kernel"
    assert torch.equal(out.cpu(), ref.cpu())


def test_metadata_contract():
    import json
    meta = json.loads((REPO / "build" / "torch-neuron" / "metadata.json").read_text())
    assert meta["backend"]["type"] == "neuron" and "nki" in meta["python-depends"]
    assert os.path.isfile(REPO / "build" / "torch-neuron" / "layers" / "__init__.py")


def test_get_kernel_by_repo_id_offline():
    """get_kernel("org/name", version=1) resolves to the local checkout
    through LOCAL_KERNELS, without network (fresh process: the variable is
    read by the loader)."""
    from conftest import run_json
    r = run_json(f"""
        import json, torch, torch_neuronx
        from kernels import get_kernel
        k = get_kernel("torch-neuronx/rmsnorm-nki", version=1)
        x, w = torch.randn(4, 32), torch.randn(32)
        y = k.rms_norm(x.to("neuron"), w.to("neuron"), 1e-6).cpu()
        ref = w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6))
        print(json.dumps({{"name": k.__name__, "err": (y - ref).abs().max().item()}}))
    """, env={"LOCAL_KERNELS": f"torch-neuronx/rmsnorm-nki={REPO}", "HF_HUB_OFFLINE": "1",
              "PYTHONPATH": str(REPO.parent.parent.parent)})
    assert r["name"] == "_rmsnorm_nki_neuron_7c31e5a" and r["err"] < 1e-5
