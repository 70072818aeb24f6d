"""nl.rand, nl.dropout and nisa.dropout: Philox4x32-10 keyed once per kernel
call from torch's default generator (nki/_philox.py). The same seed gives the
same bits on both executors, on CPU, on the neuron device and through
nki.simulate; different calls differ; dropout keeps about 1 - p of the values."""
import numpy as np
import pytest
import torch

import nki
import nki.isa as nisa
import nki.language as nl
from nki import _philox


@nki.jit
def rand_kernel(x):
    t = nl.rand((x.shape[0], x.shape[1]))
    u = nl.rand((x.shape[0], x.shape[1]))  # a second stream: other numbers
    o1 = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.shared_hbm)
    o2 = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.shared_hbm)
    nl.store(o1, t)
    nl.store(o2, u)
    return o1, o2


@nki.jit
def dropout_kernel(x, p):
    a = nl.load(x)
    d = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
    nisa.dropout(dst=d, data=a, prob=p)
    o1 = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    o2 = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    nl.store(o1, d)
    nl.store(o2, nl.dropout(a, p))
    return o1, o2


def _philox_reference(key, stream, n):
    """Philox4x32-10 in plain Python integers (the published algorithm)."""
    M0, M1, W0, W1, MASK = 0xD2511F53, 0xCD9E8D57, 0x9E3779B9, 0xBB67AE85, 0xFFFFFFFF
    out = []
    for block in range((n + 3) // 4):
        c = [block & MASK, block >> 32, stream & MASK, stream >> 32]
        k0, k1 = key & MASK, key >> 32
        for _ in range(10):
            p0, p1 = M0 * c[0], M1 * c[2]
            c = [(p1 >> 32) ^ c[1] ^ k0, p1 & MASK, (p0 >> 32) ^ c[3] ^ k1, p0 & MASK]
            k0, k1 = (k0 + W0) & MASK, (k1 + W1) & MASK
        out += c
    return torch.tensor([(w >> 8) / 16777216.0 for w in out[:n]], dtype=torch.float32)


def test_uniform_is_philox():
    key = 0x0123456789ABCDEF
    for stream in (0, 5):
        got = _philox.uniform(key, stream, (3, 7)).reshape(-1)
        assert torch.equal(got, _philox_reference(key, stream, 21))


@pytest.mark.parametrize("executor", ["interpreter", "native"])
@pytest.mark.parametrize("device", ["cpu", "neuron"])
def test_rand_same_seed_same_numbers(executor, device, monkeypatch):
    monkeypatch.setenv("NKI_EXECUTOR", executor)
    x = torch.zeros(64, 40, device=device)
    torch.manual_seed(7)
    a1, a2 = rand_kernel(x)
    torch.manual_seed(7)
    b1, b2 = rand_kernel(x)
    assert torch.equal(a1.cpu(), b1.cpu()) and torch.equal(a2.cpu(), b2.cpu())
    c1, _ = rand_kernel(x)  # the next call: a new key
    assert not torch.equal(a1.cpu(), c1.cpu())
    assert not torch.equal(a1.cpu(), a2.cpu())  # two instructions, two streams
    u = a1.cpu()
    assert u.min() >= 0 and u.max() < 1 and abs(u.mean().item() - 0.5) < 0.05
    # The numbers are the documented Philox stream of the key drawn from torch's generator.
    torch.manual_seed(7)
    key = _philox.draw_key()
    assert torch.equal(u, _philox.uniform(key, 0, (64, 40)))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int32])
def test_executors_agree_and_numpy(dtype, monkeypatch):
    x = (torch.randn(128, 96) * 8).to(dtype)
    outs = {}
    for executor in ("interpreter", "native"):
        monkeypatch.setenv("NKI_EXECUTOR", executor)
        for device in ("cpu", "neuron"):
            torch.manual_seed(3)
            outs[executor, device] = [t.cpu() for t in dropout_kernel(x.to(device), 0.4)]
    monkeypatch.setenv("NKI_EXECUTOR", "auto")
    if dtype != torch.bfloat16:  # NumPy has no bfloat16
        torch.manual_seed(3)
        sim = nki.simulate(dropout_kernel)(x.numpy(), 0.4)
        outs["simulate"] = [torch.from_numpy(np.asarray(t)) for t in sim]
    ref = outs["interpreter", "cpu"]
    for k, v in outs.items():
        for o, r in zip(v, ref):
            assert torch.equal(o, r), k


@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_dropout_statistics(p, monkeypatch):
    monkeypatch.setenv("NKI_EXECUTOR", "native")
    x = torch.rand(128, 512) + 1.0  # no zeros of its own
    torch.manual_seed(11)
    d1, d2 = dropout_kernel(x.to("neuron"), p)
    d1, d2 = d1.cpu(), d2.cpu()
    kept = d1 != 0
    n = kept.numel()
    # Binomial(n, 1 - p): 5 standard deviations.
    assert abs(kept.sum().item() - n * (1 - p)) < 5 * (n * p * (1 - p)) ** 0.5
    assert torch.equal(d1[kept], x[kept])
    k2 = d2 != 0
    assert torch.allclose(d2[k2], x[k2] / (1 - p))
    assert not torch.equal(kept, k2)  # nisa.dropout and nl.dropout draw different streams


@nki.jit
def dropout_tile_rate_kernel(x, rate):
    a = nl.load(x)
    r = nl.load(rate)  # [1, 1]: the rate read at run time
    d = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
    nisa.dropout(dst=d, data=a, prob=r)
    o1 = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    o2 = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    nl.store(o1, d)
    nl.store(o2, nl.dropout(a, r))
    return o1, o2


def test_dropout_rate_in_a_tile(monkeypatch):
    x = torch.rand(64, 80) + 1.0
    rate = torch.tensor([[0.3]])
    outs = {}
    for executor in ("interpreter", "native"):
        monkeypatch.setenv("NKI_EXECUTOR", executor)
        torch.manual_seed(5)
        outs[executor] = [t.cpu() for t in dropout_tile_rate_kernel(x.to("neuron"), rate.to("neuron"))]
    for o, r in zip(outs["native"], outs["interpreter"]):
        assert torch.equal(o, r)
    d1, d2 = outs["native"]
    assert abs((d1 != 0).float().mean().item() - 0.7) < 0.05
    k = d2 != 0
    assert torch.equal(d2[k], x[k] / torch.tensor(1 - 0.3, dtype=torch.float64).float())
