"""Shared helpers of the device-generic tests.

These modules use PyTorch's own device-generic framework
(``torch.testing._internal.common_device_type``): a generic test class is
instantiated once per device type. ``only_for="privateuse1"`` keeps just the
PrivateUse1 variant. PrivateUse1TestBase learns the backend's name
(``torch._C._get_privateuse1_backend_name()`` -> ``neuron``) only in its
``setUpClass``; calling that once up front names every class ``TestFooNEURON``
(instead of ``TestFooPRIVATEUSE1`` for the first class of a process). Tests are
``test_bar_neuron[_float32]``; their ``device`` argument is
``"neuron:<current device>"``.

torch_neuronx is imported before common_device_type on purpose: the framework
picks its device-type bases at import time, and adds PrivateUse1TestBase only
if ``torch.neuron.is_available()`` is already True then.
"""
import torch
import torch_neuronx  # noqa: F401  (registers the device before the framework looks)
from torch.testing._internal.common_device_type import (
    PrivateUse1TestBase, instantiate_device_type_tests)
from torch.testing._internal.common_utils import TestCase

ONLY_FOR = ("privateuse1",)


def instantiate(generic_cls, scope):
    """The neuron (PrivateUse1) variant of ``generic_cls`` in ``scope``."""
    if PrivateUse1TestBase.device_type == "privateuse1":
        PrivateUse1TestBase.setUpClass()
    instantiate_device_type_tests(generic_cls, scope, only_for=ONLY_FOR)


def to_cpu(obj):
    """Deep copy of ``obj`` with every tensor moved to CPU (for references)."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().cpu()
    if isinstance(obj, (list, tuple)):
        return type(obj)(to_cpu(x) for x in obj)
    return obj


class DeviceTestCase(TestCase):
    """Device-vs-CPU comparisons: the device result must live on the device
    under test and equal the CPU reference (exact for integer and bool, dtype
    tolerances of ``torch.testing.assert_close`` unless given)."""

    def assertMatchesCPU(self, dev_out, cpu_out, device, **tol):
        if isinstance(cpu_out, torch.Tensor):
            self.assertIsInstance(dev_out, torch.Tensor)
            self.assertEqual(dev_out.device.type, torch.device(device).type,
                             msg="result not on the device under test")
            self.assertEqual(cpu_out.device.type, "cpu")
            self.assertEqual(dev_out.dtype, cpu_out.dtype)
            self.assertEqual(dev_out.shape, cpu_out.shape)
            torch.testing.assert_close(dev_out.cpu(), cpu_out, **tol)
            return
        if isinstance(cpu_out, (list, tuple)):
            self.assertEqual(len(dev_out), len(cpu_out))
            for d, c in zip(dev_out, cpu_out):
                self.assertMatchesCPU(d, c, device, **tol)
            return
        self.assertEqual(dev_out, cpu_out)

    def assertSameError(self, fn, dev_args, cpu_args):
        """``fn`` raises on CPU; the device must raise the same exception type
        (a clean Python error, not a crash or a silent result)."""
        with self.assertRaises(Exception) as cpu_ctx:
            fn(*cpu_args)
        with self.assertRaises(type(cpu_ctx.exception)):
            fn(*dev_args)
