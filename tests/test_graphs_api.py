"""torch.neuron.make_graphed_callables: forward and backward replayed as
neuron graphs, against eager neuron and CPU on the same steps."""
import copy

import pytest
import torch

from conftest import assert_same

TOL = dict(rtol=1e-5, atol=1e-6)


class Bump(torch.nn.Module):
    """A smooth activation of plain element-wise ops."""

    def forward(self, t):
        return t * torch.exp(-t * t) + 0.5 * t


def _mlp(kind="bump"):
    if kind == "bump":
        return torch.nn.Sequential(torch.nn.Linear(16, 32), Bump(), torch.nn.Linear(32, 32), Bump(),
                                   torch.nn.Linear(32, 8))
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 32), torch.nn.ReLU(),
                               torch.nn.Linear(32, 8), torch.nn.Tanh(), torch.nn.LayerNorm(8))


def _train(model, opt_cls, batches, device):
    """Runs the steps; returns each step's loss and parameters' grads (on CPU)."""
    opt = opt_cls(model.parameters(), lr=0.05)
    history = []
    for x, y in batches:
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.mse_loss(model(x.to(device)), y.to(device))
        loss.backward()
        history.append((loss.detach().cpu(), [p.grad.cpu() for p in model.parameters()]))
        opt.step()  # outside the graph: it updates the captured parameters in place
    return history


@pytest.mark.parametrize("kind", ["bump", "gelu-relu-tanh-layernorm"])
@pytest.mark.parametrize("opt_cls", [torch.optim.SGD, torch.optim.Adam], ids=["sgd", "adam"])
def test_mlp_training_steps_equal_eager_and_cpu(opt_cls, kind):
    torch.manual_seed(0)
    cpu = _mlp(kind)
    eager, graphed = copy.deepcopy(cpu).to("neuron"), copy.deepcopy(cpu).to("neuron")
    graphed = torch.neuron.make_graphed_callables(graphed, (torch.randn(4, 16, device="neuron"),))
    batches = [(torch.randn(4, 16), torch.randn(4, 8)) for _ in range(5)]

    got = _train(graphed, opt_cls, batches, "neuron")
    want = _train(eager, opt_cls, batches, "neuron")
    ref = _train(cpu, opt_cls, batches, "cpu")
    for (loss, grads), (eager_loss, eager_grads), (cpu_loss, cpu_grads) in zip(got, want, ref):
        torch.testing.assert_close(loss, eager_loss, **TOL)
        torch.testing.assert_close(loss, cpu_loss, rtol=1e-4, atol=1e-5)
        for g, e, c in zip(grads, eager_grads, cpu_grads):
            torch.testing.assert_close(g, e, **TOL)
            torch.testing.assert_close(g, c, rtol=1e-4, atol=1e-5)
    for p, q in zip(graphed.parameters(), cpu.parameters()):
        assert_same(p.detach(), q.detach(), rtol=1e-4, atol=1e-5)


def test_function_with_inputs_that_require_grad():
    torch.manual_seed(1)
    consts = {"cpu": torch.randn(8, 12)}  # a constant the function closes over, per device
    consts["neuron"] = consts["cpu"].to("neuron")

    def fn(a, b, w):
        return (a @ w) * b, (a * consts[a.device.type]).sum(1)

    a = torch.randn(8, 12, device="neuron", requires_grad=True)
    b = torch.randn(8, 6, device="neuron")  # needs no grad: its slot gets None
    w = torch.randn(12, 6, device="neuron", requires_grad=True)
    graphed = torch.neuron.make_graphed_callables(fn, (a, b, w))
    for _ in range(3):
        ra, rb, rw = torch.randn(8, 12), torch.randn(8, 6), torch.randn(12, 6)
        na, nw = ra.to("neuron").requires_grad_(), rw.to("neuron").requires_grad_()
        ca, cw = ra.clone().requires_grad_(), rw.clone().requires_grad_()
        nb = rb.to("neuron")
        out, s = graphed(na, nb, nw)
        ref_out, ref_s = fn(ca, rb, cw)
        assert_same(out.detach(), ref_out.detach(), rtol=1e-5, atol=1e-5)
        assert_same(s.detach(), ref_s.detach(), rtol=1e-5, atol=1e-5)
        (out.square().sum() + s.sum()).backward()
        (ref_out.square().sum() + ref_s.sum()).backward()
        assert_same(na.grad, ca.grad, rtol=1e-4, atol=1e-4)
        assert_same(nw.grad, cw.grad, rtol=1e-4, atol=1e-4)
        assert nb.grad is None


def test_tuple_of_modules_shares_one_pool_and_trains_like_eager():
    torch.manual_seed(2)
    cpu_a, cpu_b = torch.nn.Sequential(torch.nn.Linear(10, 20), Bump()), torch.nn.Linear(20, 5)
    a, b = copy.deepcopy(cpu_a).to("neuron"), copy.deepcopy(cpu_b).to("neuron")
    ea, eb = copy.deepcopy(cpu_a).to("neuron"), copy.deepcopy(cpu_b).to("neuron")
    x = torch.randn(6, 10, device="neuron")
    h = torch.randn(6, 20, device="neuron", requires_grad=True)  # b's input is a's output: it needs grad
    a, b = torch.neuron.make_graphed_callables((a, b), ((x,), (h,)))

    params = list(a.parameters()) + list(b.parameters())
    eparams = list(ea.parameters()) + list(eb.parameters())
    opt, eopt = torch.optim.SGD(params, lr=0.1), torch.optim.SGD(eparams, lr=0.1)
    for _ in range(4):
        xb, yb = torch.randn(6, 10).to("neuron"), torch.randn(6, 5).to("neuron")
        for (m1, m2, o) in ((a, b, opt), (ea, eb, eopt)):
            o.zero_grad()
            torch.nn.functional.mse_loss(m2(m1(xb)), yb).backward()
            o.step()
        for p, q in zip(params, eparams):
            torch.testing.assert_close(p.grad.cpu(), q.grad.cpu(), **TOL)
            torch.testing.assert_close(p.detach().cpu(), q.detach().cpu(), **TOL)


def test_module_in_another_mode_runs_its_own_forward():
    torch.manual_seed(3)
    m = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Dropout(0.5)).to("neuron").eval()
    x = torch.randn(2, 4, device="neuron")
    m = torch.neuron.make_graphed_callables(m, (x,))
    want = torch.nn.functional.linear(x.cpu(), m[0].weight.detach().cpu(), m[0].bias.detach().cpu())
    assert_same(m(x).detach(), want, **TOL)
    m.train()  # not the captured mode: dropout runs eagerly (random ops are not captured)
    out = m(torch.ones(64, 4, device="neuron")).detach().cpu()
    assert (out == 0).any()


def test_replays_allocate_nothing():
    torch.manual_seed(4)
    m = _mlp().to("neuron")
    x = torch.randn(4, 16, device="neuron")
    m = torch.neuron.make_graphed_callables(m, (x,))
    loss = m(x).sum()
    loss.backward()
    torch.neuron.synchronize()
    before = torch.neuron.memory_allocated()
    for _ in range(3):
        m(x).sum().backward()  # x is the static input itself: nothing to copy
    torch.neuron.synchronize()
    # Only the loss scalars (freed) and the grads (accumulated in place) may differ.
    assert torch.neuron.memory_allocated() == before


def test_unused_input_needs_allow_unused_input():
    a = torch.randn(3, device="neuron", requires_grad=True)
    unused = torch.randn(3, device="neuron", requires_grad=True)
    with pytest.raises(RuntimeError, match="not have been used"):
        torch.neuron.make_graphed_callables(lambda x, y: x * 2, (a, unused), num_warmup_iters=1)
    graphed = torch.neuron.make_graphed_callables(lambda x, y: x * 2, (a, unused), allow_unused_input=True)
    x, y = torch.randn(3).to("neuron").requires_grad_(), torch.randn(3).to("neuron").requires_grad_()
    graphed(x, y).sum().backward()
    assert_same(x.grad, torch.full((3,), 2.0))
    assert y.grad is None


def test_bad_arguments():
    x = torch.randn(2, 3, device="neuron")
    with pytest.raises(TypeError, match="only tensors"):
        torch.neuron.make_graphed_callables(lambda t, k: t * k, (x, 2))
    hooked = torch.nn.Linear(3, 3).to("neuron")
    hooked.register_forward_hook(lambda *args: None)
    with pytest.raises(RuntimeError, match="no hooks"):
        torch.neuron.make_graphed_callables(hooked, (x,))
    graphed = torch.neuron.make_graphed_callables(lambda t: t * 3, (x,), num_warmup_iters=0)
    with pytest.raises(ValueError, match=r"captured for \(2, 3\) torch.float32"):
        graphed(torch.randn(4, 3, device="neuron"))
    with pytest.raises(TypeError, match="takes 1 tensors"):
        graphed(x, x)
    assert_same(graphed(torch.ones(2, 3, device="neuron")), torch.full((2, 3), 3.0))
