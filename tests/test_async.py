"""Asynchronous launches (docs/runtime.md): kernels are queued on the current
stream and the caller returns; user errors still raise at the call site,
data-dependent kernel errors at the next synchronization point; sync points
synchronize; streams run concurrently."""
import os

import pytest
import torch

from conftest import assert_same, run_python

# NEURON_RT_STRICT=1 runs every op synchronously too: its checks read results (docs/runtime.md).
pytestmark = pytest.mark.skipif(
    "1" in (os.environ.get("NEURON_RT_LAUNCH_BLOCKING"), os.environ.get("NEURON_RT_STRICT")),
    reason="launches are synchronous in this mode",
)


def _long_work(a, n=12):
    for _ in range(n):
        a = torch.mm(a, a).clamp(-1, 1)
    return a


def test_launch_returns_before_the_kernel_ran():
    a = torch.randn(768, 768, device="neuron") / 768
    torch.neuron.synchronize()
    stream = torch.neuron.current_stream()
    out = _long_work(a)
    assert not stream.query()  # twelve 768^3 matmuls are still queued
    stream.synchronize()
    assert stream.query()
    assert_same(out, _long_work(a.cpu()), rtol=1e-4, atol=1e-5)


def test_compiled_kernels_are_queued():
    # A compiled graph's C++ kernels are queued like eager ops: the call
    # returns while the stream still works on what came before it.
    fn = torch.compile(lambda t: (t.cos() * 2).sum(-1))
    x = torch.randn(64, 64)
    xd = x.to("neuron")
    fn(xd)  # compiled before the stream gets busy
    a = torch.randn(768, 768, device="neuron") / 768
    torch.neuron.synchronize()
    stream = torch.neuron.current_stream()
    busy = _long_work(a)
    out = fn(xd)
    assert not stream.query()
    assert_same(out, (x.cos() * 2).sum(-1), rtol=1e-5, atol=1e-5)
    assert_same(busy, _long_work(a.cpu()), rtol=1e-4, atol=1e-5)


def test_small_kernels_on_an_idle_stream_run_at_once_and_report_errors_later():
    # A handoff to the executor costs more than a 16-element kernel, so an idle
    # stream runs it on the caller; errors still wait for a sync point.
    x = torch.randn(16, device="neuron")
    torch.neuron.synchronize()
    stream = torch.neuron.current_stream()
    y = x * 2
    assert stream.query()
    assert_same(y, x.cpu() * 2)
    bad = torch.tensor([0, 99], device="neuron")
    torch.index_select(x, 0, bad)  # runs now; its error is kept
    with pytest.raises(torch.AcceleratorError, match="index_select"):
        torch.neuron.synchronize()


def test_a_decode_step_does_not_stall():
    # No op of a Llama decode step waits for queued work: an op outside the
    # queue table would make the caller wait for the stream, and Python
    # overhead would stop overlapping with the kernels.
    from transformers import LlamaConfig, LlamaForCausalLM

    from torch_neuronx import _C

    cfg = LlamaConfig(vocab_size=128, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2)
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).eval()
    ids = torch.randint(0, 128, (1, 6))
    with torch.no_grad():
        want = model(ids).logits[:, -1]
        model.to("neuron")
        out = model(ids[:, :-1].to("neuron"), use_cache=True)
        token = ids[:, -1:].to("neuron")
        torch.neuron.synchronize()
        before = _C._launch_counts(0)
        got = model(token, past_key_values=out.past_key_values, use_cache=True).logits[:, -1]
        issued, stalls = (b - a for a, b in zip(before, _C._launch_counts(0)))
    assert issued > 50 and stalls <= 1, (issued, stalls)  # arange (a factory) may find work queued
    assert_same(got, want, rtol=1e-4, atol=1e-5)


def test_token_selection_does_not_stall():
    # What generate() runs between a decode step and the token's copy to the
    # host (logits processors and stopping criteria: arange, isin, where,
    # any(dim), ...) is queued behind the step: one waiting op would make the
    # host wait for the whole step before it queues the rest.
    from torch_neuronx import _C

    g = torch.Generator().manual_seed(0)
    scores = torch.randn(1, 1000, generator=g)
    ids = torch.randint(0, 1000, (1, 9), generator=g)
    eos = torch.tensor([7, int(scores.argmax())])

    def select(scores, ids, eos):
        vocab = torch.arange(scores.shape[-1], device=scores.device)
        scores = torch.where(torch.isin(vocab, eos), -float("inf"), scores)
        token = scores.argmax(-1)
        ids = torch.cat([ids, token[:, None]], dim=-1)
        done = torch.isin(ids[:, -1], eos) | (ids == 3).any(dim=-1) | torch.isin(ids, 5, invert=True).all()
        positions = torch.arange(2, ids.shape[-1] + 2, 3, device=ids.device, dtype=torch.int32)
        return ids, done, positions

    want = select(scores, ids, eos)
    a = torch.randn(768, 768, device="neuron") / 768
    args = (scores.neuron(), ids.neuron(), eos.neuron())
    torch.neuron.synchronize()
    busy = _long_work(a, n=6)
    before = _C._launch_counts(0)
    got = select(*args)
    issued, stalls = (b - a for a, b in zip(before, _C._launch_counts(0)))
    assert issued >= 10 and stalls == 0, (issued, stalls)
    for g_, w in zip(got, want):
        assert g_.dtype == w.dtype and g_.shape == w.shape and g_.stride() == w.stride()
        assert_same(g_, w)
    assert_same(busy, _long_work(a.cpu(), n=6), rtol=1e-4, atol=1e-5)


def test_a_compiled_graph_does_not_stall():
    # A compiled graph calls matmuls as out= extern kernels into buffers it
    # allocated (`extern_kernels.mm(a, b, out=buf)`): they are queued like its
    # C++ kernels. (A synchronous one waits for the kernels before it: in a
    # SmolLM2 decode step, 211 such waits made compiled decode slower than eager.)
    import torch.nn.functional as F

    from torch_neuronx import _C

    torch._dynamo.reset()
    ws = [torch.randn(256, 256) / 16 for _ in range(4)]
    bias = torch.randn(256)

    def fn(x, ws, bias):
        for w in ws:
            x = F.linear(x.sin(), w, bias).relu()
        return x @ ws[0]

    x = torch.randn(64, 256)
    dev = lambda t: t.to("neuron")  # noqa: E731
    args = (dev(x), [dev(w) for w in ws], dev(bias))
    compiled = torch.compile(fn)
    compiled(*args)
    torch.neuron.synchronize()
    before = _C._launch_counts(0)
    got = compiled(*args)
    issued, stalls = (b - a for a, b in zip(before, _C._launch_counts(0)))
    assert issued >= 9 and stalls == 0, (issued, stalls)
    assert_same(got, fn(x, ws, bias), rtol=1e-4, atol=1e-5)


def test_out_arguments_are_queued_only_when_used_as_given():
    a = torch.randn(768, 768, device="neuron") / 768
    b = torch.randn(256, 256)
    bd = b.to("neuron")
    out = torch.empty(256, 256, device="neuron")
    torch.neuron.synchronize()
    stream = torch.neuron.current_stream()
    busy = _long_work(a)
    r = torch.mm(bd, bd, out=out)  # queued behind the busy work
    assert r is out and not stream.query()
    assert_same(out, b @ b, rtol=1e-4, atol=1e-5)
    assert_same(busy, _long_work(a.cpu()), rtol=1e-4, atol=1e-5)
    # An output the kernel would resize, or one of another dtype, takes the
    # synchronous path and behaves as on CPU.
    small = torch.empty(3, device="neuron")
    with pytest.warns(UserWarning, match="resized"):
        torch.mm(bd, bd, out=small)
    assert_same(small, b @ b, rtol=1e-4, atol=1e-5)
    wide = torch.empty(256, 256, dtype=torch.float64, device="neuron")
    torch.add(bd, bd, out=wide)
    assert_same(wide, torch.add(b, b, out=torch.empty(256, 256, dtype=torch.float64)))
    # Overlaps the kernel refuses raise at the call site, also behind queued
    # work: a partial one, and cat's output as its own input.
    x = torch.randn(64 * 1024, device="neuron")
    _long_work(a, n=2)  # the stream is busy: the calls below would be queued
    with pytest.raises(RuntimeError, match="unsupported operation"):
        torch.add(x[:1000], x[1:1001], out=x[2:1002])
    with pytest.raises(RuntimeError, match="unsupported operation"):
        torch.cat([x], out=x)
    torch.neuron.synchronize()  # nothing was queued to fail later
    # An elementwise op may write over its own input, as on CPU.
    y = torch.randn(64, 64)
    yd = y.to("neuron")
    torch.mul(yd, 3, out=yd)
    assert_same(yd, y * 3)


def test_queued_ops_match_cpu():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(5, 7, generator=g)
    w = torch.randn(7, 3, generator=g)
    idx = torch.tensor([4, 0, 2])
    n = torch.randint(-5, 5, (5, 7), generator=g)
    cases = [
        lambda x, w, idx, n: torch.add(x, x.t().t(), alpha=2.5),
        lambda x, w, idx, n: (x - 1).pow(2).mean(-1, keepdim=True).rsqrt(),
        lambda x, w, idx, n: x.sum(0, dtype=torch.float64),
        lambda x, w, idx, n: torch.cat([x, -x], 1).softmax(-1),
        lambda x, w, idx, n: torch.addmm(w.sum(0), x, w, beta=0.5, alpha=2),
        lambda x, w, idx, n: torch.index_select(x, 0, idx),
        lambda x, w, idx, n: x.argmax(1),
        lambda x, w, idx, n: (x > 0) | (n == 3),
        lambda x, w, idx, n: n * 2.5,  # wrapped scalar: int tensor * float -> float32
        lambda x, w, idx, n: x[:, 1:4] / torch.tensor(3.0, dtype=torch.float64),  # 0-dim CPU operand
        lambda x, w, idx, n: torch.nn.functional.silu(x).cumsum(1),
        lambda x, w, idx, n: torch.zeros(5, 7).index_copy_(0, idx, x[:3]) if x.device.type == "cpu"
        else torch.zeros(5, 7, device="neuron").index_copy_(0, idx, x[:3]),
    ]
    for i, fn in enumerate(cases):
        want = fn(x, w, idx, n)
        got = fn(x.neuron(), w.neuron(), idx.neuron(), n.neuron())
        assert got.dtype == want.dtype and got.shape == want.shape, i
        assert_same(got, want, rtol=1e-5, atol=1e-6)


def test_queued_ops_keep_the_cpu_kernels_layouts():
    # A queued op's outputs are allocated from its shape function before the
    # kernel runs: they must have the CPU kernel's strides (which its meta
    # function, and so Inductor, also assume), e.g. attention output laid out
    # like the query. Ops called inside a launch (the fallbacks of compiled
    # graphs and AOTI models) find their stream busy and are queued.
    from torch_neuronx import _C

    g = torch.Generator().manual_seed(0)
    base = torch.randn(2, 10, 2, 8, generator=g)
    for q in (base.transpose(1, 2), base.transpose(1, 2).contiguous(), base.permute(0, 2, 3, 1).transpose(2, 3)):
        want = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, q, q)
        d = q.neuron()
        got = _C._launch(0, lambda: torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(d, d, d))
        for g_, w in zip(got, want):
            assert g_.stride() == w.stride()
            assert_same(g_, w, rtol=1e-6, atol=1e-6)


def test_in_place_ops_on_views_are_ordered():
    base = torch.arange(24.0).reshape(4, 6)
    dev = base.neuron()
    for t in (base, dev):
        v = t[1:3, ::2]
        v.mul_(10)
        v.add_(t[0, :3])
        t.neg_()
        t[:, 0].zero_()
        t.add_(1)
    assert_same(dev, base)


def test_operands_are_captured_at_launch():
    # Later changes to a CPU scalar or to the metadata of a device tensor do
    # not reach a queued kernel.
    s = torch.tensor(2.0)
    x = torch.arange(6.0).reshape(2, 3)
    xd = x.neuron()
    _long_work(torch.randn(512, 512, device="neuron") / 512, 4)  # keep the queue busy
    y = xd * s
    s.fill_(100.0)
    xd.t_()
    assert_same(y, x * 2)
    assert xd.shape == (3, 2)


def test_shape_errors_raise_at_the_call_site():
    a = torch.ones(3, device="neuron")
    b = torch.ones(4, device="neuron")
    with pytest.raises(RuntimeError, match="must match the size"):
        a + b
    with pytest.raises(RuntimeError, match="mat1 and mat2 shapes cannot be multiplied"):
        torch.mm(torch.ones(2, 3, device="neuron"), torch.ones(4, 2, device="neuron"))
    with pytest.raises(RuntimeError, match="doesn't match the broadcast shape"):
        a.add_(torch.ones(2, 3, device="neuron"))


def test_kernel_errors_surface_at_the_next_synchronization_point():
    x = torch.randn(4, 3, device="neuron")
    bad = torch.tensor([0, 7], device="neuron")
    y = torch.index_select(x, 0, bad)  # queued: the index values are data
    z = x * 2  # skipped after the failure
    with pytest.raises(torch.AcceleratorError, match=r"aten::index_select.*index out of range") as info:
        torch.neuron.synchronize()
    assert "NEURON_RT_LAUNCH_BLOCKING=1" in str(info.value)
    del y, z
    # Reported once; the stream works afterwards.
    torch.neuron.synchronize()
    assert_same(x + 1, x.cpu() + 1)
    # .item() and .cpu() are synchronization points too.
    torch.index_select(x, 0, bad)
    with pytest.raises(torch.AcceleratorError, match="index_select"):
        x.sum().item()


def test_launch_blocking_raises_kernel_errors_at_the_call():
    code = """
import torch
x = torch.randn(4, 3, device="neuron")
try:
    torch.index_select(x, 0, torch.tensor([9], device="neuron"))
except IndexError as e:
    print("raised at call:", type(e).__name__)
"""
    out = run_python(code, env={"NEURON_RT_LAUNCH_BLOCKING": "1"}).stdout
    assert "raised at call: IndexError" in out


def test_malformed_launch_blocking_is_a_clear_error():
    code = """
import torch
try:
    torch.ones(1, device="neuron")
except ValueError as e:
    print(e)
"""
    out = run_python(code, env={"NEURON_RT_LAUNCH_BLOCKING": "yes"}).stdout
    assert "NEURON_RT_LAUNCH_BLOCKING='yes' is invalid. Accepted: 0 or 1." in out


def test_two_streams_run_concurrently():
    # Device time of the same work on two streams, stamped by the streams
    # themselves: the intervals overlap (the executors run side by side).
    a = torch.randn(512, 512, device="neuron") / 512
    torch.neuron.synchronize()
    streams = [torch.neuron.Stream(), torch.neuron.Stream()]
    marks, outs = [], []
    for s in streams:
        with torch.neuron.stream(s):
            start, end = torch.neuron.Event(enable_timing=True), torch.neuron.Event(enable_timing=True)
            start.record()
            outs.append(_long_work(a, 8))
            end.record()
            marks.append((start, end))
    torch.neuron.synchronize()
    (s0, e0), (s1, e1) = marks
    assert s0.elapsed_time(e0) > 0 and s1.elapsed_time(e1) > 0
    assert s0.elapsed_time(s1) < s0.elapsed_time(e0)  # stream 1 started before stream 0 ended
    assert_same(outs[0], outs[1].cpu())


def test_wait_stream_orders_a_consumer_after_its_producer():
    producer, consumer = torch.neuron.Stream(), torch.neuron.Stream()
    a = torch.randn(512, 512, device="neuron") / 512
    torch.neuron.synchronize()
    with torch.neuron.stream(producer):
        y = _long_work(a, 6) + 1
    consumer.wait_stream(producer)
    with torch.neuron.stream(consumer):
        z = y * 2
    y.record_stream(consumer)
    del y
    with torch.neuron.stream(producer):  # may reuse y's block only after z is computed
        junk = torch.full((512, 512), 7.0, device="neuron")
    consumer.synchronize()
    assert_same(z, (_long_work(a.cpu(), 6) + 1) * 2, rtol=1e-4, atol=1e-5)
    del junk


def test_memory_of_finished_kernels_is_released():
    torch.neuron.synchronize()
    before = torch.neuron.memory_allocated()
    x = torch.randn(256, 256, device="neuron")
    y = torch.mm(x, x) + 1
    del x, y
    torch.neuron.synchronize()
    assert torch.neuron.memory_allocated() == before


def test_pending_kernels_release_memory_before_oom():
    code = """
import torch
MiB = 1 << 20
x = torch.ones(4 * MiB // 4, device="neuron")      # 4 MiB
for i in range(40):                                  # 40 x 8 MiB through a 32 MiB device
    y = torch.cat([x, x]) * i
    del y
torch.neuron.synchronize()
print("ok", torch.neuron.memory_stats()["num_ooms"])
"""
    out = run_python(code, env={"NEURON_RT_HBM_BYTES": str(32 << 20)}).stdout
    assert "ok 0" in out


def test_dropped_tensors_of_queued_kernels_stay_bounded():
    # Queued kernels hold their operands, also those the host already dropped.
    # A loop far ahead of the device held 1024 kernels' worth: an RMSNorm on a
    # 32 MiB tensor had 9.7 GiB allocated after 100 iterations. The stream
    # bounds the bytes its queued kernels touch (kMaxQueuedBytes, 1 GiB).
    x = torch.randn(8192, 1024, device="neuron")
    w = torch.randn(1024, device="neuron")
    torch.neuron.synchronize()
    torch.neuron.reset_peak_memory_stats()
    base = torch.neuron.memory_allocated()
    for _ in range(40):  # ~4 GiB of intermediates
        y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w
    torch.neuron.synchronize()
    assert torch.neuron.max_memory_allocated() - base < (1536 << 20)
    assert_same(y, x.cpu() * torch.rsqrt(x.cpu().pow(2).mean(-1, keepdim=True) + 1e-6) * w.cpu())


def test_non_blocking_copy_to_pinned_memory():
    x = torch.randn(1024, 256, device="neuron")
    y = _long_work(x[:256] / 256, 3)
    host = torch.empty(256, 256).pin_memory()
    host.copy_(y, non_blocking=True)
    ev = torch.neuron.Event()
    ev.record()
    ev.synchronize()
    torch.testing.assert_close(host, _long_work(x.cpu()[:256] / 256, 3), rtol=1e-4, atol=1e-5)


def test_queued_kernels_run_below_autograd_like_their_caller():
    # An out= kernel (any.all_out) fills its output through the dispatcher; on
    # the executor it must skip autograd as its caller did, inference tensors too.
    with torch.inference_mode():
        x = torch.randn(16, device="neuron")
        inside = (x > 0).any()
        mean = x.reshape(4, 4).mean(-1, keepdim=True)
    outside = (x > 0).any() & (x < 10).all()
    torch.neuron.synchronize()
    assert inside.item() == bool((x.cpu() > 0).any())
    assert_same(mean, x.cpu().reshape(4, 4).mean(-1, keepdim=True))
    assert outside.item() == bool((x.cpu() > 0).any() & (x.cpu() < 10).all())


def test_nki_kernels_are_queued():
    # An NKI kernel is queued like an ATen op: the call returns while the
    # stream still works on what came before it (a synchronous launch made a
    # decode step with the Hub RMSNorm wait for the stream 61 times a token).
    import nki_kernels as K
    from torch_neuronx import _C

    x, y = torch.randn(256, 512), torch.randn(256, 512)
    xd, yd = x.neuron(), y.neuron()
    K.tensor_add(xd, yd)  # traced and lowered before the stream gets busy
    a = torch.randn(768, 768, device="neuron") / 768
    torch.neuron.synchronize()
    stream = torch.neuron.current_stream()
    busy = _long_work(a)
    before = _C._launch_counts(0)
    out = K.tensor_add(xd * 2, busy[:256, :512] + yd)  # reads what the queued work writes
    issued, stalls = (b - a for a, b in zip(before, _C._launch_counts(0)))
    assert not stream.query() and issued == 3 and stalls == 0, (issued, stalls)
    assert_same(out, x * 2 + _long_work(a.cpu())[:256, :512] + y, rtol=1e-4, atol=1e-5)


def test_nki_kernel_keeps_its_arguments_until_it_ran():
    # A tensor the kernel reads on a side stream, dropped by the caller at once:
    # its block must not go back to the allocator (and into a new tensor the
    # default stream writes) before the queued kernel has read it.
    import nki_kernels as K

    x, y = torch.randn(256, 512), torch.randn(256, 512)
    yd = y.neuron()
    K.tensor_add(yd, yd)
    a = torch.randn(768, 768, device="neuron") / 768
    side = torch.neuron.Stream()
    for _ in range(3):
        xd = x.neuron()
        torch.neuron.synchronize()
        with torch.neuron.stream(side):
            _long_work(a, n=6)
            out = K.tensor_add(xd, yd)
        del xd
        junk = [torch.full((256, 512), 7.0, device="neuron") for _ in range(4)]
        side.synchronize()
        torch.neuron.synchronize()
        assert_same(out, x + y)
        del junk
