"""Conformance of the ``neuron`` c10d backend against CPU Gloo (world 2).

Each test method is one spawned world-2 job that runs many cases; a case
runs the collective on neuron tensors (neuron backend) and on the same values
as CPU tensors (a Gloo group) and compares rank by rank. Failures are
collected and reported together.
"""
import copy

import pytest
import torch
import torch.distributed as dist
from torch.testing._internal.common_utils import run_tests

from _common import ALL_DTYPES, FP8_DTYPES, GLOO_LACKS, Failures, NeuronDistTestCase, make, same

pytestmark = pytest.mark.distributed

R = dist.ReduceOp
REDUCE_OPS = ["SUM", "AVG", "MAX", "MIN", "PRODUCT", "BAND", "BOR", "BXOR", "PREMUL_SUM"]
PREMUL_FACTOR = 0.5


def expect_type_error(dtype, op):
    """Cases the neuron backend must refuse with a TypeError."""
    floating = dtype.is_floating_point and dtype not in FP8_DTYPES
    if dtype in FP8_DTYPES:
        return True  # fp8 moves, never reduces
    if op in ("AVG", "PREMUL_SUM"):
        return not floating
    if op in ("BAND", "BOR", "BXOR"):
        return floating
    return False


def neuron_op(op, factor_on=None):
    if op == "PREMUL_SUM":
        f = PREMUL_FACTOR if factor_on is None else torch.tensor([PREMUL_FACTOR], device=factor_on)
        return dist._make_nccl_premul_sum(f)
    return getattr(R, op)


def ref_prepare(x, op):
    """(input, op) that make Gloo compute what the neuron backend promises:
    PREMUL_SUM is SUM of scaled inputs; int16, which Gloo cannot reduce, is
    reduced as int32 (and narrowed by ``ref_result``)."""
    if op == "PREMUL_SUM":
        return x * PREMUL_FACTOR, R.SUM
    if x.dtype == torch.int16:
        return x.to(torch.int32), getattr(R, op)
    return x.clone(), getattr(R, op)


def ref_result(t, dtype):
    return t.to(dtype) if t.dtype != dtype else t


class TestNeuronCollectives(NeuronDistTestCase):
    def _reduction_case(self, fails, what, dtype, op, run_neuron, run_ref):
        """run_ref() -> result or raises; run_neuron() -> result on neuron."""
        def check():
            ref_err = got_err = None
            try:
                ref = run_ref()
            except Exception as e:  # noqa: BLE001
                ref_err = e
            try:
                got = run_neuron()
            except Exception as e:  # noqa: BLE001
                got_err = e
            if expect_type_error(dtype, op):
                assert isinstance(got_err, TypeError), f"expected TypeError, got {got_err!r}"
                return
            if ref_err is not None:
                assert got_err is not None, f"Gloo raised {ref_err!r} but neuron returned a result"
                return
            if got_err is not None:
                raise got_err
            for g, r in zip(got, ref):
                same(g, ref_result(r, dtype), what)
        fails.check(what, check)

    def test_reductions(self):
        self.init_neuron()
        fails = Failures(self.rank)
        gloo, dev, rank = self.gloo, self.device, self.rank
        for i, dtype in enumerate(ALL_DTYPES):
            for j, op in enumerate(REDUCE_OPS):
                seed = 100 * i + 10 * j + rank
                x = make(dtype, (4, 3), seed)

                # all_reduce
                def nr(x=x, op=op):
                    t = x.to(dev)
                    dist.all_reduce(t, op=neuron_op(op))
                    return [t]

                def rr(x=x, op=op):
                    t, o = ref_prepare(x, op)
                    dist.all_reduce(t, op=o, group=gloo)
                    return [t]
                self._reduction_case(fails, f"all_reduce {dtype} {op}", dtype, op, nr, rr)

                # reduce_scatter_tensor (the caller's input must stay unchanged)
                def nrs(x=x, op=op):
                    t = x.to(dev)
                    out = torch.empty((2, 3), dtype=dtype, device=dev)
                    dist.reduce_scatter_tensor(out, t, op=neuron_op(op))
                    same(t, x, "reduce_scatter_tensor input untouched")
                    return [out]

                def rrs(x=x, op=op):
                    t, o = ref_prepare(x, op)
                    out = torch.empty((2, 3), dtype=t.dtype)
                    dist.reduce_scatter_tensor(out, t, op=o, group=gloo)
                    return [out]
                self._reduction_case(fails, f"reduce_scatter_tensor {dtype} {op}", dtype, op, nrs, rrs)

        # The other reductions on a representative subset.
        for i, dtype in enumerate([torch.float32, torch.bfloat16, torch.int32, torch.int16, torch.bool]):
            for j, op in enumerate(["SUM", "MAX", "AVG", "PREMUL_SUM", "BOR"]):
                seed = 5000 + 100 * i + 10 * j + rank
                x = make(dtype, (4, 3), seed)
                y = make(dtype, (5,), seed + 7)

                def nred(x=x, op=op):
                    t = x.to(dev)
                    dist.reduce(t, dst=1, op=neuron_op(op))
                    return [t] if rank == 1 else []

                def rred(x=x, op=op):
                    t, o = ref_prepare(x, op)
                    dist.reduce(t, dst=1, op=o, group=gloo)
                    return [t] if rank == 1 else []
                self._reduction_case(fails, f"reduce {dtype} {op}", dtype, op, nred, rred)

                def nrsl(x=x, op=op):
                    ins = [c.to(dev) for c in x.chunk(2)]
                    out = torch.empty((2, 3), dtype=dtype, device=dev)
                    dist.reduce_scatter(out, ins, op=neuron_op(op))
                    return [out]

                def rrsl(x=x, op=op):
                    t, o = ref_prepare(x, op)
                    out = torch.empty((2, 3), dtype=t.dtype)
                    # Gloo has no list form: the flat form computes the same.
                    dist.reduce_scatter_tensor(out, t, op=o, group=gloo)
                    return [out]
                self._reduction_case(fails, f"reduce_scatter {dtype} {op}", dtype, op, nrsl, rrsl)

                def nco(x=x, y=y, op=op):
                    ts = [x.to(dev), y.to(dev)]
                    dist.all_reduce_coalesced(ts, op=neuron_op(op))
                    return ts

                def rco(x=x, y=y, op=op):
                    ts = [ref_prepare(x, op)[0], ref_prepare(y, op)[0]]
                    dist.all_reduce_coalesced(ts, op=ref_prepare(x, op)[1], group=gloo)
                    return ts
                self._reduction_case(fails, f"all_reduce_coalesced {dtype} {op}", dtype, op, nco, rco)

        # PREMUL_SUM with a one-element factor tensor on neuron.
        def premul_tensor_factor():
            x = make(torch.float32, (6,), 77 + rank)
            t = x.to(dev)
            dist.all_reduce(t, op=neuron_op("PREMUL_SUM", factor_on=dev))
            ref = x * PREMUL_FACTOR
            dist.all_reduce(ref, group=gloo)
            same(t, ref, "premul tensor factor")
        fails.check("all_reduce PREMUL_SUM tensor factor", premul_tensor_factor)

        # CPU tensors go through the same backend (it is bound to "cpu" too).
        def cpu_tensors():
            assert dist.group.WORLD._get_backend(torch.device("cpu")).name() == "neuron"
            x = make(torch.float32, (6,), 88 + rank)
            t = x.clone()
            dist.all_reduce(t)
            ref = x.clone()
            dist.all_reduce(ref, group=gloo)
            assert torch.equal(t, ref)
        fails.check("all_reduce on cpu tensors", cpu_tensors)

        # Complex is not a neuron dtype; on cpu tensors the backend reduces
        # SUM/AVG as Gloo does and moves it as bytes; MAX is refused (by
        # torch.distributed itself, before the backend).
        def complex_cpu():
            x = torch.randn(6, dtype=torch.complex64, generator=torch.Generator().manual_seed(5 + rank))
            for op in (R.SUM, R.AVG):
                t, ref = x.clone(), x.clone()
                dist.all_reduce(t, op=op)
                dist.all_reduce(ref, op=op, group=gloo)
                assert torch.equal(t, ref), op
            with self.assertRaisesRegex((TypeError, ValueError), "complex"):
                dist.all_reduce(x.clone(), op=R.MAX)
            t, ref = x.clone(), x.clone()
            dist.broadcast(t, src=1)
            dist.broadcast(ref, src=1, group=gloo)
            assert torch.equal(t, ref)
        fails.check("complex on cpu tensors", complex_cpu)

        # Error messages name the problem.
        def messages():
            with self.assertRaisesRegex(TypeError, "integer average"):
                dist.all_reduce(torch.ones(2, dtype=torch.int32, device=dev), op=R.AVG)
            with self.assertRaisesRegex(TypeError, "fp8 is supported for data movement only"):
                dist.all_reduce(torch.ones(2, device=dev).to(torch.float8_e4m3fn))
        fails.check("error messages", messages)
        fails.raise_if_any()

    def test_data_movement(self):
        self.init_neuron()
        fails = Failures(self.rank)
        gloo, dev, rank = self.gloo, self.device, self.rank
        for i, dtype in enumerate(ALL_DTYPES):
            seed = 10 * i + rank
            x = make(dtype, (4, 3), seed)
            # Gloo cannot move fp8 or int16: the reference moves the same bytes.
            view = (lambda t: t.view(torch.uint8)) if dtype in GLOO_LACKS else (lambda t: t)
            unview = (lambda t, dtype=dtype: t.view(dtype)) if dtype in GLOO_LACKS else (lambda t: t)

            def broadcast(x=x, view=view, unview=unview):
                t = x.to(dev)
                work = dist.broadcast(t, src=1, async_op=True)
                work.wait()
                fut = work.get_future().value()
                assert fut[0].device == dev, fut[0].device
                r = view(x.clone())
                dist.broadcast(r, src=1, group=gloo)
                same(t, unview(r), "broadcast")
            fails.check(f"broadcast {dtype}", broadcast)

            def all_gather(x=x, view=view, unview=unview, dtype=dtype):
                outs = [torch.empty((4, 3), dtype=dtype, device=dev) for _ in range(2)]
                dist.all_gather(outs, x.to(dev))
                refs = [view(torch.empty((4, 3), dtype=dtype)) for _ in range(2)]
                dist.all_gather(refs, view(x.clone()), group=gloo)
                for o, r in zip(outs, refs):
                    same(o, unview(r), "all_gather")
            fails.check(f"all_gather {dtype}", all_gather)

            def all_gather_into_tensor(x=x, view=view, unview=unview, dtype=dtype):
                out = torch.empty((8, 3), dtype=dtype, device=dev)
                dist.all_gather_into_tensor(out, x.to(dev))
                ref = view(torch.empty((8, 3), dtype=dtype))
                dist.all_gather_into_tensor(ref, view(x.clone()), group=gloo)
                same(out, unview(ref), "all_gather_into_tensor")
            fails.check(f"all_gather_into_tensor {dtype}", all_gather_into_tensor)

            def gather(x=x, view=view, unview=unview, dtype=dtype):
                outs = [torch.empty((4, 3), dtype=dtype, device=dev) for _ in range(2)] if rank == 0 else None
                dist.gather(x.to(dev), outs, dst=0)
                refs = [view(torch.empty((4, 3), dtype=dtype)) for _ in range(2)] if rank == 0 else None
                dist.gather(view(x.clone()), refs, dst=0, group=gloo)
                if rank == 0:
                    for o, r in zip(outs, refs):
                        same(o, unview(r), "gather")
            fails.check(f"gather {dtype}", gather)

            def scatter(x=x, view=view, unview=unview, dtype=dtype):
                out = torch.empty((2, 3), dtype=dtype, device=dev)
                dist.scatter(out, [c.to(dev) for c in x.chunk(2)] if rank == 1 else None, src=1)
                ref = view(torch.empty((2, 3), dtype=dtype))
                dist.scatter(ref, [view(c.contiguous()) for c in x.chunk(2)] if rank == 1 else None, src=1,
                             group=gloo)
                same(out, unview(ref), "scatter")
            fails.check(f"scatter {dtype}", scatter)

            def all_to_all_single(x=x, view=view, unview=unview, dtype=dtype):
                out = torch.empty((4, 3), dtype=dtype, device=dev)
                dist.all_to_all_single(out, x.to(dev))
                ref = view(torch.empty((4, 3), dtype=dtype))
                dist.all_to_all_single(ref, view(x.clone()), group=gloo)
                same(out, unview(ref), "all_to_all_single")
                # Uneven: rank r sends r+1 rows to rank 0 and 3-r rows to rank 1.
                ins = [rank + 1, 3 - rank]
                outs = [1, 2] if rank == 0 else [3, 2]
                n = sum(outs)
                out = torch.empty((n, 3), dtype=dtype, device=dev)
                dist.all_to_all_single(out, x.to(dev), output_split_sizes=outs, input_split_sizes=ins)
                ref = view(torch.empty((n, 3), dtype=dtype))
                dist.all_to_all_single(ref, view(x.clone()), output_split_sizes=outs, input_split_sizes=ins,
                                       group=gloo)
                same(out, unview(ref), "all_to_all_single uneven")
            fails.check(f"all_to_all_single {dtype}", all_to_all_single)

            def all_to_all(x=x, view=view, unview=unview, dtype=dtype):
                ins = [x[:1].to(dev), x[1:].to(dev)]
                shapes = [(1, 3), (1, 3)] if rank == 0 else [(3, 3), (3, 3)]
                outs = [torch.empty(s, dtype=dtype, device=dev) for s in shapes]
                dist.all_to_all(outs, ins)
                # Gloo's list form needs equal sizes: the flat form with splits is the reference.
                n = sum(s[0] for s in shapes)
                ref = view(torch.empty((n, 3), dtype=dtype))
                dist.all_to_all_single(ref, view(x.clone()), output_split_sizes=[s[0] for s in shapes],
                                       input_split_sizes=[1, 3], group=gloo)
                for o, r in zip(outs, unview(ref).split([s[0] for s in shapes])):
                    same(o, r, "all_to_all")
            fails.check(f"all_to_all {dtype}", all_to_all)
        fails.raise_if_any()

    def test_point_to_point(self):
        self.init_neuron()
        fails = Failures(self.rank)
        dev, rank = self.device, self.rank
        peer = 1 - rank
        for i, dtype in enumerate(ALL_DTYPES):
            mine = make(dtype, (3, 2), 10 * i + rank)
            theirs = make(dtype, (3, 2), 10 * i + peer)  # what the peer sends

            def send_recv(mine=mine, theirs=theirs, dtype=dtype):
                got = torch.empty((3, 2), dtype=dtype, device=dev)
                if rank == 0:
                    dist.send(mine.to(dev), dst=1)
                    dist.recv(got, src=1)
                else:
                    dist.recv(got, src=0)
                    dist.send(mine.to(dev), dst=0)
                same(got, theirs, "send/recv")
            fails.check(f"send/recv {dtype}", send_recv)

            def isend_irecv(mine=mine, theirs=theirs, dtype=dtype):
                got = torch.empty((3, 2), dtype=dtype, device=dev)
                works = [dist.irecv(got, src=peer), dist.isend(mine.to(dev), dst=peer)]
                for w in works:
                    w.wait()
                same(got, theirs, "isend/irecv")
            fails.check(f"isend/irecv {dtype}", isend_irecv)

            def batch(mine=mine, theirs=theirs, dtype=dtype):
                got = torch.empty((3, 2), dtype=dtype, device=dev)
                ops = [dist.P2POp(dist.irecv, got, peer), dist.P2POp(dist.isend, mine.to(dev), peer)]
                for w in dist.batch_isend_irecv(ops):
                    w.wait()
                same(got, theirs, "batch_isend_irecv")
            fails.check(f"batch_isend_irecv {dtype}", batch)
        fails.raise_if_any()

    def test_groups_objects_coalescing(self):
        self.init_neuron()
        fails = Failures(self.rank)
        gloo, dev, rank = self.gloo, self.device, self.rank

        def barrier():
            dist.barrier(device_ids=[rank])
            dist.barrier()
            dist.barrier(async_op=True).wait()
        fails.check("barrier", barrier)

        def objects():
            out = [None, None]
            dist.all_gather_object(out, {"rank": rank, "t": torch.arange(3)})
            assert [o["rank"] for o in out] == [0, 1]
            lst = [{"from": rank}, "x"]
            dist.broadcast_object_list(lst, src=1)
            assert lst[0] == {"from": 1}
            g = [None, None] if rank == 0 else None
            dist.gather_object(rank * 10, g, dst=0)
            if rank == 0:
                assert g == [0, 10]
            got = [None]
            dist.scatter_object_list(got, ["a", "b"] if rank == 0 else None, src=0)
            assert got[0] == "ab"[rank]
        fails.check("object collectives", objects)

        def new_group():
            g = dist.new_group([0, 1])
            assert g._get_backend(torch.device("neuron")).name() == "neuron"
            x = make(torch.float32, (5,), 31 + rank)
            t = x.to(dev)
            dist.all_reduce(t, group=g)
            ref = x.clone()
            dist.all_reduce(ref, group=gloo)
            same(t, ref, "new_group all_reduce")
        fails.check("new_group", new_group)


        def coalescing():
            xs = [make(torch.float32, (4, 2), 40 + k + 10 * rank) for k in range(3)]
            ts = [x.to(dev) for x in xs]
            with dist._coalescing_manager(async_ops=True) as cm:
                for t in ts:
                    dist.all_reduce(t)
            cm.wait()
            refs = [x.clone() for x in xs]
            with dist._coalescing_manager(group=gloo):
                for r in refs:
                    dist.all_reduce(r, group=gloo)
            for t, r in zip(ts, refs):
                same(t, r, "coalesced all_reduce")
            outs = [torch.empty((8, 2), device=dev) for _ in xs]
            with dist._coalescing_manager():
                for o, x in zip(outs, xs):
                    dist.all_gather_into_tensor(o, x.to(dev))
            routs = [torch.empty((8, 2)) for _ in xs]
            with dist._coalescing_manager(group=gloo):
                for o, x in zip(routs, xs):
                    dist.all_gather_into_tensor(o, x, group=gloo)
            for o, r in zip(outs, routs):
                same(o, r, "coalesced all_gather_into_tensor")
            outs = [torch.empty((2, 2), device=dev) for _ in xs]
            with dist._coalescing_manager():
                for o, x in zip(outs, xs):
                    dist.reduce_scatter_tensor(o, x.to(dev), op=R.AVG)
            routs = [torch.empty((2, 2)) for _ in xs]
            with dist._coalescing_manager(group=gloo):
                for o, x in zip(routs, xs):
                    dist.reduce_scatter_tensor(o, x, op=R.AVG, group=gloo)
            for o, r in zip(outs, routs):
                same(o, r, "coalesced reduce_scatter_tensor")
        fails.check("_coalescing_manager", coalescing)

        def futures_and_options():
            t = torch.ones(4, device=dev)
            fut = dist.all_reduce(t, async_op=True).get_future()
            chained = fut.then(lambda f: f.value()[0] * 2)
            value = chained.wait()
            assert value.device == dev, value.device
            same(value, torch.full((4,), 4.0), "future then")
            be = dist.group.WORLD._get_backend(dev)
            opts = be.options
            clone = copy.deepcopy(opts)
            clone._timeout = opts._timeout * 2
            assert clone._timeout != opts._timeout and clone.backend == "neuron"
            assert be.get_error() == 0
            assert be.supports_splitting
        fails.check("futures and options", futures_and_options)
        fails.raise_if_any()
        dist.destroy_process_group()


    def test_split_group(self):
        # device_id binds the group to neuron:rank, which split_group requires
        # (DeviceMesh and Transformers always bind one).
        self.init_neuron(device_id=torch.device("neuron", self.rank), reference=False)
        fails = Failures(self.rank)
        dev, rank = self.device, self.rank

        def split_group():
            sub = dist.split_group(split_ranks=[[0], [1]])
            assert sub is not None and sub.size() == 1
            t = torch.full((3,), float(rank + 1), device=dev)
            dist.all_reduce(t, group=sub)
            same(t, torch.full((3,), float(rank + 1)), "split_group size-1 all_reduce")
            both = dist.split_group(split_ranks=[[0, 1]])
            # split() runs once per bound device type; both get the one child.
            neuron_be = both._get_backend(torch.device("neuron"))
            assert neuron_be is both._get_backend(torch.device("cpu"))
            assert neuron_be.name() == "neuron"
            t = torch.full((3,), float(rank + 1), device=dev)
            dist.all_reduce(t, group=both)
            same(t, torch.full((3,), 3.0), "split_group all_reduce")
            out = [None, None]
            dist.all_gather_object(out, rank, group=both)
            assert out == [0, 1]
        fails.check("split_group", split_group)
        fails.raise_if_any()
        dist.destroy_process_group()


def test_collectives_release_their_tensors():
    # A work the caller dropped gives back its tensors: the group's watchdog
    # list holds weak references to works, and those kept each work's tensors
    # (up to 64 works' worth of device memory) until the group was destroyed.
    from conftest import run_json

    out = run_json("""
        import gc, json, tempfile, torch, torch.distributed as dist
        dist.init_process_group("neuron", store=dist.FileStore(tempfile.mktemp(), 1), rank=0, world_size=1)
        torch.neuron.synchronize()
        base = torch.neuron.memory_allocated()
        for i in range(4):
            t = torch.ones(1 << 18, device="neuron")
            dist.all_reduce(t)
            dist.broadcast(t, 0)
            out = torch.empty(1 << 18, device="neuron")
            dist.all_gather_into_tensor(out, t)
            dist.all_reduce(t, async_op=True).wait()
            del t, out
        # The transport's completion callback drops the last reference on
        # its own thread just after wait() returned: give it a moment.
        import time
        deadline = time.monotonic() + 5
        while True:
            gc.collect()
            torch.neuron.synchronize()
            left = torch.neuron.memory_allocated() - base
            if left == 0 or time.monotonic() > deadline:
                break
            time.sleep(0.01)
        print(json.dumps(left))
        dist.destroy_process_group()
    """)
    assert out == 0


if __name__ == "__main__":
    run_tests()
