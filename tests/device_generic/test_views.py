"""Views on the device vs CPU: shared storage, writes through views, and the
lazy conj / neg views of complex and real tensors (``conj()``, ``_neg_view()``,
``.H`` / ``.mH`` / ``.adjoint()``), which must be materialized correctly by
every consumer (copies, arithmetic, matmul, FFTs).

Runs under PyTorch's device-generic framework; see _dg_common.py."""
import torch
from torch.testing._internal.common_device_type import dtypes
from torch.testing._internal.common_utils import parametrize, run_tests

from _dg_common import DeviceTestCase, instantiate

# name -> (view fn on a [2, 3, 4] tensor, writable through the view)
VIEW_FNS = {
    "view": (lambda t: t.view(6, 4), True),
    "reshape_contiguous": (lambda t: t.reshape(3, 8), True),
    "transpose": (lambda t: t.transpose(0, 2), True),
    "permute": (lambda t: t.permute(2, 0, 1), True),
    "narrow": (lambda t: t.narrow(2, 1, 2), True),
    "select": (lambda t: t.select(1, 2), True),
    "slice_step": (lambda t: t[:, ::2, 1::2], True),
    "diagonal": (lambda t: t.diagonal(0, 1, 2), True),
    "unfold": (lambda t: t.unfold(2, 2, 2), True),
    "unsqueeze_squeeze": (lambda t: t.unsqueeze(0).squeeze(0), True),
    "unflatten": (lambda t: t.unflatten(2, (2, 2)), True),
    "movedim": (lambda t: t.movedim(0, -1), True),
    "as_strided": (lambda t: t.as_strided((3, 3), (4, 1), 2), True),
    "split": (lambda t: t.split(2, dim=2)[1], True),
    "expand": (lambda t: t[:, :1].expand(2, 5, 4), False),
    "mT": (lambda t: t.mT, True),
}


class TestViews(DeviceTestCase):
    @parametrize("name", list(VIEW_FNS))
    @dtypes(torch.float32, torch.int64, torch.complex64)
    def test_view_matches_cpu_and_aliases(self, device, dtype, name):
        fn, writable = VIEW_FNS[name]
        base_cpu = torch.arange(24).reshape(2, 3, 4).to(dtype)
        base = base_cpu.to(device)
        view, view_cpu = fn(base), fn(base_cpu)
        self.assertMatchesCPU(view, view_cpu, device)
        self.assertEqual(view.stride(), view_cpu.stride())
        self.assertEqual(view.storage_offset(), view_cpu.storage_offset())
        self.assertEqual(view.untyped_storage().data_ptr(), base.untyped_storage().data_ptr())
        if writable:  # a write through the view must land in the base
            view.mul_(3).add_(1)
            view_cpu.mul_(3).add_(1)
            self.assertMatchesCPU(base, base_cpu, device)

    @dtypes(torch.float32)
    def test_view_dtype_reinterprets_bits(self, device, dtype):
        x = torch.randn(4, 6)
        self.assertMatchesCPU(x.to(device).view(torch.int32), x.view(torch.int32), device)
        self.assertMatchesCPU(x.to(device).view(torch.uint8), x.view(torch.uint8), device)

    @dtypes(torch.float32)
    def test_noncontiguous_copies(self, device, dtype):
        x = torch.randn(5, 7)
        d = x.to(device)
        self.assertMatchesCPU(d.t().contiguous(), x.t().contiguous(), device)
        self.assertMatchesCPU(d[:, 1::3].clone(), x[:, 1::3].clone(), device)
        self.assertMatchesCPU(x[:, 1::3].to(device), x[:, 1::3], device)
        dst, dst_cpu = torch.zeros(7, 5, device=device), torch.zeros(7, 5)
        dst.t().copy_(x)            # CPU source into a transposed device view
        dst_cpu.t().copy_(x)
        self.assertMatchesCPU(dst, dst_cpu, device)


class TestConjNegViews(DeviceTestCase):
    def _pair(self, device, dtype, *shape):
        x = torch.randn(*shape, dtype=dtype)
        return x.to(device), x

    def _materializations(self, t):
        """Ways a consumer materializes a (possibly lazy) tensor."""
        return {
            "cpu": lambda v: v.cpu(),
            "clone": lambda v: v.clone(),
            "contiguous_t": lambda v: v.mT.contiguous() if v.dim() >= 2 else v.contiguous(),
            "resolve": lambda v: v.resolve_conj().resolve_neg(),
            "mul_self": lambda v: v * t,
            "add_scalar": lambda v: v + 1,
            "sum": lambda v: v.sum(),
        }

    def _check_lazy(self, device, lazy, lazy_cpu, base):
        for what, fn in self._materializations(base).items():
            with self.subTest(what=what):
                out = fn(lazy)
                ref = fn(lazy_cpu) if what != "mul_self" else lazy_cpu * base.cpu()
                if what == "cpu":
                    self.assertEqual(out.device.type, "cpu")
                    torch.testing.assert_close(out, lazy_cpu.resolve_conj().resolve_neg())
                else:
                    self.assertMatchesCPU(out, ref.resolve_conj().resolve_neg(), device)

    @dtypes(torch.complex64)
    def test_conj_view(self, device, dtype):
        d, x = self._pair(device, dtype, 4, 3)
        c = d.conj()
        self.assertTrue(c.is_conj())
        self._check_lazy(device, c, x.conj(), d)

    @dtypes(torch.float32, torch.complex64)
    def test_neg_view(self, device, dtype):
        d, x = self._pair(device, dtype, 4, 3)
        n = d._neg_view()
        self.assertTrue(n.is_neg())
        self._check_lazy(device, n, x._neg_view(), d)

    @dtypes(torch.complex64)
    def test_conj_of_neg_view(self, device, dtype):
        d, x = self._pair(device, dtype, 6)
        self._check_lazy(device, d._neg_view().conj(), x._neg_view().conj(), d)

    @dtypes(torch.float32)
    def test_conj_of_real_is_identity(self, device, dtype):
        d, x = self._pair(device, dtype, 5)
        self.assertFalse(d.conj().is_conj())
        self.assertMatchesCPU(d.conj(), x.conj(), device)

    @parametrize("attr", ["H", "mH", "adjoint", "mT"])
    @dtypes(torch.complex64, torch.float32)
    def test_adjoint_family(self, device, dtype, attr):
        shape = (3, 4) if attr == "H" else (2, 3, 4)
        d, x = self._pair(device, dtype, *shape)
        get = (lambda t: t.adjoint()) if attr == "adjoint" else (lambda t: getattr(t, attr))
        a, a_cpu = get(d), get(x)
        self.assertMatchesCPU(a.contiguous(), a_cpu.contiguous(), device)
        self.assertMatchesCPU(a.cpu(), a_cpu.resolve_conj(), "cpu")
        self.assertMatchesCPU(a @ d, a_cpu @ x, device, rtol=1e-5, atol=1e-5)
        self.assertMatchesCPU(d @ a, x @ a_cpu, device, rtol=1e-5, atol=1e-5)

    @dtypes(torch.complex64)
    def test_conj_times_self(self, device, dtype):
        d, x = self._pair(device, dtype, 8)
        self.assertMatchesCPU(d.conj() * d, x.conj() * x, device)
        self.assertMatchesCPU(torch.vdot(d, d), torch.vdot(x, x), device, rtol=1e-5, atol=1e-5)
        self.assertMatchesCPU(d.abs(), x.abs(), device)

    @dtypes(torch.complex64, torch.float32)
    def test_write_through_lazy_view(self, device, dtype):
        d, x = self._pair(device, dtype, 5)
        lazy = (lambda t: t.conj()) if dtype.is_complex else (lambda t: t._neg_view())
        lazy(d).add_(1)           # writes conj/neg(value) into the base
        lazy(x).add_(1)
        self.assertMatchesCPU(d, x, device)
        src = torch.randn(5, dtype=dtype)
        lazy(d).copy_(src)
        lazy(x).copy_(src)
        self.assertMatchesCPU(d, x, device)

    @dtypes(torch.complex64)
    def test_lazy_cpu_view_to_device(self, device, dtype):
        x = torch.randn(4, dtype=dtype)
        self.assertMatchesCPU(x.conj().to(device), x.conj().resolve_conj(), device)
        self.assertMatchesCPU(x._neg_view().to(device), x._neg_view().resolve_neg(), device)

    @dtypes(torch.complex64)
    def test_view_as_real_complex(self, device, dtype):
        d, x = self._pair(device, dtype, 3, 2)
        self.assertMatchesCPU(torch.view_as_real(d), torch.view_as_real(x), device)
        r = torch.randn(3, 2)
        self.assertMatchesCPU(torch.view_as_complex(r.to(device)), torch.view_as_complex(r), device)
        # unresolved conj views cannot be reinterpreted: same error as on CPU
        self.assertSameError(torch.view_as_real, (d.conj(),), (x.conj(),))
        self.assertMatchesCPU(torch.view_as_real(d.conj().resolve_conj()),
                              torch.view_as_real(x.conj().resolve_conj()), device)


# FFTs whose real-input path builds complex intermediates and conj views.
FFT_FNS = ["fft", "ifft", "rfft", "irfft", "hfft", "ihfft", "fft2", "ifft2", "rfft2",
           "irfft2", "hfft2", "ihfft2", "fftn", "ifftn", "rfftn", "irfftn", "hfftn", "ihfftn"]
REAL_ONLY = {"rfft", "ihfft", "rfft2", "ihfft2", "rfftn", "ihfftn"}


class TestFFT(DeviceTestCase):
    @parametrize("name", FFT_FNS)
    @dtypes(torch.float32, torch.complex64)
    def test_fft_matches_cpu(self, device, dtype, name):
        if dtype.is_complex and name in REAL_ONLY:
            self.skipTest("real-input transform")
        fn = getattr(torch.fft, name)
        x = torch.randn(4, 6, dtype=dtype)
        self.assertMatchesCPU(fn(x.to(device)), fn(x), device, rtol=1e-5, atol=1e-5)

    @dtypes(torch.complex64)
    def test_fft_of_conj_view(self, device, dtype):
        x = torch.randn(8, dtype=dtype)
        d = x.to(device)
        for name in ("fft", "ifft", "hfft"):
            fn = getattr(torch.fft, name)
            self.assertMatchesCPU(fn(d.conj()), fn(x.conj()), device, rtol=1e-5, atol=1e-5)


instantiate(TestViews, globals())
instantiate(TestConjNegViews, globals())
instantiate(TestFFT, globals())

if __name__ == "__main__":
    run_tests()
