"""Training on ``neuron`` matches training on CPU.

Every test builds its model on CPU under a fixed seed, deep-copies it to ``neuron`` and
runs the same steps on both devices; losses, gradients and final parameters are compared
within fp32 tolerance (bf16/fp16 tolerance under autocast). After each test the host
fallback report must be empty: every op the training step needs has a neuron kernel.
"""

from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.utils.checkpoint as ckpt

import torch_neuronx

DEV = "neuron"
FP32 = dict(rtol=1e-5, atol=1e-6)


# ----------------------------------------------------------------------------- helpers
@pytest.fixture(autouse=True)
def no_fallback():
    """(h) every test must run without the generic host fallback."""
    torch_neuronx.reset_fallback_report()
    yield
    report = torch_neuronx.fallback_report()
    if report:
        print(f"\nfallback report: {report}")
    assert report == {}, f"ops hit the host fallback: {report}"


def to_cpu(t):
    return t.detach().to("cpu")


def assert_close(actual, expected, **tol):
    """``actual`` on neuron, ``expected`` on CPU."""
    if isinstance(actual, torch.Tensor):
        assert actual.device.type == DEV, actual.device
        torch.testing.assert_close(to_cpu(actual), expected, **(tol or FP32))
    else:
        torch.testing.assert_close(actual, expected, **(tol or FP32))


def assert_params_close(model_dev, model_cpu, grads=False, **tol):
    pd = dict(model_dev.named_parameters())
    for name, p_cpu in model_cpu.named_parameters():
        p_dev = pd[name]
        a, b = (p_dev.grad, p_cpu.grad) if grads else (p_dev, p_cpu)
        if b is None:
            assert a is None, name
            continue
        assert a.device.type == DEV, (name, a.device)
        torch.testing.assert_close(to_cpu(a), to_cpu(b), msg=lambda m: f"{name}: {m}", **(tol or FP32))


def assert_buffers_close(model_dev, model_cpu, **tol):
    bd = dict(model_dev.named_buffers())
    for name, b_cpu in model_cpu.named_buffers():
        torch.testing.assert_close(to_cpu(bd[name]), b_cpu, msg=lambda m: f"{name}: {m}", **(tol or FP32))


def pair(builder, seed=0):
    """The model built on CPU under ``seed`` and a copy of it on neuron."""
    torch.manual_seed(seed)
    cpu = builder()
    dev = copy.deepcopy(cpu).to(DEV)
    return cpu, dev


def train(model, opt, batches, loss_fn, device, steps, clip=None):
    losses = []
    for i in range(steps):
        inputs, target = (t.to(device) for t in batches[i % len(batches)])
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(inputs), target)
        loss.backward()
        if clip is not None:
            clip(model.parameters())
        opt.step()
        losses.append(loss.detach())
    return torch.stack(losses)  # stays on ``device``


# ----------------------------------------------------------------------------- (a) MLP
def make_mlp():
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 4))


def mlp_batches(n=5, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(8, 16, generator=g), torch.randint(0, 4, (8,), generator=g)) for _ in range(n)]


OPTIMIZERS = {
    "sgd-foreach": lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, weight_decay=1e-4, foreach=True),
    "sgd-fused": lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, weight_decay=1e-4, fused=True),
    "adamw-foreach": lambda p: torch.optim.AdamW(p, lr=1e-2, weight_decay=1e-2, foreach=True),
    "adamw-fused": lambda p: torch.optim.AdamW(p, lr=1e-2, weight_decay=1e-2, fused=True),
}


@pytest.mark.parametrize("opt_name", list(OPTIMIZERS))
def test_mlp_training_matches_cpu(opt_name):
    make_opt = OPTIMIZERS[opt_name]
    cpu, dev = pair(make_mlp)
    batches = mlp_batches()
    opt_cpu, opt_dev = make_opt(cpu.parameters()), make_opt(dev.parameters())
    l_cpu = train(cpu, opt_cpu, batches, F.cross_entropy, "cpu", 5)
    l_dev = train(dev, opt_dev, batches, F.cross_entropy, DEV, 5)
    assert_close(l_dev, l_cpu)
    assert_params_close(dev, cpu)
    # optimizer state lives on neuron and matches
    for p_cpu, p_dev in zip(cpu.parameters(), dev.parameters()):
        for key, s_cpu in opt_cpu.state[p_cpu].items():
            s_dev = opt_dev.state[p_dev][key]
            if key == "step" and s_dev.device.type == "cpu":  # capturable=False keeps step on CPU
                torch.testing.assert_close(s_dev, s_cpu)
            else:
                assert_close(s_dev, s_cpu)


OPTIMIZER_ZOO = [
    (torch.optim.AdamW, dict(amsgrad=True, foreach=True)),
    (torch.optim.AdamW, dict(amsgrad=True, fused=True)),
    (torch.optim.Adam, dict(fused=True)),
    (torch.optim.Adagrad, dict(fused=True)),
    (torch.optim.SGD, dict(nesterov=True, momentum=0.9, foreach=True)),
    (torch.optim.SGD, dict(foreach=False)),
    (torch.optim.RMSprop, dict(foreach=True)),
    (torch.optim.NAdam, dict(foreach=True)),
    (torch.optim.RAdam, dict(foreach=True)),
    (torch.optim.Adamax, dict(foreach=True)),
    (torch.optim.Rprop, dict(foreach=True)),
]


@pytest.mark.parametrize("cls,kw", OPTIMIZER_ZOO, ids=lambda v: v.__name__ if isinstance(v, type) else
                         "-".join(f"{k}={x}" for k, x in v.items()))
@pytest.mark.parametrize("capturable", [False, True])
def test_optimizer_zoo_matches_cpu(cls, kw, capturable):
    """Other optimizers/flags; ``capturable=True`` (state steps on neuron) against CPU's non-capturable run."""
    if capturable and ("fused" in kw or cls in (torch.optim.SGD, torch.optim.Adagrad)):
        pytest.skip("no capturable variant")
    cpu, dev = pair(make_mlp)
    batches = mlp_batches(3)
    opt_cpu = cls(cpu.parameters(), lr=1e-2, **kw)
    opt_dev = cls(dev.parameters(), lr=1e-2, **kw, **({"capturable": True} if capturable else {}))
    l_cpu = train(cpu, opt_cpu, batches, F.cross_entropy, "cpu", 3)
    l_dev = train(dev, opt_dev, batches, F.cross_entropy, DEV, 3)
    assert_close(l_dev, l_cpu)
    assert_params_close(dev, cpu)
    if capturable:
        assert opt_dev.state[next(dev.parameters())]["step"].device.type == DEV


# ----------------------------------------------------------------------------- (b) tiny transformer
class Block(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, 4 * d)
        self.fc2 = nn.Linear(4 * d, d)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class TinyLM(nn.Module):
    def __init__(self, vocab=64, d=32, heads=4, layers=2, seq=16, encoder_layer=False):
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Parameter(torch.randn(seq, d) * 0.02)
        if encoder_layer:
            self.blocks = nn.ModuleList(
                nn.TransformerEncoderLayer(d, heads, 4 * d, dropout=0.0, activation="gelu", batch_first=True, norm_first=True)
                for _ in range(layers)
            )
        else:
            self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.encoder_layer = encoder_layer
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)
        self.checkpoint = None  # None | "reentrant" | "non-reentrant"

    def forward(self, idx):
        t = idx.shape[1]
        x = self.tok(idx) + self.pos[:t]
        mask = nn.Transformer.generate_square_subsequent_mask(t, device=idx.device) if self.encoder_layer else None
        for blk in self.blocks:
            fn = (lambda y, blk=blk: blk(y, src_mask=mask, is_causal=True)) if self.encoder_layer else blk
            if self.checkpoint is None:
                x = fn(x)
            else:
                x = ckpt.checkpoint(fn, x, use_reentrant=self.checkpoint == "reentrant")
        return self.head(self.ln(x))


def lm_loss(logits, target):
    return F.cross_entropy(logits.flatten(0, 1), target.flatten())


def lm_batches(n=3, vocab=64, seq=16, seed=2):
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        ids = torch.randint(0, vocab, (4, seq + 1), generator=g)
        out.append((ids[:, :-1], ids[:, 1:]))
    return out


@pytest.mark.parametrize("encoder_layer", [False, True], ids=["sdpa-block", "TransformerEncoderLayer"])
def test_tiny_transformer_training_matches_cpu(encoder_layer):
    cpu, dev = pair(lambda: TinyLM(encoder_layer=encoder_layer))
    cpu.train(), dev.train()
    batches = lm_batches()
    # eps=1e-5: the key-projection bias has an identically-zero true gradient (softmax is
    # shift invariant), so its computed gradient is rounding noise (~1e-9) that Adam's
    # default eps=1e-8 would amplify into lr-sized, sign-random updates on either device.
    make_opt = lambda p: torch.optim.AdamW(p, lr=3e-3, eps=1e-5, foreach=True)  # noqa: E731
    l_cpu = train(cpu, make_opt(cpu.parameters()), batches, lm_loss, "cpu", 3)
    l_dev = train(dev, make_opt(dev.parameters()), batches, lm_loss, DEV, 3)
    assert_close(l_dev, l_cpu, rtol=1e-5, atol=1e-5)
    assert_params_close(dev, cpu, rtol=1e-5, atol=1e-5)


# ----------------------------------------------------------------------------- (c) checkpointing
@pytest.mark.parametrize("mode", ["non-reentrant", "reentrant"])
def test_gradient_checkpointing_same_grads(mode):
    _, dev = pair(TinyLM)
    ref = copy.deepcopy(dev)
    ids, target = (t.to(DEV) for t in lm_batches(1)[0])

    lm_loss(ref(ids), target).backward()
    dev.checkpoint = mode
    loss = lm_loss(dev(ids), target)
    loss.backward()
    assert_params_close(dev, ref, grads=True)
    # and both equal CPU
    cpu = copy.deepcopy(ref).to("cpu")
    cpu.zero_grad()
    lm_loss(cpu(ids.cpu()), target.cpu()).backward()
    assert_params_close(dev, cpu, grads=True, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("mode", ["non-reentrant", "reentrant"])
def test_gradient_checkpointing_with_dropout_rng(mode):
    """Checkpoint replays the RNG state: recomputed dropout masks match the original ones."""
    torch.manual_seed(0)
    lin = nn.Linear(32, 32).to(DEV)
    x = torch.randn(8, 32, device=DEV, requires_grad=True)
    fn = lambda y: F.dropout(lin(y), p=0.5, training=True).sum(-1)  # noqa: E731

    grads = []
    for use_ckpt in (False, True):
        lin.zero_grad(), setattr(x, "grad", None)
        torch.manual_seed(123)  # CPU and every neuron generator
        out = ckpt.checkpoint(fn, x, use_reentrant=mode == "reentrant") if use_ckpt else fn(x)
        torch.rand(8, device=DEV), torch.rand(8)  # advance both generators before the recomputation
        out.sum().backward()
        grads.append((to_cpu(x.grad), to_cpu(lin.weight.grad)))
    torch.testing.assert_close(grads[1], grads[0], rtol=0, atol=0)


def test_native_dropout_uses_neuron_generator():
    x = torch.ones(1000, device=DEV)
    torch.manual_seed(5)
    torch.neuron.manual_seed(1)
    a = F.dropout(x, 0.5).cpu()
    torch.manual_seed(6)  # a different CPU stream must not matter...
    torch.neuron.manual_seed(1)  # ...the neuron stream is the same
    b = F.dropout(x, 0.5).cpu()
    state = torch.neuron.get_rng_state()
    c = F.dropout(x, 0.5).cpu()
    torch.neuron.set_rng_state(state)
    d = F.dropout(x, 0.5).cpu()
    assert torch.equal(a, b) and torch.equal(c, d)


def test_random_ops_use_neuron_generator():
    """Ops with a Generator argument draw from the neuron generator (the control for the xfail above)."""
    for fn in (lambda: torch.rand(1000, device=DEV), lambda: torch.empty(1000, device=DEV).bernoulli_(0.5),
               lambda: torch.randperm(100, device=DEV)):
        torch.manual_seed(5)
        torch.neuron.manual_seed(1)
        a = fn().cpu()
        torch.manual_seed(6)
        torch.neuron.manual_seed(1)
        assert torch.equal(fn().cpu(), a)


# ----------------------------------------------------------------------------- (d) autocast bf16
@pytest.mark.parametrize("dtype", [torch.bfloat16])
def test_autocast_bf16_matches_cpu_autocast(dtype):
    cpu, dev = pair(make_mlp)
    x, y = mlp_batches(1)[0]
    results = {}
    for device, model in (("cpu", cpu), (DEV, dev)):
        xi, yi = x.to(device), y.to(device)
        with torch.autocast(device, dtype=dtype):
            h = model[0](xi)
            assert h.dtype == dtype and h.device.type == device
            mm = xi @ model[0].weight.t()
            assert mm.dtype == dtype
            out = model(xi)
            assert out.dtype == dtype
            loss = F.cross_entropy(out, yi)  # autocast runs cross_entropy in fp32
            assert loss.dtype == torch.float32
        loss.backward()
        for p in model.parameters():
            assert p.grad is not None and p.grad.dtype == torch.float32 and p.grad.device.type == device
        results[device] = (loss.detach().cpu(), [p.grad.detach().cpu() for p in model.parameters()])
    bf16 = dict(rtol=1.6e-2, atol=1e-2)
    torch.testing.assert_close(results[DEV][0], results["cpu"][0], **bf16)
    for g_dev, g_cpu in zip(results[DEV][1], results["cpu"][1]):
        torch.testing.assert_close(g_dev, g_cpu, rtol=5e-2, atol=2e-2)
    assert torch.is_autocast_enabled(DEV) is False


def test_autocast_bf16_op_dtypes_match_cpu():
    x, w = torch.randn(2, 8, 8), torch.randn(8, 8)
    ops = {
        "mm": lambda x, w: torch.mm(x[0], w), "bmm": lambda x, w: torch.bmm(x, x), "matmul": lambda x, w: x @ w,
        "linear": lambda x, w: F.linear(x, w), "addmm": lambda x, w: torch.addmm(w, w, w),
        "baddbmm": lambda x, w: torch.baddbmm(x, x, x), "conv1d": lambda x, w: F.conv1d(x, x[:, :, :3]),
        "sdpa": lambda x, w: F.scaled_dot_product_attention(x[None], x[None], x[None]),
        "einsum": lambda x, w: torch.einsum("bij,jk->bik", x, w),
        "layer_norm": lambda x, w: F.layer_norm(x, (8,)), "add": lambda x, w: x + w,
    }
    for name, op in ops.items():
        dtypes = {}
        for device in ("cpu", DEV):
            with torch.autocast(device, dtype=torch.bfloat16):
                dtypes[device] = op(x.to(device), w.to(device)).dtype
        if name in ("layer_norm",):  # fp32 on neuron (CUDA lists); CPU autocast keeps bf16 -- documented difference
            assert dtypes[DEV] == torch.float32, name
        else:
            assert dtypes[DEV] == dtypes["cpu"], (name, dtypes)
        if name not in ("layer_norm", "add"):
            assert dtypes[DEV] == torch.bfloat16, name


def test_autocast_default_dtype_is_bf16():
    # bf16 is the NeuronCore's native low precision; ATen's PrivateUse1 default is fp16.
    assert torch.get_autocast_dtype(DEV) == torch.bfloat16
    x, w = torch.randn(4, 8), torch.randn(8, 3)
    with torch.autocast(DEV):
        assert torch.get_autocast_dtype(DEV) == torch.bfloat16
        out = x.to(DEV) @ w.to(DEV)
    assert out.dtype == torch.bfloat16
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ref = x @ w
    torch.testing.assert_close(out.cpu(), ref, rtol=0, atol=0)
    # An explicit dtype still wins, and the default comes back afterwards.
    with torch.autocast(DEV, dtype=torch.float16):
        assert (x.to(DEV) @ w.to(DEV)).dtype == torch.float16
    assert torch.get_autocast_dtype(DEV) == torch.bfloat16


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_autocast_binary_cross_entropy_is_banned_like_cuda(dtype):
    torch.manual_seed(0)
    logits, target = torch.randn(6, 1), torch.rand(6, 1)
    with torch.autocast(DEV, dtype=dtype):
        probs = torch.sigmoid(logits.to(DEV).to(dtype))
        # PyTorch's CUDA wording first, then ours.
        with pytest.raises(RuntimeError, match=r"(?s)^torch.nn.functional.binary_cross_entropy and torch.nn.BCELoss "
                                               r"are unsafe to autocast\..*binary_cross_entropy_with_logits"):
            F.binary_cross_entropy(probs, target.to(DEV))
        with pytest.raises(RuntimeError, match="are unsafe to autocast"):
            nn.BCELoss()(probs, target.to(DEV))
        # The recommended form runs in fp32 and matches CPU autocast.
        loss = F.binary_cross_entropy_with_logits(logits.to(DEV).to(dtype), target.to(DEV))
    assert loss.dtype == torch.float32
    with torch.autocast("cpu", dtype=dtype):
        ref = F.binary_cross_entropy_with_logits(logits.to(dtype), target)
    torch.testing.assert_close(loss.cpu(), ref)
    # Outside autocast the op is unaffected.
    assert_close_bce = F.binary_cross_entropy(torch.sigmoid(logits.to(DEV)), target.to(DEV))
    torch.testing.assert_close(assert_close_bce.cpu(), F.binary_cross_entropy(torch.sigmoid(logits), target))


def test_autocast_bf16_transformer_backward():
    cpu, dev = pair(TinyLM)
    ids, target = lm_batches(1)[0]
    losses = {}
    for device, model in (("cpu", cpu), (DEV, dev)):
        with torch.autocast(device, dtype=torch.bfloat16):
            logits = model(ids.to(device))
            assert logits.dtype == torch.bfloat16
            loss = lm_loss(logits, target.to(device))
        loss.backward()
        assert all(torch.isfinite(p.grad).all() for p in model.parameters())
        losses[device] = loss.detach().cpu()
    torch.testing.assert_close(losses[DEV], losses["cpu"], rtol=1.6e-2, atol=1e-2)
    assert_params_close(dev, cpu, grads=True, rtol=5e-2, atol=5e-3)


# ----------------------------------------------------------------------------- (e) clip_grad_norm_
@pytest.mark.parametrize("norm_type", [2.0, 1.0, math.inf])
@pytest.mark.parametrize("foreach", [True, False])
def test_clip_grad_norm_matches_cpu(norm_type, foreach):
    cpu, dev = pair(make_mlp)
    x, y = mlp_batches(1)[0]
    for device, model in (("cpu", cpu), (DEV, dev)):
        (F.cross_entropy(model(x.to(device)), y.to(device)) * 10).backward()
    n_cpu = nn.utils.clip_grad_norm_(cpu.parameters(), 0.5, norm_type=norm_type, foreach=foreach)
    n_dev = nn.utils.clip_grad_norm_(dev.parameters(), 0.5, norm_type=norm_type, foreach=foreach)
    assert n_cpu > 0.5  # clipping actually happens
    assert_close(n_dev, n_cpu)
    assert_params_close(dev, cpu, grads=True)


def test_clip_grad_norm_in_training_loop():
    cpu, dev = pair(make_mlp)
    batches = mlp_batches()
    clip = lambda ps: nn.utils.clip_grad_norm_(ps, 0.1, foreach=True)  # noqa: E731
    mk = lambda p: torch.optim.AdamW(p, lr=1e-2, foreach=True)  # noqa: E731
    l_cpu = train(cpu, mk(cpu.parameters()), batches, F.cross_entropy, "cpu", 5, clip=clip)
    l_dev = train(dev, mk(dev.parameters()), batches, F.cross_entropy, DEV, 5, clip=clip)
    assert_close(l_dev, l_cpu)
    assert_params_close(dev, cpu)


# ----------------------------------------------------------------------------- (f) GradScaler
def scaler_step(device, model, opt, scaler, x, y, poison=False):
    opt.zero_grad(set_to_none=True)
    with torch.autocast(device, dtype=torch.float16):
        out = model(x.to(device))
        assert out.dtype == torch.float16
        loss = F.cross_entropy(out, y.to(device))
    scaler.scale(loss).backward()
    if poison:
        next(model.parameters()).grad.view(-1)[0] = float("inf")
    scaler.unscale_(opt)
    found_inf = sum(v.item() for v in scaler._found_inf_per_device(opt).values())
    grads = [p.grad.detach().cpu().clone() for p in model.parameters()]
    scaler.step(opt)
    scaler.update()
    return loss.detach().cpu(), found_inf, grads


@pytest.mark.parametrize("opt_kind", ["foreach", "fused"])
def test_grad_scaler_matches_cpu(opt_kind):
    cpu, dev = pair(make_mlp)
    batches = mlp_batches(3)
    kw = {opt_kind: True}
    # SGD, not Adam: the two autocast policies differ slightly (neuron uses PyTorch's
    # CUDA op lists, so cross_entropy's log_softmax runs in fp16 as on CUDA, while CPU
    # autocast runs cross_entropy in fp32): losses differ by ~1e-4, and Adam's
    # normalisation would turn that into lr-sized differences on near-zero gradients.
    opt_cpu = torch.optim.SGD(cpu.parameters(), lr=0.1, momentum=0.9, **kw)
    opt_dev = torch.optim.SGD(dev.parameters(), lr=0.1, momentum=0.9, **kw)
    s_cpu = torch.amp.GradScaler("cpu", init_scale=2.0**10, growth_interval=1)
    s_dev = torch.amp.GradScaler(DEV, init_scale=2.0**10, growth_interval=1)
    assert s_dev.is_enabled()

    for step, (x, y) in enumerate(batches):
        poison = step == 1  # step 1 has an inf grad: skipped, scale backs off
        before = [p.detach().cpu().clone() for p in dev.parameters()]
        r_cpu = scaler_step("cpu", cpu, opt_cpu, s_cpu, x, y, poison)
        r_dev = scaler_step(DEV, dev, opt_dev, s_dev, x, y, poison)
        torch.testing.assert_close(r_dev[0], r_cpu[0], rtol=1e-3, atol=1e-3)  # fp16 forward
        assert r_dev[1] == r_cpu[1] == (1.0 if poison else 0.0)
        if poison:
            for b, p in zip(before, dev.parameters()):
                torch.testing.assert_close(p.detach().cpu(), b, rtol=0, atol=0)  # step skipped
        else:
            for g_dev, g_cpu in zip(r_dev[2], r_cpu[2]):  # unscaled grads
                torch.testing.assert_close(g_dev, g_cpu, rtol=1e-2, atol=1e-3)
        assert s_dev.get_scale() == s_cpu.get_scale()
        assert s_dev._scale.device.type == DEV
    assert s_dev.get_scale() == 2.0**10 * 2 * 2 * 0.5  # grow, back off, grow... (1 growth/step)
    assert_params_close(dev, cpu, rtol=1e-2, atol=1e-3)


def test_amp_foreach_non_finite_check_and_unscale():
    grads = [torch.tensor([1.0, 2.0, 4.0]), torch.tensor([8.0, float("nan")])]
    results = {}
    for device in ("cpu", DEV):
        gs = [g.clone().to(device) for g in grads]
        found = torch.zeros(1, device=device)
        inv = torch.full((1,), 0.5, device=device)
        torch._amp_foreach_non_finite_check_and_unscale_(gs[:1], found, inv)
        assert found.item() == 0.0
        torch._amp_foreach_non_finite_check_and_unscale_(gs, found, inv)
        results[device] = ([g.cpu() for g in gs], found.cpu())
    torch.testing.assert_close(results[DEV], results["cpu"], equal_nan=True)


# ----------------------------------------------------------------------------- (g) conv net
class ConvNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(8, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
        )
        self.fc = nn.Linear(16 * 4 * 4, 10)

    def forward(self, x):
        return self.fc(self.features(x).flatten(1))


@pytest.mark.parametrize("channels_last", [False, True], ids=["contiguous", "channels_last"])
def test_convnet_training_matches_cpu(channels_last):
    cpu, dev = pair(ConvNet)
    if channels_last:
        cpu, dev = cpu.to(memory_format=torch.channels_last), dev.to(memory_format=torch.channels_last)
    g = torch.Generator().manual_seed(3)
    batches = [(torch.randn(4, 3, 16, 16, generator=g), torch.randint(0, 10, (4,), generator=g)) for _ in range(2)]
    if channels_last:
        batches = [(x.to(memory_format=torch.channels_last), y) for x, y in batches]
    mk = lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9, foreach=True)  # noqa: E731
    grads = {}
    losses = {}
    for device, model in (("cpu", cpu), (DEV, dev)):
        model.train()
        opt = mk(model.parameters())
        ls = []
        for x, y in batches:
            opt.zero_grad()
            loss = F.cross_entropy(model(x.to(device)), y.to(device))
            loss.backward()
            grads.setdefault(device, []).append([p.grad.detach().cpu().clone() for p in model.parameters()])
            opt.step()
            ls.append(loss.detach().cpu())
        losses[device] = torch.stack(ls)
    torch.testing.assert_close(losses[DEV], losses["cpu"], **FP32)
    torch.testing.assert_close(grads[DEV], grads["cpu"], rtol=1e-4, atol=1e-5)
    assert_params_close(dev, cpu, rtol=1e-4, atol=1e-5)
    assert_buffers_close(dev, cpu, rtol=1e-5, atol=1e-5)  # running stats, num_batches_tracked
    # eval mode uses the running statistics
    cpu.eval(), dev.eval()
    x = batches[0][0]
    with torch.no_grad():
        assert_close(dev(x.to(DEV)), cpu(x), rtol=1e-4, atol=1e-5)
