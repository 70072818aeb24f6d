"""Random numbers on neuron: seeding, generators, RNG state, offsets, distributions, checkpointing."""
import struct

import pytest
import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from conftest import assert_same


def _draws(device="neuron", generator=None):
    g = {"generator": generator} if generator is not None else {}
    return {
        "rand": torch.rand(37, device=device, **g),
        "randn": torch.randn(5, 7, device=device, **g),
        "randint": torch.randint(-5, 9, (41,), device=device, **g),
        "bernoulli": torch.bernoulli(torch.full((33,), 0.4, device=device), **g),
        "normal_": torch.empty(19, device=device).normal_(2.0, 3.0, **g),
        "uniform_": torch.empty(23, device=device, dtype=torch.float64).uniform_(-1, 1, **g),
        "multinomial": torch.multinomial(torch.arange(1.0, 11.0, device=device), 6, **g),
        "randperm": torch.randperm(29, device=device, **g),
        "exponential_": torch.empty(9, device=device).exponential_(**g),
    }


def _same(a, b):
    return {k: torch.equal(a[k].cpu(), b[k].cpu()) for k in a}


def test_neuron_manual_seed_reproduces_every_sampler():
    torch.neuron.manual_seed(1234)
    first = _draws()
    torch.neuron.manual_seed(1234)
    second = _draws()
    assert all(v.device.type == "neuron" for v in first.values())
    assert _same(first, second) == {k: True for k in first}
    torch.neuron.manual_seed(4321)
    other = _draws()
    assert not any(_same(first, other)[k] for k in ("rand", "randn", "normal_", "uniform_", "randperm"))


def test_consecutive_draws_differ():
    torch.neuron.manual_seed(0)
    a = torch.rand(64, device="neuron")
    b = torch.rand(64, device="neuron")
    assert not torch.equal(a.cpu(), b.cpu())


def test_torch_manual_seed_seeds_neuron():
    torch.manual_seed(77)
    via_torch = _draws()
    torch.neuron.manual_seed(77)
    via_neuron = _draws()
    assert _same(via_torch, via_neuron) == {k: True for k in via_torch}
    assert torch.neuron.initial_seed() == 77
    torch.manual_seed(77)
    assert torch.neuron.get_rng_state(1)[:8].tolist() == list(struct.pack("<Q", 77))


def test_neuron_stream_independent_of_cpu_draws(philox_rng):
    torch.neuron.manual_seed(5)
    a = torch.rand(16, device="neuron")
    torch.neuron.manual_seed(5)
    torch.rand(100)  # CPU generator use must not shift the neuron stream
    b = torch.rand(16, device="neuron")
    assert torch.equal(a.cpu(), b.cpu())


def test_manual_seed_all_and_per_device(philox_rng):
    torch.neuron.manual_seed_all(9)
    a0 = torch.rand(8, device="neuron:0")
    a1 = torch.rand(8, device="neuron:1")
    assert torch.equal(a0.cpu(), a1.cpu())  # same seed, same offset (in cpu mode both draw from the CPU engine)
    with torch.neuron.device(1):
        torch.neuron.manual_seed(10)  # seeds only the current device
        assert torch.neuron.initial_seed() == 10
    assert torch.neuron.initial_seed() == 9


def test_seed_and_seed_all():
    torch.neuron.seed()
    s = torch.neuron.initial_seed()
    torch.neuron.seed()
    assert torch.neuron.initial_seed() != s
    torch.neuron.seed_all()
    assert torch.neuron.default_generators[0].initial_seed() == torch.neuron.default_generators[1].initial_seed()


def test_explicit_generator():
    g = torch.Generator(device="neuron")
    assert g.device == torch.device("neuron", 0)
    assert torch.Generator(device="neuron:1").device == torch.device("neuron", 1)
    g.manual_seed(42)
    first = _draws(generator=g)
    g.manual_seed(42)
    second = _draws(generator=g)
    assert _same(first, second) == {k: True for k in first}
    # The generator's stream is its own: the default generator is untouched.
    torch.neuron.manual_seed(42)
    state = torch.neuron.get_rng_state()
    g.manual_seed(3)
    torch.rand(10, device="neuron", generator=g)
    assert torch.equal(torch.neuron.get_rng_state(), state)
    # Same seed and offset as the default generator: same numbers.
    g.manual_seed(42)
    assert torch.equal(torch.rand(10, device="neuron", generator=g).cpu(), torch.rand(10, device="neuron").cpu())


def test_default_generators_tuple():
    gens = torch.neuron.default_generators
    assert len(gens) == 2
    assert gens[0].device == torch.device("neuron", 0) and gens[1].device == torch.device("neuron", 1)
    gens[1].manual_seed(99)
    assert torch.neuron.get_rng_state(1)[:8].tolist() == list(struct.pack("<Q", 99))
    assert gens[0] is torch.neuron.default_generators[0]


def test_rng_state_layout_and_restore():
    torch.neuron.manual_seed(0x0102030405)
    state = torch.neuron.get_rng_state()
    assert state.dtype == torch.uint8 and state.shape == (16,) and state.device.type == "cpu"
    assert state[:8].tolist() == list(struct.pack("<Q", 0x0102030405))
    assert state[8:].tolist() == [0] * 8  # offset 0 right after seeding
    first = torch.randn(50, device="neuron")
    after = torch.neuron.get_rng_state()
    assert struct.unpack("<Q", bytes(after[8:].tolist()))[0] > 0
    torch.neuron.set_rng_state(state)
    assert torch.equal(torch.randn(50, device="neuron").cpu(), first.cpu())
    assert torch.equal(torch.neuron.get_rng_state(), after)


def test_set_rng_state_rejects_bad_state():
    for n in (0, 4, 12, 17):
        with pytest.raises(RuntimeError, match="16 bytes"):
            torch.neuron.set_rng_state(torch.zeros(n, dtype=torch.uint8))
    with pytest.raises(RuntimeError, match="ByteTensor"):
        torch.neuron.set_rng_state(torch.zeros(2, dtype=torch.int64))
    bad_offset = torch.zeros(16, dtype=torch.uint8)
    bad_offset[8] = 3
    with pytest.raises(RuntimeError, match="multiple of 4"):
        torch.neuron.set_rng_state(bad_offset)


def test_rng_state_all():
    torch.neuron.manual_seed_all(11)
    torch.rand(5, device="neuron:1")
    states = torch.neuron.get_rng_state_all()
    assert len(states) == 2 and all(s.shape == (16,) for s in states)
    assert not torch.equal(states[0], states[1])  # device 1 advanced
    expect0 = torch.rand(6, device="neuron:0").cpu()
    expect1 = torch.rand(6, device="neuron:1").cpu()
    torch.neuron.set_rng_state_all(states)
    assert torch.equal(torch.rand(6, device="neuron:0").cpu(), expect0)
    assert torch.equal(torch.rand(6, device="neuron:1").cpu(), expect1)


def test_generator_offsets(philox_rng):
    assert hasattr(torch.Generator, "get_offset") and hasattr(torch.Generator, "set_offset")
    g = torch.Generator(device="neuron").manual_seed(8)
    assert g.get_offset() == 0
    first = torch.rand(4, device="neuron", generator=g)
    assert g.get_offset() == 4
    second = torch.rand(4, device="neuron", generator=g)
    assert g.get_offset() == 8
    torch.rand(5, device="neuron", generator=g)
    assert g.get_offset() == 16  # 5 values round up to 8
    torch.rand(1, device="neuron", generator=g)
    assert g.get_offset() == 20
    for n in (1, 3, 7, 100, 1001):
        before = g.get_offset()
        torch.randn(n, device="neuron", generator=g)
        step = g.get_offset() - before
        assert step % 4 == 0 and step >= n and step - n < 4
    # Offsets select the stream deterministically.
    g.set_offset(4)
    assert torch.equal(torch.rand(4, device="neuron", generator=g).cpu(), second.cpu())
    g.set_offset(0)
    assert torch.equal(torch.rand(4, device="neuron", generator=g).cpu(), first.cpu())
    g.set_offset(1000)
    assert not torch.equal(torch.rand(4, device="neuron", generator=g).cpu(), first.cpu())
    with pytest.raises(RuntimeError, match="multiple of 4"):
        g.set_offset(6)
    assert g.get_offset() == 1004


def test_generator_state_and_clone():
    g = torch.Generator(device="neuron").manual_seed(21)
    torch.rand(3, device="neuron", generator=g)
    state = g.get_state()
    assert state[:8].tolist() == list(struct.pack("<Q", 21))
    assert struct.unpack("<Q", bytes(state[8:].tolist()))[0] == g.get_offset() == 4
    twin = g.clone_state()
    assert twin.device == g.device and twin.get_offset() == 4
    a = torch.randn(12, device="neuron", generator=g)
    b = torch.randn(12, device="neuron", generator=twin)
    assert torch.equal(a.cpu(), b.cpu())
    g.set_state(state)
    assert torch.equal(torch.randn(12, device="neuron", generator=g).cpu(), a.cpu())


# ---- distributions -------------------------------------------------------------------------------------------------

N = 100_000


def test_uniform_and_normal_moments():
    torch.neuron.manual_seed(2024)
    u = torch.rand(N, device="neuron").cpu().double()
    assert 0.0 <= u.min().item() and u.max().item() < 1.0
    assert abs(u.mean().item() - 0.5) < 0.01
    assert abs(u.std().item() - (1 / 12) ** 0.5) < 0.01
    z = torch.randn(N, device="neuron").cpu().double()
    assert abs(z.mean().item()) < 0.02
    assert abs(z.std().item() - 1.0) < 0.02
    n = torch.empty(N, device="neuron").normal_(3.0, 0.5).cpu().double()
    assert abs(n.mean().item() - 3.0) < 0.01 and abs(n.std().item() - 0.5) < 0.01
    v = torch.empty(N, device="neuron").uniform_(-2.0, 6.0).cpu().double()
    assert -2.0 <= v.min().item() and v.max().item() < 6.0 and abs(v.mean().item() - 2.0) < 0.05
    e = torch.empty(N, device="neuron").exponential_(2.0).cpu().double()
    assert abs(e.mean().item() - 0.5) < 0.01


def test_bernoulli_and_dropout_rates():
    torch.neuron.manual_seed(7)
    b = torch.bernoulli(torch.full((N,), 0.3, device="neuron")).cpu()
    assert set(b.unique().tolist()) <= {0.0, 1.0}
    assert abs(b.mean().item() - 0.3) < 0.01
    d = F.dropout(torch.ones(N, device="neuron"), p=0.25).cpu()
    assert set(d.unique().tolist()) == {0.0, torch.tensor(1.0 / 0.75).item()}
    assert abs((d == 0).double().mean().item() - 0.25) < 0.01


def test_randint_range_and_coverage():
    torch.neuron.manual_seed(3)
    r = torch.randint(-4, 7, (N,), device="neuron")
    assert r.dtype == torch.int64
    r = r.cpu()
    assert r.min().item() == -4 and r.max().item() == 6
    counts = torch.bincount(r + 4, minlength=11)
    assert counts.numel() == 11 and (counts > N / 11 * 0.9).all()


def test_randperm_is_permutation():
    torch.neuron.manual_seed(4)
    for n in (1, 10, 1000):
        p = torch.randperm(n, device="neuron")
        assert p.device.type == "neuron" and p.dtype == torch.int64
        assert torch.equal(p.cpu().sort().values, torch.arange(n))
    big = torch.randperm(1000, device="neuron").cpu()
    assert not torch.equal(big, torch.arange(1000))


def test_multinomial_respects_weights():
    torch.neuron.manual_seed(5)
    w = torch.tensor([0.0, 1.0, 3.0, 0.0], device="neuron")
    s = torch.multinomial(w, N, replacement=True).cpu()
    assert set(s.unique().tolist()) == {1, 2}
    assert abs((s == 2).double().mean().item() - 0.75) < 0.01
    no_repl = torch.multinomial(torch.ones(20, device="neuron"), 20).cpu()
    assert torch.equal(no_repl.sort().values, torch.arange(20))


# ---- dropout and checkpointing -------------------------------------------------------------------------------------

def test_dropout_draws_from_neuron_generator(philox_rng):
    """aten::native_dropout has no Generator argument; in philox mode it must still draw from the neuron generator."""
    x = torch.ones(64, device="neuron")
    torch.neuron.manual_seed(0)
    a = F.dropout(x, 0.5)
    assert torch.neuron.default_generators[0].get_offset() >= 64  # the mask consumed the neuron stream
    torch.neuron.manual_seed(0)
    torch.rand(3)  # CPU RNG use must not change neuron dropout masks
    b = F.dropout(x, 0.5)
    assert torch.equal(a.cpu(), b.cpu())
    c = F.dropout(x, 0.5)
    assert not torch.equal(a.cpu(), c.cpu())


def test_dropout_reproducible_under_torch_manual_seed():
    x = torch.ones(256, device="neuron")
    torch.manual_seed(0)
    a = F.dropout(x, 0.5)
    torch.manual_seed(0)
    b = F.dropout(x, 0.5)
    assert torch.equal(a.cpu(), b.cpu())
    assert 0 < (a == 0).sum().item() < 256


def _block(lin):
    def f(x):
        h = F.dropout(lin(x), 0.5, training=True)
        noise = torch.rand_like(h)  # draws from the neuron generator
        return (h * noise).tanh()
    return f


@pytest.mark.parametrize("use_reentrant", [False, True])
def test_checkpoint_preserves_rng_state(use_reentrant):
    torch.manual_seed(0)
    lin = torch.nn.Linear(16, 16).neuron()
    x = torch.randn(8, 16, device="neuron", requires_grad=True)
    f = _block(lin)

    torch.manual_seed(123)
    ref = f(x)
    ref.sum().backward()
    ref_x, ref_w = x.grad.clone(), lin.weight.grad.clone()
    x.grad = None
    lin.weight.grad = None

    torch.manual_seed(123)
    out = checkpoint(f, x, use_reentrant=use_reentrant, preserve_rng_state=True)
    out.sum().backward()
    assert torch.equal(out.detach().cpu(), ref.detach().cpu())
    assert torch.equal(x.grad.cpu(), ref_x.cpu())
    assert torch.equal(lin.weight.grad.cpu(), ref_w.cpu())
    # Without restoring the state the recomputation draws new numbers.
    x.grad = None
    lin.weight.grad = None
    torch.manual_seed(123)
    out = checkpoint(f, x, use_reentrant=use_reentrant, preserve_rng_state=False)
    out.sum().backward()
    assert not torch.equal(x.grad.cpu(), ref_x.cpu())


def test_checkpoint_restores_neuron_state_only():
    """The recomputation must reproduce neuron draws even if the CPU stream is unaffected."""
    torch.manual_seed(0)
    x = torch.randn(32, device="neuron", requires_grad=True)

    def f(t):
        return t * torch.rand_like(t)

    torch.neuron.manual_seed(5)
    ref = f(x)
    ref.sum().backward()
    ref_grad = x.grad.clone()
    x.grad = None
    torch.neuron.manual_seed(5)
    out = checkpoint(f, x, use_reentrant=False)
    torch.rand(8, device="neuron")  # advance the neuron stream before the recomputation
    out.sum().backward()
    assert torch.equal(x.grad.cpu(), ref_grad.cpu())
    assert_same(out.detach(), ref.detach().cpu())
