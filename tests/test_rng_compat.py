"""Random numbers as code written for TorchNeuron sees them (issue 22, "Random numbers").

In rng mode "cpu" (the default) a neuron run seeded with ``torch.manual_seed``
draws the numbers of its CPU run: the default neuron generators draw from the
CPU default generator's engine, in program order. Mode "philox" (API or
``TORCH_NEURONX_RNG``) draws from the counter stream (seed, offset), which is
also what a state naming an offset without a snapshot (DTensor) selects.
"""
import struct

import pytest
import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from conftest import assert_same, run_json, run_python

FLOATS = [torch.float32, torch.bfloat16, torch.float16, torch.float64]
SIZES = [7, 16, 100]  # CPU's normal_ takes another algorithm from 16 contiguous values on


def _offset(state):
    return struct.unpack("<Q", bytes(state[8:16].tolist()))[0]


def _with_offset(state, offset):
    out = state.clone()
    out[8:16] = torch.tensor(list(struct.pack("<Q", offset)), dtype=torch.uint8)
    return out


# Each sampler: (device, dtype, n) -> tensor. All draw from the default generator.
FLOAT_SAMPLERS = {
    "randn": lambda d, dt, n: torch.randn(n, device=d, dtype=dt),
    "rand": lambda d, dt, n: torch.rand(n, 2, device=d, dtype=dt),
    "randn_like": lambda d, dt, n: torch.randn_like(torch.zeros(n, device=d, dtype=dt)),
    "rand_like": lambda d, dt, n: torch.rand_like(torch.zeros(3, n, device=d, dtype=dt)),
    "normal_": lambda d, dt, n: torch.empty(n, device=d, dtype=dt).normal_(2.0, 3.0),
    "normal_tensor": lambda d, dt, n: torch.normal(torch.arange(n, device=d, dtype=dt), 0.5),
    "uniform_": lambda d, dt, n: torch.empty(n, device=d, dtype=dt).uniform_(-2, 5),
    "exponential_": lambda d, dt, n: torch.empty(n, device=d, dtype=dt).exponential_(1.5),
    "bernoulli_tensor_p": lambda d, dt, n: torch.bernoulli(torch.linspace(0, 1, n, device=d, dtype=dt)),
    "bernoulli_scalar_p": lambda d, dt, n: torch.empty(n, device=d, dtype=dt).bernoulli_(0.3),
    "multinomial": lambda d, dt, n: torch.multinomial(torch.arange(1, n + 1, device=d, dtype=dt), n // 2),
    "multinomial_replacement": lambda d, dt, n: torch.multinomial(
        torch.arange(1, n + 1, device=d, dtype=dt), 2 * n, replacement=True),
}

INT_SAMPLERS = {
    "randint": lambda d, n: torch.randint(-5, 9, (n,), device=d),
    "randint_like": lambda d, n: torch.randint_like(torch.zeros(n, 2, device=d, dtype=torch.int64), 100),
    "random_": lambda d, n: torch.empty(n, device=d, dtype=torch.int64).random_(0, 1000),
    "randperm": lambda d, n: torch.randperm(n, device=d),
}


def _seeded(fn, device, seed=1234):
    torch.manual_seed(seed)
    return fn(device)


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("dtype", FLOATS, ids=str)
@pytest.mark.parametrize("name", FLOAT_SAMPLERS)
def test_float_samplers_equal_cpu(name, dtype, n):
    sample = FLOAT_SAMPLERS[name]
    ref = _seeded(lambda d: sample(d, dtype, n), "cpu")
    out = _seeded(lambda d: sample(d, dtype, n), "neuron")
    assert out.device.type == "neuron"
    assert_same(out, ref, rtol=0, atol=0)


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("name", INT_SAMPLERS)
def test_int_samplers_equal_cpu(name, n):
    sample = INT_SAMPLERS[name]
    assert_same(_seeded(lambda d: sample(d, n), "neuron"), _seeded(lambda d: sample(d, n), "cpu"))


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
@pytest.mark.parametrize("shape", [(7,), (64, 33)])
def test_dropout_equals_cpu(dtype, shape):
    x = torch.randn(shape, generator=torch.Generator().manual_seed(0)).to(dtype)
    ref = _seeded(lambda d: F.dropout(x.to(d), p=0.4, training=True), "cpu")
    out = _seeded(lambda d: F.dropout(x.to(d), p=0.4, training=True), "neuron")
    # Same mask; CPU scales the mask before the multiply, the fused neuron kernel after.
    assert torch.equal(out.cpu() == 0, ref == 0)
    assert_same(out, ref)


def _mixed_script(dev):
    """A training-like script: model init and data on the CPU, noise and dropout on the device."""
    torch.manual_seed(7)
    lin = torch.nn.Linear(8, 8)  # CPU draws
    out = [lin.weight.detach().clone()]
    x = torch.randn(4, 8).to(dev)
    out.append(torch.randn(4, 8, device=dev))
    out.append(torch.rand(3))
    out.append(F.dropout(lin.to(dev)(x), 0.5))
    out.append(torch.randint(0, 10, (20,)))
    out.append(torch.randn_like(x) + torch.rand(1).item())
    out.append(torch.randperm(12, device=dev))
    return [t.detach().cpu() for t in out]


def test_mixed_cpu_and_neuron_sequence_equals_cpu_run():
    ref = _mixed_script("cpu")
    out = _mixed_script("neuron")
    for i, (a, b) in enumerate(zip(out, ref)):
        torch.testing.assert_close(a, b, msg=f"draw {i}")
    # The CPU generator ends where the CPU run left it.
    _mixed_script("cpu")
    after_cpu = torch.get_rng_state()
    _mixed_script("neuron")
    assert torch.equal(torch.get_rng_state(), after_cpu)


def test_explicit_generator_equals_cpu_generator():
    g = torch.Generator(device="neuron").manual_seed(99)
    c = torch.Generator().manual_seed(99)
    for sample in (lambda d, gen: torch.randn(37, device=d, generator=gen),
                   lambda d, gen: torch.rand(5, device=d, generator=gen),
                   lambda d, gen: torch.randint(0, 50, (30,), device=d, generator=gen),
                   lambda d, gen: torch.randperm(20, device=d, generator=gen),
                   lambda d, gen: torch.empty(40, device=d).bernoulli_(0.5, generator=gen)):
        assert_same(sample("neuron", g), sample("cpu", c), rtol=0, atol=0)
    # Its engine is its own: neither the CPU stream nor the default generators move.
    torch.manual_seed(1)
    cpu_state, dev_state = torch.get_rng_state(), torch.neuron.get_rng_state()
    torch.randn(100, device="neuron", generator=g)
    assert torch.equal(torch.get_rng_state(), cpu_state)
    assert torch.equal(torch.neuron.get_rng_state(), dev_state)
    # A fresh generator starts from the CPU generator's default seed.
    assert_same(torch.randn(8, device="neuron", generator=torch.Generator(device="neuron")),
                torch.randn(8, generator=torch.Generator()), rtol=0, atol=0)


def test_torch_manual_seed_seeds_every_device():
    torch.manual_seed(31)
    assert [g.initial_seed() for g in torch.neuron.default_generators] == [31, 31]
    assert torch.neuron.initial_seed() == 31
    a = torch.randn(6, device="neuron:1")
    torch.manual_seed(31)
    assert_same(a, torch.randn(6), rtol=0, atol=0)


@pytest.mark.parametrize("mode", ["cpu", "philox"])
def test_rng_state_round_trips(mode):
    torch.neuron.set_rng_mode(mode)
    try:
        torch.manual_seed(5)
        torch.randn(3, device="neuron")
        state = torch.neuron.get_rng_state()
        assert state.dtype == torch.uint8 and state.shape == (16,)  # the product's layout
        assert state[:8].tolist() == list(struct.pack("<Q", 5))
        first = torch.randn(50, device="neuron")
        dropped = F.dropout(torch.ones(40, device="neuron"), 0.5)
        torch.rand(9)  # CPU draws in between
        torch.neuron.set_rng_state(state)
        assert torch.equal(torch.randn(50, device="neuron").cpu(), first.cpu())
        assert torch.equal(F.dropout(torch.ones(40, device="neuron"), 0.5).cpu(), dropped.cpu())
        # All devices at once.
        states = torch.neuron.get_rng_state_all()
        x0, x1 = torch.rand(4, device="neuron:0"), torch.rand(4, device="neuron:1")
        torch.neuron.set_rng_state_all(states)
        torch.neuron.set_rng_state(states[0], 0)  # (in cpu mode both name the shared engine)
        assert torch.equal(torch.rand(4, device="neuron:0").cpu(), x0.cpu())
        torch.neuron.set_rng_state_all(states)
        if mode == "philox":
            assert torch.equal(torch.rand(4, device="neuron:1").cpu(), x1.cpu())
        # Generator get_state / set_state / clone_state.
        g = torch.Generator(device="neuron").manual_seed(21)
        torch.rand(3, device="neuron", generator=g)
        gs = g.get_state()
        twin = g.clone_state()
        a = torch.randn(12, device="neuron", generator=g)
        assert torch.equal(torch.randn(12, device="neuron", generator=twin).cpu(), a.cpu())
        g.set_state(gs)
        assert torch.equal(torch.randn(12, device="neuron", generator=g).cpu(), a.cpu())
    finally:
        torch.neuron.set_rng_mode("cpu")


def test_state_moves_between_generators_and_copies():
    import copy
    import pickle

    g = torch.Generator(device="neuron").manual_seed(5)
    torch.randn(3, device="neuron", generator=g)
    state = g.get_state()
    other = torch.Generator(device="neuron")
    other.set_state(state)
    twins = [other, copy.deepcopy(g), pickle.loads(pickle.dumps(g))]
    expect = torch.randn(9, device="neuron", generator=g).cpu()
    for t in twins:
        assert torch.equal(torch.randn(9, device="neuron", generator=t).cpu(), expect)
    # ... and they are the CPU generator's numbers.
    c = torch.Generator().manual_seed(5)
    torch.randn(3, generator=c)
    assert torch.equal(torch.randn(9, generator=c), expect)


def test_state_after_cpu_draws_names_a_new_snapshot():
    # Two get_rng_state calls at one offset with CPU draws between them name
    # different engine states, so they must be different states.
    torch.manual_seed(2)
    s1 = torch.neuron.get_rng_state()
    torch.rand(5)
    s2 = torch.neuron.get_rng_state()
    assert not torch.equal(s1, s2) and _offset(s2) > _offset(s1)
    after_s2 = torch.randn(10, device="neuron").cpu()
    torch.neuron.set_rng_state(s1)
    after_s1 = torch.randn(10, device="neuron").cpu()
    torch.manual_seed(2)
    assert torch.equal(after_s1, torch.randn(10))
    torch.neuron.set_rng_state(s2)
    assert torch.equal(torch.randn(10, device="neuron").cpu(), after_s2)


def test_many_states_restored_out_of_order():
    """A long run names thousands of states (Trainer's checkpointed layers: one per call) and goes
    back to older ones; each restore draws that state's numbers. In a fresh process: restoring
    a state moves its snapshot to the registry's back, which once crashed when the registry grew."""
    proc = run_python("""
import torch, torch_neuronx
torch.manual_seed(3)
states, draws = [], []
for i in range(3000):
    torch.rand(1)  # a CPU draw moves the shared engine: the next state is a new snapshot
    states.append(torch.neuron.get_rng_state())
    draws.append(torch.randn(4, device="neuron").cpu())
    j = (i * 7919) % len(states)
    if i % 3 == 2 and j >= len(states) - 2000:  # still held (the registry keeps the last 2048)
        torch.neuron.set_rng_state(states[j])
        assert torch.equal(torch.randn(4, device="neuron").cpu(), draws[j]), (i, j)
print("restored")
""")
    assert proc.stdout.strip().endswith("restored")


def test_states_saved_by_another_process_resume_the_cpu_stream(tmp_path):
    """Accelerate's save_state/load_state: CPU state and torch.neuron states to a file, restored
    in a new process (CPU state first); the resumed draws are those of the uninterrupted run."""
    path = str(tmp_path / "rng.pt")
    save = run_json(f"""
import json, torch, torch_neuronx, torch.nn.functional as F
torch.manual_seed(12)
torch.randn(7, device="neuron"); torch.rand(3); F.dropout(torch.ones(50, device="neuron"), 0.5)
torch.save({{"cpu": torch.get_rng_state(), "neuron": torch.neuron.get_rng_state_all()}}, {path!r})
after = [torch.randn(6, device="neuron").cpu(), F.dropout(torch.ones(30, device="neuron"), 0.5).cpu(), torch.rand(4)]
print(json.dumps([t.tolist() for t in after]))
""")
    resumed = run_json(f"""
import json, torch, torch_neuronx, torch.nn.functional as F
torch.manual_seed(99)
torch.randn(100, device="neuron")
states = torch.load({path!r})
torch.set_rng_state(states["cpu"])
torch.neuron.set_rng_state_all(states["neuron"])
after = [torch.randn(6, device="neuron").cpu(), F.dropout(torch.ones(30, device="neuron"), 0.5).cpu(), torch.rand(4)]
print(json.dumps([t.tolist() for t in after]))
""")
    assert resumed == save


def test_seed_only_state_reseeds():
    # The product accepts an 8-byte state: the seed, offset 0.
    torch.manual_seed(0)
    torch.neuron.set_rng_state(torch.tensor(list(struct.pack("<Q", 77)), dtype=torch.uint8))
    assert torch.neuron.initial_seed() == 77
    out = torch.randn(20, device="neuron")
    torch.manual_seed(77)
    assert_same(out, torch.randn(20), rtol=0, atol=0)


def test_fork_rng_round_trip():
    torch.manual_seed(3)
    with torch.random.fork_rng(devices=range(torch.neuron.device_count()), device_type="neuron"):
        inner = torch.randn(10, device="neuron").cpu()
        torch.rand(4)
    outer = torch.randn(10, device="neuron").cpu()
    assert torch.equal(inner, outer)
    torch.manual_seed(3)
    assert torch.equal(outer, torch.randn(10))


def test_checkpoint_recomputation_matches_cpu():
    def block(x):
        return F.dropout(x.sin(), 0.3, training=True) * torch.rand_like(x)

    grads = {}
    for dev in ("cpu", "neuron"):
        torch.manual_seed(11)
        x = torch.randn(16, 16, device=dev, requires_grad=True)
        out = checkpoint(block, x, use_reentrant=False)
        out.sum().backward()
        grads[dev] = (out.detach().cpu(), x.grad.cpu())
    torch.testing.assert_close(grads["neuron"], grads["cpu"])


def test_moved_offset_addresses_philox_stream():
    """DTensor's OffsetBasedRNGTracker sets states with per-shard offsets: those draw from (seed, offset)."""
    from torch.distributed.tensor._random import _PhiloxState

    torch.manual_seed(8)
    torch.randn(5, device="neuron")
    tracker_state = _PhiloxState(torch.neuron.get_rng_state())  # 16 bytes, as _PhiloxState requires
    tracker_state.offset = tracker_state.offset + 64
    moved = tracker_state.state.clone()
    torch.neuron.set_rng_state(moved)
    a = torch.randn(30, device="neuron").cpu()
    d = F.dropout(torch.ones(20, device="neuron"), 0.5).cpu()
    end = torch.neuron.get_rng_state()
    # The same (seed, offset) in philox mode gives the same numbers.
    torch.neuron.set_rng_mode("philox")
    try:
        torch.neuron.set_rng_state(moved)
        assert torch.equal(torch.randn(30, device="neuron").cpu(), a)
        assert torch.equal(F.dropout(torch.ones(20, device="neuron"), 0.5).cpu(), d)
        assert torch.equal(torch.neuron.get_rng_state(), end)
    finally:
        torch.neuron.set_rng_mode("cpu")
    # Again in cpu mode, and set_offset too; these are not the CPU's numbers.
    torch.neuron.set_rng_state(moved)
    assert torch.equal(torch.randn(30, device="neuron").cpu(), a)
    torch.manual_seed(8)
    torch.randn(5)
    assert not torch.equal(torch.randn(30), a)
    g = torch.neuron.default_generators[0]
    g.set_offset(_offset(moved))
    assert torch.equal(torch.randn(30, device="neuron").cpu(), a)
    # Reseeding returns to the CPU engine.
    torch.manual_seed(8)
    assert_same(torch.randn(30, device="neuron"), (torch.manual_seed(8), torch.randn(30))[1], rtol=0, atol=0)


def test_rng_mode_api(philox_rng):
    assert torch.neuron.get_rng_mode() == "philox"
    torch.manual_seed(4)
    cpu_state = torch.get_rng_state()
    a = torch.randn(20, device="neuron")
    assert torch.equal(torch.get_rng_state(), cpu_state)  # the CPU stream is not touched
    torch.manual_seed(4)
    assert not torch.equal(a.cpu(), torch.randn(20))
    torch.neuron.manual_seed(4)
    assert torch.equal(torch.randn(20, device="neuron").cpu(), a.cpu())
    with pytest.raises(ValueError, match="rng mode"):
        torch.neuron.set_rng_mode("mt19937")
    assert torch.neuron.get_rng_mode() == "philox"


_MODE_PROBE = """
import json, torch, torch_neuronx
torch.manual_seed(6)
a = torch.randn(10, device="neuron").cpu()
torch.manual_seed(6)
print(json.dumps({"mode": torch.neuron.get_rng_mode(), "equal_cpu": torch.equal(a, torch.randn(10))}))
"""


@pytest.mark.parametrize("value, mode", [(None, "cpu"), ("", "cpu"), ("cpu", "cpu"), ("philox", "philox")])
def test_rng_mode_from_env(value, mode):
    got = run_json(_MODE_PROBE, env={"TORCH_NEURONX_RNG": value})
    assert got == {"mode": mode, "equal_cpu": mode == "cpu"}


def test_malformed_rng_env_raises_value_error_at_first_device_use():
    proc = run_python("""
import torch
torch.manual_seed(0); torch.randn(3)  # CPU work is unaffected
try:
    torch.ones(2, device="neuron")
except ValueError as e:
    print("VALUE_ERROR", e)
""", env={"TORCH_NEURONX_RNG": "Philox4x32"})
    assert "VALUE_ERROR" in proc.stdout and "TORCH_NEURONX_RNG='Philox4x32'" in proc.stdout, proc.stdout
    assert "cpu or philox" in proc.stdout
