"""The runtime's GEMV kernel for matmuls of one to four rows and its small-M
GEMM kernel for five to 512 (csrc/aten/DeviceKernels.cpp, csrc/runtime/Gemv.h,
csrc/runtime/Gemm.h): `mm.out` and `addmm.out` in float32 with a transposed
row-major weight, as nn.Linear, F.linear, `x @ w.t()` and Inductor's extern
mm calls give it. Each case checks which kernel ran (each kernel counts its
calls) and the result against a float64 reference within float32 rounding of
the products' magnitudes, as for the CPU's own result; cases the kernels do
not cover (more rows, a scaled addmm, a non-transposed weight, other dtypes,
small weights, a strided output) must run the CPU kernel and match it
exactly.

Runs under PyTorch's device-generic framework; see _dg_common.py."""
import os

import torch
import torch.nn.functional as F
import torch_neuronx
from torch.testing._internal.common_device_type import dtypes
from torch.testing._internal.common_utils import parametrize, run_tests

from _dg_common import DeviceTestCase, instantiate


def _rand(*shape, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g).to(dtype)


# name -> (fn(a, w, b) computing a @ w.t() (+ b), whether it has a bias)
FORMS = {
    "matmul": lambda a, w, b: a @ w.t(),
    "linear": lambda a, w, b: F.linear(a, w),
    "linear_bias": lambda a, w, b: F.linear(a, w, b),
    "linear_3d_bias": lambda a, w, b: F.linear(a.unsqueeze(0), w, b),
    "mm_out": lambda a, w, b: torch.mm(a, w.t(), out=torch.empty(a.shape[0], w.shape[0], device=a.device)),
    "addmm_bias_row": lambda a, w, b: torch.addmm(b.unsqueeze(0), a, w.t()),
    "addmm_out": lambda a, w, b: torch.addmm(b, a, w.t(), out=torch.empty(a.shape[0], w.shape[0], device=a.device)),
}


class TestGemv(DeviceTestCase):
    def _calls(self, fn, kernel="gemv"):
        """fn()'s result (synchronized) and the calls it made of `kernel` ("gemv", "gemm" or "any")."""
        counters = {"gemv": [torch_neuronx._C._gemv_calls], "gemm": [torch_neuronx._C._gemm_calls]}
        counters["any"] = counters["gemv"] + counters["gemm"]
        torch.neuron.synchronize()
        before = sum(c() for c in counters[kernel])
        out = fn()
        torch.neuron.synchronize()
        return out, sum(c() for c in counters[kernel]) - before

    def _close(self, got, a, w, b):
        """got = a @ w.t() + b within float32 rounding of the products' magnitudes."""
        a64, w64 = a.double(), w.double()
        ref = a64 @ w64.t() + (b.double() if b is not None else 0)
        mag = a64.abs() @ w64.abs().t() + (b.double().abs() if b is not None else 0)
        err = (got.cpu().double() - ref).abs()
        self.assertTrue(bool((err <= 1e-6 * mag + 1e-6).all()), f"max error {err.max().item():.3g}")

    @parametrize("form", list(FORMS))
    @parametrize("rows", [1, 2, 3, 4])
    # (1536, 576): the down projection, where 3-4 rows take two passes.
    @parametrize("k,n", [(576, 1536), (1536, 576), (100, 1001), (17, 4000)])
    def test_gemv_matches_reference(self, device, form, rows, k, n):
        a, w, b = _rand(rows, k, seed=1), _rand(n, k, seed=2), _rand(n, seed=3)
        has_bias = "bias" in form or form.startswith("addmm")
        fn = FORMS[form]
        got, calls = self._calls(lambda: fn(a.to(device), w.to(device), b.to(device)))
        self.assertEqual(calls, 1)
        self.assertEqual(got.device.type, "neuron")
        want = fn(a, w, b)
        self.assertEqual(got.shape, want.shape)
        got = got.reshape(rows, n)
        self._close(got, a, w, b if has_bias else None)
        self._close(want.reshape(rows, n), a, w, b if has_bias else None)  # the bound holds for the CPU too

    @parametrize("form", list(FORMS))
    @parametrize("rows", [5, 7, 8, 13, 16, 33, 64, 65, 130])
    @parametrize("k,n", [(576, 1536), (100, 1001)])
    def test_gemm_matches_reference(self, device, form, rows, k, n):
        a, w, b = _rand(rows, k, seed=21), _rand(n, k, seed=22), _rand(n, seed=23)
        has_bias = "bias" in form or form.startswith("addmm")
        fn = FORMS[form]
        got, calls = self._calls(lambda: fn(a.to(device), w.to(device), b.to(device)), "gemm")
        self.assertEqual(calls, 1)
        want = fn(a, w, b)
        self.assertEqual(got.shape, want.shape)
        self._close(got.reshape(rows, n), a, w, b if has_bias else None)
        self._close(want.reshape(rows, n), a, w, b if has_bias else None)  # the bound holds for the CPU too
        self.assertEqual(got.cpu(), want, atol=1e-4, rtol=1e-4)  # matmul tolerances against the CPU kernel

    @parametrize("out", [False, True])
    @parametrize("rows", [1, 3, 5, 16, 64])
    def test_bias_matrix(self, device, rows, out):
        # addmm with a full [M, N] bias (Inductor folds a residual add into
        # addmm): the kernels add it row by row, also through a padded view.
        a, w = _rand(rows, 576, seed=26), _rand(1536, 576, seed=27)
        big_bias = _rand(rows, 1600, seed=28)
        bias = big_bias[:, 30:1566]
        kernel = "gemv" if rows <= 4 else "gemm"
        dev = lambda t: t.to(device)  # noqa: E731
        if out:
            fn = lambda: torch.addmm(dev(big_bias)[:, 30:1566], dev(a), dev(w).t(),  # noqa: E731
                                     out=torch.empty(rows, 1536, device=device))
        else:
            fn = lambda: torch.addmm(dev(big_bias)[:, 30:1566], dev(a), dev(w).t())  # noqa: E731
        got, calls = self._calls(fn, kernel)
        self.assertEqual(calls, 1)
        self._close(got, a, w, bias)

    @parametrize("rows", [6, 40])
    def test_gemm_strided_operands(self, device, rows):
        # Rows of a, w and out inside wider matrices (leading dimensions > K, > N).
        big_a, big_w = _rand(rows, 600, seed=24), _rand(1200, 700, seed=25)
        a, w = big_a[:, 10:586], big_w[100:1101, 50:626]
        out = torch.full((rows, 1100), -1.0, device=device)
        view = out[:, 50:1051]
        got, calls = self._calls(lambda: torch.mm(big_a.to(device)[:, 10:586], big_w.to(device)[100:1101, 50:626].t(),
                                                  out=view), "gemm")
        self.assertEqual(calls, 1)
        host = out.cpu()
        self._close(host[:, 50:1051], a, w, None)
        self.assertTrue(bool((host[:, :50] == -1).all() and (host[:, 1051:] == -1).all()))

    @parametrize("busy", [False, True])
    def test_strided_operands(self, device, busy):
        # Rows of a and w inside wider matrices (leading dimensions > K), the
        # weight a slice of a larger one; behind queued matmuls or not.
        big_a, big_w = _rand(4, 600, seed=4), _rand(1200, 700, seed=5)
        a, w = big_a[:, 10:586], big_w[100:1100, 50:626]
        da, dw = big_a.to(device)[:, 10:586], big_w.to(device)[100:1100, 50:626]
        if busy:
            x = torch.randn(256, 256, device=device)
            for _ in range(4):
                x = x @ x.t() / 256
        got, calls = self._calls(lambda: da @ dw.t())
        self.assertEqual(calls, 1)
        self._close(got, a, w, None)

    @parametrize("threads", [1, 2, 3])
    @parametrize("rows", [1, 4, 9])
    @parametrize("busy", [False, True])
    def test_split_across_threads(self, device, threads, rows, busy):
        # torch.set_num_threads rules the split across the runtime's workers,
        # also when the matmul is queued behind others.
        a, w, b = _rand(rows, 576, seed=15), _rand(4001, 576, seed=16), _rand(4001, seed=17)
        da, dw, db = a.to(device), w.to(device), b.to(device)
        before_threads = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            if busy:  # queued matmuls the kernels do not take (a weight not transposed): no splits of theirs
                x = torch.randn(256, 256, device=device)
                for _ in range(4):
                    x = x @ x / 256
            splits = torch_neuronx._C._parallel_splits()
            got, calls = self._calls(lambda: F.linear(da, dw, db), "gemv" if rows <= 4 else "gemm")
            splits = torch_neuronx._C._parallel_splits() - splits
        finally:
            torch.set_num_threads(before_threads)
        self.assertEqual(calls, 1)
        self.assertEqual(splits, 0 if min(threads, os.cpu_count() or 1) == 1 else 1)  # a thread a core at most
        self._close(got, a, w, b)

    def test_results_stay_on_their_rows(self):
        # out= into rows of a larger matrix (leading dimension > N): the other rows are untouched.
        device = "neuron"
        a, w = _rand(2, 576, seed=6), _rand(1536, 576, seed=7)
        out = torch.full((3, 2000), -1.0, device=device)
        view = out[:2, 100:1636]
        _, calls = self._calls(lambda: torch.mm(a.to(device), w.to(device).t(), out=view))
        self.assertEqual(calls, 1)
        host = out.cpu()
        self._close(host[:2, 100:1636], a, w, None)
        self.assertTrue(bool((host[2] == -1).all() and (host[:, :100] == -1).all() and (host[:, 1636:] == -1).all()))

    @parametrize("case", ["many_rows", "alpha", "beta", "weight_not_transposed", "small_weight", "strided_out",
                          "out_aliases_input"])
    @parametrize("rows", [2, 16])
    def test_other_cases_run_the_cpu_kernel(self, device, case, rows):
        a, w, b = _rand(rows, 576, seed=8), _rand(1536, 576, seed=9), _rand(1536, seed=10)
        fns = {
            "many_rows": lambda a, w, b: _rand(513, 576, seed=11).to(a.device) @ w.t(),
            "alpha": lambda a, w, b: torch.addmm(b, a, w.t(), alpha=0.5),
            "beta": lambda a, w, b: torch.addmm(b, a, w.t(), beta=2),
            "weight_not_transposed": lambda a, w, b: a @ w.reshape(576, 1536),
            "small_weight": lambda a, w, b: a[:, :64] @ w[:200, :64].t(),
            "strided_out": lambda a, w, b: torch.mm(a, w.t(), out=torch.empty(1536, rows, device=a.device).t()),
            "out_aliases_input": lambda a, w, b: torch.mm(a, w[:576].t(), out=w[:rows].zero_()),
        }
        fn = fns[case]
        # An output that overlaps an input makes the CPU kernel read values it
        # has written: with several threads that order, and so the result,
        # varies from run to run (4 of 1152 values differed in one fresh-clone
        # CI run of about a dozen this session). One thread each.
        before_threads = torch.get_num_threads()
        if case == "out_aliases_input":
            torch.set_num_threads(1)
        try:
            got, calls = self._calls(lambda: fn(a.to(device), w.to(device), b.to(device)), "any")
            want = fn(a, w.clone(), b)
        finally:
            torch.set_num_threads(before_threads)
        self.assertEqual(calls, 0)
        self.assertEqual(got.cpu(), want, rtol=0, atol=0)

    @dtypes(torch.float64, torch.bfloat16, torch.float16)
    @parametrize("rows", [1, 16])
    def test_other_dtypes_run_the_cpu_kernel(self, device, dtype, rows):
        a, w = _rand(rows, 576, seed=12, dtype=dtype), _rand(1536, 576, seed=13, dtype=dtype)
        got, calls = self._calls(lambda: a.to(device) @ w.to(device).t(), "any")
        self.assertEqual(calls, 0)
        self.assertEqual(got.cpu(), a @ w.t(), rtol=0, atol=0)

    @parametrize("rows", [1, 8])
    def test_compiled_linear(self, rows):
        # Inductor's wrapper calls extern mm/addmm with out=: the same kernels.
        device = "neuron"
        torch._dynamo.reset()
        lin = torch.nn.Linear(576, 1536)
        x = _rand(rows, 576, seed=14)
        dev_lin = torch.nn.Linear(576, 1536).to(device)
        dev_lin.load_state_dict(lin.state_dict())
        compiled = torch.compile(lambda t: torch.relu(dev_lin(t)))
        compiled(x.to(device))  # compiles
        got, calls = self._calls(lambda: compiled(x.to(device)), "gemv" if rows <= 4 else "gemm")
        self.assertGreaterEqual(calls, 1)
        ref = x.double() @ lin.weight.detach().double().t() + lin.bias.detach().double()
        mag = x.double().abs() @ lin.weight.detach().double().abs().t() + lin.bias.detach().double().abs()
        err = (got.cpu().double() - ref.relu()).abs()
        self.assertTrue(bool((err <= 1e-6 * mag + 1e-6).all()))


instantiate(TestGemv, globals())

if __name__ == "__main__":
    run_tests()
