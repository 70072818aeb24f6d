"""What a device graph can capture (docs/graphs.md, "Capture rules"): ops
without a queued route (recorded with their Meta kernel's output
description), ops that read device values on the host (capture errors),
host-to-device copies, and random ops (philox mode), against eager/CPU."""
import os

import pytest
import torch

from conftest import assert_same, run_json


def _capture(fn, *args):
    g = torch.neuron.NeuronGraph()
    with torch.neuron.graph(g):
        out = fn(*args)
    return g, out


# ---- ops without a queued route ------------------------------------------------

def _elementwise(x):
    y = torch.relu(x).clamp_min(0.1).clamp_max(2.0)
    z = torch.where(x > 0, x, y * 2).remainder(0.7)
    return torch.nn.functional.leaky_relu(z - y, 0.2) + torch.fmod(x, 0.3).abs()


def test_elementwise_chain_without_queued_routes_replays():
    x = torch.randn(32, 17, device="neuron")
    g, y = _capture(_elementwise, x)
    for _ in range(3):
        ref = torch.randn(32, 17)
        x.copy_(ref)
        g.replay()
        assert_same(y, _elementwise(ref))


def test_integer_ops_without_queued_routes_are_exact():
    fn = lambda t: torch.where(t % 3 == 0, t.clamp_min(-5), torch.remainder(t, 7)).relu().flip(0)  # noqa: E731
    x = torch.zeros(64, dtype=torch.int64, device="neuron")
    g, y = _capture(fn, x)
    for _ in range(2):
        ref = torch.randint(-100, 100, (64,))
        x.copy_(ref)
        g.replay()
        assert_same(y, fn(ref))


def test_layer_norm_gelu_mlp_replays():
    torch.manual_seed(0)
    def make():
        return torch.nn.Sequential(torch.nn.LayerNorm(24), torch.nn.Linear(24, 48), torch.nn.GELU(),
                                   torch.nn.Linear(48, 24), torch.nn.LayerNorm(24))
    ref_mlp = make()
    for p in ref_mlp.parameters():  # LayerNorm's weights away from their init
        p.data.uniform_(-1, 1)
    dev = make().to("neuron")
    dev.load_state_dict(ref_mlp.state_dict())
    x = torch.zeros(6, 24, device="neuron")
    with torch.no_grad():
        g, y = _capture(dev, x)
        for _ in range(3):
            ref = torch.randn(6, 24)
            x.copy_(ref)
            g.replay()
            assert_same(y, ref_mlp(ref), atol=1e-5, rtol=1e-4)


def test_in_place_and_out_arguments_are_written_at_replay():
    x = torch.randn(10, device="neuron")
    buf = torch.zeros(10, device="neuron")
    idx = torch.tensor([1, 4, 7], device="neuron")
    table = torch.zeros(5, 10, device="neuron")
    row = torch.tensor([2], device="neuron")

    def fn(t):
        buf.relu_()
        torch.clamp_min(t, 0.0, out=buf)           # out= of the right size
        table.index_put_((row,), t)  # index_put_ (no queued route)
        t.masked_fill_(t < -1, -1.0)
        return torch.arange(idx.numel(), device="neuron") + idx  # arange resizes a fresh out=

    with pytest.raises(RuntimeError, match="is capturing a graph"):
        # A tensor made from a Python list inside the capture is a host copy.
        _capture(lambda t: torch.tensor([1, 2], device="neuron") + t, x)
    g, r = _capture(fn, x)
    for _ in range(2):
        ref = torch.randn(10) * 2
        x.copy_(ref)
        g.replay()
        ref_x = ref.masked_fill(ref < -1, -1.0)
        assert_same(buf, ref.clamp_min(0.0))
        assert_same(table[2], ref)
        assert_same(x, ref_x)
        assert_same(r, torch.tensor([1, 5, 9]))


def test_tiny_llama_decode_step_with_static_cache_replays_as_eager():
    # What generate() with graphs needs: embedding, RMS norm, rotary
    # (cat/neg/slices), linear, SDPA, masks, the static cache's index_copy_.
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(vocab_size=96, hidden_size=64, intermediate_size=112, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg).eval().to("neuron")
    prompt = torch.randint(0, 96, (1, 5), device="neuron")
    caches = [transformers.StaticCache(config=cfg, max_cache_len=24) for _ in range(2)]  # graph, eager

    def step(ids, pos, cache):
        return model(input_ids=ids, past_key_values=cache, use_cache=True, cache_position=pos).logits

    with torch.no_grad():
        for cache in caches:
            prefill = step(prompt, torch.arange(5, device="neuron"), cache)
        tok = prefill[:, -1:].argmax(-1)
        ids, pos = tok.clone(), torch.tensor([5], device="neuron")
        g, logits = _capture(step, ids, pos, caches[0])
        eager_tok = tok
        for k in range(5, 10):
            ids.copy_(eager_tok)
            pos.fill_(k)
            g.replay()
            eager = step(eager_tok, torch.tensor([k], device="neuron"), caches[1])
            torch.testing.assert_close(logits.cpu(), eager.cpu(), atol=1e-5, rtol=1e-5)
            eager_tok = eager[:, -1:].argmax(-1)
        for layer0, layer1 in zip(caches[0].layers, caches[1].layers):
            torch.testing.assert_close(layer0.keys.cpu(), layer1.keys.cpu(), atol=1e-5, rtol=1e-5)


# ---- OpInfo sweep: which ops capture, and do their replays equal eager ---------

def _to_neuron(x):
    return x.to("neuron") if isinstance(x, torch.Tensor) else x


def _tensors(tree):
    return [t for t in torch.utils._pytree.tree_leaves(tree) if isinstance(t, torch.Tensor)]


def _same(a, b):
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if a.is_floating_point() or a.is_complex():
        return torch.allclose(a, b, rtol=1e-5, atol=1e-6, equal_nan=True)
    return torch.equal(a, b)


def sweep(max_samples=2, dtype=torch.float32):
    """Per OpInfo sample (float32): capture the op on static inputs filled
    with zeros, copy the sample's values in, replay, compare with the op run
    eagerly on neuron. Returns {"captured": n, "capture_error": n, "wrong":
    [names], "skipped": n, "errors": {name: message}}."""
    from torch.testing._internal.common_methods_invocations import op_db
    from torch.utils._pytree import tree_map

    counts = {"captured": 0, "capture_error": 0, "skipped": 0}
    wrong, errors = [], {}
    for op in op_db:
        # Uninitialized outputs (empty*) have no value to compare.
        if dtype not in op.supported_dtypes("cpu") or op.name.startswith(("empty", "new_empty")):
            continue
        try:
            samples = list(op.sample_inputs("cpu", dtype))[:max_samples]
        except Exception:
            continue
        for k, s in enumerate(samples):
            name = f"{op.name}.{op.variant_test_name}[{k}]" if op.variant_test_name else f"{op.name}[{k}]"
            args = tree_map(_to_neuron, (s.input, s.args, s.kwargs))
            try:
                eager = op(args[0], *args[1], **args[2])
                again = op(args[0], *args[1], **args[2])
                torch.neuron.synchronize()
                eager_t, again_t = _tensors(eager), _tensors(again)
                if not eager_t or not all(_same(a.cpu(), b.cpu()) for a, b in zip(eager_t, again_t)):
                    counts["skipped"] += 1  # no tensor output, or nondeterministic (random ops)
                    continue
            except Exception:
                counts["skipped"] += 1  # fails eagerly: not a capture question
                continue
            static = tree_map(lambda t: torch.zeros_like(t) if isinstance(t, torch.Tensor) else t, args)
            g = torch.neuron.NeuronGraph()
            try:
                with torch.neuron.graph(g):
                    out = op(static[0], *static[1], **static[2])
            except RuntimeError as e:
                if "is capturing a graph" not in str(e):
                    raise
                counts["capture_error"] += 1
                errors[name] = str(e).split(": ", 1)[-1][:160]
                continue
            for dst, src in zip(_tensors(static), _tensors(args)):
                dst.copy_(src)
            try:
                g.replay()
                torch.neuron.synchronize()
            except RuntimeError as e:  # a failing recorded kernel: as wrong as a wrong value
                wrong.append(name)
                errors[name] = "replay: " + str(e)[:200]
                continue
            out_t = _tensors(out)
            if len(out_t) == len(eager_t) and all(_same(o.cpu(), e.cpu()) for o, e in zip(out_t, eager_t)):
                counts["captured"] += 1
            else:
                wrong.append(name)
            del g
    return dict(counts, wrong=wrong, errors=errors)


def test_opinfo_sweep_captures_most_ops_and_replays_none_wrong():
    # In a child process: a replay gone wrong must not take pytest down.
    r = run_json("""
        import json, sys, warnings
        warnings.filterwarnings("ignore")
        sys.path.insert(0, %r)
        import torch, torch_neuronx
        from test_graphs_capture import sweep
        print(json.dumps(sweep()))
    """ % os.path.dirname(os.path.abspath(__file__)))
    attempted = r["captured"] + r["capture_error"] + len(r["wrong"])
    print(f"captured and equal {r['captured']}, capture errors {r['capture_error']}, wrong {len(r['wrong'])}, "
          f"skipped {r['skipped']} (of {attempted + r['skipped']} samples)")
    assert r["wrong"] == [], {k: r["errors"].get(k) for k in r["wrong"]}
    assert r["captured"] >= 0.85 * attempted, r["errors"]


# ---- ops that read device values on the host -------------------------------------

_HOST_READS = {
    "nonzero": lambda x: torch.nonzero(x > 0),
    "boolean_mask_index": lambda x: x[x > 0],
    "masked_select": lambda x: torch.masked_select(x, x > 0),
    "unique": lambda x: torch.unique(x),
    "item": lambda x: x.sum().item(),
    "equal": lambda x: torch.equal(x, x + 1),
    "tolist": lambda x: x.tolist(),
    "cpu": lambda x: x.cpu(),
    "bool": lambda x: bool(x.sum() > 0),
    "repeat_interleave": lambda x: torch.repeat_interleave(torch.ones(4, dtype=torch.long, device="neuron")),
}


@pytest.mark.parametrize("what", list(_HOST_READS))
def test_host_reads_raise_the_capture_error_and_leave_the_device_usable(what):
    x = torch.randn(16, device="neuron")
    g = torch.neuron.NeuronGraph()
    with pytest.raises(RuntimeError, match=r"neuron:0 stream \d+ is capturing a graph: .*The capture is invalidated"):
        with torch.neuron.graph(g):
            _HOST_READS[what](torch.relu(x))
    assert not torch.neuron.is_current_stream_capturing()
    ref = x.cpu()
    assert_same(torch.nonzero(x > 0), torch.nonzero(ref > 0))  # the op itself works eagerly afterwards
    g2, y = _capture(lambda t: torch.relu(t) * 2, x)  # and a new capture works
    g2.replay()
    assert_same(y, torch.relu(ref) * 2)


def test_boolean_mask_in_place_writes_are_recorded():
    # Writing through a mask keeps the shape: nothing for the host to read.
    x = torch.zeros(12, device="neuron")
    g, _ = _capture(lambda t: t.masked_fill_(t > 0.5, 0.5).index_put_((t < -0.5,), torch.tensor(-0.5)), x)
    ref = torch.randn(12)
    x.copy_(ref)
    g.replay()
    assert_same(x, ref.clamp(-0.5, 0.5))


# ---- host-to-device copies ----------------------------------------------------------

def test_pinned_non_blocking_copy_is_recorded_and_rereads_the_pinned_buffer():
    host = torch.zeros(32).pin_memory()
    dev = torch.zeros(32, device="neuron")
    g, y = _capture(lambda: dev.copy_(host, non_blocking=True) * 3)
    for _ in range(3):
        ref = torch.randn(32)
        host.copy_(ref)  # the replay copies from the pinned buffer as it is then
        g.replay()
        assert_same(y, ref * 3)


def test_non_blocking_copy_to_pinned_memory_is_recorded():
    x = torch.zeros(16, device="neuron")
    out = torch.empty(16).pin_memory()
    g, _ = _capture(lambda: out.copy_(x.exp(), non_blocking=True))
    ref = torch.randn(16)
    x.copy_(ref)
    g.replay()
    torch.neuron.synchronize()
    torch.testing.assert_close(out, ref.exp())


@pytest.mark.parametrize("how", ["pageable_copy", "blocking_pinned_copy", "tensor_from_list", "to_device"])
def test_synchronous_host_copies_raise_with_a_hint(how):
    dev = torch.zeros(4, device="neuron")
    copies = {
        "pageable_copy": lambda: dev.copy_(torch.ones(4), non_blocking=True),
        "blocking_pinned_copy": lambda: dev.copy_(torch.ones(4).pin_memory()),
        "tensor_from_list": lambda: torch.tensor([1.0, 2.0, 3.0, 4.0], device="neuron") + dev,
        "to_device": lambda: torch.ones(4).to("neuron") + dev,
    }
    with pytest.raises(RuntimeError, match="create the tensor before the capture"):
        _capture(copies[how])
    assert_same(torch.tensor([1.0, 2.0], device="neuron") + 1, torch.tensor([2.0, 3.0]))


# ---- random ops ------------------------------------------------------------------------

def _random_ops(x, gen=None):
    return (torch.rand(16, device="neuron"), torch.randn(8, 3, device="neuron"),
            torch.nn.functional.dropout(x, 0.5), torch.bernoulli(torch.full((32,), 0.3, device="neuron")),
            torch.empty(20, device="neuron").normal_(2.0, 0.5, generator=gen),
            torch.multinomial(x.view(4, 16).softmax(-1), 3), torch.randperm(12, device="neuron"),
            torch.randint(0, 1000, (9,), device="neuron"), torch.rand_like(x).exponential_(),
            torch.poisson(x * 4))


def test_random_ops_in_cpu_rng_mode_raise_with_the_philox_hint():
    assert torch.neuron.get_rng_mode() == "cpu"
    with pytest.raises(RuntimeError, match=r'set_rng_mode\("philox"\)'):
        _capture(lambda: torch.rand(4, device="neuron"))
    assert_same(torch.zeros(2, device="neuron") + 1, torch.ones(2))


def test_random_ops_replay_fresh_numbers_equal_to_eager(philox_rng):
    x = torch.ones(64, device="neuron")
    gen = torch.Generator(device="neuron")
    torch.neuron.manual_seed(123)
    gen.manual_seed(7)
    g, outs = _capture(_random_ops, x, gen)
    start = torch.neuron.default_generators[0].get_offset()
    replays = []
    for _ in range(3):
        g.replay()
        replays.append([o.cpu() for o in outs])
    # Each replay moved the generators past the capture's draws.
    drawn = torch.neuron.default_generators[0].get_offset() - start
    assert drawn > 0 and drawn % 3 == 0
    # Fresh numbers per replay ...
    for a, b in zip(replays[0], replays[1]):
        assert not torch.equal(a, b)
    # ... the numbers eager calls draw from the same (seed, offset) sequence.
    torch.neuron.manual_seed(123)
    gen.manual_seed(7)
    for r in replays:
        for got, want in zip(r, _random_ops(x, gen)):
            torch.testing.assert_close(got, want.cpu(), rtol=0, atol=0)
    assert torch.neuron.default_generators[0].get_offset() == start + drawn


def test_manual_seed_between_replays_restarts_the_replays_numbers(philox_rng):
    # As CUDA graphs: a replay reads the generator's seed and offset when it
    # is launched, so reseeding repeats the replays that followed the seed.
    g, y = _capture(lambda: torch.randn(10, device="neuron") * 2)
    torch.neuron.manual_seed(5)
    g.replay()
    first = y.cpu()
    g.replay()
    second = y.cpu()
    torch.neuron.manual_seed(5)
    g.replay()
    assert torch.equal(y.cpu(), first)
    assert not torch.equal(first, second)
    torch.neuron.manual_seed(5)
    assert torch.equal(torch.randn(10, device="neuron").cpu() * 2, first)


def test_views_are_made_at_capture_also_across_dtypes():
    # Rotary embeddings written with complex numbers (view_as_complex/real),
    # and unfold: views of device memory, made at capture.
    x = torch.zeros(2, 6, 8, device="neuron")
    freqs = torch.polar(torch.ones(6, 4), torch.randn(6, 4)).to("neuron")

    def fn(t):
        xc = torch.view_as_complex(t.float().reshape(2, 6, 4, 2))
        rotated = torch.view_as_real(xc * freqs).flatten(2)
        return rotated, t[:, 1:].unfold(1, 2, 1).sum(-1)

    g, (rot, win) = _capture(fn, x)
    for _ in range(2):
        ref = torch.randn(2, 6, 8)
        x.copy_(ref)
        g.replay()
        xc = torch.view_as_complex(ref.reshape(2, 6, 4, 2))
        assert_same(rot, torch.view_as_real(xc * freqs.cpu()).flatten(2))
        assert_same(win, ref[:, 1:].unfold(1, 2, 1).sum(-1))


def test_tiny_llama_sampling_decode_loop_in_a_graph_matches_eager(philox_rng):
    # generate() with graphs: the decode step and its sampling (softmax,
    # multinomial) replayed per token, against the same loop run eagerly
    # from the same seed.
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                   num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=32)
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(1)
    model = transformers.LlamaForCausalLM(cfg).eval().to("neuron")
    prompt = torch.randint(0, 64, (1, 4), device="neuron")

    def step(ids, pos, cache):
        logits = model(input_ids=ids, past_key_values=cache, use_cache=True, cache_position=pos).logits
        return torch.multinomial(torch.softmax(logits[:, -1] / 0.8, -1), 1)

    def prefill(cache):
        return model(input_ids=prompt, past_key_values=cache, use_cache=True,
                     cache_position=torch.arange(4, device="neuron")).logits[:, -1:].argmax(-1)

    with torch.no_grad():
        cache = transformers.StaticCache(config=cfg, max_cache_len=16)
        ids, pos = prefill(cache), torch.tensor([4], device="neuron")
        g, next_tok = _capture(step, ids, pos, cache)
        torch.neuron.manual_seed(11)
        graph_tokens = []
        for k in range(4, 12):
            pos.fill_(k)
            g.replay()
            graph_tokens.append(next_tok.item())
            ids.copy_(next_tok)

        cache = transformers.StaticCache(config=cfg, max_cache_len=16)
        tok = prefill(cache)
        torch.neuron.manual_seed(11)
        eager_tokens = []
        for k in range(4, 12):
            tok = step(tok, torch.tensor([k], device="neuron"), cache)
            eager_tokens.append(tok.item())
    assert graph_tokens == eager_tokens
    assert len(set(eager_tokens)) > 1  # sampled, not a constant


def test_attention_without_dropout_moves_no_generator(philox_rng):
    # Eagerly the fused attention ran inline (small, idle stream) or queued;
    # only the inline run used to move the offset, so a graph's draws and the
    # eager ones went apart. Neither moves it now.
    q = torch.randn(1, 2, 5, 8, device="neuron")
    big = torch.randn(1, 2, 300, 64, device="neuron")
    gen = torch.neuron.default_generators[0]
    torch.neuron.manual_seed(0)
    torch.neuron.synchronize()
    torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True)  # idle stream: inline
    torch.nn.functional.scaled_dot_product_attention(big, big, big)  # large: queued
    torch.neuron.synchronize()
    assert gen.get_offset() == 0


def test_forward_and_backward_of_a_layer_norm_relu_gelu_mlp_replay():
    # Backward ops (layer-norm, threshold and GELU backward, ...) are
    # recorded like the forward ones; grads set to None before the capture
    # are allocated in it and rewritten by each replay.
    torch.manual_seed(0)

    def make():
        return torch.nn.Sequential(torch.nn.LayerNorm(12), torch.nn.Linear(12, 20), torch.nn.ReLU(),
                                   torch.nn.Linear(20, 12), torch.nn.GELU())
    ref, dev = make(), make().to("neuron")
    dev.load_state_dict(ref.state_dict())
    x = torch.zeros(5, 12, device="neuron", requires_grad=True)
    g = torch.neuron.NeuronGraph()
    with torch.neuron.graph(g):
        loss = dev(x).pow(2).mean()
        loss.backward()
    for _ in range(2):
        xin = torch.randn(5, 12)
        x.data.copy_(xin)
        g.replay()
        xr = xin.clone().requires_grad_()
        ref.zero_grad(set_to_none=True)
        ref(xr).pow(2).mean().backward()
        assert_same(loss, ref(xr).pow(2).mean().detach())
        assert_same(x.grad, xr.grad, atol=1e-6, rtol=1e-5)
        for p, q in zip(dev.parameters(), ref.parameters()):
            assert_same(p.grad, q.grad, atol=1e-6, rtol=1e-5)
