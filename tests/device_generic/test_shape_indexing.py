"""Shape ops, indexing (basic, advanced, boolean masks, CPU index tensors,
index_put with and without accumulate, masked ops, scatter/gather) and out=
arguments on the wrong device, each against the CPU reference.

Runs under PyTorch's device-generic framework; see _dg_common.py."""
import torch
from torch.testing._internal.common_device_type import dtypes
from torch.testing._internal.common_utils import parametrize, run_tests

from _dg_common import DeviceTestCase, instantiate

# name -> fn(x) on a [2, 3, 4] tensor
SHAPE_FNS = {
    "cat_noncontiguous": lambda x: torch.cat([x, x.transpose(1, 2).transpose(1, 2) * 2, x[:, :, ::2].repeat(1, 1, 2)], 1),
    "stack": lambda x: torch.stack([x, x.flip(0)], -1),
    "split_sizes": lambda x: x.split([1, 3], dim=2),
    "chunk": lambda x: x.chunk(3, dim=1),
    "unbind": lambda x: x.unbind(1),
    "flip": lambda x: x.flip(0, 2),
    "roll": lambda x: x.roll((1, -2), (1, 2)),
    "repeat": lambda x: x.repeat(2, 1, 3),
    "tile": lambda x: x.tile((2,)),
    "repeat_interleave": lambda x: x.repeat_interleave(2, dim=1),
    "reshape_copy": lambda x: x.transpose(0, 2).reshape(-1, 2),
    "flatten_noncontiguous": lambda x: x.permute(2, 0, 1).flatten(1),
    "broadcast_to": lambda x: x[:, :1].broadcast_to(2, 3, 4).contiguous(),
    "tril_triu": lambda x: (x.tril(-1), x.triu(1)),
    "diag_embed": lambda x: torch.diag_embed(x[0]),
    "meshgrid": lambda x: torch.meshgrid(x[0, 0], x[1, 1], indexing="ij"),
    "pad": lambda x: torch.nn.functional.pad(x, (1, 2, 0, 1)),
    "narrow_copy": lambda x: x.narrow_copy(2, 1, 2),
    "rot90": lambda x: x.rot90(1, (1, 2)),
}


class TestShapeOps(DeviceTestCase):
    @parametrize("name", list(SHAPE_FNS))
    @dtypes(torch.float32, torch.int64, torch.bool, torch.complex64)
    def test_shape_op(self, device, dtype, name):
        x = torch.arange(1, 25).reshape(2, 3, 4)
        x = (x % 2 == 0) if dtype == torch.bool else x.to(dtype)
        fn = SHAPE_FNS[name]
        self.assertMatchesCPU(fn(x.to(device)), fn(x), device)


class TestIndexing(DeviceTestCase):
    def _x(self, device, dtype=torch.float32):
        x = torch.arange(60).reshape(5, 3, 4).to(dtype)
        return x.to(device), x

    @dtypes(torch.float32, torch.int64)
    def test_basic_getitem(self, device, dtype):
        d, x = self._x(device, dtype)
        for key in (1, -1, (slice(None), slice(1, 3)), (Ellipsis, slice(None, None, 2)),
                    (None, 2), (slice(1, 5, 2), 0, slice(None))):
            with self.subTest(key=key):
                self.assertMatchesCPU(d[key], x[key], device)

    @dtypes(torch.float32)
    def test_advanced_getitem(self, device, dtype):
        d, x = self._x(device, dtype)
        idx = torch.tensor([4, 0, 0, 2])
        mask = x[:, 0, 0] > 20
        cases = {
            "device_index": (lambda t, i, m: t[i], idx.to(device), mask.to(device)),
            "cpu_index": (lambda t, i, m: t[i], idx, mask),
            "list_index": (lambda t, i, m: t[[1, 3]], idx, mask),
            "two_indices": (lambda t, i, m: t[i, i % 3], idx.to(device), mask),
            "two_indices_cpu": (lambda t, i, m: t[i, i % 3], idx, mask),
            "index_after_slice": (lambda t, i, m: t[:, :, i % 4], idx.to(device), mask),
            "device_mask": (lambda t, i, m: t[m], idx, mask.to(device)),
            "cpu_mask": (lambda t, i, m: t[m], idx, mask),
            "full_mask": (lambda t, i, m: t[t > 30], idx, mask),
        }
        for name, (fn, i, m) in cases.items():
            with self.subTest(name=name):
                self.assertMatchesCPU(fn(d, i, m), fn(x, idx, mask), device)

    @dtypes(torch.float32, torch.int64)
    def test_setitem(self, device, dtype):
        idx = torch.tensor([3, 1])
        cases = {
            "scalar_slice": lambda t, i, on: t.__setitem__((slice(None), 1), 7),
            "tensor_broadcast": lambda t, i, on: t.__setitem__(0, torch.arange(4, dtype=t.dtype, device=t.device)),
            "device_index": lambda t, i, on: t.__setitem__(i.to(t.device), -1),
            "cpu_index": lambda t, i, on: t.__setitem__(i, -2),
            "cpu_index_tensor_value": lambda t, i, on: t.__setitem__(
                i, torch.full((2, 3, 4), 5, dtype=t.dtype, device=t.device)),
            "mask_scalar": lambda t, i, on: t.__setitem__(t > 40, 0),
            "mask_cpu_0dim_value": lambda t, i, on: t.__setitem__(t < 10, torch.tensor(9, dtype=t.dtype)),
        }
        for name, fn in cases.items():
            with self.subTest(name=name):
                d, x = self._x(device, dtype)
                fn(d, idx, device)
                fn(x, idx, "cpu")
                self.assertMatchesCPU(d, x, device)

    @parametrize("accumulate", [False, True])
    @parametrize("index_device", ["device", "cpu"])
    @dtypes(torch.float32, torch.int64)
    def test_index_put(self, device, dtype, accumulate, index_device):
        d, x = self._x(device, dtype)
        rows = torch.tensor([0, 2, 2, 4, 0])   # duplicates: accumulate must add all
        cols = torch.tensor([1, 1, 1, 0, 2])
        vals = torch.arange(5 * 4).reshape(5, 4).to(dtype)
        ir, ic = (rows, cols) if index_device == "cpu" else (rows.to(device), cols.to(device))
        if not accumulate:             # duplicates without accumulate are unordered
            ir, ic, rows, cols, vals = ir[1:4:2], ic[1:4:2], rows[1:4:2], cols[1:4:2], vals[1:4:2]
        d.index_put_((ir, ic), vals.to(device), accumulate=accumulate)
        x.index_put_((rows, cols), vals, accumulate=accumulate)
        self.assertMatchesCPU(d, x, device)
        # functional form with a bool mask index
        m = x[..., 0] > 25
        self.assertMatchesCPU(torch.index_put(d, (m.to(device),), torch.tensor(1, dtype=dtype, device=device)),
                              torch.index_put(x, (m,), torch.tensor(1, dtype=dtype)), device)

    @dtypes(torch.float32, torch.int64)
    def test_masked_ops(self, device, dtype):
        d, x = self._x(device, dtype)
        m = (x % 3) == 0
        dm = m.to(device)
        src = torch.arange(100, 160).reshape(5, 3, 4).to(dtype)
        self.assertMatchesCPU(d.masked_fill(dm, 5), x.masked_fill(m, 5), device)
        self.assertMatchesCPU(d.masked_fill(dm, torch.tensor(6, dtype=dtype)),  # CPU 0-dim value
                              x.masked_fill(m, torch.tensor(6, dtype=dtype)), device)
        self.assertMatchesCPU(d.masked_scatter(dm, src.to(device)), x.masked_scatter(m, src), device)
        self.assertMatchesCPU(d.masked_select(dm), x.masked_select(m), device)
        self.assertMatchesCPU(torch.where(dm, d, -d), torch.where(m, x, -x), device)
        self.assertMatchesCPU(torch.where(dm, d, 0), torch.where(m, x, 0), device)
        d.masked_fill_(dm[0], 3)       # broadcast mask, in place
        x.masked_fill_(m[0], 3)
        self.assertMatchesCPU(d, x, device)

    @dtypes(torch.float32, torch.int64)
    def test_index_reduce_family(self, device, dtype):
        d, x = self._x(device, dtype)
        idx = torch.tensor([4, 0, 4])
        di = idx.to(device)
        src = torch.ones(3, 3, 4, dtype=dtype)
        ds = src.to(device)
        self.assertMatchesCPU(d.index_select(0, di), x.index_select(0, idx), device)
        self.assertMatchesCPU(d.index_add(0, di, ds), x.index_add(0, idx, src), device)
        self.assertMatchesCPU(d.index_copy(0, di[:2], ds[:2]), x.index_copy(0, idx[:2], src[:2]), device)
        self.assertMatchesCPU(d.index_fill(1, di[1:2], -1), x.index_fill(1, idx[1:2], -1), device)
        g = torch.tensor([[[0, 1, 2, 0]], [[2, 2, 1, 0]]]).expand(2, 3, 4)
        self.assertMatchesCPU(d[:2].gather(1, g.to(device)), x[:2].gather(1, g), device)
        self.assertMatchesCPU(d[:2].scatter(1, g.to(device), ds[:2]), x[:2].scatter(1, g, src[:2]), device)
        self.assertMatchesCPU(d[:2].scatter_add(1, g.to(device), ds[:2]), x[:2].scatter_add(1, g, src[:2]), device)
        flat = torch.tensor([0, 59, 7])
        self.assertMatchesCPU(d.take(flat.to(device)), x.take(flat), device)
        self.assertMatchesCPU(d.clone().put_(flat.to(device), ds.flatten()[:3], accumulate=True),
                              x.clone().put_(flat, src.flatten()[:3], accumulate=True), device)
        self.assertMatchesCPU(torch.nonzero(d % 7 == 0), torch.nonzero(x % 7 == 0), device)
        self.assertMatchesCPU(torch.argwhere(d > 50), torch.argwhere(x > 50), device)


class TestOutDevice(DeviceTestCase):
    """out= on another device must raise (as on CUDA: "Expected all tensors
    to be on the same device"), never be filled or silently re-homed."""

    CASES = {
        "nonzero": lambda d: (torch.nonzero, (d > 0,), torch.empty(0, dtype=torch.long)),
        "add": lambda d: (torch.add, (d, d), torch.empty(3, 4)),
        "mm": lambda d: (torch.mm, (d, d.t()), torch.empty(3, 3)),
        "cat": lambda d: (torch.cat, ([d, d],), torch.empty(6, 4)),
        "index_select": lambda d: (torch.index_select, (d, 0, torch.tensor([0, 2], device=d.device)),
                                   torch.empty(2, 4)),
        "sum": lambda d: (torch.sum, (d, 0), torch.empty(4)),
        "exp": lambda d: (torch.exp, (d,), torch.empty(3, 4)),
        "where": lambda d: (torch.where, (d > 0, d, d), torch.empty(3, 4)),
        "sort": lambda d: (torch.sort, (d,), (torch.empty(3, 4), torch.empty(3, 4, dtype=torch.long))),
        # a 0-dim CPU tensor may be an *input* of a device op, never its output
        "add_0dim_out": lambda d: (torch.add, (d[0, 0], d[1, 1]), torch.empty(())),
        "sum_0dim_out": lambda d: (torch.sum, (d, (0, 1)), torch.empty(())),
    }

    @parametrize("name", list(CASES))
    def test_cpu_out_rejected(self, device, name):
        d = torch.randn(3, 4, device=device)
        fn, args, out = self.CASES[name](d)
        shapes = [o.shape for o in (out if isinstance(out, tuple) else (out,))]
        with self.assertRaisesRegex(RuntimeError, "(?i)device"):
            fn(*args, out=out)
        # not resized / re-homed
        self.assertEqual([o.shape for o in (out if isinstance(out, tuple) else (out,))], shapes)

    def test_device_out_accepted(self, device):
        x = torch.randn(3, 4)
        out = torch.empty(3, 4, device=device)
        res = torch.add(x.to(device), 1, out=out)
        self.assertIs(res, out)
        self.assertMatchesCPU(out, x + 1, device)


instantiate(TestShapeOps, globals())
instantiate(TestIndexing, globals())
instantiate(TestOutDevice, globals())

if __name__ == "__main__":
    run_tests()
