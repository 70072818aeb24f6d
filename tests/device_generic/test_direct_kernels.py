"""The direct kernels (csrc/aten/DirectKernels.cpp): add, sub, mul, div (and
their in-place forms), sum over dims, fill_/zero_ and advanced indexing run
ATen's CPU structured kernels on device memory when no operand needs a dtype
conversion, and go through the host path otherwise. Either way the results
must be the CPU's, bit for bit (the same CPU kernels compute them), and the
errors the CPU's. Each case below mixes operand kinds that take one path or
the other: same-dtype device tensors, Python scalars (converted to the op's
dtype, or promoting it), 0-dim CPU tensors, other dtypes, broadcasting,
non-contiguous views; and runs both on an idle stream (where the direct path
applies) and behind queued work (where the host path queues the op).

Runs under PyTorch's device-generic framework; see _dg_common.py."""
import torch
from torch.testing._internal.common_device_type import dtypes
from torch.testing._internal.common_utils import parametrize, run_tests

from _dg_common import DeviceTestCase, instantiate

ALL = (torch.float32, torch.float64, torch.bfloat16, torch.float16, torch.int64, torch.int32, torch.uint8,
       torch.bool, torch.complex64)

# name -> (functional, in-place) forms of (a, b)
BINARY = {
    "add": (lambda a, b: torch.add(a, b), lambda a, b: a.add_(b)),
    "add_alpha": (lambda a, b: torch.add(a, b, alpha=3), lambda a, b: a.add_(b, alpha=3)),
    "sub": (lambda a, b: torch.sub(a, b, alpha=2), lambda a, b: a.sub_(b, alpha=2)),
    "mul": (lambda a, b: a * b, lambda a, b: a.mul_(b)),
    "div": (lambda a, b: a / b, lambda a, b: a.div_(b)),
}

# name -> second operand built from (the first operand on CPU, device)
OTHERS = {
    "same_dtype": lambda a, d: _rand(a.shape, a.dtype).to(d),
    "broadcast_row": lambda a, d: _rand(a.shape[-1:], a.dtype).to(d),
    "transposed": lambda a, d: _rand(a.shape[::-1], a.dtype).to(d).t(),
    "zero_dim_device": lambda a, d: _rand((), a.dtype).to(d),
    "python_int": lambda a, d: 3,
    "python_float": lambda a, d: 0.1,
    "python_bool": lambda a, d: True,
    "python_complex": lambda a, d: 1.5 - 2j,
    "cpu_scalar_same_dtype": lambda a, d: _rand((), a.dtype),
    "cpu_scalar_float64": lambda a, d: torch.tensor(0.3, dtype=torch.float64),
    "other_dtype": lambda a, d: _rand(a.shape, torch.float64 if a.dtype != torch.float64 else torch.float32).to(d),
}


def _rand(shape, dtype):
    g = torch.Generator().manual_seed(len(shape) * 7 + 1)
    if dtype == torch.bool:
        return torch.rand(shape, generator=g) > 0.5
    if dtype.is_complex:
        return torch.randn(shape, dtype=dtype, generator=g)
    if dtype.is_floating_point:
        return (torch.randn(shape, generator=g) * 3).to(dtype)
    # nonzero integers, so that divisions have finite results
    return torch.randint(1, 9, shape, generator=g).to(dtype)


def _cpu(x):
    return x.cpu() if isinstance(x, torch.Tensor) else x


class TestDirectKernels(DeviceTestCase):
    def _same(self, got, want):
        """Bit-for-bit equality with the CPU result, dtype and shape included."""
        self.assertEqual(got.device.type, "neuron")
        self.assertEqual(got.dtype, want.dtype)
        self.assertEqual(got.shape, want.shape)
        self.assertEqual(got.cpu(), want, rtol=0, atol=0, equal_nan=True)

    def _run_both(self, fn_dev, fn_cpu):
        """The outcome on the device and on the CPU: both results, or both errors."""
        try:
            want = fn_cpu()
        except Exception as e:  # noqa: BLE001 - the device must raise the same
            with self.assertRaises(type(e)) as ctx:
                fn_dev()
                torch.neuron.synchronize()
            self.assertEqual(str(ctx.exception).split("\n")[0], str(e).split("\n")[0])
            return None, None
        got = fn_dev()
        torch.neuron.synchronize()
        return got, want

    def _binary(self, device, dtype, name, other, inplace, busy):
        fn = BINARY[name][1 if inplace else 0]
        a_cpu = _rand((4, 5), dtype)
        b = OTHERS[other](a_cpu, device)
        b_cpu = _cpu(b)
        a = a_cpu.to(device)
        if busy:  # queued work ahead: the host path queues the op behind it
            big = torch.randn(256, 256, device=device)
            for _ in range(4):
                big = big @ big.t() / 256
        got, want = self._run_both(lambda: fn(a, b), lambda: fn(a_cpu.clone(), b_cpu))
        if want is None:
            return
        self._same(got, want)
        if inplace:
            self.assertIs(got, a)

    @parametrize("name", list(BINARY))
    @parametrize("other", list(OTHERS))
    @dtypes(*ALL)
    def test_binary_matches_cpu(self, device, dtype, name, other):
        self._binary(device, dtype, name, other, inplace=False, busy=False)

    @parametrize("name", list(BINARY))
    @parametrize("other", list(OTHERS))
    @dtypes(*ALL)
    def test_binary_inplace_matches_cpu(self, device, dtype, name, other):
        self._binary(device, dtype, name, other, inplace=True, busy=False)

    @parametrize("name", list(BINARY))
    @parametrize("inplace", [False, True])
    @dtypes(torch.float32, torch.int64)
    def test_binary_behind_queued_work(self, device, dtype, name, inplace):
        self._binary(device, dtype, name, "broadcast_row", inplace=inplace, busy=True)

    @dtypes(torch.float32)
    def test_binary_device_mix_raises(self, device, dtype):
        a = torch.randn(4, device=device)
        b = torch.randn(4)
        with self.assertRaisesRegex(RuntimeError, "same device"):
            a + b
        with self.assertRaisesRegex(RuntimeError, "same device"):
            a.mul_(b)
        with self.assertRaisesRegex(RuntimeError, "same device"):
            b.mul_(a)

    @dtypes(torch.float32)
    def test_inplace_on_a_view_writes_the_base(self, device, dtype):
        base_cpu = torch.arange(24.0).reshape(4, 6)
        base = base_cpu.to(device)
        base[:, 1::2].mul_(-2).add_(0.5)
        base_cpu[:, 1::2].mul_(-2).add_(0.5)
        self._same(base, base_cpu)

    @parametrize("dims", [None, (0,), (1,), (-1,), (0, 2), ()])
    @parametrize("keepdim", [False, True])
    @dtypes(torch.float32, torch.float64, torch.bfloat16, torch.float16, torch.int64, torch.int32, torch.bool,
            torch.complex64)
    def test_sum_matches_cpu(self, device, dtype, dims, keepdim):
        x_cpu = _rand((3, 4, 5), dtype)
        x = x_cpu.to(device)
        if dims is None:
            got, want = x.sum(), x_cpu.sum()
        else:
            got, want = x.sum(dims, keepdim=keepdim), x_cpu.sum(dims, keepdim=keepdim)
        self._same(got, want)
        # permuted input, an explicit dtype, an empty input
        self._same(x.permute(2, 0, 1).sum(1), x_cpu.permute(2, 0, 1).sum(1))
        self._same(x.sum(0, dtype=torch.float64), x_cpu.sum(0, dtype=torch.float64))
        self._same(x[:, :0].sum(1), x_cpu[:, :0].sum(1))

    @parametrize("value", [0, 1, -2.5, True, 1 + 2j])
    @dtypes(*ALL)
    def test_fill_and_zero_match_cpu(self, device, dtype, value):
        x_cpu = _rand((4, 6), dtype)
        x = x_cpu.to(device)
        got, want = self._run_both(lambda: x[:, ::2].fill_(value), lambda: x_cpu[:, ::2].fill_(value))
        if want is not None:
            self._same(x, x_cpu)
        x[1].zero_()
        x_cpu[1].zero_()
        self._same(x, x_cpu)
        self._same(torch.zeros(3, 2, dtype=dtype, device=device), torch.zeros(3, 2, dtype=dtype))

    @parametrize("kind", ["long", "two_long", "broadcast", "negative", "with_slice", "int32", "bool_mask",
                          "cpu_long", "out_of_range"])
    @dtypes(torch.float32, torch.int64, torch.bfloat16, torch.complex64)
    def test_index_matches_cpu(self, device, dtype, kind):
        x_cpu = _rand((6, 5, 4), dtype)
        x = x_cpu.to(device)
        i = torch.tensor([3, 1, 4, 1, 5])
        j = torch.tensor([[0], [2]])
        keys = {
            "long": lambda d: (i.to(d),),
            "two_long": lambda d: (i.to(d), i.remainder(5).to(d)),
            "broadcast": lambda d: (j.to(d), i.remainder(5).to(d)),
            "negative": lambda d: (-i.to(d),),
            "with_slice": lambda d: (slice(None), i.remainder(5).to(d)),
            "int32": lambda d: (i.int().to(d),),
            "bool_mask": lambda d: ((x_cpu.real if dtype.is_complex else x_cpu.float())[:, 0, 0].gt(0).to(d),),
            "cpu_long": lambda d: (i,),
            "out_of_range": lambda d: (torch.tensor([6]).to(d),),
        }[kind]
        got, want = self._run_both(lambda: x[keys(device)], lambda: x_cpu[keys("cpu")])
        if want is not None:
            self._same(got, want)


instantiate(TestDirectKernels, globals())

if __name__ == "__main__":
    run_tests()
