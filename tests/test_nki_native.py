"""The native NKI executor (csrc/runtime/nki, lowered by nki/_native.py) against the
interpreter it replaces: identical outputs (bit for bit, NaNs included) on
the acceptance kernels, torch's summation order reproduced, the NaN
sentinel of fresh tiles, aliasing, threads, and NKI_EXECUTOR; fp16, fp8 and
integer tiles (torch's conversions on store), transposes; matmuls (nc_matmul,
nl.matmul) and
transcendental activations within the tolerance docs/nki.md states; the
runtime launch and its checks of the record table."""
import os
import sys

import pytest
import torch

import nki
import nki.isa as nisa
import nki.language as nl
from nki import _native

sys.path.insert(0, os.path.dirname(__file__))
import nki_kernels as K  # noqa: E402

from conftest import assert_same  # noqa: E402


def _run(mode, kernel, *args, monkeypatch):
    monkeypatch.setenv("NKI_EXECUTOR", mode)
    return kernel(*args)


def _identical(a, b):
    a, b = a.cpu(), b.cpu()
    assert a.dtype == b.dtype and a.shape == b.shape
    assert torch.equal(a.isnan(), b.isnan())
    assert torch.equal(torch.nan_to_num(a), torch.nan_to_num(b)), (a.float() - b.float()).abs().max()


def _both(kernel, *args, monkeypatch):
    ref = _run("interpreter", kernel, *args, monkeypatch=monkeypatch)
    out = _run("native", kernel, *args, monkeypatch=monkeypatch)
    _identical(out, ref)
    return out


def _rmsnorm_ref(x, w, eps):
    x32 = x.float()
    return x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps) * w.float()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
# (2100, 2048): outputs of 8 MiB and more are stored with streaming stores; (520, 4099):
# streamed rows that start off the vector alignment (a head of normal stores, then a tail).
@pytest.mark.parametrize("rows,hidden", [(512, 2048), (300, 1000), (5, 13), (2100, 2048), (520, 4099)])
def test_rmsnorm_native_matches_interpreter(dtype, rows, hidden, monkeypatch):
    x = torch.randn(rows, hidden).to(dtype).to("neuron")
    w = torch.randn(1, hidden).to(dtype).to("neuron")
    out = _both(K.rmsnorm_wide, x, w, 1e-6, monkeypatch=monkeypatch)
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    assert_same(out.float(), _rmsnorm_ref(x.cpu(), w.cpu(), 1e-6), atol=tol, rtol=tol)


@nki.jit
def _row_chain(x, w, eps):
    """RMSNorm's row step with [P, 1] records that must not take the value the
    record before stored from a register: a bf16 statistic (rounded on store),
    and a record reading an older tile than the one just written."""
    rows, H = x.shape
    out = nl.ndarray((rows, H), dtype=x.dtype, buffer=nl.shared_hbm)
    wb = nl.ndarray((128, H), dtype=w.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=wb, src=w.broadcast_to((128, H)))
    for i in nl.affine_range((rows + 127) // 128):
        p = min(128, rows - i * 128)
        t = nl.ndarray((128, H), dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t[:p], src=x[i * 128:i * 128 + p])
        sq = nl.ndarray((128, H), dtype=nl.float32, buffer=nl.sbuf)
        ss = nl.ndarray((128, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.activation_reduce(dst=sq[:p], op=nl.square, data=t[:p], reduce_op=nl.add, reduce_res=ss[:p])
        m = nl.ndarray((128, 1), dtype=nl.bfloat16, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=m[:p], data=ss[:p], op0=nl.multiply, operand0=1.0 / H, op1=nl.add, operand1=eps)
        r = nl.ndarray((128, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.activation(dst=r[:p], op=nl.rsqrt, data=m[:p])
        s = nl.ndarray((128, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=s[:p], data=ss[:p], op0=nl.multiply, operand0=r[:p], op1=nl.multiply, operand1=1.0 / H)
        nisa.activation(dst=s[:p], op=nl.rsqrt, data=s[:p])
        y = nl.ndarray((128, H), dtype=x.dtype, buffer=nl.sbuf)
        nisa.scalar_tensor_tensor(dst=y[:p], data=t[:p], op0=nl.multiply, operand0=s[:p], op1=nl.multiply,
                                  operand1=wb[:p])
        nisa.dma_copy(dst=out[i * 128:i * 128 + p], src=y[:p])
    return out


@pytest.mark.parametrize("threads", [1, 2])
def test_row_step_forwarding_matches_interpreter(threads, monkeypatch):
    # A streamed fp32 output (8.5 MB, a partial last tile) makes these row
    # steps; each [P, 1] value goes to the next record in a register only
    # where that is the fp32 element it just stored (RowOp::forward).
    monkeypatch.setenv("NKI_SPLIT_SMALL", "1")
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        x = torch.randn(1040, 2048).to("neuron")
        w = torch.randn(1, 2048).to("neuron")
        out = _both(_row_chain, x, w, 1e-6, monkeypatch=monkeypatch)
    finally:
        torch.set_num_threads(old)
    x32 = x.cpu()
    ss = x32.pow(2).sum(-1, keepdim=True)
    r = torch.rsqrt((ss / 2048 + 1e-6).bfloat16().float())
    ref = x32 * torch.rsqrt(ss * r / 2048) * w.cpu()
    assert_same(out, ref, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("dtype,shape", [(torch.float32, (3, 64, 30, 30)), (torch.bfloat16, (3, 64, 30, 30)),
                                         (torch.float32, (24, 128, 56, 56))])  # a streamed 9.6 MB output
def test_pool_native_matches_interpreter(dtype, shape, monkeypatch):
    x = torch.randn(*shape).to(dtype).to("neuron")
    b = torch.randn(shape[1], 1).to(dtype).to("neuron")
    out = _both(K.avgpool_bias_relu, x, b, monkeypatch=monkeypatch)
    ref = torch.relu(torch.nn.functional.avg_pool2d(x.cpu().float(), 2) + b.cpu().float().view(1, -1, 1, 1))
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    assert_same(out.float(), ref, atol=tol, rtol=tol)


@pytest.mark.parametrize("threads", [1, 2])
def test_native_threads_identical(threads, monkeypatch):
    monkeypatch.setenv("NKI_SPLIT_SMALL", "1")  # small programs would run on one thread
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        x = torch.randn(700, 256).to("neuron")
        w = torch.randn(1, 256).to("neuron")
        _both(K.rmsnorm_wide, x, w, 1e-5, monkeypatch=monkeypatch)
    finally:
        torch.set_num_threads(old)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_native_matmul_rows_split_identical(dtype, monkeypatch):
    # Each thread computes its partitions' rows of a matmul: the same bits as
    # one thread (tiled matmuls accumulating in PSUM; attention heads whose
    # last query tile is partial, with transposes and softmax between them).
    monkeypatch.setenv("NKI_SPLIT_SMALL", "1")  # small programs would run on one thread
    monkeypatch.setenv("NKI_EXECUTOR", "native")
    g = torch.Generator().manual_seed(5)
    a, b = torch.randn(256, 128, generator=g).to(dtype), torch.randn(256, 1024, generator=g).to(dtype)
    q, k, v = (torch.randn(s, 64, generator=g).to(dtype) for s in (200, 256, 256))
    old = torch.get_num_threads()
    outs = {}
    try:
        for threads in (1, 2, 3):
            torch.set_num_threads(threads)
            outs[threads] = (K.matmul_tiled(a.to("neuron"), b.to("neuron")).cpu(),
                             K.attention_head(q.to("neuron"), k.to("neuron"), v.to("neuron"), 0.125).cpu())
    finally:
        torch.set_num_threads(old)
    for threads in (2, 3):
        for got, ref in zip(outs[threads], outs[1]):
            _identical(got, ref)


@nki.jit
def _row_sums(x):
    """Sum of squares per row through activation_reduce, and plain row sums
    and maxima through tensor_reduce (both in torch's summation order)."""
    P, F = x.shape
    out = nl.ndarray((P, 3), dtype=nl.float32, buffer=nl.shared_hbm)
    t = nl.ndarray((P, F), dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x)
    sq = nl.ndarray((P, F), dtype=nl.float32, buffer=nl.sbuf)
    r = nl.ndarray((P, 3), dtype=nl.float32, buffer=nl.sbuf)
    nisa.activation_reduce(dst=sq, op=nl.square, data=t, reduce_op=nl.add, reduce_res=r[:, 0:1])
    nisa.tensor_reduce(dst=r[:, 1:2], op=nl.add, data=t, axis=1, keepdims=True)
    nisa.tensor_reduce(dst=r[:, 2:3], op=nl.maximum, data=t, axis=1, keepdims=True, negate=True)
    nisa.dma_copy(dst=out, src=r)
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_native_sum_order_is_torchs(dtype, monkeypatch):
    # Every width through the lane, ILP and cascade-level boundaries of torch's sum;
    # 5 rows: the executor sums two rows per pass, and the last one alone.
    for F in list(range(1, 80)) + [127, 128, 129, 255, 256, 257, 1000, 2048, 4097, 16384, 40000]:
        x = (torch.randn(5, F) * 1000).to(dtype)
        _both(_row_sums, x, monkeypatch=monkeypatch)


@nki.jit
def _row_extremes(x):
    """Row maxima and minima through tensor_reduce (negated too)."""
    P, F = x.shape
    out = nl.ndarray((P, 4), dtype=nl.float32, buffer=nl.shared_hbm)
    t = nl.ndarray((P, F), dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x)
    r = nl.ndarray((P, 4), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_reduce(dst=r[:, 0:1], op=nl.maximum, data=t, axis=1, keepdims=True)
    nisa.tensor_reduce(dst=r[:, 1:2], op=nl.minimum, data=t, axis=1, keepdims=True)
    nisa.tensor_reduce(dst=r[:, 2:3], op=nl.maximum, data=t, axis=1, keepdims=True, negate=True)
    nisa.tensor_reduce(dst=r[:, 3:4], op=nl.minimum, data=t, axis=1, keepdims=True, negate=True)
    nisa.dma_copy(dst=out, src=r)
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_native_extremes_edges(dtype, monkeypatch):
    # Rows long enough for the 16-lane max/min: NaN (first, in the lanes, in the
    # tail, two different payloads), ties of +0 and -0 in either order (the sign
    # of the first one wins), infinities, and all-equal rows.
    for F in (64, 65, 100, 2048):
        x = torch.randn(12, F)
        x[0, 0] = float("nan")
        x[1, 37] = float("nan")
        x[2, F - 1] = float("nan")
        x[3, 20], x[3, 50] = float("nan"), -float("nan")
        x[4] = 0.0
        x[4, F // 2:] = -0.0
        x[5] = -0.0
        x[5, 17] = 0.0
        x[6] = -x[6].abs()
        x[6, 8], x[6, 19] = 0.0, -0.0  # the max is a zero: the first one's sign (+0; lane 3's is -0)
        x[7] = x[7].abs()
        x[7, 5], x[7, 34] = 0.0, -0.0  # the min is a zero (+0 first; lane 2's is -0)
        x[8, 9] = float("inf")
        x[8, 60] = -float("inf")
        x[9] = 1.5
        x[10] = -x[10].abs() - 1
        x[10, F - 1] = -0.5  # the max in the scalar tail
        _both(_row_extremes, x.to(dtype), monkeypatch=monkeypatch)


@nki.jit
def _partial_tile(x):
    """Reads a tile of which only half was written: the other half is the
    NaN sentinel on both executors."""
    P, F = x.shape
    out = nl.ndarray((P, F), dtype=x.dtype, buffer=nl.shared_hbm)
    t = nl.ndarray((P, F), dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t[:, :F // 2], src=x[:, :F // 2])
    y = nl.ndarray((P, F), dtype=x.dtype, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=y, data=t, op0=nl.add, operand0=1.0)
    nisa.dma_copy(dst=out, src=y)
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_native_nan_sentinel(dtype, monkeypatch):
    x = torch.randn(8, 64).to(dtype)
    out = _both(_partial_tile, x, monkeypatch=monkeypatch)
    assert out[:, 32:].isnan().all() and not out[:, :32].isnan().any()


@nki.jit
def _aliasing(x):
    """Sources overlapping the destination in the same tile: a shifted copy
    within rows, an in-place op whose per-partition operand lives in the
    destination, and a shifted-partition copy."""
    P, F = x.shape
    out = nl.ndarray((P, F), dtype=x.dtype, buffer=nl.shared_hbm)
    t = nl.ndarray((P, F), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x)
    nisa.tensor_copy(dst=t[:, 1:], src=t[:, :F - 1])
    nisa.tensor_scalar(dst=t, data=t, op0=nl.multiply, operand0=t[:, 3:4], op1=nl.add, operand1=t[:, 0:1])
    nisa.scalar_tensor_tensor(dst=t, data=t, op0=nl.multiply, operand0=2.0, op1=nl.subtract, operand1=t)
    nisa.tensor_copy(dst=t[1:], src=t[:P - 1])
    nisa.dma_copy(dst=out, src=t)
    return out


def test_native_aliasing(monkeypatch):
    _both(_aliasing, torch.randn(16, 40), monkeypatch=monkeypatch)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_native_precise_fp_off(dtype, monkeypatch):
    monkeypatch.setenv("NKI_PRECISE_FP", "0")
    x = torch.randn(200, 96).to(dtype)
    w = torch.randn(1, 96).to(dtype)
    _both(K.rmsnorm_wide, x, w, 1e-6, monkeypatch=monkeypatch)


@nki.jit
def _repeat_add(x, count):
    # A device loop (tile-valued condition): acc += a while the counter is positive.
    a = nl.load(x)
    n = nl.full((1, 1), count, nl.float32)
    acc = nl.copy(a)
    last = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)  # first written inside the loop

    def body(state):
        cnt, t = state
        nisa.tensor_scalar(dst=cnt, data=cnt, op0=nl.subtract, operand0=1.0)
        nisa.tensor_tensor(dst=t, data1=t, data2=a, op=nl.add)
        nisa.tensor_copy(dst=last, src=t)
        return state
    nl.while_loop(lambda state: nl.greater(state[0], 0.0), body, (n, acc))
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    seen = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    nl.store(out, acc)
    nl.store(seen, last)
    return out, seen


def _both_pair(kernel, *args, monkeypatch):
    ref = _run("interpreter", kernel, *args, monkeypatch=monkeypatch)
    out = _run("native", kernel, *args, monkeypatch=monkeypatch)  # NKI_EXECUTOR=native: no fallback
    for o, r in zip(out, ref):
        _identical(o, r)
    return out


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("dtype", [torch.int32, torch.float32])
def test_native_while_loop_counts(dtype, threads, monkeypatch):
    monkeypatch.setenv("NKI_SPLIT_SMALL", "1")  # a device loop runs on one thread whatever it is offered
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        a = torch.randint(-100, 100, (128, 512)).to(dtype).to("neuron")
        out, seen = _both_pair(_repeat_add, a, 3, monkeypatch=monkeypatch)
    finally:
        torch.set_num_threads(old)
    assert out.device.type == "neuron"
    assert torch.equal(out.cpu(), a.cpu() * 4)
    assert torch.equal(seen.cpu(), a.cpu() * 4)


def test_native_while_loop_runs_zero_times(monkeypatch):
    a = torch.randn(64, 96).to("neuron")
    out, seen = _both_pair(_repeat_add, a, 0, monkeypatch=monkeypatch)
    assert torch.equal(out.cpu(), a.cpu())
    # The tile only the body writes keeps the NaN sentinel of a fresh buffer, on both executors.
    assert seen.cpu().isnan().all()


@nki.jit
def _halve_until(x, threshold):
    """A data-dependent loop: halve every element (rounded to x's dtype)
    until the largest is at most ``threshold``; also counts the steps."""
    t = nl.load(x)
    steps = nl.full((1, 1), 0, nl.int32)
    row = nl.ndarray((x.shape[0], 1), dtype=nl.float32, buffer=nl.sbuf)
    top = nl.ndarray((1, 1), dtype=nl.float32, buffer=nl.sbuf)

    def cond(state):
        nisa.tensor_reduce(dst=row, op=nl.maximum, data=state[0], axis=1, keepdims=True)
        nisa.tensor_partition_reduce(dst=top, op=nl.maximum, data=row)
        return nl.greater(top, threshold)

    def body(state):
        cur, n = state
        nisa.tensor_scalar(dst=cur, data=cur, op0=nl.multiply, operand0=0.5)
        nisa.tensor_scalar(dst=n, data=n, op0=nl.add, operand0=1)
        return state
    nl.while_loop(cond, body, (t, steps))
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    count = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.shared_hbm)
    nl.store(out, t)
    nl.store(count, steps)
    return out, count


@pytest.mark.parametrize("dtype", [torch.float32, torch.int32])
def test_native_while_loop_data_dependent(dtype, monkeypatch):
    x = (torch.rand(128, 200) * 1e6).to(dtype)
    x[17, 3] = 3e6  # the largest element decides the number of steps
    threshold = 10.0
    out, count = _both_pair(_halve_until, x.to("neuron"), threshold, monkeypatch=monkeypatch)
    ref, steps = x.clone(), 0
    while ref.float().max() > threshold:
        ref = (ref * 0.5) if dtype.is_floating_point else torch.round(ref.double() * 0.5).to(dtype)
        steps += 1
    assert steps > 10
    assert torch.equal(out.cpu(), ref)
    assert count.cpu().item() == steps


@nki.jit
def _nested(x):
    """Loops inside an affine_range body, nested two deep: each row block
    adds itself 1 + 3 * 2 times (the inner counter restarts per outer pass)."""
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    for i in nl.affine_range(x.shape[0] // 32):
        a = nl.load(x[i * 32:(i + 1) * 32, :])
        acc = nl.copy(a)
        outer = nl.full((1, 1), 3, nl.int32)
        inner = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.sbuf)

        def inner_body(cnt):
            nisa.tensor_scalar(dst=cnt, data=cnt, op0=nl.subtract, operand0=1)
            nisa.tensor_tensor(dst=acc, data1=acc, data2=a, op=nl.add)
            return cnt

        def outer_body(cnt):
            nisa.tensor_scalar(dst=cnt, data=cnt, op0=nl.subtract, operand0=1)
            nisa.memset(inner, 2)
            nl.while_loop(lambda c: nl.greater(c, 0), inner_body, inner)
            return cnt
        nl.while_loop(lambda c: nl.greater(c, 0), outer_body, outer)
        nl.store(out[i * 32:(i + 1) * 32, :], acc)
    return out


def test_native_while_loop_nested(monkeypatch):
    x = torch.randint(-1000, 1000, (96, 40), dtype=torch.int32).to("neuron")
    out = _both(_nested, x, monkeypatch=monkeypatch)
    assert torch.equal(out.cpu(), x.cpu() * 7)


@nki.jit
def _capped(x, count, cap):
    a = nl.load(x)
    n = nl.full((1, 1), count, nl.float32)

    def body(cnt):
        nisa.tensor_scalar(dst=cnt, data=cnt, op0=nl.subtract, operand0=1.0)
        nisa.tensor_tensor(dst=a, data1=a, data2=a, op=nl.add)
        return cnt
    nl.while_loop(lambda c: nl.greater(c, 0.0), body, n, max_iterations=cap)
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    nl.store(out, a)
    return out


@pytest.mark.parametrize("mode", ["interpreter", "native"])
def test_while_loop_iteration_cap(mode, monkeypatch):
    x = torch.ones(8, 16).to("neuron")
    with pytest.raises(nki.NKIError) as err:
        _run(mode, _capped, x, 10, 3, monkeypatch=monkeypatch)
    assert str(err.value) == "nki.language.while_loop: more than 3 iterations"
    # Exactly the cap is allowed; the device still works after the error.
    out = _run(mode, _capped, x, 3, 3, monkeypatch=monkeypatch)
    assert torch.equal(out.cpu(), torch.full((8, 16), 8.0))


def test_executor_env_checked(monkeypatch):
    monkeypatch.setenv("NKI_EXECUTOR", "fast")
    with pytest.raises(nki.NKIError, match="NKI_EXECUTOR"):
        K.rmsnorm_wide(torch.randn(4, 8), torch.randn(1, 8), 1e-6)


def test_native_elides_dma(monkeypatch):
    # The lowering loads tiles in place and stores forward into the output:
    # rmsnorm_wide keeps no copy record at all.
    x, w = torch.randn(256, 64), torch.randn(1, 64)
    monkeypatch.setenv("NKI_EXECUTOR", "native")
    K.rmsnorm_wide(x, w, 1e-6)
    nat = _native.plan(K.rmsnorm_wide.trace((x, w, 1e-6)), True)
    ops = nat.words.reshape(nat.ninstr, -1)[:, 0].tolist()
    assert _native.OP_COPY not in ops
    assert nat.covered  # the output is written whole: no NaN fill
    assert _native.OP_FILL not in ops  # nor of the sums tile, written whole through reduce_res


def test_native_no_fill_where_nothing_unwritten_is_read(monkeypatch):
    # A partial last tile ([128, H] tiles written and read on their first p rows)
    # needs no NaN fill: nothing reads the rows left unwritten (_never_read_unwritten).
    # _partial_tile, which reads them, keeps its fill (test_native_nan_sentinel).
    x, w = torch.randn(200, 96), torch.randn(1, 96)
    ops = _native.plan(K.rmsnorm_wide.trace((x, w, 1e-6)), True).words.reshape(-1, _native.RECORD)[:, 0]
    assert _native.OP_FILL not in ops.tolist()
    fills = _native.plan(_partial_tile.trace((x[:8],)), True).words.reshape(-1, _native.RECORD)[:, 0]
    assert _native.OP_FILL in fills.tolist()
    _both(K.rmsnorm_wide, x, w, 1e-6, monkeypatch=monkeypatch)


@nki.jit
def _per_row(x):
    """[P, 1] statistics: reversed tensor_scalar ops with tile operands, an
    activation with scale and bias tiles, into fp32 and bf16 tiles."""
    P, F = x.shape
    out = nl.ndarray((P, 4), dtype=x.dtype, buffer=nl.shared_hbm)
    t = nl.ndarray((P, F), dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x)
    r = nl.ndarray((P, 4), dtype=x.dtype, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=r[:, 0:1], data=t[:, 0:1], op0=nl.subtract, operand0=t[:, 1:2], reverse0=True,
                       op1=nl.divide, operand1=3.0, reverse1=True)
    nisa.tensor_scalar(dst=r[:, 1:2], data=t[:, 2:3], op0=nl.maximum, operand0=0.25, op1=nl.greater,
                       operand1=t[:, 3:4])
    nisa.activation(dst=r[:, 2:3], op=nl.rsqrt, data=t[:, 4:5], scale=t[:, 5:6], bias=2.5)
    nisa.activation(dst=r[:, 3:4], op=nl.relu, data=t[:, 6:7], scale=-1.5, bias=t[:, 7:8])
    nisa.dma_copy(dst=out, src=r)
    return out


@pytest.mark.parametrize("seq", [512, 200])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_attention_head_query_tiles_run_split(seq, dtype):
    # A head's records all run split by query rows (matmuls by their rows of
    # dst, read through the transposed views of Q and E), where whole matmuls
    # met twice each. The matmuls read K^T through k's transposed view
    # (packed or gathered once per launch), so no copy and no meeting.
    q, k = torch.randn(seq, 64).to(dtype), torch.randn(256, 64).to(dtype)
    nat = _native.plan(K.attention_head.trace((q, k, k, 0.125)), True)
    words = nat.words.reshape(nat.ninstr, -1)
    assert (words[:, 0] == _native.OP_MM).sum() >= 3 * -(-seq // 128)
    assert words[:, 13].tolist() == [0] * nat.ninstr
    assert words[0, 0] == _native.OP_MM and words[:, 14].sum().item() == 0
    assert _native.OP_COPY not in words[:, 0].tolist()


@nki.jit
def _shift_between_runs(x):
    """Two partition-local stretches around a DMA that rotates the partitions
    (b[p] = a[p + 1]): the executor runs local stretches a block of rows at a
    time, so the rotation must wait for every row of ``a``."""
    P, F = x.shape
    out = nl.ndarray((P, F), dtype=x.dtype, buffer=nl.shared_hbm)
    t = nl.ndarray((P, F), dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x)
    a = nl.ndarray((P, F), dtype=nl.float32, buffer=nl.sbuf)
    ss = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.activation_reduce(dst=a, op=nl.square, data=t, reduce_op=nl.add, reduce_res=ss)
    nisa.tensor_scalar(dst=a, data=a, op0=nl.multiply, operand0=ss, op1=nl.add, operand1=1.0)
    b = nl.ndarray((P, F), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=b[0:P - 1], src=a[1:P])
    nisa.dma_copy(dst=b[P - 1:P], src=a[0:1])
    y = nl.ndarray((P, F), dtype=x.dtype, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=y, data1=b, data2=t, op=nl.multiply)
    nisa.dma_copy(dst=out, src=y)
    return out


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_native_partition_mixing_between_local_runs(dtype, threads, monkeypatch):
    # F = 1024: a block is 32 rows, so each local stretch runs in several blocks.
    x = torch.randn(128, 1024).to(dtype)
    nat = _native.plan(_shift_between_runs.trace((x,)), True)
    words = nat.words.reshape(nat.ninstr, -1)
    # Every record runs split: the threads meet before the copies read rows
    # other threads wrote, and before the product reads the shifted rows.
    assert words[:, 0].tolist() == [_native.OP_ACT, _native.OP_TS, _native.OP_COPY, _native.OP_COPY, _native.OP_TT]
    assert words[:, 13].tolist() == [0] * 5 and words[:, 14].tolist() == [0, 0, 1, 0, 1]
    monkeypatch.setenv("NKI_SPLIT_SMALL", "1")  # small programs would run on one thread
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        out = _both(_shift_between_runs, x.to("neuron"), monkeypatch=monkeypatch)
    finally:
        torch.set_num_threads(old)
    xf = x.float()
    a = xf * xf * (xf * xf).sum(1, keepdim=True) + 1
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    assert_same(out.float(), (a.roll(-1, 0) * xf).to(dtype).float(), atol=tol, rtol=tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_native_per_row_statistics(dtype, monkeypatch):
    x = torch.randn(100, 8).abs().to(dtype)
    _both(_per_row, x, monkeypatch=monkeypatch)


def test_native_program_is_one_launch_on_the_current_stream(tmp_path, monkeypatch):
    # The runtime executor runs the whole program as one kernel, named after
    # the NKI kernel, on the stream that is current at the call.
    import json
    from torch.profiler import ProfilerActivity, profile
    monkeypatch.setenv("NKI_EXECUTOR", "native")
    x, w = torch.randn(256, 64, device="neuron"), torch.randn(1, 64, device="neuron")
    K.rmsnorm_wide(x, w, 1e-6)  # lowered outside the profile
    side = torch.neuron.Stream()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]) as prof:
        with torch.neuron.stream(side):
            out = K.rmsnorm_wide(x, w, 1e-6)
    path = tmp_path / "trace.json"
    prof.export_chrome_trace(str(path))
    kernels = [e for e in json.loads(path.read_text())["traceEvents"] if e.get("cat") == "kernel"]
    assert [(e["name"], e["tid"]) for e in kernels] == [("nki::rmsnorm_wide", side.stream_id)]
    assert_same(out, _rmsnorm_ref(x.cpu(), w.cpu(), 1e-6), atol=1e-5, rtol=1e-5)


def test_malformed_record_table_raises():
    # The runtime checks a table before it can run: a view past its buffer,
    # an unknown opcode and a wrong bound tensor are Python errors.
    from torch_neuronx import _C
    rec = [0] * _native.RECORD
    rec[0] = _native.OP_TS
    rec[3:9] = [0, 0, -1, -1, 0, -1]
    for k, (off, shape, strides) in enumerate([(1, (8, 4), (4, 1)), (0, (8, 4), (4, 1))]):
        v = _native.HEADER + k * _native.VIEW_WORDS
        rec[v:v + 3] = [1 - k, 2, off]
        rec[v + 3:v + 3 + _native.MAX_DIMS] = list(shape) + [1] * (_native.MAX_DIMS - 2)
        rec[v + 3 + _native.MAX_DIMS:v + _native.VIEW_WORDS] = list(strides) + [0] * (_native.MAX_DIMS - 2)
    imms = torch.zeros(2, dtype=torch.float64)
    bufs = [(0, 32, -1), (0, 32, -1)]
    with pytest.raises(RuntimeError, match=r"record 0: view 0 spans elements \[1, 32\] of buffer 1 of 32"):
        _C._NkiProgram(torch.tensor(rec), imms, bufs, 0, "bad")
    rec[_native.HEADER + 2] = 0
    prog = _C._NkiProgram(torch.tensor(rec), imms, bufs, 0, "ok")
    a, out = torch.randn(32), torch.empty(32)
    prog.run([a, out], 2)
    assert torch.equal(out, a)
    with pytest.raises(RuntimeError, match="bound buffer 1 must be a contiguous Float tensor of 32 elements"):
        prog.run([a, torch.empty(31)], 1)
    with pytest.raises(RuntimeError, match="expected 2 bound tensors"):
        prog.run([a], 1)
    rec[0] = 42
    with pytest.raises(RuntimeError, match="unknown opcode 42"):
        _C._NkiProgram(torch.tensor(rec), imms, bufs, 0, "bad")


def _close(out, ref, rtol, atol):
    """Native transcendentals and matmuls against the interpreter: NaNs in
    the same places, values within the documented tolerance."""
    out, ref = out.cpu().float(), ref.cpu().float()
    assert torch.equal(out.isnan(), ref.isnan())
    torch.testing.assert_close(out, ref, rtol=rtol, atol=atol, equal_nan=True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_native_matmul(dtype, monkeypatch):
    # One nc_matmul, K tiles accumulated in PSUM (accumulate=None: the first
    # write overwrites), and the ones-column broadcast of rmsnorm (K = 1: exact).
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(128, 64, generator=g).to(dtype), torch.randn(128, 512, generator=g).to(dtype)
    monkeypatch.setenv("NKI_EXECUTOR", "native")
    out = K.matmul_basic(a.to("neuron"), b.to("neuron"))
    ref = _run("interpreter", K.matmul_basic, a.to("neuron"), b.to("neuron"), monkeypatch=monkeypatch)
    tol = 1e-5 if dtype == torch.float32 else 1e-2  # fp32 sums in another order (bf16: the output rounding)
    _close(out, ref, rtol=tol, atol=tol)
    assert_same(out.float(), a.float().t() @ b.float(), atol=10 * tol, rtol=10 * tol)
    a, b = torch.randn(256, 128, generator=g), torch.randn(256, 1024, generator=g)
    monkeypatch.setenv("NKI_EXECUTOR", "native")
    out = K.matmul_tiled(a.to("neuron"), b.to("neuron"))
    ref = _run("interpreter", K.matmul_tiled, a.to("neuron"), b.to("neuron"), monkeypatch=monkeypatch)
    _close(out, ref, rtol=1e-5, atol=1e-4)
    x, w = torch.randn(200, 96, generator=g).to(dtype), torch.randn(1, 96, generator=g).to(dtype)
    _both(K.rmsnorm, x.to("neuron"), w.to("neuron"), 1e-6, monkeypatch=monkeypatch)


@nki.jit
def _moving_rewritten(a, b, c):
    """Two bf16 matmuls whose moving tiles are read from the same HBM rows,
    rewritten in between (b, then c): the second must see c."""
    K, M = a.shape
    N = b.shape[1]
    out = nl.ndarray((2, M, N), dtype=nl.float32, buffer=nl.shared_hbm)
    rows = nl.ndarray((K, N), dtype=b.dtype, buffer=nl.shared_hbm)
    ta = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=ta, src=a)
    for j, src in enumerate((b, c)):
        nisa.dma_copy(dst=rows, src=src)
        tb = nl.ndarray((K, N), dtype=b.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=tb, src=rows)
        acc = nl.ndarray((M, N), dtype=nl.float32, buffer=nl.psum)
        nisa.nc_matmul(acc, ta, tb)
        res = nl.ndarray((M, N), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(dst=res, src=acc)
        nisa.dma_copy(dst=out[j], src=res)
    return out, rows


def test_native_matmul_moving_packs_kept_only_while_unchanged(monkeypatch):
    # A bf16 matmul's moving operand from a bound buffer that no record writes
    # is packed once per launch (attention's K^T and V blocks); rows the kernel
    # rewrites are packed again, and two launches on new inputs are not mixed up.
    g = torch.Generator().manual_seed(3)
    a, b, c = (torch.randn(64, s, generator=g).to(torch.bfloat16) for s in (128, 256, 256))
    monkeypatch.setenv("NKI_EXECUTOR", "native")
    out, _ = _moving_rewritten(a.to("neuron"), b.to("neuron"), c.to("neuron"))
    ref, _ = _run("interpreter", _moving_rewritten, a.to("neuron"), b.to("neuron"), c.to("neuron"),
                  monkeypatch=monkeypatch)
    _close(out, ref, rtol=1e-5, atol=1e-5)
    assert_same(out[0], a.float().t() @ b.float(), atol=1e-3, rtol=1e-3)
    assert_same(out[1], a.float().t() @ c.float(), atol=1e-3, rtol=1e-3)
    q, k, v = (torch.randn(384, 64, generator=g).to(torch.bfloat16) for _ in range(3))
    first = K.attention_head(q.to("neuron"), k.to("neuron"), v.to("neuron"), 0.125)
    second = K.attention_head(q.to("neuron"), v.to("neuron"), k.to("neuron"), 0.125)  # new moving operands
    for got, (kk, vv) in ((first, (k, v)), (second, (v, k))):
        want = _run("interpreter", K.attention_head, q.to("neuron"), kk.to("neuron"), vv.to("neuron"), 0.125,
                    monkeypatch=monkeypatch)
        monkeypatch.setenv("NKI_EXECUTOR", "native")
        _close(got, want, rtol=2e-2, atol=2e-2)


@nki.jit
def _moving_transposed(a, bt, c, rewrite):
    """Two matmuls reading one tile transposed from argument bt (K^T of
    an attention head); with ``rewrite`` the kernel then writes bt (an
    in-place argument)."""
    K, M = a.shape
    N = bt.shape[0]
    out = nl.ndarray((2, M, N), dtype=nl.float32, buffer=nl.shared_hbm)
    tb = nl.ndarray((K, N), dtype=bt.dtype, buffer=nl.sbuf)
    nisa.dma_transpose(dst=tb, src=bt)
    for j, st in enumerate((a, c)):
        ts = nl.ndarray((K, M), dtype=a.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=ts, src=st)
        acc = nl.ndarray((M, N), dtype=nl.float32, buffer=nl.psum)
        nisa.nc_matmul(acc, ts, tb)
        res = nl.ndarray((M, N), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(dst=res, src=acc)
        nisa.dma_copy(dst=out[j], src=res)
    if rewrite:
        t2 = nl.ndarray((M, K), dtype=a.dtype, buffer=nl.sbuf)
        nisa.dma_transpose(dst=t2, src=a)
        nisa.dma_copy(dst=bt, src=t2)
    return out


@pytest.mark.parametrize("rewrite", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_native_matmul_operand_transpose_folded_only_when_unwritten(dtype, rewrite, monkeypatch):
    # A tile transposed from an argument and read only by matmuls: they read
    # the argument through the transposed view (packed or gathered once per
    # launch) and the copy goes, unless the kernel writes the argument. The
    # same bits as with the copy (1 and 2 threads alike; the interpreter
    # within the matmul's tolerance).
    g = torch.Generator().manual_seed(9)
    a, c = (torch.randn(64, 128, generator=g).to(dtype) for _ in range(2))
    bt = torch.randn(128, 64, generator=g).to(dtype)
    nat = _native.plan(_moving_transposed.trace((a, bt, c, rewrite)), True)
    words = nat.words.reshape(nat.ninstr, -1)
    transposed = [i for i in range(nat.ninstr) if words[i, 0] == _native.OP_COPY and words[i, _native.HEADER + 1] == 2
                  and words[i, _native.HEADER + _native.VIEW_WORDS + 3 + _native.MAX_DIMS] == 1]
    assert words[0, 0] == (_native.OP_COPY if rewrite else _native.OP_MM) and len(transposed) == 2 * rewrite
    monkeypatch.setenv("NKI_SPLIT_SMALL", "1")
    old = torch.get_num_threads()
    outs = []
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            args = [x.to("neuron") for x in (a, bt, c)]
            monkeypatch.setenv("NKI_EXECUTOR", "native")
            outs.append((_moving_transposed(*args, rewrite).cpu(), args[1].cpu()))
    finally:
        torch.set_num_threads(old)
    args = [x.to("neuron") for x in (a, bt, c)]
    ref = _run("interpreter", _moving_transposed, *args, rewrite, monkeypatch=monkeypatch)
    for out, b_after in outs:
        _identical(out, outs[0][0])
        _close(out, ref, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(out[0], a.float().t() @ bt.float().t(), atol=1e-3, rtol=1e-3)
        assert torch.equal(b_after, a.t() if rewrite else bt)


@nki.jit
def _psum_accumulate(a, b):
    """Overwrite, then add, then a forced overwrite and a forced add."""
    K, M = a.shape
    out = nl.ndarray((3, M, b.shape[1]), dtype=nl.float32, buffer=nl.shared_hbm)
    ta = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.sbuf)
    tb = nl.ndarray(b.shape, dtype=b.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=ta, src=a)
    nisa.dma_copy(dst=tb, src=b)
    acc = nl.ndarray((M, b.shape[1]), dtype=nl.float32, buffer=nl.psum)
    res = nl.ndarray((M, b.shape[1]), dtype=nl.float32, buffer=nl.sbuf)
    nisa.nc_matmul(acc, ta, tb)
    nisa.nc_matmul(acc, ta, tb)
    nisa.tensor_copy(dst=res, src=acc)
    nisa.dma_copy(dst=out[0], src=res)
    nisa.nc_matmul(acc, ta, tb, accumulate=False)
    nisa.tensor_copy(dst=res, src=acc)
    nisa.dma_copy(dst=out[1], src=res)
    fresh = nl.ndarray((M, b.shape[1]), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul(fresh, ta, tb, accumulate=True)  # onto the NaN sentinel
    nisa.tensor_copy(dst=res, src=fresh)
    nisa.dma_copy(dst=out[2], src=res)
    return out


def test_native_psum_accumulate(monkeypatch):
    a, b = torch.randn(32, 16).to("neuron"), torch.randn(32, 48).to("neuron")
    monkeypatch.setenv("NKI_EXECUTOR", "native")
    out = _psum_accumulate(a, b)
    ref = _run("interpreter", _psum_accumulate, a, b, monkeypatch=monkeypatch)
    _close(out, ref, rtol=1e-5, atol=1e-5)
    a, b = a.cpu(), b.cpu()
    assert_same(out[0], 2 * (a.t() @ b), atol=1e-4, rtol=1e-4)
    assert_same(out[1], a.t() @ b, atol=1e-4, rtol=1e-4)
    assert out[2].cpu().isnan().all()


@nki.jit
def _activate(x, fn, scale, bias):
    P, F = x.shape
    out = nl.ndarray((P, F + 1), dtype=nl.float32, buffer=nl.shared_hbm)
    t = nl.ndarray((P, F), dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x)
    y = nl.ndarray((P, F + 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.activation(dst=y[:, :F], op=getattr(nl, fn), data=t, scale=scale, bias=bias, reduce_op=nl.add,
                    reduce_res=y[:, F:], reduce_cmd=nisa.reduce_cmd.reset_reduce)
    nisa.dma_copy(dst=out, src=y)
    return out


@pytest.mark.parametrize("fn", sorted(_native._FN))
def test_native_activation_functions(fn, monkeypatch):
    # Exact functions equal the interpreter bit for bit; the others (libm
    # against torch's vectorised approximations) agree within 4e-6 relative
    # or 2e-5 absolute (cancellation in GELU's tails; the row sums inherit it).
    x = torch.linspace(-8, 8, 97 * 130).reshape(97, 130)
    if fn in ("log",):
        x = x.abs() + 1e-3
    monkeypatch.setenv("NKI_EXECUTOR", "native")
    out = _activate(x, fn, 0.75, 0.25)
    ref = _run("interpreter", _activate, x, fn, 0.75, 0.25, monkeypatch=monkeypatch)
    if fn in _native.EXACT_FN:
        _identical(out, ref)
    else:
        _close(out, ref, rtol=4e-6, atol=2e-5)


_EXP_FNS = ("exp", "sigmoid", "silu", "softplus")  # computed from the executor's vectorised exp


def _exp_edges():
    """Wide-range values plus exp's edges: +-inf, NaN, overflow past 88.72, underflow
    below -103.97, subnormal results, signed zeros; 130 columns leave a scalar tail."""
    g = torch.Generator().manual_seed(3)
    x = (torch.rand(64, 130, generator=g) * 240 - 120)
    edges = torch.tensor([float("inf"), float("-inf"), float("nan"), 88.72, 88.7229, 89.0, -87.3, -100.0,
                          -103.9, -103.98, -104.0, -110.0, 1e-30, -1e-30, 0.0, -0.0, 20.0, 20.001, -20.0])
    x[0, :edges.numel()] = edges
    x[1, -edges.numel():] = -edges
    return x


def test_native_exp_edges(monkeypatch):
    # exp and the functions built on it against the interpreter (torch) on
    # the whole range: inf, -inf and NaN where torch has them, within the
    # transcendental tolerance elsewhere (underflow: the absolute part).
    x = _exp_edges()
    for fn in _EXP_FNS:
        monkeypatch.setenv("NKI_EXECUTOR", "native")
        out = _activate(x, fn, 1.0, 0.0)[:, :130]
        ref = _run("interpreter", _activate, x, fn, 1.0, 0.0, monkeypatch=monkeypatch)[:, :130]
        out, ref = out.cpu(), ref.cpu()
        assert torch.equal(out.isnan(), ref.isnan()), fn
        assert torch.equal(out.isinf(), ref.isinf()) and torch.equal(out[out.isinf()], ref[ref.isinf()]), fn
        fin = ref.isfinite()
        _close(out[fin], ref[fin], rtol=4e-6, atol=2e-5)


def _exp_in_range():
    """Rows whose exp arguments all lie in [-86, 86] (the executor's short exp form,
    chunk by chunk), spread over exponents and around exp's 2^n steps, with a
    576-column row (a 64-element tail chunk)."""
    g = torch.Generator().manual_seed(4)
    x = torch.rand(16, 576, generator=g) * 172 - 86
    x[1] = torch.randn(576, generator=g)
    x[2] = torch.randn(576, generator=g) * 1e-3
    x[3] = torch.linspace(-86, 86, 576)
    x[4] = torch.arange(-288, 288) * 0.6931472  # multiples of ln 2: the rounding of n
    x[5] = torch.arange(-288, 288) * 0.6931472 + 0.3465736
    return x


def test_native_exp_chunk_forms_identical(monkeypatch):
    # A chunk of in-range arguments takes a shorter exp (no clamps, 2^n in one step)
    # than a chunk holding one out-of-range value: the same bits either way, and
    # within the transcendental tolerance of the interpreter.
    monkeypatch.setenv("NKI_EXECUTOR", "native")
    x = _exp_in_range()
    spoilt = x.clone()
    spoilt[:, ::256] = float("nan")  # one per 256-element chunk: every chunk the long way
    keep = ~spoilt.isnan()
    for fn in ("exp", "sigmoid", "silu"):
        for scale, bias in ((1.0, 0.0), (0.5, 0.25)):
            short = _activate(x, fn, scale, bias)[:, :576].cpu()
            long = _activate(spoilt, fn, scale, bias)[:, :576].cpu()
            _same_bits(short[keep], long[keep])
        ref = _run("interpreter", _activate, x, fn, 1.0, 0.0, monkeypatch=monkeypatch)[:, :576].cpu()
        monkeypatch.setenv("NKI_EXECUTOR", "native")
        _close(_activate(x, fn, 1.0, 0.0)[:, :576].cpu(), ref, rtol=4e-6, atol=2e-5)


def test_native_exp_builds_agree():
    # The vectorised exp gives the same bits in every build (4, 8 or 16 lanes
    # and the scalar tail run the same fp32 steps), inside SwiGLU's fused loop too.
    from conftest import run_json
    cpu = open("/proc/cpuinfo").read()
    isas = ["generic"] + [i for i, flag in (("avx2", "avx2"), ("avx512", "avx512bw")) if flag in cpu]
    code = """
        import hashlib, json, os, sys, torch, torch_neuronx
        from torch_neuronx import _C
        sys.path.insert(0, %r)
        import test_nki_native as T
        assert _C._nki_kernel_isa() == %r
        os.environ["NKI_EXECUTOR"] = "native"
        x = T._exp_edges()
        xs = (x, T._exp_in_range())  # the long and the short (in-range) form
        got = {fn: [hashlib.sha256(T._bits(T._activate(v, fn, 0.75, 0.25)).numpy().tobytes()).hexdigest()
                    for v in xs] for fn in T._EXP_FNS}
        for dt in (torch.float32, torch.bfloat16):  # the fused activation and multiply (gate_mul)
            g, u = T._gate_inputs(300, 1100, dt)
            for fn in ("silu", "sigmoid"):
                out = T._gate_kernel(fn, T.nl.multiply)(g, u)
                got[f"{fn} fused {dt}"] = hashlib.sha256(T._bits(out).numpy().tobytes()).hexdigest()
        print(json.dumps(got))
    """
    got = {isa: run_json(code % (os.path.dirname(os.path.abspath(__file__)), isa), env={"NKI_KERNEL_ISA": isa})
           for isa in isas}
    for isa in isas[1:]:
        assert got[isa] == got["generic"], (isa, got)


def _gate_kernel(fn, op1, reuse=False, scale=1.5, in_place=False):
    """A fresh jit kernel (its own trace and plan) of SwiGLU's form:
    activation(s, fn, g) into an fp32 tile, then (s * 1.5) op1 u rounded to
    g's dtype; ``reuse`` reads s again afterwards (nothing to fuse then);
    ``in_place`` writes the result over ``gate`` and returns it."""
    def gate(gate, up):
        rows, F = gate.shape
        out = gate if in_place else nl.ndarray((rows, F), dtype=gate.dtype, buffer=nl.shared_hbm)
        for i in nl.affine_range((rows + 127) // 128):
            p = min(128, rows - i * 128)
            g = nl.ndarray((p, F), dtype=gate.dtype, buffer=nl.sbuf)
            u = nl.ndarray((p, F), dtype=up.dtype, buffer=nl.sbuf)
            nisa.dma_copy(dst=g, src=gate[i * 128:i * 128 + p])
            nisa.dma_copy(dst=u, src=up[i * 128:i * 128 + p])
            s = nl.ndarray((p, F), dtype=nl.float32, buffer=nl.sbuf)
            nisa.activation(dst=s, op=getattr(nl, fn), data=g)
            y = nl.ndarray((p, F), dtype=gate.dtype, buffer=nl.sbuf)
            nisa.scalar_tensor_tensor(dst=y, data=s, op0=nl.multiply, operand0=scale, op1=op1, operand1=u)
            if reuse:
                nisa.tensor_tensor(dst=y, data1=y, data2=s, op=nl.add)
            nisa.dma_copy(dst=out[i * 128:i * 128 + p], src=y)
        return out
    return nki.jit(gate)


def _gate_inputs(rows, cols, dtype):
    """In-range rows (the short exp form) and rows of exp's edges (the long one),
    ``cols`` past a 512-element chunk with a tail."""
    g = torch.Generator().manual_seed(5)
    x = torch.randn(rows, cols, generator=g) * 4
    edges = _exp_edges().reshape(-1)
    x[1::3] = edges[torch.randint(0, edges.numel(), (x[1::3].numel(),), generator=g)].reshape(x[1::3].shape)
    return x.to(dtype), (torch.randn(rows, cols, generator=g) * 2).to(dtype)


@nki.jit
def _act_sums(x, b, fn, scale):
    """One activation three ways: with its row sum into fp32 and into bf16
    tiles, and without, then summed by tensor_reduce and rounded by a copy."""
    P, F = x.shape
    out = nl.ndarray((P, 3 * F + 3), dtype=nl.float32, buffer=nl.shared_hbm)
    out16 = nl.ndarray((P, 2 * F), dtype=nl.bfloat16, buffer=nl.shared_hbm)
    t = nl.ndarray((P, F), dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x)
    bias = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=bias, src=b)
    y = nl.ndarray((P, 3 * F + 3), dtype=nl.float32, buffer=nl.sbuf)
    y16 = nl.ndarray((P, 2 * F), dtype=nl.bfloat16, buffer=nl.sbuf)
    op = getattr(nl, fn)
    nisa.activation(dst=y[:, :F], op=op, data=t, bias=bias, scale=scale, reduce_op=nl.add,
                    reduce_res=y[:, 3 * F:3 * F + 1], reduce_cmd=nisa.reduce_cmd.reset_reduce)
    e16 = nl.ndarray((P, F), dtype=nl.bfloat16, buffer=nl.sbuf)
    nisa.activation(dst=e16, op=op, data=t, bias=bias, scale=scale, reduce_op=nl.add,
                    reduce_res=y[:, 3 * F + 1:3 * F + 2], reduce_cmd=nisa.reduce_cmd.reset_reduce)
    nisa.tensor_copy(dst=y16[:, :F], src=e16)
    plain = nl.ndarray((P, F), dtype=nl.float32, buffer=nl.sbuf)
    nisa.activation(dst=plain, op=op, data=t, bias=bias, scale=scale)
    nisa.tensor_copy(dst=y[:, F:2 * F], src=plain)
    nisa.tensor_reduce(dst=y[:, 3 * F + 2:3 * F + 3], op=nl.add, data=plain, axis=1, keepdims=True)
    nisa.tensor_copy(dst=y16[:, F:], src=plain)
    nisa.dma_copy(dst=out, src=y)
    nisa.dma_copy(dst=out16, src=y16)
    return out, out16


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("fn", ["exp", "sigmoid", "silu"])
@pytest.mark.parametrize("cols", [512, 300, 40])
def test_native_activation_row_sum_in_one_pass(fn, cols, dtype, monkeypatch):
    # exp, sigmoid and silu with their row sum run in one pass over whole
    # blocks of 32 (Kernels.inc act_sum, fp32 or bf16 data, into fp32 rows and
    # rounded into bf16 rows in the registers): the values and sums of the
    # activation alone followed by tensor_reduce, and its bf16 copy, bit for
    # bit; rows of exp's edges (NaN, inf, out of the short form's range) take
    # the two passes, and tiny silu results round through the scalar conversion.
    monkeypatch.setenv("NKI_EXECUTOR", "native")
    g = torch.Generator().manual_seed(11)
    x = torch.randn(128, cols, generator=g) * 3
    edges = _exp_edges().reshape(-1)
    x[1::4] = edges[torch.randint(0, edges.numel(), (x[1::4].numel(),), generator=g)].reshape(x[1::4].shape)
    x[2::4] = torch.randn(x[2::4].shape, generator=g) * 1e-39  # denormal silu results
    x = x.to(dtype)
    b = -torch.rand(128, 1, generator=g)
    out, out16 = _act_sums(x, b, fn, 0.5)
    out, out16 = out.cpu(), out16.cpu()
    F = cols
    _same_bits(out[:, :F], out[:, F:2 * F])
    _same_bits(out[:, 3 * F], out[:, 3 * F + 2])
    _same_bits(out[:, 3 * F + 1], out[:, 3 * F + 2])
    _same_bits(out16[:, :F], out16[:, F:])
    ref = _run("interpreter", _act_sums, x, b, fn, 0.5, monkeypatch=monkeypatch)[0].cpu()
    _close(out, ref, rtol=4e-6, atol=2e-5)


# (fp16: the gathered-row form)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
# (2100, 2048): an output of 8 MiB and more, stored with streaming stores (bf16: 8.2 MiB).
@pytest.mark.parametrize("rows,cols", [(300, 1100), (2100, 2048)])
def test_native_fused_activation_multiply(dtype, rows, cols, monkeypatch):
    # An activation into an fp32 tile that only the next scalar_tensor_tensor
    # reads is folded into it (nki/_native.py _fuse_activation): the same bits
    # as the two records, for silu and sigmoid (SwiGLU's one-loop form), exp
    # (the chunked form) and an add as op1 (the row form); NaN, inf and large
    # values included.
    monkeypatch.setenv("NKI_EXECUTOR", "native")
    g, u = _gate_inputs(rows, cols, dtype)
    for fn, op1 in (("silu", nl.multiply), ("sigmoid", nl.multiply), ("exp", nl.multiply), ("silu", nl.add)):
        fused = _gate_kernel(fn, op1)
        ops = _native.plan(fused.trace((g, u)), True).words.reshape(-1, _native.RECORD)[:, 0].tolist()
        assert _native.OP_ACT not in ops and _native.OP_STT in ops, (fn, ops)
        out = fused(g, u)
        with monkeypatch.context() as m:
            m.setattr(_native, "_fuse_activation", lambda low, bound: None)
            two = _gate_kernel(fn, op1)
            assert _native.OP_ACT in _native.plan(two.trace((g, u)), True).words.reshape(-1, _native.RECORD)[:, 0]
            _same_bits(out, two(g, u))
        if rows < 1000:  # and within the transcendental tolerance of the interpreter
            ref = _run("interpreter", fused, g, u, monkeypatch=monkeypatch)
            monkeypatch.setenv("NKI_EXECUTOR", "native")
            assert torch.equal(out.isnan(), ref.isnan()) and torch.equal(out.isinf(), ref.isinf())
            fin = ref.isfinite() & out.isfinite()
            tol = 5e-6 if dtype == torch.float32 else 8e-3 if dtype == torch.bfloat16 else 1e-3
            _close(out[fin].float(), ref[fin].float(), rtol=tol, atol=1e-4)


@pytest.mark.parametrize("in_place", [False, True])
# fp32 (2100, 2048): a streamed output, whose loop is one pass from the registers
# (Kernels.inc gate_mul_stream_f32)
@pytest.mark.parametrize("dtype,rows,cols", [(torch.bfloat16, 256, 1100), (torch.float32, 2100, 2048)])
def test_native_gate_loop_scale_one_and_in_place(in_place, dtype, rows, cols, monkeypatch):
    # SwiGLU's bf16 gate loop, and its fp32 loop into a streamed output, run in
    # one pass when the destination overlaps neither input and skip `* s` for
    # s = 1 (Kernels.inc gate_mul): the bits of the two records, with the chunks
    # outside the short exp form's range, and written over the gate itself (the
    # two-pass loop then).
    monkeypatch.setenv("NKI_EXECUTOR", "native")
    g, u = _gate_inputs(rows, cols, dtype)
    for scale in (1.0, 1.5):
        fused = _gate_kernel("silu", nl.multiply, scale=scale, in_place=in_place)
        ga = g.clone()
        out = fused(ga, u)
        with monkeypatch.context() as m:
            m.setattr(_native, "_fuse_activation", lambda low, bound: None)
            gb = g.clone()
            two = _gate_kernel("silu", nl.multiply, scale=scale, in_place=in_place)(gb, u)
        _same_bits(out, two)
        if in_place:
            _same_bits(ga, out)
        ref = (torch.nn.functional.silu(g.float()) * scale) * u.float()
        fin = ref.isfinite() & out.float().isfinite()
        _close(out.float()[fin], ref.to(dtype).float()[fin], rtol=8e-3, atol=1e-4)


@nki.jit
def _bf16_stores(x, ones):
    """fp32 -> bf16 three ways: a tensor_copy into a bf16 tile, a
    scalar_tensor_tensor (x * 1 * 1) into a bf16 tile and into HBM rows."""
    P, F = x.shape
    a = nl.ndarray((P, F), dtype=nl.bfloat16, buffer=nl.shared_hbm)
    b = nl.ndarray((P, F), dtype=nl.bfloat16, buffer=nl.shared_hbm)
    for i in nl.affine_range(P // 128):
        t = nl.ndarray((128, F), dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x[i * 128:(i + 1) * 128])
        o = nl.ndarray((128, F), dtype=ones.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=o, src=ones[i * 128:(i + 1) * 128])
        u = nl.ndarray((128, F), dtype=nl.bfloat16, buffer=nl.sbuf)
        nisa.tensor_copy(dst=u, src=t)
        nisa.dma_copy(dst=a[i * 128:(i + 1) * 128], src=u)
        v = nl.ndarray((128, F), dtype=nl.bfloat16, buffer=nl.sbuf)
        nisa.scalar_tensor_tensor(dst=v, data=t, op0=nl.multiply, operand0=1.0, op1=nl.multiply, operand1=o)
        nisa.dma_copy(dst=b[i * 128:(i + 1) * 128], src=v)
    return a, b


# (2048 x 2048: bf16 outputs of 8 MiB, stored with streaming stores)
@pytest.mark.parametrize("rows,cols", [(256, 1000), (2048, 2048)])
def test_native_bf16_rounding_pieces(rows, cols, monkeypatch):
    # bf16 rows round 32 values at a time with VCVTNE2PS2BF16 where the CPU
    # has AVX512_BF16 (Kernels.inc bf16_run); a piece holding a NaN or a
    # denormal, which the instruction treats otherwise, takes c10's integer
    # rounding. Random bit patterns, with one NaN (payloads), denormal, tie or
    # signed zero planted in some pieces: torch's bits everywhere but NaN
    # payloads, in every piece and the tail (1000 = 31 pieces + 8).
    g = torch.Generator().manual_seed(3)
    bits = torch.randint(-2**31, 2**31, (rows, cols), generator=g, dtype=torch.int64).to(torch.int32)
    exp = (bits >> 23) & 0xFF
    bits = torch.where((exp == 0) | (exp == 255), bits ^ 0x40000000, bits)  # all normal
    special = torch.tensor([0x7FA00001, -0x3E000000 | 0x12345, 0x00018000, -0x7FFFFFFF, 0x007FFFFF, 0x3F808000,
                            0x3F818000, 0x7F7FFFFF, 0, -2**31, 0x7F800000], dtype=torch.int64).to(torch.int32)
    flat = bits.view(-1)
    where = torch.arange(0, flat.numel() - 32, 32 * 7) + torch.randint(0, 32, (1,), generator=g)
    flat[where] = special[torch.arange(where.numel()) % special.numel()]
    x = bits.view(torch.float32)
    ones = torch.ones(rows, cols)
    monkeypatch.setenv("NKI_EXECUTOR", "native")
    want = x.to(torch.bfloat16)
    for out in _bf16_stores(x, ones):
        assert torch.equal(out.isnan(), want.isnan())
        keep = ~want.isnan()
        assert torch.equal(_bits(out)[keep], _bits(want)[keep])


@nki.jit
def _bf16_stt(x, w, op0, s, op1):
    """op1(op0(x, s), w) on bf16 tiles into a bf16 tile, 128 rows at a time."""
    P, F = x.shape
    out = nl.ndarray((P, F), dtype=x.dtype, buffer=nl.shared_hbm)
    for i in nl.affine_range(P // 128):
        t = nl.ndarray((128, F), dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x[i * 128:(i + 1) * 128])
        u = nl.ndarray((128, F), dtype=w.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=u, src=w[i * 128:(i + 1) * 128])
        v = nl.ndarray((128, F), dtype=x.dtype, buffer=nl.sbuf)
        nisa.scalar_tensor_tensor(dst=v, data=t, op0=op0, operand0=s, op1=op1, operand1=u)
        nisa.dma_copy(dst=out[i * 128:(i + 1) * 128], src=v)
    return out


@pytest.mark.parametrize("rows,cols", [(256, 1000), (2048, 2048)])
def test_native_bf16_stt_pairs(rows, cols, monkeypatch):
    # bf16 x bf16 -> bf16 scalar_tensor_tensor with add/subtract/multiply runs
    # 32 values per step on even/odd halves where the CPU has AVX512_BF16
    # (Kernels.inc stt_bf16_pairs); pieces with a NaN or denormal result take
    # the element loop. Random bit patterns (every exponent: products that
    # underflow, overflow, ties), NaN, inf and denormal inputs: the
    # interpreter's bits but NaN payloads.
    g = torch.Generator().manual_seed(4)
    x, w = (torch.randint(-2**15, 2**15, (rows, cols), generator=g, dtype=torch.int32).to(torch.int16)
            .view(torch.bfloat16) for _ in range(2))
    x.view(torch.int16).view(-1)[::97] = torch.tensor([0x7FC1, 0x0001, -0x7FC0, 0x7F80, 0x0040],
                                                       dtype=torch.int16).repeat(rows * cols // 485 + 1)[:(rows * cols + 96) // 97]
    for op0, s, op1 in ((nl.multiply, 1.37, nl.multiply), (nl.subtract, 0.5, nl.add)):
        ref = _run("interpreter", _bf16_stt, x, w, op0, s, op1, monkeypatch=monkeypatch)
        out = _run("native", _bf16_stt, x, w, op0, s, op1, monkeypatch=monkeypatch)
        assert torch.equal(out.isnan(), ref.isnan())
        keep = ~ref.isnan()
        assert torch.equal(_bits(out)[keep], _bits(ref)[keep])


def test_native_fusion_needs_a_dead_tile(monkeypatch):
    # s read again after the multiply: two records, and the result of both.
    monkeypatch.setenv("NKI_EXECUTOR", "native")
    g, u = _gate_inputs(128, 600, torch.float32)
    kernel = _gate_kernel("silu", nl.multiply, reuse=True)
    ops = _native.plan(kernel.trace((g, u)), True).words.reshape(-1, _native.RECORD)[:, 0].tolist()
    assert _native.OP_ACT in ops
    s = torch.nn.functional.silu(g)
    _close(kernel(g, u), (s * 1.5) * u + s, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("isa", ["generic", "avx2"])
def test_native_kernel_builds_agree(isa):
    # The executor's row kernels are built per instruction set and the widest
    # the CPU runs is used; the others give the same bits (sum order, rounding).
    from conftest import run_python
    if isa == "avx2" and "avx2" not in open("/proc/cpuinfo").read():
        pytest.skip("no AVX2")
    run_python("""
        import os, sys, torch, torch_neuronx
        from torch_neuronx import _C
        sys.path.insert(0, %r)
        import nki_kernels as K
        import test_nki_native as T
        assert _C._nki_kernel_isa() == %r
        g = torch.Generator().manual_seed(0)
        for dtype in (torch.float32, torch.bfloat16):
            x = (torch.randn(300, 1000, generator=g) * 100).to(dtype)
            w = torch.randn(1, 1000, generator=g).to(dtype)
            y = torch.randn(2, 64, 30, 30, generator=g).to(dtype)
            b = torch.randn(64, 1, generator=g).to(dtype)
            for kernel, args in ((K.rmsnorm_wide, (x, w, 1e-6)), (T._row_sums, (x[:100].contiguous(),)), (K.avgpool_bias_relu, (y, b))):
                os.environ["NKI_EXECUTOR"] = "native"
                out = kernel(*args)
                os.environ["NKI_EXECUTOR"] = "interpreter"
                T._identical(out, kernel(*args))
        # fp16, fp8 and integer tiles (conversions on load and store), transposes.
        e = T._float_edges()
        wide = torch.randn(128, 1024, generator=g)
        cases = [(T._convert, (e, dt)) for dt in (torch.float16, torch.bfloat16, torch.float8_e4m3fn, torch.float8_e5m2, torch.int8)]
        cases += [(T._int_ops, T._int_inputs(dt)) for dt in T._INTS]
        cases += [(T._transposes, (torch.randn(128, 96, generator=g).to(torch.float16), wide))]
        for kernel, args in cases:
            os.environ["NKI_EXECUTOR"] = "native"
            out = kernel(*args)
            os.environ["NKI_EXECUTOR"] = "interpreter"
            ref = kernel(*args)
            for o, r in zip(out if isinstance(out, tuple) else (out,), ref if isinstance(ref, tuple) else (ref,)):
                T._same_bits(o, r) if o.dtype in (torch.float8_e4m3fn, torch.float8_e5m2) else T._identical(o, r)
    """ % (os.path.dirname(os.path.abspath(__file__)), isa), env={"NKI_KERNEL_ISA": isa})


# -- element types: fp16, integers, fp8 (one conversion on load, one on store) --
def _bits(t):
    """The raw bits of a tensor (NaN payloads included)."""
    t = t.cpu().contiguous()
    return t.view({1: torch.uint8, 2: torch.int16, 4: torch.int32}[t.element_size()])


def _same_bits(a, b):
    a, b = a.cpu(), b.cpu()
    assert a.dtype == b.dtype and a.shape == b.shape
    diff = (_bits(a) != _bits(b)).nonzero()
    assert diff.numel() == 0, f"{diff.shape[0]} differ, first at {diff[0].tolist()}: {a[tuple(diff[0])]!r} vs " \
                              f"{b[tuple(diff[0])]!r}"


@nki.jit
def _convert(x, dtype):
    """HBM -> a tile of x's dtype -> a tile of ``dtype`` (tensor_copy) -> HBM."""
    P, F = x.shape
    out = nl.ndarray((P, F), dtype=dtype, buffer=nl.shared_hbm)
    t = nl.ndarray((P, F), dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x)
    u = nl.ndarray((P, F), dtype=dtype, buffer=nl.sbuf)
    nisa.tensor_copy(dst=u, src=t)
    nisa.dma_copy(dst=out, src=u)
    return out


def _float_edges():
    """fp32 values over every exponent, with the rounding midpoints, overflow
    edges and subnormals of fp16 and both fp8 formats, signed zeros, inf, NaN."""
    g = torch.Generator().manual_seed(1)
    rand = torch.randint(0, 2**32, (60000,), generator=g, dtype=torch.int64)
    rand = (rand - 2**31).to(torch.int32).view(torch.float32)
    around = []
    for dt in (torch.float16, torch.float8_e4m3fn, torch.float8_e5m2):
        grid = torch.arange(-(2**15) if dt == torch.float16 else 0, 2**16 if dt == torch.float16 else 256,
                            dtype=torch.int32)
        vals = grid.to(torch.int16 if dt == torch.float16 else torch.uint8).view(dt).float()
        vals = vals[torch.isfinite(vals)].unique()
        mids = (vals[1:].double() + vals[:-1].double()) / 2
        around += [vals, mids.float(), torch.nextafter(mids.float(), torch.tensor(float("inf"))),
                   torch.nextafter(mids.float(), torch.tensor(-float("inf")))]
    special = torch.tensor([0.0, -0.0, float("inf"), -float("inf"), float("nan"), 448.0, 464.0, 470.0, 480.0,
                            57344.0, 61440.0, 65504.0, 65519.0, 65520.0, 1e-7, 6e-8, 3e-8, -2.9e-8, 1e30])
    x = torch.cat([rand, *around, special, -special])
    n = x.numel() // 128 * 128
    return x[:n].reshape(128, -1).contiguous()


@pytest.mark.parametrize("dtype", [torch.float16, torch.float8_e4m3fn, torch.float8_e5m2])
def test_native_float_store_rounds_like_copy(dtype, monkeypatch):
    # fp32 -> fp16/fp8 on store: round to nearest even, fp16 and e5m2 overflow
    # to inf, e4m3fn to NaN, subnormals kept: torch's .to(dtype), bit for bit.
    x = _float_edges()
    monkeypatch.setenv("NKI_EXECUTOR", "native")
    out = _convert(x.to("neuron"), dtype)
    ref = _run("interpreter", _convert, x.to("neuron"), dtype, monkeypatch=monkeypatch)
    want = x.to(dtype)
    if dtype == torch.float16:  # NaN payloads aside (torch's conversion keeps them, as ours does)
        _identical(out, ref)
        _identical(out, want.to("neuron"))
    else:
        _same_bits(out, ref)
        _same_bits(out, want)


@pytest.mark.parametrize("dtype", [torch.float16, torch.float8_e4m3fn, torch.float8_e5m2])
def test_native_every_bit_pattern_round_trips(dtype, monkeypatch):
    # Every value of the format: loaded as fp32 (exactly), stored back, through a native copy.
    n = 2**16 if dtype == torch.float16 else 256
    pattern = torch.arange(n, dtype=torch.int32).to(torch.int16 if n == 2**16 else torch.uint8)
    x = pattern.view(dtype).reshape(128, -1).to("neuron")
    as_f32 = _both(_convert, x, torch.float32, monkeypatch=monkeypatch)
    _identical(as_f32, x.cpu().float().to("neuron"))
    monkeypatch.setenv("NKI_EXECUTOR", "native")
    back = _convert(as_f32, dtype)
    ref = _run("interpreter", _convert, as_f32, dtype, monkeypatch=monkeypatch)
    if dtype == torch.float16:
        _identical(back, ref)
        nan = x.cpu().isnan()
        assert torch.equal(_bits(back)[~nan], _bits(x)[~nan])  # every non-NaN value is itself again
    else:
        _same_bits(back, ref)
        nan = x.cpu().float().isnan()
        assert torch.equal(_bits(back)[~nan], _bits(x)[~nan])
        # NaNs come back as the format's NaN with their sign (e4m3fn has no other).
        assert set(_bits(back)[nan].tolist()) <= {0x7F, 0xFF}


@nki.jit
def _low_precision_ops(x, w):
    """Elementwise, activation (exact functions), per-partition operands and
    reductions on tiles of x's dtype, with fp32 and bf16 tiles mixed in."""
    P, F = x.shape
    out = nl.ndarray((P, 2 * F + 2), dtype=x.dtype, buffer=nl.shared_hbm)
    t = nl.ndarray((P, F), dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x)
    tw = nl.load(w, dtype=nl.bfloat16)
    r = nl.ndarray((P, 2 * F + 2), dtype=x.dtype, buffer=nl.sbuf)
    a = nl.ndarray((P, F), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=a, data=t, op0=nl.multiply, operand0=t[:, 0:1], op1=nl.add, operand1=0.375)
    nisa.tensor_tensor(dst=r[:, 0:F], data1=a, data2=tw, op=nl.subtract)
    nisa.scalar_tensor_tensor(dst=r[:, F:2 * F], data=t, op0=nl.multiply, operand0=3.0, op1=nl.maximum,
                              operand1=r[:, 0:F])
    nisa.activation(dst=r[:, F:2 * F], op=nl.square, data=r[:, F:2 * F], scale=t[:, 1:2], bias=1.5,
                    reduce_op=nl.add, reduce_res=r[:, 2 * F:2 * F + 1])
    nisa.tensor_reduce(dst=r[:, 2 * F + 1:], op=nl.maximum, data=r[:, 0:F], axis=1, keepdims=True)
    nisa.dma_copy(dst=out, src=r)
    return out


@pytest.mark.parametrize("dtype", [torch.float16, torch.float8_e4m3fn, torch.float8_e5m2])
@pytest.mark.parametrize("scale", [1.0, 300.0, 1e-4])  # 300: overflows fp16 (inf) and fp8; 1e-4: subnormals
def test_native_low_precision_tiles(dtype, scale, monkeypatch):
    g = torch.Generator().manual_seed(2)
    x = (torch.randn(128, 96, generator=g) * scale).to(dtype)
    w = torch.randn(128, 96, generator=g)
    out = _both(_low_precision_ops, x.to("neuron"), w.to("neuron"), monkeypatch=monkeypatch) \
        if dtype == torch.float16 else None
    if out is None:  # no isnan for fp8: compare bits
        monkeypatch.setenv("NKI_EXECUTOR", "native")
        out = _low_precision_ops(x.to("neuron"), w.to("neuron"))
        _same_bits(out, _run("interpreter", _low_precision_ops, x.to("neuron"), w.to("neuron"),
                             monkeypatch=monkeypatch))
    xf = x.float()
    a = (xf * xf[:, 0:1] + 0.375).float()
    r0 = (a - w.to(torch.bfloat16).float()).to(dtype).float()
    if scale == 1.0:  # the first block against torch itself
        assert torch.equal(out[:, :96].cpu().float(), r0)


@pytest.mark.parametrize("dtype", [torch.float16])
def test_native_fp16_acceptance_kernels(dtype, monkeypatch):
    g = torch.Generator().manual_seed(3)
    x, w = torch.randn(300, 1000, generator=g).to(dtype), torch.randn(1, 1000, generator=g).to(dtype)
    out = _both(K.rmsnorm_wide, x.to("neuron"), w.to("neuron"), 1e-6, monkeypatch=monkeypatch)
    assert_same(out.float(), _rmsnorm_ref(x, w, 1e-6), atol=2e-3, rtol=2e-3)
    _both(_row_sums, (torch.randn(5, 1000, generator=g) * 100).to(dtype), monkeypatch=monkeypatch)
    y, b = torch.randn(2, 64, 30, 30, generator=g).to(dtype), torch.randn(64, 1, generator=g).to(dtype)
    _both(K.avgpool_bias_relu, y.to("neuron"), b.to("neuron"), monkeypatch=monkeypatch)
    # NumPy arrays (fp16 is a NumPy dtype) run in place as well.
    xn, wn = x.numpy(), w.numpy()
    monkeypatch.setenv("NKI_EXECUTOR", "native")
    nat = K.rmsnorm_wide(xn, wn, 1e-6)
    monkeypatch.setenv("NKI_EXECUTOR", "interpreter")
    _identical(torch.from_numpy(nat), torch.from_numpy(K.rmsnorm_wide(xn, wn, 1e-6)))


# -- transposes and nl.matmul ---------------------------------------------------
@nki.jit
def _transposes(x, wide):
    """Partition-local stretches around transposes that mix partitions:
    nc_transpose on the Tensor Engine (SBUF -> PSUM) and on the Vector
    Engine (32x32, within one tile), nl.transpose, load_transpose2d and
    dma_transpose (SBUF -> HBM). ``wide`` rows make the executor's row
    blocks smaller than a tile (1024 fp32: 32 rows)."""
    P, F = x.shape
    out_w = nl.ndarray(wide.shape, dtype=wide.dtype, buffer=nl.shared_hbm)
    tw = nl.load(wide)
    nisa.tensor_scalar(dst=tw, data=tw, op0=nl.multiply, operand0=3.0)
    nisa.dma_copy(dst=out_w, src=tw)
    out = nl.ndarray((F, P), dtype=x.dtype, buffer=nl.shared_hbm)
    out_t = nl.ndarray((P, F), dtype=x.dtype, buffer=nl.shared_hbm)
    out_v = nl.ndarray((32, 64), dtype=x.dtype, buffer=nl.shared_hbm)
    t = nl.ndarray((P, F), dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x)
    a = nl.ndarray((P, F), dtype=x.dtype, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=a, data=t, op0=nl.multiply, operand0=2.0, op1=nl.add, operand1=t[:, 0:1])
    pt = nl.ndarray((F, P), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_transpose(dst=pt, data=a)
    b = nl.ndarray((F, P), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=b, data=pt, op0=nl.add, operand0=1.0)
    c = nl.transpose(b)                  # [P, F] fp32
    d = nl.transpose(c, dtype=x.dtype)   # [F, P]
    nisa.tensor_tensor(dst=d, data1=d, data2=b, op=nl.multiply)
    nisa.dma_copy(dst=out, src=d)
    e = nl.load_transpose2d(x)           # [F, P] straight from HBM
    nisa.dma_transpose(dst=out_t, src=e, axes=(1, 0))  # and back, into HBM: x itself
    v = nl.ndarray((32, 64), dtype=x.dtype, buffer=nl.sbuf)
    nisa.tensor_copy(dst=v[:, 0:32], src=t[0:32, 0:32])
    nisa.nc_transpose(dst=v[:, 32:64], data=v[:, 0:32], engine=nisa.engine.vector)  # within one tile
    nisa.dma_copy(dst=out_v, src=v)
    # A column [P, 1] to a row [1, P]: its one destination partition reads all of them.
    col = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_reduce(dst=col, op=nl.maximum, data=a, axis=1, keepdims=True)
    prow = nl.ndarray((1, P), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_transpose(dst=prow, data=col)
    row = nl.ndarray((1, P), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=row, data=prow, op0=nl.add, operand0=0.5)
    out_r = nl.ndarray((1, P), dtype=nl.float32, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out_r, src=row)
    return out, out_t, out_v, out_w, out_r


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_native_transposes(dtype, threads, monkeypatch):
    g = torch.Generator().manual_seed(4)
    x = torch.randn(128, 96, generator=g).to(dtype)
    wide = torch.randn(128, 1024, generator=g)
    nat = _native.plan(_transposes.trace((x, wide)), True)
    assert nat.prog.max_free == 1024
    words = nat.words.reshape(nat.ninstr, -1)
    whole = words[:, 13].tolist()
    copies = [i for i in range(nat.ninstr) if words[i, 0] == _native.OP_COPY and not whole[i]]
    # The transposes run split (each thread its rows of dst), the threads
    # meeting before a record reads what others wrote across partitions.
    assert len(copies) >= 5 and sum(words[:, 14].tolist()) >= 3 and whole[0] == 0 and whole[-1] == 0
    monkeypatch.setenv("NKI_SPLIT_SMALL", "1")  # small programs would run on one thread
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        monkeypatch.setenv("NKI_EXECUTOR", "native")
        outs = _transposes(x.to("neuron"), wide.to("neuron"))
        refs = _run("interpreter", _transposes, x.to("neuron"), wide.to("neuron"), monkeypatch=monkeypatch)
    finally:
        torch.set_num_threads(old)
    for o, r in zip(outs, refs):
        _identical(o, r)
    xf = x.float()
    a = (xf * 2 + xf[:, 0:1]).to(dtype).float()
    b = a.t() + 1
    assert torch.equal(outs[0].cpu(), (b.to(dtype).float() * b).to(dtype))
    assert torch.equal(outs[1].cpu(), x)
    assert torch.equal(outs[2].cpu(), torch.cat([x[:32, :32], x[:32, :32].t()], 1))
    assert torch.equal(outs[3].cpu(), wide * 3)
    assert torch.equal(outs[4].cpu(), a.amax(1)[None] + 0.5)


@nki.jit
def _nl_matmul(x, xt, y):
    """nl.matmul with x as [M, K] (seen transposed by the lowering) and as
    [K, M] (transpose_x=True)."""
    M, Kd = x.shape
    N = y.shape[1]
    out = nl.ndarray((2, M, N), dtype=nl.float32, buffer=nl.shared_hbm)
    tx, txt, ty = nl.load(x), nl.load(xt), nl.load(y)
    for k, p in enumerate((nl.matmul(tx, ty), nl.matmul(txt, ty, transpose_x=True))):
        r = nl.ndarray((M, N), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(dst=r, src=p)
        nisa.dma_copy(dst=out[k], src=r)
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_native_nl_matmul(dtype, monkeypatch):
    # Lowered to nc_matmul's record: within the matmul tolerance of docs/nki.md.
    g = torch.Generator().manual_seed(5)
    x, y = torch.randn(96, 128, generator=g).to(dtype), torch.randn(128, 200, generator=g).to(dtype)
    xt = x.t().contiguous()
    nat = _native.plan(_nl_matmul.trace((x, xt, y)), True)
    assert (nat.words.reshape(nat.ninstr, -1)[:, 0] == _native.OP_MM).sum() == 2
    args = [t.to("neuron") for t in (x, xt, y)]
    monkeypatch.setenv("NKI_EXECUTOR", "native")
    out = _nl_matmul(*args)
    ref = _run("interpreter", _nl_matmul, *args, monkeypatch=monkeypatch)
    _close(out, ref, rtol=1e-5, atol=1e-5)
    want = x.float() @ y.float()
    assert_same(out[0], want, atol=1e-4, rtol=1e-4)
    assert_same(out[1], want, atol=1e-4, rtol=1e-4)


# -- integer tiles ----------------------------------------------------------------
@nki.jit
def _int_ops(x, y, big):
    """Integer tiles through the engines, which compute in fp32: elementwise,
    per-partition operands, an activation with a reduction, a reduce, a
    memset and a shifted copy. Stores round half to even, then convert as
    torch's copy_ (x86: int32 truncation, then the low bits)."""
    P, F = x.shape
    out = nl.ndarray((P, 8 * F + 2), dtype=x.dtype, buffer=nl.shared_hbm)
    tx, ty = nl.load(x), nl.load(y)
    r = nl.ndarray((P, 8 * F + 2), dtype=x.dtype, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=r[:, 0:F], data1=tx, data2=ty, op=nl.add)
    nisa.tensor_tensor(dst=r[:, F:2 * F], data1=tx, data2=ty, op=nl.multiply)
    nisa.tensor_tensor(dst=r[:, 2 * F:3 * F], data1=tx, data2=ty, op=nl.divide)  # / 0: inf, NaN
    nisa.tensor_tensor(dst=r[:, 3 * F:4 * F], data1=tx, data2=ty, op=nl.greater_equal)
    nisa.tensor_scalar(dst=r[:, 4 * F:5 * F], data=tx, op0=nl.multiply, operand0=0.5, op1=nl.subtract,
                       operand1=ty[:, 0:1], reverse1=True)
    nisa.scalar_tensor_tensor(dst=r[:, 5 * F:6 * F], data=tx, op0=nl.maximum, operand0=-3, op1=nl.minimum,
                              operand1=ty)
    nisa.activation(dst=r[:, 6 * F:7 * F], op=nl.abs, data=tx, scale=1.5, bias=ty[:, 1:2], reduce_op=nl.add,
                    reduce_res=r[:, 8 * F:8 * F + 1])
    nisa.tensor_reduce(dst=r[:, 8 * F + 1:], op=nl.maximum, data=tx, axis=1, keepdims=True)
    nisa.memset(dst=r[:, 7 * F:7 * F + 1], value=big)
    nisa.tensor_copy(dst=r[:, 7 * F + 1:8 * F], src=tx[:, 1:F])
    nisa.dma_copy(dst=out, src=r)
    return out


_INTS = [torch.int32, torch.int16, torch.int8, torch.uint8, torch.uint16]


def _int_inputs(dtype, P=128, F=40, seed=6):
    g = torch.Generator().manual_seed(seed)
    info = torch.iinfo(dtype)
    lo, hi = max(info.min, -(2**30)), min(info.max, 2**30)
    x = torch.randint(lo, hi + 1, (P, F), generator=g, dtype=torch.int64)
    x[:, :4] = torch.tensor([info.min, info.max, 0, 1])  # the extremes (int32: past fp32's 2^24)
    y = torch.randint(max(lo, -9), min(hi, 9) + 1, (P, F), generator=g, dtype=torch.int64)
    return x.to(dtype), y.to(dtype), info.max


@pytest.mark.parametrize("dtype", _INTS)
def test_native_integer_tiles(dtype, monkeypatch):
    x, y, big = _int_inputs(dtype)
    out = _both(_int_ops, x.to("neuron"), y.to("neuron"), big, monkeypatch=monkeypatch)
    out = out.cpu()
    F = x.shape[1]
    xf, yf = x.double(), y.double()

    def stored(v):  # what an integer store makes of fp32 values
        v = torch.round(v.float())
        return torch.empty(v.shape, dtype=dtype).copy_(v)
    assert torch.equal(out[:, 0:F], stored(xf.float() + yf.float()))
    assert torch.equal(out[:, 2 * F:3 * F], stored(xf.float() / yf.float()))
    assert torch.equal(out[:, 3 * F:4 * F], (x.long() >= y.long()).to(dtype))
    assert torch.equal(out[:, 7 * F], torch.full((x.shape[0],), big, dtype=dtype))  # memset is exact
    assert torch.equal(out[:, 7 * F + 1:8 * F], x[:, 1:])  # integer copies keep every bit


@nki.jit
def _int_copies(x, f):
    """Copies between integer tiles (torch's integer conversions: wrapping),
    integer -> float tiles and float -> integer tiles (round half to even;
    NaN, inf and out-of-range values as torch converts them)."""
    P, F = x.shape
    outs = []
    tx, tf = nl.load(x), nl.load(f)
    for src, dts in ((tx, (nl.int8, nl.uint8, nl.int16, nl.uint16, nl.float32, nl.bfloat16, nl.float16)),
                     (tf, (nl.int32, nl.int16, nl.int8, nl.uint8, nl.uint16))):
        for dt in dts:
            t = nl.ndarray((P, F), dtype=dt, buffer=nl.sbuf)
            nisa.tensor_copy(dst=t, src=src)
            o = nl.ndarray((P, F), dtype=dt, buffer=nl.shared_hbm)
            nisa.dma_copy(dst=o, src=t)
            outs.append(o)
    back = nl.ndarray((P, F), dtype=nl.int32, buffer=nl.sbuf)
    nisa.dma_copy(dst=back, src=outs[0])  # int8 HBM -> int32: sign extension
    o = nl.ndarray((P, F), dtype=nl.int32, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=o, src=back)
    outs.append(o)
    return tuple(outs)


def test_native_integer_conversions(monkeypatch):
    x, _y, _big = _int_inputs(torch.int32, F=64)
    x[:, 4:8] = torch.tensor([2**24 + 1, 2**24 + 2**16 + 1, -(2**31), 70000])
    f = torch.randn(128, 64) * 10**torch.randint(0, 11, (128, 64)).float()
    f[:, :12] = torch.tensor([0.5, 1.5, 2.5, -2.5, float("nan"), float("inf"), -float("inf"), 2**31, -(2**31),
                              2147483520.0, 300.0, -129.5])
    monkeypatch.setenv("NKI_EXECUTOR", "native")
    outs = _int_copies(x.to("neuron"), f.to("neuron"))
    refs = _run("interpreter", _int_copies, x.to("neuron"), f.to("neuron"), monkeypatch=monkeypatch)
    for o, r in zip(outs, refs):
        _identical(o, r)
    want = [x.to(d) for d in (torch.int8, torch.uint8, torch.int16, torch.uint16, torch.float32, torch.bfloat16,
                              torch.float16)]
    want += [torch.round(f).to(d) for d in (torch.int32, torch.int16, torch.int8, torch.uint8, torch.uint16)]
    want.append(x.to(torch.int8).to(torch.int32))
    for o, w in zip(outs, want):
        _identical(o.cpu(), w)


@nki.jit
def _int_partial(x):
    """The integer sentinel (4) of a half-written tile, through an add."""
    P, F = x.shape
    out = nl.ndarray((P, F), dtype=x.dtype, buffer=nl.shared_hbm)
    t = nl.ndarray((P, F), dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t[:, :F // 2], src=x[:, :F // 2])
    nisa.tensor_scalar(dst=t, data=t, op0=nl.add, operand0=1)
    nisa.dma_copy(dst=out, src=t)
    return out


def test_native_integer_sentinel_and_numpy(monkeypatch):
    x = torch.randint(-100, 100, (16, 64), dtype=torch.int32)
    out = _both(_int_partial, x, monkeypatch=monkeypatch)
    assert torch.equal(out[:, :32], x[:, :32] + 1) and (out[:, 32:] == 5).all()
    # NumPy int32 arrays run in place; the acceptance add kernel on neuron too.
    a = torch.randint(-(2**30), 2**30, (128, 512), dtype=torch.int32)
    b = torch.randint(-(2**30), 2**30, (128, 512), dtype=torch.int32)
    monkeypatch.setenv("NKI_EXECUTOR", "native")
    nat = K.tensor_add(a.numpy(), b.numpy())
    monkeypatch.setenv("NKI_EXECUTOR", "interpreter")
    assert (nat == K.tensor_add(a.numpy(), b.numpy())).all()
    out = _both(K.tensor_add, a.to("neuron"), b.to("neuron"), monkeypatch=monkeypatch)
    assert torch.equal(out.cpu(), torch.round(a.float() + b.float()).to(torch.int32))  # through fp32


@nki.jit
def _reinterpret(x):
    """A float tile read through an int32 view (NkiTensor.view): bits, not values."""
    out = nl.ndarray(x.shape, dtype=nl.int32, buffer=nl.shared_hbm)
    t = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x)
    nisa.dma_copy(dst=out, src=t.view(nl.int32))
    return out


def test_native_leaves_dtype_views_to_the_interpreter(monkeypatch):
    # The executor converts values between dtypes; a view that reinterprets
    # bits is not covered (the view's storage is not among the program's).
    x = torch.randn(16, 32)
    monkeypatch.setenv("NKI_EXECUTOR", "native")
    with pytest.raises(nki.NKIError, match="dtype-reinterpreting"):
        _reinterpret(x)
    out = _run("auto", _reinterpret, x.to("neuron"), monkeypatch=monkeypatch)
    assert_same(out, x.view(torch.int32))


@nki.jit
def _memset_value(x, value):
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    t = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
    nisa.memset(t, value)
    nisa.dma_copy(dst=out, src=t)
    return out


@nki.jit
def _fp8_to_int(x):
    out = nl.ndarray(x.shape, dtype=nl.int32, buffer=nl.shared_hbm)
    u = nl.ndarray(x.shape, dtype=nl.int32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=u, src=nl.load(x))
    nisa.dma_copy(dst=out, src=u)
    return out


def test_native_leaves_interpreter_errors_to_the_interpreter(monkeypatch):
    # Where the interpreter raises (a memset value the dtype cannot hold, fp8
    # rounded to an integer), the executor does not cover the kernel, so
    # `auto` raises the interpreter's error instead of computing something.
    for kernel, args, native_msg, msg in (
            (_memset_value, (torch.zeros(4, 8, dtype=torch.int8), 300), "memset: value cannot be converted",
             "memset: failed while executing: value cannot be converted"),
            (_fp8_to_int, (torch.ones(4, 8).to(torch.float8_e4m3fn),), "fp8 -> integer copy", "round")):
        monkeypatch.setenv("NKI_EXECUTOR", "native")
        with pytest.raises(nki.NKIError, match=native_msg):
            kernel(*args)
        monkeypatch.setenv("NKI_EXECUTOR", "auto")
        with pytest.raises(nki.NKIError, match=msg):
            kernel(*args)
    out = _both(_memset_value, torch.zeros(4, 8, dtype=torch.int16), 300, monkeypatch=monkeypatch)
    assert (out == 300).all()
    out = _both(_memset_value, torch.zeros(4, 8, dtype=torch.int32), 2**24 + 1, monkeypatch=monkeypatch)
    assert (out == 2**24 + 1).all()  # not through fp32


# Forms that used to fall back to the interpreter (issue 23): each runs with
# NKI_EXECUTOR=native and equals the interpreter bit for bit.
def _rmw_copy(a, b):
    d = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=d, src=a)
    nisa.dma_copy(dst=d, src=b, dst_rmw_op=nl.multiply)
    return d


def _where_wide_ints(a, b):
    return nl.where(a, 2**31 - 1, -(2**31) + 5)


def _where_wide_ints_u32(a, b):
    return nl.where(b, 3 * 2**30 + 7, 2**25 + 1, dtype=nl.uint32)


def _broadcast_new_dims(a, b):
    return nl.broadcast_to(a[0:3, :], (2, 3, a.shape[1]))


def _bn_aggr_groups(a, b):
    s = nl.ndarray((a.shape[0], 5, 6), dtype=nl.float32, buffer=nl.sbuf)  # 3-D: five groups
    for i in range(5):
        nisa.bn_stats(dst=s[:, i, :], data=a[:, 8 * i:8 * i + 8])
    d = nl.ndarray((a.shape[0], 2), dtype=nl.float32, buffer=nl.sbuf)
    nisa.bn_aggr(dst=d, data=s)
    return d


def _rms_norm_3d(a, b):
    x = a.reshape((a.shape[0], 4, 10))
    return nl.rms_norm(x, b[0:1, :].reshape((1, 4, 10)), axis=2, n=10)


def _permuted_reductions(a, b):
    x = a.reshape((a.shape[0], 8, 5)).permute(0, 2, 1)  # a permuted view: reduced in memory order
    d = nl.ndarray((a.shape[0], 43), dtype=nl.float32, buffer=nl.sbuf)
    pred = nl.ndarray((a.shape[0], 5, 8), dtype=nl.uint8, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=pred, data=b.reshape((a.shape[0], 5, 8)), op0=nl.greater, operand0=0.0)
    nisa.select_reduce(dst=d[:, :40], predicate=pred, on_true=x, on_false=-1.0, reduce_res=d[:, 40:41],
                       reduce_op=nl.maximum)
    nisa.activation_reduce(dst=d[:, :40], op=nl.square, data=x, reduce_op=nl.add, reduce_res=d[:, 41:42])
    nisa.scalar_tensor_tensor(dst=d[:, :40], data=x, op0=nl.subtract, operand0=1.0, op1=nl.multiply,
                              operand1=b, reduce_op=nl.add, reduce_res=d[:, 42:43])
    return d


def _permuted_sum(a, b):
    d = nl.ndarray((a.shape[0], 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_reduce(dst=d, op=nl.add, data=a.reshape((a.shape[0], 8, 5)).permute(0, 2, 1), axis=(1, 2),
                       keepdims=True)
    return d


def _where_number_condition(a, b):
    return nl.where(0, a, -3)


FORMER_FALLBACKS = {"bn_aggr[5 groups]": _bn_aggr_groups, "tensor_reduce[permuted]": _permuted_sum, "where[number condition]": _where_number_condition,
                    "register reductions[permuted]": _permuted_reductions,
                    "rms_norm[3-D, last axis]": _rms_norm_3d, "dma_copy[dst_rmw_op]": _rmw_copy, "where[wide ints]": _where_wide_ints,
                    "where[wide ints, uint32]": _where_wide_ints_u32, "broadcast_to[new dims]": _broadcast_new_dims}


def _former_fallback_kernel(body):
    @nki.jit
    def kernel(a, b):
        r = body(nl.load(a), nl.load(b))
        out = nl.ndarray(r.shape, dtype=r.dtype, buffer=nl.shared_hbm)
        nl.store(out, r)
        return out
    return kernel


@pytest.mark.parametrize("form", sorted(FORMER_FALLBACKS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int32])
def test_native_covers_former_fallbacks(form, dtype, monkeypatch):
    g = torch.Generator().manual_seed(7)
    a = (torch.randn(96, 40, generator=g) * 3).to(dtype)
    b = (torch.randn(96, 40, generator=g) * 3).to(dtype)
    a[0, :4] = 0  # some false conditions
    kernel = _former_fallback_kernel(FORMER_FALLBACKS[form])
    _both(kernel, a.to("neuron"), b.to("neuron"), monkeypatch=monkeypatch)


@pytest.mark.parametrize("axis", [0, 1, 2])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_native_softmax_other_axes(axis, dtype, monkeypatch):
    # Within the transcendental tolerance of docs/nki.md (torch's fused kernel has its own exp and order).
    @nki.jit
    def kernel(a):
        r = nl.softmax(nl.load(a).reshape((a.shape[0], 4, 10)), axis=axis)
        out = nl.ndarray(r.shape, dtype=r.dtype, buffer=nl.shared_hbm)
        nl.store(out, r)
        return out
    a = (torch.randn(96, 40, generator=torch.Generator().manual_seed(3)) * 3).to(dtype).to("neuron")
    ref = _run("interpreter", kernel, a, monkeypatch=monkeypatch).cpu().float()
    out = _run("native", kernel, a, monkeypatch=monkeypatch).cpu().float()
    eps = torch.finfo(dtype).eps
    torch.testing.assert_close(out, ref, rtol=max(4e-6, 2 * eps), atol=max(2e-5, eps))
    assert torch.allclose(out.sum(dim=axis), torch.ones(()), atol=1e-2)  # a distribution along the axis


@pytest.mark.parametrize("mode", ["interpreter", "native"])
def test_dma_copy_bitvector_rmw_is_an_error(mode, monkeypatch):
    # The DMA's read-modify-write is arithmetic: a bitvector op is refused while tracing, on both executors.
    @nki.jit
    def kernel(a):
        d = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=d, src=a)
        nisa.dma_copy(dst=d, src=a, dst_rmw_op=nl.bitwise_xor)
        out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
        nl.store(out, d)
        return out
    with pytest.raises(nki.NKIError, match="dst_rmw_op.*bitvector op"):
        _run(mode, kernel, torch.arange(12, dtype=torch.int32).reshape(3, 4).to("neuron"), monkeypatch=monkeypatch)


@pytest.mark.parametrize("mode", ["interpreter", "native"])
def test_partition_bitvector_reduce_is_exact(mode, monkeypatch):
    # Integer semantics: int32 values past 2^24 (which fp32 would round) and negative ones stay exact.
    @nki.jit
    def kernel(a):
        t = nl.load(a)
        d = nl.ndarray((1, a.shape[1]), dtype=a.dtype, buffer=nl.sbuf)
        e = nl.ndarray((1, a.shape[1]), dtype=a.dtype, buffer=nl.sbuf)
        nisa.tensor_partition_reduce(dst=d, op=nl.bitwise_or, data=t)
        nisa.tensor_partition_reduce(dst=e, op=nl.bitwise_and, data=t)
        o1 = nl.ndarray(d.shape, dtype=d.dtype, buffer=nl.shared_hbm)
        o2 = nl.ndarray(e.shape, dtype=e.dtype, buffer=nl.shared_hbm)
        nl.store(o1, d)
        nl.store(o2, e)
        return o1, o2
    a = torch.randint(-(2**31), 2**31 - 1, (37, 10), generator=torch.Generator().manual_seed(5), dtype=torch.int32)
    a[:, 0] = 2**24 + 1
    o, n = _run(mode, kernel, a.to("neuron"), monkeypatch=monkeypatch)
    want_or, want_and = a[0:1].clone(), a[0:1].clone()
    for p in range(1, a.shape[0]):
        want_or, want_and = want_or | a[p:p + 1], want_and & a[p:p + 1]
    assert torch.equal(o.cpu(), want_or) and torch.equal(n.cpu(), want_and)
    assert o[0, 0].item() == 2**24 + 1


def test_where_of_numbers_only_is_an_error(monkeypatch):
    # No tile: no result shape (it used to fail inside the shape broadcast).
    @nki.jit
    def kernel(a):
        r = nl.where(1, 2**40, 3, dtype=nl.int32)
        out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
        nl.store(out, r)
        return out
    with pytest.raises(nki.NKIError, match="where.*must be a tile"):
        _run("interpreter", kernel, torch.zeros(2, 3, dtype=torch.int32).to("neuron"), monkeypatch=monkeypatch)


@pytest.mark.parametrize("cap", [2.5, -1, True, 1 << 62])
@pytest.mark.parametrize("mode", ["interpreter", "native"])
def test_while_loop_max_iterations_checked(cap, mode, monkeypatch):
    # A device loop's cap is an integer in [0, 2^62): anything else is refused while tracing, on both executors.
    x = torch.ones(4, 8).to("neuron")
    with pytest.raises(nki.NKIError, match="max_iterations"):
        _run(mode, _capped, x, 3.0, cap, monkeypatch=monkeypatch)


def _transposed_operand_matmul(x, v):
    """x [128, K] through nc_transpose into PSUM and tensor_copy to v's dtype,
    as the stationary of a matmul with v [K, d]: the operand chain the
    lowering folds when every copy keeps x's values."""
    P, Kd = x.shape
    out = nl.ndarray((P, v.shape[1]), dtype=nl.float32, buffer=nl.shared_hbm)
    xs = nl.ndarray((P, Kd), dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=xs, src=x)
    vs = nl.ndarray(v.shape, dtype=v.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=vs, src=v)
    tp = nl.ndarray((Kd, P), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_transpose(dst=tp, data=xs)
    ts = nl.ndarray((Kd, P), dtype=v.dtype, buffer=nl.sbuf)
    nisa.tensor_copy(dst=ts, src=tp)
    o = nl.ndarray((P, v.shape[1]), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul(dst=o, stationary=ts, moving=vs)
    y = nl.ndarray((P, v.shape[1]), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=y, src=o)
    nisa.dma_copy(dst=out, src=y)
    return out


@pytest.mark.parametrize("xdt, vdt, folds", [(torch.bfloat16, torch.bfloat16, True),
                                             (torch.float32, torch.float32, True),
                                             (torch.float32, torch.bfloat16, False)])
def test_native_matmul_operand_folds(xdt, vdt, folds, monkeypatch):
    # The transpose and copy feeding a matmul are dropped and the matmul reads
    # x through the transposed view (nki/_native.py _fuse_matmul_operands)
    # only when every tile of the chain holds x's values (not fp32 x rounded
    # to bf16); the same bits as the records unfolded, and the matmul of the
    # values the kernel's copies give.
    monkeypatch.setenv("NKI_EXECUTOR", "native")
    g = torch.Generator().manual_seed(3)
    x = torch.randn(128, 130, generator=g)[:, :128].contiguous().to(xdt)
    v = torch.randn(128, 72, generator=g).to(vdt)
    kernel = nki.jit(_transposed_operand_matmul)
    ops = _native.plan(kernel.trace((x, v)), True).words.reshape(-1, _native.RECORD)[:, 0]
    copies = int((ops == _native.OP_COPY).sum())
    out = kernel(x, v)
    with monkeypatch.context() as m:
        m.setattr(_native, "_fuse_matmul_operands", lambda low, bound, apart: None)
        m.setattr(_native, "_fuse_copies", lambda low, bound, apart: None)
        m.setattr(_native, "_fold_packed_operands", lambda low, bound: None)
        unfolded = nki.jit(_transposed_operand_matmul)
        ops2 = _native.plan(unfolded.trace((x, v)), True).words.reshape(-1, _native.RECORD)[:, 0]
        plain = unfolded(x, v)
    # (x's loads are read in place; unfolded, the transpose and copy come first:
    # fp32 x into a bf16 tile is one rounding copy, _fuse_copies)
    assert (int(ops[0]) == _native.OP_MM) == folds and int(ops2[0]) == _native.OP_COPY, (ops.tolist(), ops2.tolist())
    assert copies < int((ops2 == _native.OP_COPY).sum())
    _same_bits(out, plain)
    ref = x.to(vdt).float() @ v.float()  # stationary x^T: out[m, n] = sum_k x[m, k] v[k, n]
    _close(out, ref, rtol=1e-5, atol=1e-5)
