"""torch.export and AOTInductor with neuron inputs.

``aoti_compile_and_package`` of a program exported on neuron builds a neuron
package (AOTI_DEVICE_KEY "neuron"); ``aoti_load_package`` runs it through the
neuron AOTI model runner, one runtime launch per call. Outputs are compared
with the eager CPU model. AOTI compiles cost 30-90 s here: each package is
built once per module (fixtures) and shared by the tests."""
import json

import pytest
import torch
from conftest import assert_same, run_json
from torch.export import Dim

DEV = "neuron"
FP32 = dict(atol=1e-5, rtol=1e-5)


class Block(torch.nn.Module):
    """A small MLP: fused C++ kernels and addmm fallbacks."""

    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(8, 16)
        self.b = torch.nn.Linear(16, 4)

    def forward(self, x):
        return self.b(torch.relu(self.a(x))).softmax(-1)


class Fallbacks(torch.nn.Module):
    """mm, softmax and index ops next to fused kernels. topk, sort,
    index_add, embedding_bag and searchsorted are aten fallbacks (neuron ops
    through the dispatcher inside the model's launch); index_add,
    embedding_bag and the convolution read the model's constants; int64
    outputs."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(8, 8))
        self.register_buffer("table", torch.randn(10, 8))
        self.conv = torch.nn.Conv1d(1, 2, 3, padding=1)

    def forward(self, x, idx):
        h = torch.mm(x, self.w).softmax(-1)
        vals, pos = h.topk(3, dim=-1)
        picked = torch.gather(h, 1, pos)
        acc = self.table.index_add(0, idx, h)
        ordered, order = acc.sort(-1)
        bags = torch.nn.functional.embedding_bag(idx.remainder(10).view(-1, 1), self.table, mode="sum")
        buckets = torch.searchsorted(ordered[:1].expand(h.shape[0], -1).contiguous(), h)
        return vals, picked, ordered, order, bags + self.table.index_select(0, idx), buckets, self.conv(x[:, None])


def _neuron_copy(cpu_module):
    dev = type(cpu_module)()
    dev.load_state_dict(cpu_module.state_dict())
    return dev.to(DEV).eval()


def _package(module, args, path, dynamic_shapes=None):
    ep = torch.export.export(module, args, dynamic_shapes=dynamic_shapes)
    return torch._inductor.aoti_compile_and_package(ep, package_path=str(path))


@pytest.fixture(scope="module")
def block():
    torch.manual_seed(0)
    return Block().eval()


@pytest.fixture(scope="module")
def block_package(block, tmp_path_factory):
    x = torch.randn(3, 8, device=DEV)
    return _package(_neuron_copy(block), (x,), tmp_path_factory.mktemp("aoti") / "block.pt2")


@pytest.fixture(scope="module")
def fallbacks():
    torch.manual_seed(0)
    return Fallbacks().eval()


@pytest.fixture(scope="module")
def fallbacks_package(fallbacks, tmp_path_factory):
    # Dynamic batch: the size symbol flows into the fused kernels, the
    # fallbacks' shapes and the outputs' allocation.
    x = torch.randn(4, 8, device=DEV)
    idx = torch.tensor([1, 9, 0, 9], device=DEV)
    batch = Dim("batch", min=2, max=64)
    return _package(_neuron_copy(fallbacks), (x, idx), tmp_path_factory.mktemp("aoti") / "fallbacks.pt2",
                    dynamic_shapes={"x": {0: batch}, "idx": {0: batch}})


def test_export_of_neuron_model_runs_on_neuron(block):
    x = torch.randn(3, 8)
    ep = torch.export.export(_neuron_copy(block), (x.to(DEV),))
    assert_same(ep.module()(x.to(DEV)), block(x))


def test_aoti_finds_the_neuron_device_header(block_package):
    # AOTI precompiles <torch/csrc/inductor/aoti_include/{device}.h> with only
    # torch's include directories; torch_neuronx ships the neuron one and puts
    # its directory on the compiler's search path (CPLUS_INCLUDE_PATH) when it
    # generates a neuron AOTI model (block_package).
    import os

    from torch._inductor.codecache import _get_cpp_wrapper_header
    from torch_neuronx._compile import cpp_wrapper

    header = _get_cpp_wrapper_header("neuron", aot_mode=True)
    assert os.path.join(cpp_wrapper.AOTI_INCLUDE, header) == cpp_wrapper.AOTI_HEADER
    assert os.path.isfile(cpp_wrapper.AOTI_HEADER)
    assert cpp_wrapper.AOTI_INCLUDE in os.environ["CPLUS_INCLUDE_PATH"].split(os.pathsep)
    assert not cpp_wrapper.aoti_header_missing()


def test_package_is_a_neuron_package(block_package):
    from torch._C._aoti import AOTIModelPackageLoader

    metadata = AOTIModelPackageLoader(block_package, "model", False, 1, -1).get_metadata()
    assert metadata["AOTI_DEVICE_KEY"] == "neuron"


def test_mlp_package_matches_cpu(block, block_package):
    model = torch._inductor.aoti_load_package(block_package)
    for seed in (1, 2):
        torch.manual_seed(seed)
        x = torch.randn(3, 8)
        assert_same(model(x.to(DEV)), block(x), **FP32)


class Attention(torch.nn.Module):
    """Self-attention over a [B, S, 3, H, D] projection: SDPA's fused op on
    strided views of one buffer (the host flash kernel by name in C++ wrappers)."""

    def __init__(self):
        super().__init__()
        self.qkv = torch.nn.Linear(16, 48)

    def forward(self, x):
        q, k, v = self.qkv(x).view(x.shape[0], x.shape[1], 3, 2, 8).unbind(2)
        out = torch.nn.functional.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                                               v.transpose(1, 2), is_causal=True)
        return out.transpose(1, 2).reshape(x.shape[0], x.shape[1], 16)


def test_attention_package_matches_cpu(tmp_path):
    torch.manual_seed(0)
    cpu = Attention().eval()
    x = torch.randn(2, 10, 16)
    model = torch._inductor.aoti_load_package(_package(_neuron_copy(cpu), (x.to(DEV),), tmp_path / "attn.pt2"))
    with torch.no_grad():
        assert_same(model(x.to(DEV)), cpu(x), **FP32)


class ComplexRope(torch.nn.Module):
    """A complex rotary table held as a plain attribute and moved with
    ``.to(x.device)`` (Qwen-Image's RoPE): a constant device_put that Inductor
    keeps as a fallback (complex), then complex math around it."""

    def __init__(self):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.freqs = torch.polar(torch.ones(6, 4), torch.randn(6, 4, generator=g))

    def forward(self, x):
        freqs = self.freqs.to(x.device)
        rotated = torch.view_as_complex(x.reshape(x.shape[0], 6, 4, 2)) * freqs.unsqueeze(0)
        return torch.view_as_real(rotated).flatten(1) * 2


def test_complex_constant_moved_to_device_matches_cpu(tmp_path):
    cpu = ComplexRope()
    x = torch.randn(3, 48)
    model = torch._inductor.aoti_load_package(_package(ComplexRope(), (x.to(DEV),), tmp_path / "rope.pt2"))
    got = model(x.to(DEV))
    assert got.device.type == DEV
    assert_same(got, cpu(x), **FP32)


@pytest.mark.parametrize("batch", [4, 2, 7])
def test_fallbacks_package_dynamic_batch_matches_cpu(fallbacks, fallbacks_package, batch):
    model = torch._inductor.aoti_load_package(fallbacks_package)
    torch.manual_seed(batch)
    x = torch.randn(batch, 8)
    idx = torch.randint(0, 10, (batch,))
    got = model(x.to(DEV), idx.to(DEV))
    want = fallbacks(x, idx)
    assert len(got) == len(want) == 7
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape
        assert_same(g, w, **FP32)


def test_cpp_wrapper_fallbacks_match_cpu(fallbacks):
    # The same fallbacks under torch.compile(cpp_wrapper=True): C shims that
    # return new tensors would allocate them on the host.
    torch._dynamo.reset()
    compiled = torch.compile(_neuron_copy(fallbacks), options={"cpp_wrapper": True})
    x = torch.randn(5, 8)
    idx = torch.randint(0, 10, (5,))
    for g, w in zip(compiled(x.to(DEV), idx.to(DEV)), fallbacks(x, idx)):
        assert_same(g, w, **FP32)


def test_package_runs_on_the_current_stream(block, block_package):
    # The model is one launch on the current stream: it runs after the work
    # queued there (the input written on a side stream) without a synchronize.
    model = torch._inductor.aoti_load_package(block_package)
    x = torch.randn(3, 8)
    side = torch.neuron.Stream()
    with torch.neuron.stream(side):
        xd = torch.zeros(3, 8, device=DEV)
        xd.copy_(x.to(DEV) * 2)
        out = model(xd)
    assert_same(out, block(x * 2), **FP32)


def test_package_on_second_device(block, block_package):
    if torch.neuron.device_count() < 2:
        pytest.skip("needs two neuron devices")
    model = torch._inductor.aoti_load_package(block_package, device_index=1)
    x = torch.randn(3, 8)
    out = model(x.to("neuron:1"))
    assert out.device == torch.device("neuron:1")
    torch.testing.assert_close(out.cpu(), block(x), **FP32)


def test_cpu_inputs_raise_clear_error(block_package):
    model = torch._inductor.aoti_load_package(block_package)
    with pytest.raises(RuntimeError, match=r"input 0 is on cpu but this model was compiled for neuron"):
        model(torch.randn(3, 8))


@pytest.mark.parametrize("shape,dtype,message", [
    ((5, 8), torch.float32, r"unmatched dim value at 0, expected: 3, but got: 5"),
    ((3, 9), torch.float32, r"unmatched dim value at 1, expected: 8, but got: 9"),
    ((3,), torch.float32, r"expected a 2-dimensional tensor, but got 1 dimensions"),
    ((3, 8), torch.float64, r"unmatched dtype"),
])
def test_inputs_not_matching_the_export_raise_clear_error(block_package, shape, dtype, message):
    # AOTI checks inputs only under AOTI_RUNTIME_CHECK_INPUTS=1; unchecked, a
    # larger batch ran on the exported size and returned a wrong result.
    model = torch._inductor.aoti_load_package(block_package)
    with pytest.raises(RuntimeError, match=message):
        model(torch.zeros(shape, dtype=dtype, device=DEV))


def test_dynamic_batch_outside_its_range_raises_clear_error(fallbacks_package):
    model = torch._inductor.aoti_load_package(fallbacks_package)
    with pytest.raises(RuntimeError, match=r"dim value is too large at 0, expected to be <= 64, but got: 65"):
        model(torch.zeros(65, 8, device=DEV), torch.zeros(65, dtype=torch.long, device=DEV))


def test_inputs_on_another_device_raise_clear_error(block_package):
    if torch.neuron.device_count() < 2:
        pytest.skip("needs two neuron devices")
    model = torch._inductor.aoti_load_package(block_package)  # loaded for neuron:0
    with pytest.raises(RuntimeError, match=r"input 0 is on neuron:1 .* loaded for neuron:0"):
        model(torch.randn(3, 8, device="neuron:1"))


def test_load_for_invalid_device_index_raises_clear_error(block_package):
    bad = torch.neuron.device_count()
    with pytest.raises(RuntimeError, match=rf"Device index {bad} is out of range"):
        torch._inductor.aoti_load_package(block_package, device_index=bad)


@pytest.mark.parametrize("env", [{}, {"NEURON_RT_PROTECT": "1"}], ids=["default", "protect"])
def test_package_loads_in_fresh_process(block, block_package, env):
    # A packaged model is self-contained: a new interpreter with torch_neuronx
    # (which registers the neuron model runner) loads and runs it; protect mode
    # proves the model touches device memory only inside its launch.
    torch.manual_seed(3)
    x = torch.randn(3, 8)
    got = run_json(f"""
        import json, torch, torch_neuronx
        model = torch._inductor.aoti_load_package({block_package!r})
        out = model(torch.tensor({json.dumps(x.tolist())}, device="neuron"))
        print(json.dumps({{"device": str(out.device), "out": out.cpu().tolist()}}))
        """, env=env)
    assert got["device"] == "neuron:0"
    torch.testing.assert_close(torch.tensor(got["out"]), block(x), **FP32)
