"""torch.autocast on the device vs the CPU reference: the default lower
precision dtype (bf16, what NeuronCores compute natively), matmul-like ops in
lower precision, numerically sensitive ops in fp32 (softmax, log_softmax,
losses), and binary_cross_entropy refused with a clear error inside the
region, as on CUDA (docs/api.md), while the logits form runs in fp32.

Runs under PyTorch's device-generic framework; see _dg_common.py."""
import torch
import torch.nn.functional as F
from torch.testing._internal.common_utils import parametrize, run_tests

from _dg_common import DeviceTestCase, instantiate

LOWER = {
    "mm": lambda a, b: torch.mm(a, b),
    "matmul": lambda a, b: a @ b,
    "bmm": lambda a, b: torch.bmm(a.expand(2, 4, 4), b.expand(2, 4, 4)),
    "addmm": lambda a, b: torch.addmm(a, a, b),
    "linear": lambda a, b: F.linear(a, b, a[0]),
}
FP32 = {
    "softmax": lambda x: torch.softmax(x, -1),
    "log_softmax": lambda x: F.log_softmax(x, -1),
    "exp": lambda x: torch.exp(x),
    "sum": lambda x: torch.sum(x),
    "layer_norm": lambda x: F.layer_norm(x, (4,)),
    "mse_loss": lambda x: F.mse_loss(x, x.flip(0)),
}
BF16_TOL = dict(rtol=1.6e-2, atol=1e-2)


class TestAutocast(DeviceTestCase):
    def _dev_type(self, device):
        return torch.device(device).type

    def test_default_dtype_is_bf16(self, device):
        dt = self._dev_type(device)
        self.assertEqual(torch.get_autocast_dtype(dt), torch.bfloat16)
        a = torch.randn(4, 4, device=device)
        with torch.autocast(dt):
            self.assertEqual(torch.mm(a, a).dtype, torch.bfloat16)

    @parametrize("name", list(LOWER))
    @parametrize("low", ["bfloat16", "float16"])
    def test_lower_precision_ops(self, device, name, low):
        low = getattr(torch, low)
        fn = LOWER[name]
        a, b = torch.randn(4, 4), torch.randn(4, 4)
        with torch.autocast(self._dev_type(device), dtype=low):
            out = fn(a.to(device), b.to(device))
        self.assertMatchesCPU(out, fn(a.to(low), b.to(low)), device, **BF16_TOL)

    @parametrize("name", list(FP32))
    def test_fp32_ops(self, device, name):
        fn = FP32[name]
        x = torch.randn(3, 4).to(torch.bfloat16)
        with torch.autocast(self._dev_type(device), dtype=torch.bfloat16):
            out = fn(x.to(device))
        self.assertMatchesCPU(out, fn(x.float()), device, rtol=1e-5, atol=1e-5)

    def test_binary_cross_entropy(self, device):
        # Banned inside the region as on CUDA (docs/api.md): a clear error that
        # points to the logits form, never a dtype-mismatch error from inside.
        a, w = torch.randn(4, 3), torch.randn(3, 3)
        target = torch.rand(4, 3)
        dt = self._dev_type(device)
        with torch.autocast(dt, dtype=torch.bfloat16):
            logits = a.to(device) @ w.to(device)
            p = torch.sigmoid(logits)
            self.assertEqual(p.dtype, torch.bfloat16)
            for bce in (F.binary_cross_entropy, torch.nn.BCELoss()):
                with self.assertRaisesRegex(RuntimeError, "binary_cross_entropy_with_logits"):
                    bce(p, target.to(device))
            # the recommended replacement runs in float32
            with_logits = F.binary_cross_entropy_with_logits(logits, target.to(device))
        ref_logits = logits.detach().cpu().float()
        self.assertMatchesCPU(with_logits, F.binary_cross_entropy_with_logits(ref_logits, target),
                              device, rtol=1e-5, atol=1e-5)
        # outside the region BCE is an ordinary op
        self.assertMatchesCPU(F.binary_cross_entropy(p.float(), target.to(device)),
                              F.binary_cross_entropy(p.detach().cpu().float(), target), device,
                              rtol=1e-5, atol=1e-5)

    def test_backward_through_autocast(self, device):
        a, b = torch.randn(4, 4, requires_grad=True), torch.randn(4, 4)
        da = a.detach().to(device).requires_grad_()
        with torch.autocast(self._dev_type(device), dtype=torch.bfloat16):
            F.log_softmax(da @ b.to(device), -1).sum().backward()
        F.log_softmax((a.bfloat16() @ b.bfloat16()).float(), -1).sum().backward()
        self.assertMatchesCPU(da.grad, a.grad, device, **BF16_TOL)

    def test_disabled_region(self, device):
        a = torch.randn(4, 4)
        dt = self._dev_type(device)
        with torch.autocast(dt, dtype=torch.bfloat16):
            with torch.autocast(dt, enabled=False):
                out = torch.mm(a.to(device), a.to(device))
        self.assertMatchesCPU(out, a @ a, device, rtol=1e-5, atol=1e-5)


instantiate(TestAutocast, globals())

if __name__ == "__main__":
    run_tests()
