"""torch.save/torch.load of neuron tensors, storages, pinned host memory and non-blocking copies."""
import io

import pytest
import torch

from conftest import assert_same


def _roundtrip(obj, **load_kwargs):
    buf = io.BytesIO()
    torch.save(obj, buf)
    buf.seek(0)
    return torch.load(buf, **load_kwargs)


def test_tensor_roundtrip_keeps_device_dtype_and_values():
    refs = {
        "f32": torch.randn(3, 4),
        "bf16": torch.randn(5).bfloat16(),
        "i64": torch.arange(-3, 9),
        "bool": torch.tensor([True, False, True]),
    }
    data = {k: v.to("neuron") for k, v in refs.items()}
    data["on1"] = refs["f32"].to("neuron:1")
    loaded = _roundtrip(data)
    for k, ref in refs.items():
        assert loaded[k].device == torch.device("neuron", 0) and loaded[k].dtype == ref.dtype
        assert_same(loaded[k], ref)
    assert loaded["on1"].device == torch.device("neuron", 1)
    assert_same(loaded["on1"], refs["f32"])


def test_views_share_storage_after_load():
    base = torch.arange(12.0, device="neuron")
    loaded = _roundtrip({"base": base, "view": base[2:8].view(2, 3)})
    assert_same(loaded["view"], torch.arange(2.0, 8.0).view(2, 3))
    loaded["base"][3] = -1.0
    assert loaded["view"][0, 1].item() == -1.0  # still a view of the loaded base


def test_state_dict_roundtrip():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3)).neuron()
    model.train()
    model(torch.randn(6, 4, device="neuron"))  # updates running stats
    sd = model.state_dict()
    loaded = _roundtrip(sd, weights_only=True)
    assert list(loaded) == list(sd)
    for k, v in sd.items():
        assert loaded[k].device == v.device and loaded[k].dtype == v.dtype
        assert_same(loaded[k], v.cpu())
    fresh = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3)).neuron()
    fresh.load_state_dict(loaded)
    model.eval()
    fresh.eval()
    x = torch.randn(2, 4, device="neuron")
    assert_same(fresh(x).detach(), model(x).detach().cpu())


def test_map_location_neuron1():
    data = {"a": torch.arange(5, device="neuron:0"), "b": torch.ones(2, 2, device="neuron:1")}
    buf = io.BytesIO()
    torch.save(data, buf)
    for loc in ("neuron:1", torch.device("neuron", 1), {"neuron:0": "neuron:1"}):
        buf.seek(0)
        loaded = torch.load(buf, map_location=loc)
        assert loaded["a"].device == torch.device("neuron", 1), loc
        assert loaded["b"].device == torch.device("neuron", 1), loc
        assert_same(loaded["a"], torch.arange(5))
        assert_same(loaded["b"], torch.ones(2, 2))


def test_map_location_cpu_and_from_cpu():
    loaded = _roundtrip({"t": torch.arange(6.0, device="neuron:1").reshape(2, 3)}, map_location="cpu")
    assert loaded["t"].device.type == "cpu"
    torch.testing.assert_close(loaded["t"], torch.arange(6.0).reshape(2, 3))
    to_dev = _roundtrip(torch.arange(4), map_location="neuron")
    assert to_dev.device == torch.device("neuron", 0)
    assert_same(to_dev, torch.arange(4))


def test_map_location_to_missing_device_raises():
    buf = io.BytesIO()
    torch.save(torch.ones(2, device="neuron"), buf)
    buf.seek(0)
    with pytest.raises(RuntimeError, match="device 5 but torch.neuron.device_count\\(\\) is 2"):
        torch.load(buf, map_location="neuron:5")


def test_untyped_storage_to_neuron():
    src = torch.tensor([1.0, -2.5, 3.0, 4.75])
    storage = src.untyped_storage().neuron()
    assert storage.device.type == "neuron" and storage.nbytes() == 16
    t = torch.empty(0, device="neuron").set_(storage)
    assert t.dtype == torch.float32
    assert_same(t, src)
    back = storage.cpu()
    assert back.device.type == "cpu" and bytes(back) == bytes(src.untyped_storage())
    loaded = _roundtrip({"t": t})
    assert loaded["t"].untyped_storage().device.type == "neuron"
    assert bytes(loaded["t"].untyped_storage().cpu()) == bytes(src.untyped_storage())


def test_untyped_storage_resize():
    t = torch.arange(4.0, device="neuron")
    storage = t.untyped_storage()
    storage.resize_(32)
    assert storage.nbytes() == 32
    assert_same(t, torch.arange(4.0))  # prefix kept
    storage.resize_(0)
    assert storage.nbytes() == 0


# ---- pinned memory -------------------------------------------------------------------------------------------------

def test_pin_memory():
    t = torch.arange(10.0)
    pinned = t.pin_memory()
    assert pinned.is_pinned() and not t.is_pinned()
    assert pinned.data_ptr() != t.data_ptr()
    torch.testing.assert_close(pinned, t)
    assert pinned[2:5].is_pinned()  # views of pinned memory are pinned
    assert pinned.pin_memory().data_ptr() == pinned.data_ptr()  # already pinned: no copy


def test_dataloader_pin_memory_yields_pinned_batches():
    xs = torch.arange(20.0).reshape(10, 2)
    ys = torch.arange(10)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(xs, ys), batch_size=4, pin_memory=True)
    seen = []
    for xb, yb in loader:
        assert xb.is_pinned() and yb.is_pinned()
        xd = xb.to("neuron", non_blocking=True)
        yd = yb.to("neuron", non_blocking=True)
        torch.neuron.synchronize()
        seen.append((xd, yd))
    assert len(seen) == 3
    assert_same(torch.cat([x for x, _ in seen]), xs)
    assert_same(torch.cat([y for _, y in seen]), ys)


@pytest.mark.parametrize("dtype", [torch.float32, torch.int32])
def test_non_blocking_copies(dtype):
    host = (torch.arange(1000) % 17).to(dtype).pin_memory()
    dev = host.to("neuron", non_blocking=True)
    dev1 = dev.to("neuron:1", non_blocking=True)
    back = dev1.to("cpu", non_blocking=True)
    torch.neuron.synchronize(0)
    torch.neuron.synchronize(1)
    assert back.device.type == "cpu"
    torch.testing.assert_close(back, host.clone())
    assert_same(dev, host.clone())
    out = torch.empty(1000, dtype=dtype).pin_memory()
    out.copy_(dev, non_blocking=True)
    torch.neuron.synchronize()
    torch.testing.assert_close(out, host.clone())
