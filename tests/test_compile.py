"""torch.compile on neuron (Inductor with neuron registered as a device;
backend "neuron" and default Inductor take the same route) against eager,
forward and backward."""
import copy

import re

import pytest
import torch
import torch.nn.functional as F

DEV = "neuron"


def _pair(module):
    torch.manual_seed(0)
    cpu = module()
    dev = copy.deepcopy(cpu).to(DEV)
    return cpu, dev


class MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(16, 32)
        self.b = torch.nn.Linear(32, 4)

    def forward(self, x):
        return self.b(F.gelu(self.a(x))).softmax(-1)


class ConvNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(8)
        self.fc = torch.nn.Linear(8 * 4 * 4, 5)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.bn(self.conv(x))), 2)
        return self.fc(x.flatten(1))


@pytest.mark.parametrize("backend", ["neuron", "inductor"])
@pytest.mark.parametrize("mode", [None, "reduce-overhead", "max-autotune-no-cudagraphs"])
def test_mlp_forward_backward_matches_eager(mode, backend):
    torch._dynamo.reset()
    cpu, dev = _pair(MLP)
    x = torch.randn(8, 16)
    compiled = torch.compile(dev, backend=backend, mode=mode)
    out = compiled(x.to(DEV))
    assert out.device.type == "neuron"
    ref = cpu(x)
    torch.testing.assert_close(out.cpu(), ref, rtol=1e-5, atol=1e-5)
    out.pow(2).sum().backward()
    ref.pow(2).sum().backward()
    for p_dev, p_cpu in zip(dev.parameters(), cpu.parameters()):
        torch.testing.assert_close(p_dev.grad.cpu(), p_cpu.grad, rtol=1e-4, atol=1e-5)


def test_convnet_training_step_matches_eager():
    torch._dynamo.reset()
    cpu, dev = _pair(ConvNet)
    x, y = torch.randn(4, 3, 8, 8), torch.randint(0, 5, (4,))
    opt_cpu = torch.optim.SGD(cpu.parameters(), lr=0.1)
    opt_dev = torch.optim.SGD(dev.parameters(), lr=0.1)
    step = torch.compile(lambda m, a, b: F.cross_entropy(m(a), b), backend="neuron")
    for _ in range(2):
        loss_dev = step(dev, x.to(DEV), y.to(DEV))
        loss_cpu = F.cross_entropy(cpu(x), y)
        loss_dev.backward()
        loss_cpu.backward()
        opt_dev.step(), opt_cpu.step()
        opt_dev.zero_grad(), opt_cpu.zero_grad()
        torch.testing.assert_close(loss_dev.cpu(), loss_cpu, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(dev.bn.running_mean.cpu(), cpu.bn.running_mean, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("dynamic", [False, None, True])
def test_dynamic_shapes_and_recompiles(dynamic):
    torch._dynamo.reset()
    from torch._dynamo.testing import CompileCounterWithBackend

    counter = CompileCounterWithBackend("neuron")
    fn = torch.compile(lambda x: (x * 2 + 1).sum(0), backend=counter, dynamic=dynamic)
    for n in (4, 5, 6, 7):
        x = torch.randn(n, 3)
        torch.testing.assert_close(fn(x.to(DEV)).cpu(), (x * 2 + 1).sum(0))
    if dynamic is False:
        assert counter.frame_count == 4
    else:
        assert counter.frame_count <= 2


def test_graph_break_and_inplace():
    torch._dynamo.reset()

    def fn(x):
        y = x.sin()
        torch._dynamo.graph_break()
        y.add_(1)
        return y * x

    x = torch.randn(5)
    out = torch.compile(fn, backend="neuron")(x.to(DEV))
    torch.testing.assert_close(out.cpu(), fn(x))


def test_autocast_bf16_compiled():
    torch._dynamo.reset()
    cpu, dev = _pair(MLP)
    x = torch.randn(8, 16)

    def run(m, a, device):
        with torch.autocast(device, dtype=torch.bfloat16):
            return m.a(a)

    out = torch.compile(run, backend="neuron")(dev, x.to(DEV), "neuron")
    ref = run(cpu, x, "cpu")
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.cpu(), ref, rtol=1.6e-2, atol=1e-2)


def test_seeded_dropout_is_reproducible():
    torch._dynamo.reset()
    fn = torch.compile(lambda x: F.dropout(x, 0.5, training=True), backend="neuron")
    x = torch.ones(64, device=DEV)
    torch.neuron.manual_seed(3)
    a = fn(x)
    torch.neuron.manual_seed(3)
    b = fn(x)
    assert torch.equal(a.cpu(), b.cpu())
    assert set(a.cpu().unique().tolist()) <= {0.0, 2.0}


def test_default_inductor_pointwise():
    torch._dynamo.reset()
    x, y = torch.randn(8, 8), torch.randn(8, 8)
    fn = lambda a, b: (a.sin() + b).relu() * 2  # noqa: E731
    out = torch.compile(fn)(x.to(DEV), y.to(DEV))
    assert out.device.type == "neuron"
    torch.testing.assert_close(out.cpu(), fn(x, y))


def test_compiled_optimizer_step():
    torch._dynamo.reset()
    cpu, dev = _pair(MLP)
    x = torch.randn(8, 16)
    for m in (cpu, dev):
        m(x.to(next(m.parameters()).device)).sum().backward()
    opt_cpu = torch.optim.AdamW(cpu.parameters(), lr=1e-2, foreach=True)
    opt_dev = torch.optim.AdamW(dev.parameters(), lr=1e-2, foreach=True)
    step = torch.compile(opt_dev.step, backend="neuron")
    for _ in range(2):
        step()
        opt_cpu.step()
    for p_dev, p_cpu in zip(dev.parameters(), cpu.parameters()):
        torch.testing.assert_close(p_dev.detach().cpu(), p_cpu.detach(), rtol=1e-5, atol=1e-6)


def test_cpp_wrapper_forward_backward():
    # Inductor's C++ wrapper: the graph runs as one launch, fallbacks through
    # the CPU C shims over device memory, buffers on neuron.
    torch._dynamo.reset()
    cpu, dev = _pair(MLP)
    x = torch.randn(8, 16)
    out = torch.compile(dev, options={"cpp_wrapper": True})(x.to(DEV))
    assert out.device.type == "neuron"
    ref = cpu(x)
    torch.testing.assert_close(out.cpu(), ref, rtol=1e-5, atol=1e-5)
    out.sum().backward()
    ref.sum().backward()
    torch.testing.assert_close(dev.a.weight.grad.cpu(), cpu.a.weight.grad, rtol=1e-4, atol=1e-5)
    assert dev.a.weight.grad.device.type == "neuron"


def test_default_inductor_training_with_reductions():
    torch._dynamo.reset()
    torch.manual_seed(0)
    cpu = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.LayerNorm(16), torch.nn.GELU(), torch.nn.Linear(16, 4))
    dev = copy.deepcopy(cpu).to(DEV)
    x = torch.randn(8, 8)
    out = torch.compile(dev)(x.to(DEV))
    ref = cpu(x)
    torch.testing.assert_close(out.cpu(), ref, rtol=1e-5, atol=1e-5)
    out.softmax(-1).sum().backward()
    ref.softmax(-1).sum().backward()
    torch.testing.assert_close(dev[0].weight.grad.cpu(), cpu[0].weight.grad, rtol=1e-4, atol=1e-5)


# ---- what runs where: each output keeps the device eager gives it ----------------

def _compile(fn, backend):
    return torch.compile(fn) if backend == "inductor" else torch.compile(fn, backend=backend)


def _assert_host_memory(t):
    # A CPU result must be an ordinary CPU tensor, not a view of device memory.
    from torch_neuronx import _C

    assert t.device.type == "cpu"
    assert _C._is_neuron_ptr(t.untyped_storage().data_ptr()) < 0


@pytest.mark.parametrize("backend", ["neuron", "inductor"])
@pytest.mark.parametrize("train", [False, True], ids=["inference", "training"])
def test_mixed_device_outputs_match_eager(backend, train):
    torch._dynamo.reset()
    fn = lambda a, s, v: (a * s, s + 1, v * 2)  # noqa: E731
    a, s, v = torch.randn(4), torch.tensor(3.0), torch.randn(4)
    a_dev = a.to(DEV).requires_grad_(train)
    v_cpu = v.clone().requires_grad_(train)
    outs = _compile(fn, backend)(a_dev, s, v_cpu)
    refs = fn(a.requires_grad_(train), s, v.requires_grad_(train))
    assert [o.device.type for o in outs] == ["neuron", "cpu", "cpu"]
    for o in outs[1:]:
        _assert_host_memory(o)
    for o, r in zip(outs, refs):
        torch.testing.assert_close(o.detach().cpu(), r.detach())
    if train:
        (outs[0].pow(2).sum().cpu() + outs[2].pow(2).sum()).backward()
        (refs[0].pow(2).sum() + refs[2].pow(2).sum()).backward()
        assert a_dev.grad.device.type == "neuron" and v_cpu.grad.device.type == "cpu"
        torch.testing.assert_close(a_dev.grad.cpu(), a.grad)
        torch.testing.assert_close(v_cpu.grad, v.grad)


@pytest.mark.parametrize("backend", ["neuron", "inductor"])
def test_cpu_copy_inside_graph_stays_on_cpu(backend):
    torch._dynamo.reset()
    fn = lambda x: ((x + 1).cpu() * 2, x - 1)  # noqa: E731
    x = torch.randn(3, 2)
    host, dev = _compile(fn, backend)(x.to(DEV))
    _assert_host_memory(host)
    assert dev.device.type == "neuron"
    ref_host, ref_dev = fn(x)
    torch.testing.assert_close(host, ref_host)
    torch.testing.assert_close(dev.cpu(), ref_dev)


@pytest.mark.parametrize("backend", ["neuron", "inductor"])
def test_factory_inside_graph_stays_on_cpu(backend):
    torch._dynamo.reset()
    fn = lambda x: (x * 2, torch.arange(3))  # noqa: E731
    x = torch.randn(3)
    dev, idx = _compile(fn, backend)(x.to(DEV))
    assert dev.device.type == "neuron"
    _assert_host_memory(idx)
    assert torch.equal(idx, torch.arange(3))
    torch.testing.assert_close(dev.cpu(), x * 2)


def test_cpu_only_graph_under_neuron_backend_is_cpu_inductor():
    torch._dynamo.reset()
    torch.manual_seed(0)
    ref = torch.nn.Linear(3, 2)
    model = copy.deepcopy(ref)
    x = torch.randn(5, 3)
    out = torch.compile(model, backend="neuron")(x)
    expected = ref(x)
    _assert_host_memory(out)
    torch.testing.assert_close(out, expected)
    out.pow(2).sum().backward()
    expected.pow(2).sum().backward()
    for p, p_ref in zip(model.parameters(), ref.parameters()):
        assert p.grad.device.type == "cpu"
        torch.testing.assert_close(p.grad, p_ref.grad)


@pytest.mark.parametrize("fullgraph", [False, True])
def test_dynamo_metrics_count_recompiles(fullgraph):
    torch._dynamo.reset()  # the lambda's code object may be cached by another test
    before = torch.neuron.get_dynamo_metrics()
    f = torch.compile(lambda x: x * 2 + 1, backend="neuron", dynamic=False, fullgraph=fullgraph)
    for n in (2, 3, 4):  # one compilation, then a recompile per new static shape
        assert torch.equal(f(torch.ones(n, device="neuron")).cpu(), torch.full((n,), 3.0))
    after = torch.neuron.get_dynamo_metrics()
    assert after["recompiles"] - before["recompiles"] == 2
    assert after["frames_total"] - before["frames_total"] == 3


# ---- one route: neuron is an Inductor device, no wrapper around compile_fx ----

def test_compile_fx_is_not_wrapped():
    from torch._inductor import compile_fx

    assert not hasattr(compile_fx.compile_fx, "__wrapped__")
    assert not any(type(f).__module__.startswith("torch_neuronx") for f in __import__("sys").meta_path)


def test_compile_fx_with_inner_compile_lowers_neuron_graph():
    # Any caller of compile_fx (here with its own inner_compile, as export
    # and the compiled-autograd paths do) reaches the neuron lowering.
    from torch._inductor.compile_fx import compile_fx, compile_fx_inner

    torch._dynamo.reset()
    seen = []

    def inner(gm, example_inputs, **kwargs):
        seen.append({t.device.type for t in example_inputs if isinstance(t, torch.Tensor)})
        return compile_fx_inner(gm, example_inputs, **kwargs)

    def backend(gm, example_inputs):
        return compile_fx(gm, example_inputs, inner_compile=inner)

    fn = lambda x: F.dropout(x.sin(), 0.5, training=True) * 2  # noqa: E731
    x = torch.rand(64, device=DEV) + 1
    torch.neuron.manual_seed(5)
    # A cache hit would skip inner_compile.
    with torch._inductor.config.patch(fx_graph_cache=False), \
            torch._functorch.config.patch(enable_autograd_cache=False):
        out = torch.compile(fn, backend=backend)(x)
    assert seen and seen[0] == {"neuron"}
    assert out.device.type == "neuron"
    kept = out.cpu() != 0
    assert 0 < kept.sum() < 64
    torch.testing.assert_close(out.cpu()[kept], (x.cpu().sin() * 4)[kept])


def test_generated_code_launches_kernels_on_the_runtime():
    # Buffers are allocated on neuron and each C++ kernel is queued as a
    # runtime launch through its neuron binding (no host aliases of device
    # memory outside a launch); the wrapper passes the kernel's name.
    from torch._inductor.utils import run_and_get_code

    torch._dynamo.reset()
    x = torch.randn(8, 8)
    fn = lambda a: (a.sin() + 1).softmax(-1)  # noqa: E731
    out, (code,) = run_and_get_code(torch.compile(fn), x.to(DEV))
    torch.testing.assert_close(out.cpu(), fn(x))
    assert "device='neuron'" in code
    assert "async_compile = NeuronAsyncCompile()" in code
    assert re.search(r"(cpp_fused\w+)\(arg0_1, .*'\1'\)", code), code


def _kernel_calls(code):
    # The wrapper's kernel and extern calls, with buffer numbers and neuron's
    # trailing kernel-name argument left out.
    calls = re.findall(r"^\s*((?:cpp_fused\w+|extern_kernels\.\w+)\(.*\))$", code, re.M)
    return [re.sub(r"buf\d+", "buf", re.sub(r", '\w+'\)$", ")", c)) for c in calls]


def test_cat_lowers_as_on_cpu():
    # Inductor's C++ backend does not vectorize pointwise cats, so Inductor
    # lowers CPU cats to ConcatKernels; neuron's kernels come from that
    # backend and follow the same rule (torch_neuronx/_compile/cat.py).
    from torch._inductor.utils import fresh_cache, run_and_get_code

    def fn(a, b):
        return torch.cat([a * 2, F.gelu(b, approximate="tanh")], dim=-1).relu()

    a, b = torch.randn(16, 32), torch.randn(16, 96)
    codes = {}
    with fresh_cache():
        for dev in ("cpu", DEV):
            torch._dynamo.reset()
            out, (codes[dev],) = run_and_get_code(torch.compile(fn), a.to(dev), b.to(dev))
            torch.testing.assert_close(out.cpu(), fn(a, b))
    assert _kernel_calls(codes[DEV]) == _kernel_calls(codes["cpu"]), (codes["cpu"], codes[DEV])
    assert "std::tanh" not in codes[DEV]


def test_compiled_random_ops_equal_compiled_cpu():
    # rng mode "cpu": Inductor's seeds come from the engine the CPU run draws
    # them from, and the kernels are the CPU backend's.
    fn = lambda x: F.dropout(x.sin(), 0.5, training=True) + torch.rand_like(x)  # noqa: E731
    results = {}
    for dev in ("cpu", DEV):
        torch._dynamo.reset()
        compiled = torch.compile(fn)
        x = torch.linspace(0, 1, 64, device=dev)
        torch.manual_seed(9)
        results[dev] = (compiled(x).cpu(), compiled(x).cpu(), torch.get_rng_state())
    for a, b in zip(results[DEV], results["cpu"]):
        assert torch.equal(a, b)


def test_compiled_random_ops_leave_cpu_generator_alone(philox_rng):
    torch._dynamo.reset()
    fn = torch.compile(lambda x: torch.rand_like(x) + x)
    x = torch.zeros(32, device=DEV)
    cpu_state = torch.get_rng_state()
    torch.neuron.manual_seed(11)
    a = fn(x)
    torch.neuron.manual_seed(11)
    b = fn(x)
    assert torch.equal(torch.get_rng_state(), cpu_state)
    assert torch.equal(a.cpu(), b.cpu())
    assert not torch.equal(a.cpu(), fn(x).cpu())
