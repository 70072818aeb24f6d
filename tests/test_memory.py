"""Caching allocator statistics (torch.cuda-style names) and out-of-memory behaviour."""
import collections
import gc

import pytest
import torch

from conftest import assert_cache_released, run_json

MiB = 2**20


def rounded(nbytes):
    """The allocator's size classes: 512 B steps up to 1 MiB, quarter powers of two above."""
    if nbytes <= MiB:
        return max(512, -(-nbytes // 512) * 512)
    pow2 = 1 << (nbytes.bit_length() - 1)
    step = pow2 // 4
    return -(-nbytes // step) * step


def stat(key, device=0):
    return torch.neuron.memory_stats(device)[key]


@pytest.fixture(autouse=True)
def _collect():
    gc.collect()
    yield
    gc.collect()


def test_memory_stats_keys_and_types():
    stats = torch.neuron.memory_stats()
    assert isinstance(stats, collections.OrderedDict)
    for metric in ("allocated_bytes", "reserved_bytes", "active_bytes", "requested_bytes", "allocation", "segment",
                   "active"):
        for pool in ("all", "small_pool", "large_pool"):
            for kind in ("current", "peak", "allocated", "freed"):
                key = f"{metric}.{pool}.{kind}"
                assert key in stats, key
                assert isinstance(stats[key], int) and stats[key] >= 0, (key, stats[key])
    for key in ("num_ooms", "num_alloc_retries", "num_device_alloc", "num_device_free"):
        assert isinstance(stats[key], int) and stats[key] >= 0
    assert stats["allocated_bytes.all.current"] == torch.neuron.memory_allocated()
    assert stats["reserved_bytes.all.current"] == torch.neuron.memory_reserved()


@pytest.mark.parametrize("numel", [1, 100, 1000, 128 * 1024, 256 * 1024 + 1, 3 * MiB // 4 + 5, 3 * MiB])
def test_allocation_counts_rounded_size_and_returns_on_free(numel):
    nbytes = numel * 4
    torch.neuron.empty_cache()  # a cached larger block would serve the request
    before = torch.neuron.memory_allocated()
    before_req = stat("requested_bytes.all.current")
    before_count = stat("allocation.all.current")
    t = torch.empty(numel, dtype=torch.float32, device="neuron")
    assert torch.neuron.memory_allocated() - before == rounded(nbytes)
    assert stat("requested_bytes.all.current") - before_req == nbytes
    assert stat("allocation.all.current") - before_count == 1
    pool = "small_pool" if rounded(nbytes) <= MiB else "large_pool"
    assert stat(f"allocated_bytes.{pool}.current") >= rounded(nbytes)
    assert torch.accelerator.memory_allocated(0) == torch.neuron.memory_allocated()
    assert torch.neuron.memory_reserved() >= torch.neuron.memory_allocated()
    del t
    assert torch.neuron.memory_allocated() == before
    assert stat("requested_bytes.all.current") == before_req
    assert stat("allocation.all.current") == before_count


def test_stats_are_per_device():
    before0 = torch.neuron.memory_allocated(0)
    before1 = torch.neuron.memory_allocated("neuron:1")
    t = torch.empty(2 * MiB, dtype=torch.uint8, device="neuron:1")
    assert torch.neuron.memory_allocated(1) - before1 == 2 * MiB
    assert torch.neuron.memory_allocated(0) == before0
    assert torch.accelerator.memory_allocated(1) == torch.neuron.memory_allocated(1)
    with torch.neuron.device(1):
        assert torch.neuron.memory_allocated() == torch.neuron.memory_allocated(1)
    del t
    assert torch.neuron.memory_allocated(1) == before1


def test_op_results_are_counted():
    a = torch.ones(MiB // 4, device="neuron")  # 1 MiB
    before = torch.neuron.memory_allocated()
    b = a * 2
    assert torch.neuron.memory_allocated() - before == MiB
    assert b.sum().item() == 2 * (MiB // 4)
    del b
    assert torch.neuron.memory_allocated() == before


def test_cache_reuse_and_empty_cache():
    t = torch.empty(4 * MiB, dtype=torch.uint8, device="neuron")
    allocs = stat("num_device_alloc")
    reserved = torch.neuron.memory_reserved()
    del t
    assert torch.neuron.memory_reserved() == reserved  # cached, still reserved
    again = torch.empty(4 * MiB, dtype=torch.uint8, device="neuron")
    assert stat("num_device_alloc") == allocs  # served from the cache
    del again
    torch.neuron.empty_cache()
    # Every cached segment went back: what remains reserved holds a live block.
    assert_cache_released()
    assert torch.neuron.memory_reserved() <= reserved - 4 * MiB
    assert stat("num_device_free") > 0


def test_torch_accelerator_empty_cache():
    t = torch.empty(2 * MiB, dtype=torch.uint8, device="neuron:1")
    del t
    assert torch.neuron.memory_reserved(1) > torch.neuron.memory_allocated(1)
    torch.accelerator.empty_cache()
    assert_cache_released(1)


def test_peak_stats_and_reset():
    torch.neuron.reset_peak_memory_stats()
    base = torch.neuron.memory_allocated()
    assert torch.neuron.max_memory_allocated() == base
    t = torch.empty(8 * MiB, dtype=torch.uint8, device="neuron")
    del t
    assert torch.neuron.max_memory_allocated() == base + 8 * MiB
    assert torch.neuron.max_memory_reserved() >= base + 8 * MiB
    assert torch.accelerator.max_memory_allocated(0) == torch.neuron.max_memory_allocated()
    assert stat("allocated_bytes.all.peak") == base + 8 * MiB
    torch.neuron.reset_peak_memory_stats()
    assert torch.neuron.max_memory_allocated() == base
    assert torch.neuron.max_memory_reserved() == torch.neuron.memory_reserved()


def test_reset_accumulated_stats():
    t = torch.empty(1000, device="neuron")
    del t
    assert stat("allocated_bytes.all.allocated") > 0 and stat("allocated_bytes.all.freed") > 0
    torch.neuron.reset_accumulated_memory_stats()
    assert stat("allocated_bytes.all.allocated") == 0
    assert stat("allocated_bytes.all.freed") == 0
    assert stat("num_ooms") == 0
    t = torch.empty(1000, device="neuron")
    assert stat("allocated_bytes.all.allocated") == 4096
    del t
    assert stat("allocated_bytes.all.freed") == 4096


def test_mem_get_info():
    free, total = torch.neuron.mem_get_info()
    assert total == 16 * 2**30
    assert free == total - torch.neuron.memory_reserved()
    t = torch.empty(16 * MiB, dtype=torch.uint8, device="neuron:1")
    free1, total1 = torch.neuron.mem_get_info("neuron:1")
    assert free1 == total1 - torch.neuron.memory_reserved(1) <= total1 - 16 * MiB
    assert torch.accelerator.get_memory_info(1) == (free1, total1)
    del t


def test_memory_summary():
    t = torch.empty(3 * MiB, dtype=torch.uint8, device="neuron")
    summary = torch.neuron.memory_summary()
    assert isinstance(summary, str)
    assert summary.startswith("neuron:0 memory summary (capacity 16.00 GiB")
    for label in ("Allocated memory", "Reserved memory", "Active memory", "Allocations", "alloc retries", "OOMs"):
        assert label in summary
    assert "neuron:1 memory summary" in torch.neuron.memory_summary(1)
    del t


# ---- out of memory -------------------------------------------------------------------------------------------------

def test_oom_raises_with_details_and_counts():
    ooms = stat("num_ooms")
    allocated = torch.neuron.memory_allocated()
    with pytest.raises(torch.OutOfMemoryError) as info:
        torch.empty(17 * 2**30, dtype=torch.uint8, device="neuron")
    msg = str(info.value)
    assert "Tried to allocate 17.00 GiB" in msg
    assert "neuron:0" in msg
    assert "HBM capacity 16.00 GiB" in msg
    assert "already allocated" in msg
    assert isinstance(info.value, RuntimeError)
    assert stat("num_ooms") == ooms + 1
    assert torch.neuron.memory_allocated() == allocated  # nothing leaked
    # The device keeps working.
    assert (torch.ones(4, device="neuron") + 1).sum().item() == 8.0


def test_oom_in_small_budget_recovers_and_retries():
    out = run_json("""
        import json, torch
        MiB = 2**20
        n = torch.neuron
        res = {"total": n.mem_get_info()[1]}
        blocks = []
        try:
            while True:
                blocks.append(torch.ones(2 * MiB, device="neuron"))  # 8 MiB each
        except torch.OutOfMemoryError as e:
            res["msg"] = str(e)
        res["n_blocks"] = len(blocks)
        res["ooms"] = n.memory_stats()["num_ooms"]
        res["allocated_full"] = n.memory_allocated()
        # An op whose result does not fit raises the same error.
        try:
            blocks[0] + blocks[1]
        except torch.OutOfMemoryError:
            res["op_oom"] = True
        res["ooms_after_op"] = n.memory_stats()["num_ooms"]
        # The other device has its own budget.
        res["dev1"] = torch.ones(2 * MiB, device="neuron:1").sum().item()
        del blocks
        res["allocated_freed"] = n.memory_allocated()
        res["reserved_cached"] = n.memory_reserved()
        # A size the cache cannot serve forces a flush (a retry), then succeeds.
        retries = n.memory_stats()["num_alloc_retries"]
        big = torch.full((8 * MiB,), 2.0, device="neuron")  # 32 MiB
        res["retries"] = n.memory_stats()["num_alloc_retries"] - retries
        res["big_sum"] = big.sum().item()
        res["allocated_big"] = n.memory_allocated()
        res["reserved_big"] = n.memory_reserved()
        print(json.dumps(res))
    """, env={"NEURON_RT_HBM_BYTES": "64M"})
    MiB = 2**20
    assert out["total"] == 64 * MiB
    assert out["n_blocks"] == 8
    assert "Tried to allocate 8.00 MiB" in out["msg"]
    assert "HBM capacity 64.00 MiB" in out["msg"]
    assert "64.00 MiB already allocated" in out["msg"]
    assert out["ooms"] == 1
    assert out["allocated_full"] == 64 * MiB
    assert out.get("op_oom") is True
    assert out["ooms_after_op"] == 2
    assert out["dev1"] == 2 * MiB
    assert out["allocated_freed"] == 0
    assert out["reserved_cached"] == 64 * MiB
    assert out["retries"] == 1
    assert out["big_sum"] == 2.0 * 8 * MiB
    assert out["allocated_big"] == 32 * MiB
    # The flush released the cached 8 MiB blocks; only the new block (and small scalars) stay reserved.
    assert 32 * MiB <= out["reserved_big"] < 33 * MiB
