"""Collective semantics the vendor product and NCCL share, where plain Gloo
differs or refuses (world 2, each rank checked against CPU Gloo in the same
job, or NCCL's documented behaviour where Gloo has another):

- reduce: non-root ranks' tensors stay unchanged (NCCL; Gloo leaves partial
  results in them), on the shared-memory path and on Gloo, sync and async;
- all_gather with outputs of different sizes (NCCL; Gloo refuses), the
  coalesced all_gather forms with per-tensor shapes, zero-size tensors;
- local argument errors raise ValueError/TypeError on the rank that has them,
  and DistBackendError on its peers at once (not a hang or a desync), after
  which the group still works.

Every case runs twice: on the default group (shared-memory path) and on a
group created with TORCH_NEURONX_SHM=0 (Gloo transport).
"""
import os
import time

import pytest
import torch
import torch.distributed as dist
from torch.distributed import DistBackendError
from torch.testing._internal.common_utils import run_tests

from _common import Failures, NeuronDistTestCase, make, same

pytestmark = pytest.mark.distributed

R = dist.ReduceOp
OPS = ["SUM", "AVG", "MAX", "MIN", "PRODUCT", "BAND", "BOR", "BXOR", "PREMUL_SUM"]
DTYPES = [torch.float32, torch.bfloat16, torch.int32, torch.int16, torch.uint8]
FACTOR = 0.5


def valid(dtype, op):
    floating = dtype.is_floating_point
    if op in ("AVG", "PREMUL_SUM"):
        return floating
    if op in ("BAND", "BOR", "BXOR"):
        return not floating
    return True


def neuron_op(op):
    return dist._make_nccl_premul_sum(FACTOR) if op == "PREMUL_SUM" else getattr(R, op)


def gloo_reduce_root(x, op, dst, gloo):
    """What the root must hold: Gloo's reduce of the same values (PREMUL_SUM as
    SUM of scaled inputs, int16 reduced as int32, which Gloo lacks)."""
    t, o = x.clone(), op
    if op == "PREMUL_SUM":
        t, o = x * FACTOR, "SUM"
    if x.dtype == torch.int16:
        t = t.to(torch.int32)
    dist.reduce(t, dst=dst, op=getattr(R, o), group=gloo)
    return t.to(x.dtype)


class TestCollectiveSemantics(NeuronDistTestCase):
    def groups(self):
        """(name, group): the default group with the shared-memory path and a
        group created with TORCH_NEURONX_SHM=0 (Gloo only)."""
        self.init_neuron()
        os.environ["TORCH_NEURONX_SHM"] = "0"
        try:
            plain = dist.new_group([0, 1])
        finally:
            del os.environ["TORCH_NEURONX_SHM"]
        shm = dist.group.WORLD._get_backend(self.device)
        assert shm.uses_shm, "the default group should use the shared-memory path"
        assert not plain._get_backend(self.device).uses_shm
        return [("shm", dist.group.WORLD), ("gloo", plain)]

    def test_reduce_leaves_non_roots_unchanged(self):
        fails = Failures(self.rank)
        groups = self.groups()
        dev, rank, gloo = self.device, self.rank, self.gloo
        for gname, group in groups:
            for i, dtype in enumerate(DTYPES):
                for j, op in enumerate(OPS):
                    for dst in (0, 1):
                        for async_op in (False, True):
                            what = f"{gname} reduce {dtype} {op} dst={dst} async={async_op}"
                            x = make(dtype, (5, 3), 1000 * i + 100 * j + 10 * dst + rank)

                            def case(x=x, op=op, dst=dst, async_op=async_op, dtype=dtype, group=group):
                                t = x.to(dev)
                                if not valid(dtype, op):
                                    with self.assertRaises(TypeError):
                                        dist.reduce(t, dst=dst, op=neuron_op(op), group=group)
                                    return
                                work = dist.reduce(t, dst=dst, op=neuron_op(op), group=group, async_op=async_op)
                                if async_op:
                                    work.wait()
                                ref = gloo_reduce_root(x, op, dst, gloo)
                                if rank == dst:
                                    same(t, ref, "root result")
                                else:
                                    # NCCL: non-root inputs unchanged (Gloo's own reduce leaves partial results).
                                    same(t, x, "non-root input untouched")
                            fails.check(what, case)

            # Large enough for the single-copy path (the non-root's scratch falls back to the slots).
            def large(group=group):
                x = make(torch.float32, (1 << 17,), 77 + rank)
                t = x.to(dev)
                dist.reduce(t, dst=0, group=group)
                ref = gloo_reduce_root(x, "SUM", 0, gloo)
                same(t, ref if rank == 0 else x, "large reduce")
            fails.check(f"{gname} reduce 512 KiB", large)

            # _coalescing_manager does not capture reduce (torch coalesces only
            # all_reduce, all_gather_into_tensor, reduce_scatter_tensor): it runs
            # at once, with the same semantics.
            def coalesced(group=group):
                xs = [make(torch.float32, (4,), 90 + k + 10 * rank) for k in range(2)]
                ts = [x.to(dev) for x in xs]
                with dist._coalescing_manager(group=group):
                    for t in ts:
                        dist.reduce(t, dst=1, group=group)
                for t, x in zip(ts, xs):
                    ref = gloo_reduce_root(x, "SUM", 1, gloo)  # every rank takes part
                    same(t, ref if rank == 1 else x, "reduce in coalescing")
            fails.check(f"{gname} reduce inside _coalescing_manager", coalesced)
        fails.raise_if_any()
        dist.destroy_process_group()

    def test_all_gather_shapes(self):
        fails = Failures(self.rank)
        groups = self.groups()
        dev, rank, gloo = self.device, self.rank, self.gloo
        for gname, group in groups:
            for dtype in (torch.float32, torch.int16, torch.bool, torch.float8_e4m3fn):
                def uneven(dtype=dtype, group=group):
                    # Rank r contributes r + 1 rows. NCCL gathers outputs of
                    # different sizes (as one broadcast per rank); Gloo refuses,
                    # so the reference is Gloo broadcasts from each rank.
                    src = make(torch.float32, (rank + 1, 3), 5 + rank).to(dtype)
                    outs = [torch.empty((r + 1, 3), dtype=dtype, device=dev) for r in range(2)]
                    dist.all_gather(outs, src.to(dev), group=group)
                    for r in range(2):
                        ref = src.view(torch.uint8).clone() if r == rank else torch.empty((r + 1, 3 * src.element_size()), dtype=torch.uint8)
                        dist.broadcast(ref, src=r, group=gloo)
                        same(outs[r], ref.view(dtype), f"uneven all_gather from rank {r}")
                fails.check(f"{gname} uneven all_gather {dtype}", uneven)

            def coalesced_shapes(group=group):
                ins = [make(torch.float32, s, 20 + k + 10 * rank) for k, s in enumerate([(2,), (3, 2), (1, 1, 4)])]
                outs = [[torch.empty(t.shape, device=dev) for t in ins] for _ in range(2)]
                dist.all_gather_coalesced(outs, [t.to(dev) for t in ins], group=group)
                refs = [[torch.empty(t.shape) for t in ins] for _ in range(2)]
                dist.all_gather_coalesced(refs, [t.clone() for t in ins], group=gloo)
                for o, r in zip(sum(outs, []), sum(refs, [])):
                    same(o, r, "all_gather_coalesced [rank][i]")
                # The vendor product's layout, [i][rank]: accepted when only it fits.
                outs = [[torch.empty(t.shape, device=dev) for _ in range(2)] for t in ins]
                dist.all_gather_coalesced(outs, [t.to(dev) for t in ins], group=group)
                for i in range(len(ins)):
                    for r in range(2):
                        same(outs[i][r], refs[r][i], "all_gather_coalesced [i][rank]")
            fails.check(f"{gname} all_gather_coalesced per-tensor shapes", coalesced_shapes)

            def into_tensor_coalesced(group=group):
                ins = [make(torch.float32, (2,), 30 + rank), make(torch.int32, (3, 2), 31 + rank),
                       make(torch.bfloat16, (1, 5), 32 + rank), make(torch.float32, (0, 2), 33)]
                outs = [torch.empty((2 * t.shape[0], *t.shape[1:]), dtype=t.dtype, device=dev) for t in ins]
                outs[2] = torch.empty((1, 10), dtype=torch.bfloat16, device=dev)  # any world x input elements
                with dist._coalescing_manager(group=group):
                    for o, t in zip(outs, ins):
                        dist.all_gather_into_tensor(o, t.to(dev), group=group)
                for o, t in zip(outs, ins):
                    ref = torch.empty((2 * t.shape[0], *t.shape[1:]), dtype=t.dtype)
                    dist.all_gather_into_tensor(ref, t.clone(), group=gloo)
                    same(o, ref.view(o.shape), "coalesced all_gather_into_tensor")
            fails.check(f"{gname} coalesced all_gather_into_tensor shapes and dtypes", into_tensor_coalesced)

            def zero_size(group=group):
                # Gloo (and NCCL) accept zero-size tensors: so do we, with empty results.
                e = torch.empty((0, 3), device=dev)
                dist.all_reduce(e, group=group)
                dist.reduce(e, dst=0, group=group)
                dist.broadcast(e, src=1, group=group)
                outs = [torch.empty((0, 3), device=dev) for _ in range(2)]
                dist.all_gather(outs, e, group=group)
                out = torch.empty((0, 3), device=dev)
                dist.all_gather_into_tensor(out, e, group=group)
                dist.reduce_scatter_tensor(out, e, group=group)
                dist.all_to_all_single(out, e, group=group)
                for t in [e, out, *outs]:
                    assert t.shape == (0, 3) and t.device == dev, t
                # Zero-size next to non-empty tensors moves the non-empty ones right.
                x = make(torch.float32, (3,), 40 + rank)
                outs = [torch.empty(3, device=dev), torch.empty(0, device=dev)] if rank == 0 else \
                    [torch.empty(3, device=dev), torch.empty(0, device=dev)]
                src = x.to(dev) if rank == 0 else torch.empty(0, device=dev)
                dist.all_gather(outs, src, group=group)
                ref = x.clone()
                dist.broadcast(ref, src=0, group=gloo)
                same(outs[0], ref, "all_gather with an empty contribution")
            fails.check(f"{gname} zero-size tensors", zero_size)
        fails.raise_if_any()
        dist.destroy_process_group()

    def test_invalid_arguments_raise_on_every_rank(self):
        fails = Failures(self.rank)
        groups = self.groups()
        dev, rank = self.device, self.rank
        other = torch.device("neuron", 1 - rank)
        # (name, call, local error type, pattern on the rank with the bad argument, kind the peer is told)
        e = lambda *s, **kw: torch.empty(*s, device=dev, **kw)  # noqa: E731
        cases = [
            ("cpu output in a neuron all_gather", lambda g, bad: dist.all_gather(
                [e(2), torch.empty(2) if bad else e(2)], e(2), group=g),
             ValueError, "all_gather: Tensors must be on the same device", "tensors on different devices"),
            ("other neuron index in all_gather_into_tensor", lambda g, bad: dist.all_gather_into_tensor(
                e(4), torch.ones(2, device=other if bad else dev), group=g),
             ValueError, "all_gather_into_tensor: Tensors must be on the same device", "tensors on different devices"),
            ("mixed devices in all_reduce_coalesced", lambda g, bad: dist.all_reduce_coalesced(
                [e(2), torch.zeros(2) if bad else e(2)], group=g),
             ValueError, "all_reduce_coalesced: Tensors must be on the same device", "tensors on different devices"),
            ("wrong output list length", lambda g, bad: dist.all_gather([e(2)] * (1 if bad else 2), e(2), group=g),
             ValueError, r"all_gather: invalid output tensor list \(expected length 2", "wrong length"),
            ("all_gather own slot size", lambda g, bad: dist.all_gather(
                [e(3), e(3)] if bad else [e(2), e(2)], e(2), group=g),
             ValueError, "this rank's own slot", "mismatched tensor sizes"),
            ("all_gather_into_tensor dtype", lambda g, bad: dist.all_gather_into_tensor(
                e(4, dtype=torch.int32 if bad else torch.float32), e(2), group=g),
             TypeError, "output tensor must be the same type as the input tensor", "mismatched dtypes"),
            ("all_gather_into_tensor size", lambda g, bad: dist.all_gather_into_tensor(
                e(5 if bad else 4), e(2), group=g),
             ValueError, "output tensor size must be equal to world_size times input tensor size", "sizes"),
            ("reduce_scatter_tensor dtype", lambda g, bad: dist.reduce_scatter_tensor(
                e(2, dtype=torch.int32 if bad else torch.float32), e(4), group=g),
             TypeError, "input tensor must be the same type as the output tensor", "mismatched dtypes"),
            ("reduce_scatter_tensor size", lambda g, bad: dist.reduce_scatter_tensor(
                e(3 if bad else 2), e(4), group=g),
             ValueError, "input tensor must be the same size as output size times world size", "sizes"),
            ("split sizes not summing to dim 0", lambda g, bad: dist.all_to_all_single(
                e(4), e(4), [2, 2], [1, 2] if bad else [2, 2], group=g),
             ValueError, "all_to_all_single: Split sizes doesn't match total dim 0 size", "invalid split sizes"),
            ("negative split", lambda g, bad: dist.all_to_all_single(
                e(4), e(4), [2, 2], [-1, 5] if bad else [2, 2], group=g),
             ValueError, "all_to_all_single: Split sizes must be non-negative", "invalid split sizes"),
            ("wrong split count", lambda g, bad: dist.all_to_all_single(
                e(4), e(4), [2, 2], [4] if bad else [2, 2], group=g),
             ValueError, "Number of tensor splits not equal to group size", "invalid split sizes"),
            ("fp8 all_reduce", lambda g, bad: dist.all_reduce(
                e(4, dtype=torch.float8_e4m3fn if bad else torch.float32), group=g),
             TypeError, "fp8 is supported for data movement only", "reduction"),
            ("all_gather_coalesced shapes", lambda g, bad: dist.all_gather_coalesced(
                [[e(3 if bad else 2), e(1)], [e(2), e(1)]], [e(2), e(1)], group=g),
             ValueError, "all_gather_coalesced: output_tensor_lists must hold 2 lists", "sizes"),
        ]
        for gname, group in groups:
            for name, call, local_error, pattern, peer_kind in cases:
                def case(call=call, local_error=local_error, pattern=pattern, peer_kind=peer_kind, group=group):
                    start = time.monotonic()
                    if rank == 0:
                        with self.assertRaisesRegex(local_error, pattern):
                            call(group, True)
                    else:
                        with self.assertRaisesRegex(DistBackendError, f"rank 0 \\([^)]*{peer_kind}"):
                            call(group, False)
                    assert time.monotonic() - start < 5, "the peer waited for its timeout"
                    # Nothing moved: the group still works and agrees.
                    t = torch.full((3,), float(rank + 1), device=dev)
                    dist.all_reduce(t, group=group)
                    same(t, torch.full((3,), 3.0), "all_reduce after the rejected collective")
                fails.check(f"{gname} {name}", case)

            def both_ranks_bad(group=group):
                with self.assertRaisesRegex(ValueError, "invalid output tensor list"):
                    dist.all_gather([e(2)], e(2), group=group)
                t = torch.ones(2, device=dev)
                dist.all_reduce(t, group=group)
                same(t, torch.full((2,), 2.0), "after both ranks rejected")
            fails.check(f"{gname} both ranks reject", both_ranks_bad)

            def mismatched_reduce_op(group=group):
                # The argument check compares the reduce op (ranks would take
                # different paths or combine garbage otherwise).
                t = torch.ones(2, dtype=torch.int32, device=dev)
                with self.assertRaisesRegex(DistBackendError, r"ALLREDUCE\((SUM|BOR)\)"):
                    dist.all_reduce(t, op=R.SUM if rank == 0 else R.BOR, group=group)
            fails.check(f"{gname} mismatched reduce op", mismatched_reduce_op)
        fails.raise_if_any()
        dist.destroy_process_group()


@pytest.mark.parametrize("name,value,ok", [
    ("NEURON_USE_SPLIT_ALLGATHER", "0", True),
    ("NEURON_USE_SPLIT_REDUCE_SCATTER", "True", True),
    ("COLLECTIVE_BUCKETSIZE_IN_MB", "256", True),
    ("COLLECTIVE_MIN_BUCKETS", "0", True),
    ("NEURON_USE_SPLIT_ALLGATHER", "yes please", False),
    ("COLLECTIVE_BUCKETSIZE_IN_MB", "0", False),
    ("COLLECTIVE_BUCKETSIZE_IN_MB", "1.5", False),
    ("COLLECTIVE_MIN_BUCKETS", "-1", False),
])
def test_product_collective_env(name, value, ok):
    # The vendor product's collective variables are accepted (and inert:
    # nothing here splits collectives); a malformed value names the variable.
    from conftest import run_json

    out = run_json(f"""
        import json, os, tempfile, torch, torch.distributed as dist
        os.environ[{name!r}] = {value!r}
        try:
            dist.init_process_group("neuron", store=dist.FileStore(tempfile.mktemp(), 1), rank=0, world_size=1)
            t = torch.ones(3, device="neuron")
            dist.all_reduce(t)
            print(json.dumps(["ok", t.cpu().tolist()]))
            dist.destroy_process_group()
        except ValueError as e:
            print(json.dumps(["ValueError", str(e)]))
    """)
    if ok:
        assert out == ["ok", [1.0, 1.0, 1.0]], out
    else:
        assert out[0] == "ValueError" and name in out[1] and repr(value) in out[1], out


if __name__ == "__main__":
    run_tests()
