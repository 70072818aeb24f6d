"""Errors users hit: bad device indices, device mixes, unsupported dtypes, foreign generators."""
import pytest
import torch

from conftest import assert_same

SAME_DEVICE = "Expected all tensors to be on the same device"


# ---- invalid device index ------------------------------------------------------------------------------------------

def test_factory_on_invalid_index():
    with pytest.raises(RuntimeError, match=r"Device index 7 is out of range. Valid range is 0 to 1 for this process "
                                           r"\(2 NeuronCore devices\)"):
        torch.ones(1, device="neuron:7")
    with pytest.raises(RuntimeError, match="Device index 2 is out of range"):
        torch.arange(3).to("neuron:2")


def test_set_device_invalid_index_keeps_current():
    with pytest.raises(RuntimeError, match="Device index 7 is out of range"):
        torch.neuron.set_device(7)
    assert torch.neuron.current_device() == 0
    with pytest.raises(RuntimeError, match="Device index 7 is out of range"):
        with torch.neuron.device(7):
            pass
    assert torch.neuron.current_device() == 0
    with pytest.raises(RuntimeError, match="Device index 5 is out of range"):
        torch.accelerator.set_device_index(5)
    assert torch.accelerator.current_device_index() == 0


def test_device_query_on_invalid_index():
    with pytest.raises(RuntimeError, match="Device index 3 is out of range"):
        torch.neuron.get_device_properties(3)
    with pytest.raises(RuntimeError, match="Device index 3 is out of range"):
        torch.neuron.memory_allocated(3)
    with pytest.raises(RuntimeError, match="Device index 3 is out of range"):
        torch.neuron.synchronize(3)


# ---- device mixes --------------------------------------------------------------------------------------------------

def test_cpu_and_neuron_mix_raises():
    x = torch.ones(3, device="neuron")
    with pytest.raises(RuntimeError, match=f"{SAME_DEVICE}.*neuron:0 and cpu"):
        x + torch.ones(3)
    with pytest.raises(RuntimeError, match=SAME_DEVICE):
        torch.ones(3) * x
    with pytest.raises(RuntimeError, match=SAME_DEVICE):
        torch.mm(torch.ones(2, 2, device="neuron"), torch.ones(2, 2))
    with pytest.raises(RuntimeError, match=SAME_DEVICE):
        torch.cat([x, torch.ones(2)])
    with pytest.raises(RuntimeError, match=SAME_DEVICE):
        x.add_(torch.ones(3))
    with pytest.raises(RuntimeError, match=SAME_DEVICE):
        x.index_select(0, torch.tensor([0, 1]))
    # A failed op leaves its arguments untouched.
    assert_same(x, torch.ones(3))


def test_zero_dim_cpu_tensor_is_a_scalar():
    x = torch.arange(4.0, device="neuron")
    out = x * torch.tensor(3.0)
    assert out.device == x.device
    assert_same(out, torch.arange(4.0) * 3)
    assert_same(torch.tensor(2) + torch.arange(3, device="neuron"), torch.arange(3) + 2)
    assert_same(torch.where(x > 1, x, torch.tensor(-1.0)), torch.tensor([-1.0, -1.0, 2.0, 3.0]))
    x.add_(torch.tensor(1.0))
    assert_same(x, torch.arange(4.0) + 1)


@pytest.mark.parametrize("make_out", [lambda dt: torch.empty((), dtype=dt), lambda dt: torch.empty(0, dtype=dt)],
                         ids=["0-dim", "1-dim"])
def test_cpu_out_argument_of_a_neuron_op_raises(make_out):
    # A 0-dim CPU tensor may be read as a scalar, never written: out= and
    # in-place self are validated like every other argument (as on CUDA).
    t = torch.tensor([1.0, 0.0, 2.0], device="neuron")
    out = make_out(torch.long)
    with pytest.raises(RuntimeError, match=SAME_DEVICE):
        torch.nonzero(t, out=out)
    out = make_out(torch.float32).fill_(-5.0)  # (not empty()'s bits: they may be a NaN)
    before = out.clone()
    with pytest.raises(RuntimeError, match=SAME_DEVICE):
        torch.add(t, t, out=out)
    with pytest.raises(RuntimeError, match=SAME_DEVICE):
        torch.tensor(1.0).add_(torch.tensor(2.0, device="neuron"))
    assert torch.equal(out, before)
    # A neuron out= with CPU inputs is the same mix.
    with pytest.raises(RuntimeError, match=SAME_DEVICE):
        torch.add(torch.ones(3), torch.ones(3), out=torch.empty(3, device="neuron"))


def test_pinned_neuron_memory_is_refused():
    for make in (lambda: torch.empty(3, device="neuron", pin_memory=True),
                 lambda: torch.empty_strided((2, 2), (2, 1), device="neuron", pin_memory=True),
                 lambda: torch.zeros(3, device="neuron", pin_memory=True)):
        with pytest.raises(RuntimeError, match="Only dense CPU tensors can be pinned"):
            make()


def test_zero_tensor_reads_as_zeros():
    z = torch._efficientzerotensor((2, 3), device="neuron")
    assert z._is_zerotensor() and z.device.type == "neuron"
    torch.testing.assert_close(z.cpu(), torch.zeros(2, 3))
    assert_same(z + torch.ones(2, 3, device="neuron"), torch.ones(2, 3))


def test_cpu_index_tensors_may_index_neuron_tensors():
    x = torch.arange(10, device="neuron") * 10
    assert_same(x[torch.tensor([1, 3, 9])], torch.tensor([10, 30, 90]))
    mask = torch.arange(10) % 2 == 0
    assert_same(x[mask], torch.tensor([0, 20, 40, 60, 80]))


def test_neuron0_and_neuron1_mix_raises():
    a = torch.ones(3, device="neuron:0")
    b = torch.ones(3, device="neuron:1")
    with pytest.raises(RuntimeError, match=f"{SAME_DEVICE}.*neuron:0 and neuron:1"):
        a + b
    with pytest.raises(RuntimeError, match=SAME_DEVICE):
        torch.stack([a, b])
    with pytest.raises(RuntimeError, match=SAME_DEVICE):
        a + b[0]  # a 0-dim tensor on another neuron device is not a scalar
    # Explicit copies across devices are fine.
    assert_same(a + b.to("neuron:0"), torch.full((3,), 2.0))


# ---- dtypes --------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.quint8, torch.qint8, torch.qint32])
def test_quantized_dtype_raises(dtype):
    # Quantized dtypes dispatch to the QuantizedPrivateUse1 key, which has no kernels.
    with pytest.raises(NotImplementedError, match="Quantizedneuron"):
        torch.empty(2, dtype=dtype, device="neuron")
    with pytest.raises(NotImplementedError, match="Quantizedneuron"):
        torch.empty_strided((2, 2), (1, 2), dtype=dtype, device="neuron")


def test_complex_rope_matches_cpu():
    # Rotary embeddings written with complex numbers (DeepSeek-V2, Llama 4) run on the host runtime.
    x = torch.randn(4, 8)
    freqs = torch.polar(torch.ones(4, 4), torch.randn(4, 4))
    def rope(t, f):
        return torch.view_as_real(torch.view_as_complex(t.reshape(4, 4, 2)) * f).flatten(1)
    out = rope(x.to("neuron"), freqs.to("neuron"))
    assert out.device.type == "neuron"
    torch.testing.assert_close(out.cpu(), rope(x, freqs))


def test_supported_dtypes_work():
    for dtype in (torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.int8, torch.uint8, torch.int16,
                  torch.int32, torch.int64, torch.bool):
        ref = (torch.arange(6) % 3).to(dtype)
        assert_same(ref.to("neuron"), ref)


# ---- generators ----------------------------------------------------------------------------------------------------

def test_cpu_generator_with_neuron_op_raises():
    g = torch.Generator().manual_seed(0)
    with pytest.raises(RuntimeError, match="Expected a 'neuron' device type for generator but found 'cpu'"):
        torch.rand(3, device="neuron", generator=g)
    x = torch.empty(5, device="neuron")
    with pytest.raises(RuntimeError, match="'neuron' device type for generator"):
        x.normal_(generator=g)
    with pytest.raises(RuntimeError, match="'neuron' device type for generator"):
        torch.multinomial(torch.ones(4, device="neuron"), 2, generator=g)


def test_neuron_generator_with_cpu_op_raises():
    g = torch.Generator(device="neuron")
    with pytest.raises(RuntimeError, match="generator"):
        torch.multinomial(torch.ones(4), 2, generator=g)  # today: returns a tensor on neuron:0
    with pytest.raises(RuntimeError, match="generator"):
        torch.rand(3, generator=g)  # today: a CPU tensor drawn from the neuron generator


# ---- out of memory -------------------------------------------------------------------------------------------------

def test_oom_is_a_runtime_error_subclass():
    with pytest.raises(torch.OutOfMemoryError, match="neuron out of memory"):
        torch.empty(2**36, dtype=torch.uint8, device="neuron:1")
    with pytest.raises(RuntimeError, match="out of memory"):
        torch.empty(2**36, dtype=torch.uint8, device="neuron:1")
    assert (torch.ones(2, device="neuron:1") * 2).sum().item() == 4.0
