"""NKI kernels on the neuron device and on NumPy arrays: the vendor's
tutorial kernels (our own versions, tests/nki_kernels.py) against
torch/NumPy references, simulator behaviour, and the hardware limits."""
import os
import sys

import numpy as np
import pytest
import torch

import nki
import nki.isa as nisa
import nki.language as nl

sys.path.insert(0, os.path.dirname(__file__))
import nki_kernels as K  # noqa: E402

from conftest import assert_same  # noqa: E402


def _no_nan(x):
    x = x.cpu() if isinstance(x, torch.Tensor) else torch.from_numpy(x)
    assert not torch.isnan(x.float()).any(), "a NaN sentinel (unwritten memory) reached the output"


def test_package_is_ours():
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    assert nki.__file__.startswith(here)
    assert hasattr(nki, "jit") and hasattr(nl, "ndarray") and hasattr(nisa, "nc_matmul")


# -- acceptance kernels ---------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_tensor_add_neuron(dtype):
    a, b = torch.randn(256, 1024, dtype=dtype), torch.randn(256, 1024, dtype=dtype)
    out = K.tensor_add(a.to("neuron"), b.to("neuron"))
    assert out.device.type == "neuron" and out.dtype == dtype
    assert_same(out, a + b)
    _no_nan(out)


def test_tensor_add_numpy():
    a, b = np.random.rand(128, 1024).astype(np.float32), np.random.rand(128, 1024).astype(np.float32)
    out = K.tensor_add(a, b)
    assert isinstance(out, np.ndarray)
    np.testing.assert_allclose(out, a + b, rtol=1e-6)


def test_tensor_add_spmd_grid():
    a, b = torch.randn(256, 1024), torch.randn(256, 1024)
    out = K.tensor_add_spmd[2, 2](a.to("neuron"), b.to("neuron"))
    assert_same(out, a + b)
    # a grid that covers half the rows leaves the NaN sentinel in the rest
    half = K.tensor_add_spmd[1, 2](a.to("neuron"), b.to("neuron")).cpu()
    torch.testing.assert_close(half[:128], (a + b)[:128])
    assert torch.isnan(half[128:]).all()


def test_simulate_numpy_load_store():
    @nki.jit
    def add_kernel(a, b):
        out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
        nl.store(out, nl.add(nl.load(a), nl.load(b)))
        return out

    a, b = np.random.rand(64, 32).astype(np.float32), np.random.rand(64, 32).astype(np.float32)
    np.testing.assert_allclose(nki.simulate(add_kernel)(a, b), a + b)
    ta, tb = torch.from_numpy(a), torch.from_numpy(b)
    r = nki.simulate(add_kernel)(ta, tb)
    assert isinstance(r, torch.Tensor)
    torch.testing.assert_close(r, ta + tb)


@pytest.mark.parametrize("dtype,tol", [(torch.float32, {}), (torch.bfloat16, dict(atol=0.1, rtol=2e-2))])
def test_matmul_basic(dtype, tol):
    lhsT, rhs = torch.randn(128, 64, dtype=dtype), torch.randn(128, 512, dtype=dtype)
    out = K.matmul_basic(lhsT.to("neuron"), rhs.to("neuron"))
    ref = (lhsT.float().T @ rhs.float()).to(dtype)
    assert_same(out, ref, **tol)
    if dtype == torch.float32:
        a, b = lhsT.numpy(), rhs.numpy()
        np.testing.assert_allclose(K.matmul_basic(a, b), a.T @ b, atol=1e-4, rtol=1e-4)


def test_matmul_tiled_k_accumulates():
    lhsT, rhs = torch.randn(384, 256), torch.randn(384, 1024)  # K = 3 tiles
    out = K.matmul_tiled(lhsT.to("neuron"), rhs.to("neuron"))
    assert_same(out, lhsT.T @ rhs, atol=1e-3, rtol=1e-4)
    _no_nan(out)
    a, b = lhsT.numpy(), rhs.numpy()
    np.testing.assert_allclose(K.matmul_tiled(a, b), a.T @ b, atol=1e-3, rtol=1e-4)


@pytest.mark.parametrize("pool", [2, 3])
def test_avgpool2d(pool):
    x = np.random.rand(4, 6 * pool, 4 * pool).astype(np.float32)
    np.testing.assert_allclose(K.avgpool2d(x, pool), K.avgpool2d_ref(x, pool), rtol=1e-6)
    xt = torch.from_numpy(x).to(torch.bfloat16)
    ref = torch.nn.functional.avg_pool2d(xt.float()[None], pool)[0].to(torch.bfloat16)
    assert_same(K.avgpool2d(xt.to("neuron"), pool), ref, atol=1e-2, rtol=1e-2)


def test_transpose2d():
    x = np.arange(5 * 12, dtype=np.int32).reshape(5, 12)
    np.testing.assert_array_equal(K.transpose2d(x, (3, 4)), K.transpose2d_ref(x, (3, 4)))
    xt = torch.randn(128, 6 * 7)
    ref = torch.from_numpy(K.transpose2d_ref(xt.numpy(), (6, 7)))
    assert_same(K.transpose2d(xt.to("neuron"), (6, 7)), ref, atol=0, rtol=0)


@pytest.mark.parametrize("rows", [128, 200])
def test_rmsnorm(rows):
    x, w = torch.randn(rows, 96), torch.randn(1, 96)
    ref = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w
    out = K.rmsnorm(x.to("neuron"), w.to("neuron"), 1e-6)
    assert_same(out, ref, atol=1e-5, rtol=1e-3)
    _no_nan(out)


def test_softmax_partial_tile():
    x = torch.randn(300, 80)
    assert_same(K.softmax_rows(x.to("neuron")), torch.softmax(x, -1), atol=1e-6, rtol=1e-5)


def test_exponential_is_trn3_only(monkeypatch):
    x = torch.randn(64, 80)
    assert nisa.get_nc_version() == nisa.nc_version.gen3  # trn2, the default target
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", "trn3")
    assert nisa.get_nc_version() >= nisa.nc_version.gen4
    assert_same(K.softmax_rows_v4(x.to("neuron")), torch.softmax(x, -1), atol=1e-6, rtol=1e-5)
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", "trn2")
    with pytest.raises(nki.NKIError, match=r"exponential: is available only on NeuronCore-v4 \(trn3\)"):
        K.softmax_rows_v4(x.to("neuron"))


def test_accumulator_registers():
    """reduce_cmd: reset_reduce stores, reduce folds in, idle keeps; the
    Scalar and Vector Engines have separate registers."""
    @nki.jit
    def k(x):
        P, F = x.shape
        out = nl.ndarray((P, 4), dtype=nl.float32, buffer=nl.shared_hbm)
        t = nl.load(x)
        junk = nl.ndarray((P, F), dtype=nl.float32, buffer=nl.sbuf)
        r = nl.ndarray((P, 4), dtype=nl.float32, buffer=nl.sbuf)
        nisa.activation(dst=junk, op=nl.copy, data=t, reduce_op=nl.add,
                        reduce_cmd=nisa.reduce_cmd.reset_reduce)                  # scalar regs = sum(x)
        nisa.tensor_scalar_reduce(dst=junk, data=t, op0=nl.multiply, operand0=2.0, reduce_op=nl.maximum,
                                  reduce_res=r[:, 0:1])                          # vector regs = max(2x)
        nisa.activation(dst=junk, op=nl.square, data=t, reduce_op=nl.add, reduce_res=r[:, 1:2],
                        reduce_cmd=nisa.reduce_cmd.reduce)                       # sum(x) + sum(x^2)
        nisa.activation(dst=junk, op=nl.exp, data=t, reduce_op=nl.add, reduce_res=r[:, 2:3],
                        reduce_cmd=nisa.reduce_cmd.idle)                         # idle + reduce_res: sum(exp)
        nisa.tensor_scalar_reduce(dst=junk, data=t, op0=nl.add, operand0=0.0, reduce_op=nl.add,
                                  reduce_res=r[:, 3:4], reduce_res_negate=True)  # -sum(x)
        nl.store(out, r)
        return out

    x = torch.randn(32, 16)
    r = k(x.to("neuron")).cpu()
    torch.testing.assert_close(r[:, 0], (2 * x).amax(1))
    torch.testing.assert_close(r[:, 1], x.sum(1) + x.square().sum(1))
    torch.testing.assert_close(r[:, 2], x.exp().sum(1))
    torch.testing.assert_close(r[:, 3], -x.sum(1))


def test_language_composites():
    @nki.jit
    def composite(x, w):
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        t = nl.load(x)
        y = nl.rms_norm(t, nl.load(w), axis=1, n=x.shape[1])
        s = nl.softmax(y, axis=1)
        nl.store(out, s * 2.0 - nl.exp(t) / nl.sum(nl.exp(t), axis=1, keepdims=True))
        return out

    x, w = torch.randn(64, 32), torch.randn(1, 32)
    y = x * torch.rsqrt(x.pow(2).sum(-1, keepdim=True) / 32 + 1e-6) * w
    ref = torch.softmax(y, -1) * 2 - torch.softmax(x, -1)
    assert_same(composite(x.to("neuron"), w.to("neuron")), ref, atol=1e-5, rtol=1e-4)


def test_nl_matmul_transpose_x_and_iota_affine_select():
    @nki.jit
    def k(a, b):
        out = nl.ndarray((64, 96), dtype=nl.float32, buffer=nl.shared_hbm)
        p = nl.matmul(nl.load(a), nl.load(b))  # a: [64, 32] -> inserted transpose
        s = nl.copy(p)
        masked = nl.ndarray((64, 96), dtype=nl.float32, buffer=nl.sbuf)
        # keep s[p, i] where p - i >= 0 (lower triangle), else -inf
        nisa.affine_select(masked, [[-1, 96]], 0, 1, s, -float("inf"), cmp_op=nl.greater_equal)
        nl.store(out, masked)
        return out

    a, b = torch.randn(64, 32), torch.randn(32, 96)
    ref = (a @ b).masked_fill(~torch.ones(64, 96, dtype=torch.bool).tril(), -float("inf"))
    assert_same(k(a.to("neuron"), b.to("neuron")), ref, atol=1e-5, rtol=1e-5)


def test_isa_misc_ops():
    @nki.jit
    def k(x):
        P, F = x.shape
        out = nl.ndarray((P, 2 + 8 + 8 + F), dtype=nl.float32, buffer=nl.shared_hbm)
        t = nl.load(x)
        st = nl.ndarray((P, 6), dtype=nl.float32, buffer=nl.sbuf)
        nisa.bn_stats(dst=st, data=t)
        mv = nl.ndarray((P, 2), dtype=nl.float32, buffer=nl.sbuf)
        nisa.bn_aggr(dst=mv, data=st)
        top = nl.ndarray((P, 8), dtype=nl.float32, buffer=nl.sbuf)
        nisa.max8(dst=top, src=t)
        idx = nl.ndarray((P, 8), dtype=nl.uint32, buffer=nl.sbuf)
        nisa.nc_find_index8(dst=idx, data=t, vals=top)
        io = nl.ndarray((P, F), dtype=nl.int32, buffer=nl.sbuf)
        nisa.iota(io, [[1, F]], 3, channel_multiplier=F)
        nl.store(out[:, 0:2], mv)
        nl.store(out[:, 2:10], top)
        nl.store(out[:, 10:18], nl.copy(idx, dtype=nl.float32))
        nl.store(out[:, 18:], nl.copy(io, dtype=nl.float32))
        return out

    x = torch.randn(16, 40)
    r = k(x.to("neuron")).cpu()
    torch.testing.assert_close(r[:, 0], x.mean(1))
    torch.testing.assert_close(r[:, 1], x.var(1, correction=0))
    top = torch.topk(x, 8, dim=1)
    torch.testing.assert_close(r[:, 2:10], top.values)
    torch.testing.assert_close(r[:, 10:18], top.indices.float())
    torch.testing.assert_close(r[:, 18:], (torch.arange(16)[:, None] * 40 + torch.arange(40) + 3).float())


def test_while_loop_on_device_value():
    @nki.jit
    def halve_until_small(x):
        out = nl.ndarray((1, 1), dtype=nl.float32, buffer=nl.shared_hbm)
        v = nl.load(x)
        cond = nl.ndarray((1, 1), dtype=nl.float32, buffer=nl.sbuf)

        def c(state):
            nisa.tensor_scalar(dst=cond, data=state, op0=nl.greater, operand0=1.0)
            return cond

        def body(state):
            nisa.tensor_scalar(dst=state, data=state, op0=nl.multiply, operand0=0.5)
            return state
        nl.store(out, nl.while_loop(c, body, v))
        return out

    x = torch.tensor([[37.0]])
    r = halve_until_small(x.to("neuron")).cpu()
    v = 37.0
    while v > 1:
        v *= 0.5
    assert r.item() == v


# -- simulator behaviour ---------------------------------------------------------
def test_unwritten_memory_reads_nan_and_four():
    @nki.jit
    def partial(x):
        out = nl.ndarray((128, 8), dtype=x.dtype, buffer=nl.shared_hbm)
        t = nl.ndarray((128, 8), dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t[:, 0:4], src=x[:, 0:4])  # columns 4..7 never written
        nisa.dma_copy(dst=out, src=t)
        return out

    f = partial(torch.ones(128, 8, device="neuron")).cpu()
    assert (f[:, :4] == 1).all() and torch.isnan(f[:, 4:]).all()
    i = partial(np.ones((128, 8), dtype=np.int32))
    assert (i[:, :4] == 1).all() and (i[:, 4:] == 4).all()


def test_output_argument_mutated_in_place():
    x = torch.randn(128, 64)
    out = torch.full((128, 64), 7.0, device="neuron")
    assert K.relu_into(x.to("neuron"), out) is None
    assert_same(out, x.relu())
    o = np.zeros((128, 64), dtype=np.float32)
    K.relu_into(x.numpy(), o)
    np.testing.assert_array_equal(o, x.relu().numpy())


def test_bf16_rounding_like_hardware():
    """fp32 compute, rounded to bf16 on store (round to nearest even)."""
    @nki.jit
    def scale(x):
        out = nl.ndarray(x.shape, dtype=nl.bfloat16, buffer=nl.shared_hbm)
        t = nl.load(x)
        y = nl.ndarray(x.shape, dtype=nl.bfloat16, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=y, data=t, op0=nl.multiply, operand0=3.0, op1=nl.add, operand1=0.1)
        nisa.dma_copy(dst=out, src=y)
        return out

    x = torch.randn(32, 64)
    ref = (x * 3.0 + 0.1).to(torch.bfloat16)
    assert_same(scale(x.to("neuron")), ref, atol=0, rtol=0)


def test_fp8_storage_rounds():
    @nki.jit
    def to_fp8_and_back(x):
        out = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.shared_hbm)
        t = nl.load(x, dtype=nl.float8_e4m3)
        nl.store(out, nl.copy(t, dtype=nl.float32))
        return out

    x = torch.randn(16, 32)
    ref = x.to(torch.float8_e4m3fn).float()
    assert_same(to_fp8_and_back(x.to("neuron")), ref, atol=0, rtol=0)


def test_trace_is_cached_per_specialisation():
    traces = []

    @nki.jit
    def k(x, factor):
        traces.append(x.shape)
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        nl.store(out, nl.multiply(nl.load(x), factor))
        return out

    a = torch.randn(8, 16, device="neuron")
    for _ in range(3):
        assert_same(k(a, 2.0), a.cpu() * 2)
    assert len(traces) == 1
    k(a, 3.0)
    k(torch.randn(4, 16, device="neuron"), 2.0)
    assert len(traces) == 3


def test_target_override_changes_moving_limit(monkeypatch):
    """trn3 streams up to 4096 moving columns into an fp32 PSUM tile spanning
    banks; trn2 stops at 512."""
    @nki.jit
    def wide_matmul(lhsT, rhs):
        M, N = lhsT.shape[1], rhs.shape[1]
        out = nl.ndarray((M, N), dtype=nl.float32, buffer=nl.shared_hbm)
        acc = nl.ndarray((M, N), dtype=nl.float32, buffer=nl.psum)
        nisa.nc_matmul(acc, nl.load(lhsT), nl.load(rhs))
        nl.store(out, nl.copy(acc))
        return out

    lhsT, rhs = np.random.rand(128, 64).astype(np.float32), np.random.rand(128, 1024).astype(np.float32)
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", "trn3")
    np.testing.assert_allclose(wide_matmul(lhsT, rhs), lhsT.T @ rhs, rtol=1e-4)
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", "trn2")
    with pytest.raises(nki.NKIError, match="PSUM tile of 4096 bytes per partition exceeds the 2 KiB PSUM bank"):
        wide_matmul(lhsT, rhs)
    with pytest.raises(nki.NKIError, match="free size 1024 exceeds gemm_moving_fmax 512 on trn2"):
        _matmul_kernel(128, 64, 128, 1024, dst_shape=(64, 512))(np.zeros(1, np.float32))


# -- hardware limits: each violation names instruction, operand, limit, line ----
def _raises(match, kernel, *args):
    with pytest.raises(nki.NKIError, match=match) as info:
        kernel(*args)
    assert "test_nki.py:" in str(info.value), str(info.value)  # the kernel source line
    return info


def test_limit_partition_dimension():
    @nki.jit
    def k(x):
        t = nl.ndarray((256, 4), dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x)

    _raises(r"nki.language.ndarray: operand 'shape': partition dimension 256 exceeds maximum 128",
            k, np.zeros((256, 4), np.float32))


def test_limit_psum_tile_width():
    @nki.jit
    def k(x):
        nl.ndarray((128, 513), dtype=nl.float32, buffer=nl.psum)

    _raises(r"PSUM tile of 2052 bytes per partition exceeds the 2 KiB PSUM bank", k, np.zeros(1, np.float32))


def _matmul_kernel(k_a, m, k_b, n, dst_buf=nl.psum, a_buf=nl.sbuf, dst_shape=None):
    @nki.jit
    def k(x):
        a = nl.ndarray((k_a, m), dtype=nl.bfloat16, buffer=a_buf)
        b = nl.ndarray((k_b, n), dtype=nl.bfloat16, buffer=nl.sbuf)
        d = nl.ndarray(dst_shape or (m, n), dtype=nl.float32, buffer=dst_buf)
        nisa.nc_matmul(d, a, b)
    return k


@pytest.mark.parametrize("shape,match", [
    ((128, 129, 128, 512), r"nc_matmul: operand 'stationary': free size 129 exceeds gemm_stationary_fmax 128"),
    ((128, 128, 128, 513), r"nc_matmul: operand 'moving': free size 513 exceeds gemm_moving_fmax 512"),
    ((128, 64, 96, 512), r"nc_matmul: operand 'moving': contraction \(partition\) size 96 does not match"),
])
def test_limit_matmul_shapes(shape, match):
    # a legal PSUM dst: the allocation of a too-wide one would fail first
    _raises(match, _matmul_kernel(*shape, dst_shape=(128, 512)), np.zeros(1, np.float32))


def test_limit_matmul_buffers():
    _raises(r"nc_matmul: operand 'dst': is in sbuf, but nki.isa.nc_matmul accepts psum",
            _matmul_kernel(128, 64, 128, 512, dst_buf=nl.sbuf), np.zeros(1, np.float32))
    _raises(r"nc_matmul: operand 'stationary': is in psum, but nki.isa.nc_matmul accepts sbuf",
            _matmul_kernel(128, 64, 128, 256, a_buf=nl.psum), np.zeros(1, np.float32))


def test_limit_dma_from_psum():
    @nki.jit
    def k(x):
        out = nl.ndarray((128, 4), dtype=nl.float32, buffer=nl.shared_hbm)
        p = nl.ndarray((128, 4), dtype=nl.float32, buffer=nl.psum)
        nisa.memset(p, 0.0)
        nisa.dma_copy(dst=out, src=p)
        return out

    _raises(r"dma_copy: operand 'src': is in psum.*tensor_copy", k, np.zeros(1, np.float32))


def test_limit_returned_buffer_must_be_shared_hbm():
    @nki.jit
    def k(x):
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.hbm)
        nisa.dma_copy(dst=out, src=x)
        return out

    with pytest.raises(nki.NKIError, match="returned tensors must be allocated with buffer=nl.shared_hbm"):
        k(np.zeros((4, 4), np.float32))


def test_limit_float64_rejected():
    with pytest.raises(nki.NKIError, match="float64 is not supported"):
        K.tensor_add(np.zeros((128, 512)), np.zeros((128, 512)))
    with pytest.raises(nki.NKIError, match="float64 is not supported"):
        K.tensor_add(torch.zeros(128, 512, dtype=torch.float64, device="neuron"),
                     torch.zeros(128, 512, dtype=torch.float64, device="neuron"))


def test_limit_memset_dtype():
    @nki.jit
    def k(x):
        t = nl.ndarray((8, 8), dtype=nl.int32, buffer=nl.sbuf)
        nisa.memset(t, 1.5)

    _raises(r"memset: operand 'value': float value 1.5 does not match the int32 dst", k, np.zeros(1, np.float32))


def test_limit_cross_partition_view():
    @nki.jit
    def k(x):
        t = nl.ndarray((128, 64), dtype=nl.float32, buffer=nl.sbuf)
        t.reshape((64, 128))

    _raises(r"changes the partition dimension of an on-chip tensor", k, np.zeros(1, np.float32))

    @nki.jit
    def k2(x):
        t = nl.ndarray((128, 64), dtype=nl.float32, buffer=nl.sbuf)
        t.ap([[64, 64], [1, 128]])  # 128 elements of a 64-element row

    _raises(r"crosses partitions", k2, np.zeros(1, np.float32))


def test_limit_compute_on_hbm_and_op_enum():
    @nki.jit
    def k(x):
        t = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
        nisa.tensor_tensor(dst=t, data1=x, data2=x, op=nl.add)

    _raises(r"tensor_tensor: operand 'data1': is in shared_hbm.*dma_copy", k, np.zeros((4, 4), np.float32))

    @nki.jit
    def k2(x):
        t = nl.ndarray((4, 4), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_tensor(dst=t, data1=t, data2=t, op=0)

    _raises(r"tensor_tensor: operand 'op': expected an nl function", k2, np.zeros(1, np.float32))


def test_platform_target_argument_rejected():
    with pytest.raises(nki.NKIError, match="NEURON_PLATFORM_TARGET_OVERRIDE"):
        nki.jit(platform_target="trn1")


def test_list_argument_rejected():
    with pytest.raises(nki.NKIError, match="pass a tuple"):
        K.transpose2d(np.zeros((4, 12), np.float32), [3, 4])


def test_kernel_touches_device_memory_only_inside_its_launch():
    """Protect mode faults on host access to device memory outside a launch:
    the output's sentinel fill and the kernel must both run inside it."""
    from conftest import run_python
    run_python("""
        import torch, torch_neuronx, sys
        sys.path.insert(0, %r)
        import nki_kernels as K
        a = torch.randn(128, 512)
        out = K.tensor_add(a.to("neuron"), a.to("neuron"))
        torch.testing.assert_close(out.cpu(), a + a)
    """ % os.path.dirname(os.path.abspath(__file__)), env={"NEURON_RT_PROTECT": "1"})


def test_legacy_names_explain_the_migration():
    with pytest.raises(AttributeError, match="legacy neuronxcc.nki API.*nl.ds"):
        nl.arange(4)


def test_kernel_on_tensor_requiring_grad():
    """A raw kernel call is outside autograd: it reads a leaf that requires
    grad without an in-place error and returns a tensor without history."""
    a = torch.randn(128, 512, requires_grad=True)
    out = K.tensor_add(a, a)
    assert not out.requires_grad
    torch.testing.assert_close(out, (a + a).detach())


def test_psum_accumulate_flag():
    """accumulate=None: first write overwrites (even over the NaN sentinel),
    later ones add, also when only part of the tile was written before;
    False overwrites; True adds."""
    @nki.jit
    def k(a, b):
        out = nl.ndarray((4, 64, 8), dtype=nl.float32, buffer=nl.shared_hbm)
        x, y = nl.load(a), nl.load(b)
        acc = nl.ndarray((64, 8), dtype=nl.float32, buffer=nl.psum)
        nisa.nc_matmul(acc[:, 0:4], x, y[:, 0:4])      # first write of columns 0..3
        nisa.nc_matmul(acc, x, y)                       # adds on 0..3, overwrites 4..7
        nl.store(out[0], nl.copy(acc))
        nisa.nc_matmul(acc, x, y, accumulate=False)
        nl.store(out[1], nl.copy(acc))
        nisa.nc_matmul(acc, x, y, accumulate=True)
        nl.store(out[2], nl.copy(acc))
        nisa.nc_matmul(acc, x, y)
        nl.store(out[3], nl.copy(acc))
        return out

    a, b = torch.randn(32, 64), torch.randn(32, 8)
    p = a.T @ b
    r = k(a, b)
    first = p.clone()
    first[:, :4] *= 2
    torch.testing.assert_close(r[0], first)
    torch.testing.assert_close(r[1], p)
    torch.testing.assert_close(r[2], 2 * p)
    torch.testing.assert_close(r[3], 3 * p)


def _isa_kernel(body):
    @nki.jit
    def k(x):
        a = nl.ndarray((128, 4, 8), dtype=nl.float32, buffer=nl.sbuf)
        b = nl.ndarray((128, 8), dtype=nl.float32, buffer=nl.sbuf)
        p = nl.ndarray((128, 128), dtype=nl.float32, buffer=nl.psum)
        body(a, b, p)
    return k


@pytest.mark.parametrize("body,match", [
    (lambda a, b, p: nisa.tensor_reduce(dst=b[:, 0:4], op=nl.add, data=a, axis=1),
     r"tensor_reduce: operand 'axis': axis 1 must be the last contiguous free dimensions"),
    (lambda a, b, p: nisa.tensor_reduce(dst=b, op=nl.add, data=a, axis=0),
     r"tensor_reduce: operand 'axis': axis 0 must name free dimensions"),
    (lambda a, b, p: nisa.nc_transpose(dst=b[0:8, :], data=p[:, 0:8]),
     r"nc_transpose: operand 'dst': shape \[8, 8\] is not the transpose"),
    (lambda a, b, p: nisa.tensor_scalar(dst=b, data=b, op0=nl.add, operand0=1.0, op1=nl.bitwise_and,
                                        operand1=1),
     r"tensor_scalar: operand 'op1': op0 \(nl.add\) and op1 \(nl.bitwise_and\) must both be"),
    (lambda a, b, p: nisa.activation(dst=b, op=nl.exp, data=b, reduce_op=nl.maximum, reduce_res=b[:, 0:1]),
     r"activation: operand 'reduce_op': nl.maximum is not supported here; reduce_op must be nl.add"),
    (lambda a, b, p: nisa.activation(dst=b, op=nl.add, data=b),
     r"activation: operand 'op': expected a unary \(activation\) function, got nl.add"),
    (lambda a, b, p: nisa.tensor_tensor(dst=b, data1=b, data2=b, op=nl.bitwise_and),
     r"tensor_tensor: operand 'op': nl.bitwise_and is a bitvector op and needs integer dtypes"),
    (lambda a, b, p: nisa.tensor_scalar(dst=b, data=b, op0=nl.add, operand0=a[:, 0, 0:2]),
     r"tensor_scalar: operand 'operand0': a per-partition operand must have shape \[128, 1\]"),
    (lambda a, b, p: nisa.iota(p[:, 0:8], [[1, 8]], 0),
     r"iota: operand 'dst': is in psum, but nki.isa.iota accepts sbuf"),
    (lambda a, b, p: nisa.activation(dst=b, op=nl.exp, data=b, reduce_cmd=3),
     r"activation: operand 'reduce_cmd': expected an nisa.reduce_cmd value"),
    (lambda a, b, p: nisa.tensor_copy(dst=b, src=a),
     r"tensor_copy: operand 'src': shapes differ"),
])
def test_isa_operand_rules(body, match):
    _raises(match, _isa_kernel(body), np.zeros(1, np.float32))


def test_nc_transpose_engines():
    @nki.jit
    def k(x):
        P, F = x.shape
        out = nl.ndarray((F, P), dtype=nl.float32, buffer=nl.shared_hbm)
        t = nl.load(x)
        pt = nl.ndarray((F, P), dtype=nl.float32, buffer=nl.psum)
        nisa.nc_transpose(dst=pt, data=t)                                # Tensor Engine: SBUF -> PSUM
        small = nl.ndarray((16, 16), dtype=nl.float32, buffer=nl.sbuf)
        nisa.nc_transpose(dst=small, data=t[0:16, 0:16], engine=nisa.engine.vector)
        res = nl.copy(pt)
        nisa.tensor_copy(dst=res[0:16, 0:16], src=small)
        nl.store(out, res)
        return out

    x = torch.randn(96, 40)
    assert_same(k(x.to("neuron")), x.T.contiguous(), atol=0, rtol=0)


def test_argument_errors():
    a = torch.randn(128, 1024, device="neuron")
    # A strided argument runs on a contiguous copy (tests/test_nki_v2.py).
    assert_same(K.tensor_add(a[:, ::2], a[:, ::2]), (a[:, ::2] * 2).cpu())
    with pytest.raises(nki.NKIError, match="either torch tensors or NumPy arrays, not both"):
        K.tensor_add(a[:, :512].contiguous(), np.zeros((128, 512), np.float32))
    with pytest.raises(nki.NKIError, match="on different devices"):
        K.tensor_add(a[:, :512].contiguous(), torch.zeros(128, 512))
    with pytest.raises(nki.NKIError, match="int64 is not supported"):
        K.tensor_add(torch.zeros(128, 512, dtype=torch.int64), torch.zeros(128, 512, dtype=torch.int64))
    with pytest.raises(nki.NKIError, match="missing a required argument"):
        K.tensor_add(a)


def test_tensor_tensor_scan_linear_recurrence():
    """h[t] = a[t] * h[t-1] + b[t] per partition (a selective-scan step)."""
    @nki.jit
    def scan(a, b, h0):
        out = nl.ndarray(a.shape, dtype=nl.float32, buffer=nl.shared_hbm)
        h = nl.ndarray(a.shape, dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_tensor_scan(dst=h, data0=nl.load(a), data1=nl.load(b), initial=nl.load(h0),
                                op0=nl.multiply, op1=nl.add)
        nl.store(out, h)
        return out

    a, b, h0 = torch.rand(64, 50), torch.randn(64, 50), torch.randn(64, 1)
    ref = torch.empty(64, 50)
    h = h0[:, 0]
    for t in range(50):
        h = a[:, t] * h + b[:, t]
        ref[:, t] = h
    assert_same(scan(a.to("neuron"), b.to("neuron"), h0.to("neuron")), ref, atol=1e-5, rtol=1e-5)


def test_layernorm_language_and_bn_stats():
    """LayerNorm two ways in the current API: nl.* arithmetic (a [P] mean
    broadcasts along the free axis, from the partition axis) and
    bn_stats/bn_aggr over 512-column chunks with tensor_scalar."""
    @nki.jit
    def layernorm(x, eps, gamma, beta):
        rows, H = x.shape
        P = nl.tile_size.pmax
        out1 = nl.ndarray((rows, H), dtype=x.dtype, buffer=nl.shared_hbm)
        out2 = nl.ndarray((rows, H), dtype=x.dtype, buffer=nl.shared_hbm)
        # partition broadcast happens in the DMA, from a stride-0 HBM view
        g = nl.load(gamma.reshape((1, H)).broadcast_to((P, H)))
        b = nl.load(beta.reshape((1, H)).broadcast_to((P, H)))
        for i in nl.affine_range((rows + P - 1) // P):
            p = min(P, rows - i * P)
            t = nl.load(x[i * P:i * P + p])
            mean = nl.mean(t, axis=1)                       # shape [p]
            var = nl.mean(nl.square(t), axis=1) - mean * mean
            y1 = (t - mean) * nl.rsqrt(var + eps) * g[:p] + b[:p]
            nl.store(out1[i * P:i * P + p], y1)
            chunks = (H + nl.tile_size.bn_stats_fmax - 1) // nl.tile_size.bn_stats_fmax
            stats = nl.ndarray((p, 6 * chunks), dtype=nl.float32, buffer=nl.sbuf)
            for j in nl.affine_range(chunks):
                lo = j * nl.tile_size.bn_stats_fmax
                hi = min(H, lo + nl.tile_size.bn_stats_fmax)
                nisa.bn_stats(dst=stats[:, j * 6:(j + 1) * 6], data=t[:, lo:hi])
            mv = nl.ndarray((p, 2), dtype=nl.float32, buffer=nl.sbuf)
            nisa.bn_aggr(dst=mv, data=stats)
            rstd = nl.ndarray((p, 1), dtype=nl.float32, buffer=nl.sbuf)
            nisa.tensor_scalar(dst=rstd, data=mv[:, 1:2], op0=nl.add, operand0=eps, op1=nl.power,
                               operand1=-0.5)
            y2 = nl.ndarray((p, H), dtype=nl.float32, buffer=nl.sbuf)
            nisa.tensor_scalar(dst=y2, data=t, op0=nl.subtract, operand0=mv[:, 0:1], op1=nl.multiply,
                               operand1=rstd)
            nl.store(out2[i * P:i * P + p], y2 * g[:p] + b[:p])
        return out1, out2

    x, gamma, beta = torch.randn(200, 1100), torch.randn(1100), torch.randn(1100)
    ref = torch.nn.functional.layer_norm(x, (1100,), gamma, beta, eps=1e-5)
    o1, o2 = layernorm(x.to("neuron"), 1e-5, gamma.to("neuron"), beta.to("neuron"))
    assert_same(o1, ref, atol=1e-4, rtol=1e-4)
    assert_same(o2, ref, atol=1e-4, rtol=1e-4)


def test_positional_only_and_default_arguments():
    @nki.jit
    def k(x, /, scale=2.0, *, shift=1.0):
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        nl.store(out, nl.load(x) * scale + shift)
        return out

    x = torch.randn(8, 8)
    assert_same(k(x.to("neuron")), x * 2 + 1)
    assert_same(k(x.to("neuron"), 3.0, shift=0.5), x * 3 + 0.5)
    with pytest.raises(nki.NKIError, match="nests a tensor"):
        k(x, (x,))


def test_repeated_calls_take_the_launch_fast_path(monkeypatch):
    """The second call of an argument signature (plain contiguous neuron
    tensors, builtin constants) launches its native program directly
    (Kernel._fast): the same results, the returned argument is the caller's
    tensor, -0.0 and 0.0 are different constants, and calls that do not
    qualify (a strided argument, the interpreter) take the full path."""
    @nki.jit
    def scale_into(x, out, s):
        nl.store(out, nl.load(x) * s)
        return out

    x = torch.randn(8, 8)
    xn, out = x.to("neuron"), torch.empty(8, 8, device="neuron")
    for _ in range(3):
        xn.add_(1.0)
        x.add_(1.0)
        assert scale_into(xn, out, 3.0) is out
        assert_same(out, x * 3)
    assert len(scale_into._fast) == 1
    for s in (-0.0, 0.0, -0.0):  # bits: the sign of each zero product
        scale_into(xn, out, s)
        assert torch.equal(out.cpu().view(torch.int32), (x * s).view(torch.int32))
    assert len(scale_into._fast) == 3
    assert_same(scale_into(xn.t(), out, 2.0), x.t() * 2)  # strided: copied, full path
    monkeypatch.setenv("NKI_EXECUTOR", "interpreter")
    assert_same(scale_into(xn, out, 3.0), x * 3)
    assert len(scale_into._fast) == 3
    monkeypatch.delenv("NKI_EXECUTOR")
    with pytest.raises(nki.NKIError, match="different devices"):
        scale_into(xn, out.cpu(), 3.0)

    @nki.jit
    def pair(x, out):  # a tuple: an allocated output and the written argument
        y = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        nl.store(y, nl.load(x) + 1.0)
        nl.store(out, nl.load(x) * 2.0)
        return y, out

    for _ in range(2):
        y, o = pair(xn, out)
        assert o is out
        assert_same(y, x + 1)
        assert_same(out, x * 2)
    assert len(pair._fast) == 1


def test_positional_and_keyword_calls_share_one_specialisation():
    """A call of only positional arguments binds without inspect (the
    per-call fast path); keywords, too many arguments and too few still go
    through the signature, and every form names the same specialisation."""
    @nki.jit
    def k(x, scale):
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        nl.store(out, nl.load(x) * scale)
        return out

    x = torch.randn(8, 8)
    xn = x.to("neuron")
    assert_same(k(xn, 3.0), x * 3)
    assert_same(k(xn, scale=3.0), x * 3)
    assert_same(k(x=xn, scale=3.0), x * 3)
    assert len(k._cache) == 1
    assert_same(k(xn, 0.5), x * 0.5)
    assert len(k._cache) == 2
    with pytest.raises(nki.NKIError, match="too many positional arguments"):
        k(xn, 3.0, 4.0)
    with pytest.raises(nki.NKIError, match="missing a required argument"):
        k(xn)


def test_spmd_ids():
    @nki.jit
    def ids(x):
        out = nl.ndarray((4, 3, 4), dtype=nl.float32, buffer=nl.shared_hbm)
        i, j = nl.program_id(0), nl.program_id(1)
        t = nl.ndarray((1, 4), dtype=nl.float32, buffer=nl.sbuf)
        nisa.memset(t[:, 0:1], float(i))
        nisa.memset(t[:, 1:2], float(j))
        nisa.memset(t[:, 2:3], float(nl.num_programs()))
        nisa.memset(t[:, 3:4], float(nl.num_programs(1) * 10 + nl.program_ndim()))
        nisa.dma_copy(dst=out[i, j:j + 1, :], src=t)
        return out

    r = ids[4, 3](np.zeros(1, np.float32))
    for i in range(4):
        for j in range(3):
            assert list(r[i, j]) == [i, j, 12, 32]


def test_dtype_view_reinterprets_bits():
    @nki.jit
    def bits(x):
        out = nl.ndarray(x.shape, dtype=nl.int32, buffer=nl.shared_hbm)
        t = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.sbuf)
        as_int = t.view(nl.int32)
        nisa.memset(as_int, 0)           # first touch through the int32 view
        nisa.dma_copy(dst=t, src=x)
        nisa.dma_copy(dst=out, src=as_int)
        return out

    x = torch.randn(16, 32)
    assert_same(bits(x.to("neuron")), x.view(torch.int32))


def test_precise_fp_off_keeps_fp32_on_chip(monkeypatch):
    """NKI_PRECISE_FP=0: a bf16 SBUF tile holds fp32 values, so only the
    final store to HBM rounds (once instead of twice)."""
    @nki.jit
    def twice(x):
        out = nl.ndarray(x.shape, dtype=nl.bfloat16, buffer=nl.shared_hbm)
        t = nl.ndarray(x.shape, dtype=nl.bfloat16, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=t, data=nl.load(x), op0=nl.multiply, operand0=1.0 / 3.0)
        nisa.tensor_scalar(dst=t, data=t, op0=nl.multiply, operand0=3.0)
        nl.store(out, t)
        return out

    x = torch.randn(64, 64)
    rounded_twice = ((x * (1.0 / 3.0)).to(torch.bfloat16).float() * 3.0).to(torch.bfloat16)
    rounded_once = (x * (1.0 / 3.0) * 3.0).to(torch.bfloat16)
    assert not torch.equal(rounded_twice, rounded_once)
    assert_same(twice(x.to("neuron")), rounded_twice, atol=0, rtol=0)
    monkeypatch.setenv("NKI_PRECISE_FP", "0")
    assert_same(twice(x.to("neuron")), rounded_once, atol=0, rtol=0)
