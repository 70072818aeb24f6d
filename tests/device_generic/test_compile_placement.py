"""torch.compile must put every output where eager puts it: results computed
from device tensors on the device, results computed only from CPU tensors
(CPU scalars, CPU factories, explicit .cpu()) on CPU, with eager's values.

Runs under PyTorch's device-generic framework; see _dg_common.py."""
import torch
from torch.testing._internal.common_utils import parametrize, run_tests

from _dg_common import DeviceTestCase, instantiate

# name -> (fn, inputs builder(device))
CASES = {
    "cpu_scalar_and_cpu_tensor": (
        lambda a, s, v: (a * s, s + 1, v * 2),
        lambda dev: (torch.randn(4, device=dev), torch.tensor(3.0), torch.ones(4))),
    "cpu_scalar_and_cpu_tensor_autograd": (   # AOTAutograd's joint graph
        lambda a, s, v: (a * s, s + 1, v * 2),
        lambda dev: (torch.randn(4, device=dev, requires_grad=True),
                     torch.tensor(3.0, requires_grad=True), torch.ones(4, requires_grad=True))),
    "cpu_factory": (
        lambda a: (a + 1, torch.ones(3), torch.arange(3, device=a.device)),
        lambda dev: (torch.randn(3, device=dev),)),
    "explicit_cpu": (
        lambda a: (a.sum().cpu(), a * 2),
        lambda dev: (torch.randn(5, device=dev),)),
    "cpu_to_device": (
        lambda a, c: (a + c.to(a.device), c * 3),
        lambda dev: (torch.randn(4, device=dev), torch.randn(4))),
    "cpu_only_graph": (
        lambda s, v: (s + 1, v * 2, (v @ v.t()).sum()),
        lambda dev: (torch.tensor(2.0), torch.randn(3, 3))),
    "device_from_cpu_inputs": (
        lambda v, d: (v.to(d.device) * 2, v + 1, d.new_ones(2) + v[:2].to(d.device)),
        lambda dev: (torch.randn(4), torch.empty(0, device=dev))),
    "device_only_with_cpu_scalar": (
        lambda a, s: (a @ a.t() * s).relu(),
        lambda dev: (torch.randn(3, 3, device=dev), torch.tensor(0.5))),
}


class TestCompilePlacement(DeviceTestCase):
    def setUp(self):
        super().setUp()
        torch._dynamo.reset()

    def _check(self, fn, args, backend, device):
        eager = fn(*args)
        compiled_fn = torch.compile(fn, backend=backend, fullgraph=False)
        compiled_fn(*args)
        compiled = compiled_fn(*args)      # the cached graph, not just the first trace
        eager = eager if isinstance(eager, tuple) else (eager,)
        compiled = compiled if isinstance(compiled, tuple) else (compiled,)
        self.assertEqual(len(compiled), len(eager))
        for i, (c, e) in enumerate(zip(compiled, eager)):
            with self.subTest(output=i):
                self.assertEqual(c.device, e.device, msg="output %d placed differently than eager" % i)
                torch.testing.assert_close(c.detach().cpu(), e.detach().cpu(), rtol=1e-5, atol=1e-5)

    @parametrize("name", list(CASES))
    def test_outputs_where_eager_puts_them(self, device, name):
        fn, make = CASES[name]
        self._check(fn, make(device), "inductor", device)

    def test_neuron_backend_cpu_outputs(self, device):
        fn, make = CASES["cpu_scalar_and_cpu_tensor"]
        self._check(fn, make(device), "neuron", device)


instantiate(TestCompilePlacement, globals())

if __name__ == "__main__":
    run_tests()
