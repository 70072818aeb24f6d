"""torch.export and AOTInductor with neuron inputs.

Exporting a neuron model works (the exported program runs on neuron, equal to
eager). AOTInductor packaging needs Inductor's C++ wrapper, which has no
neuron support yet (no neuron C shims, no C launch entry; docs/compile.md):
it must fail with a clear error, never a C++ compile error or a kernel that
touches device memory outside a runtime launch."""
import pytest
import torch

DEV = "neuron"


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(8, 16)
        self.b = torch.nn.Linear(16, 4)

    def forward(self, x):
        return self.b(torch.relu(self.a(x))).softmax(-1)


def _pair():
    torch.manual_seed(0)
    cpu = Block()
    dev = Block()
    dev.load_state_dict(cpu.state_dict())
    return cpu, dev.to(DEV)


def test_export_of_neuron_model_runs_on_neuron():
    cpu, dev = _pair()
    x = torch.randn(3, 8)
    ep = torch.export.export(dev, (x.to(DEV),))
    out = ep.module()(x.to(DEV))
    assert out.device.type == "neuron"
    torch.testing.assert_close(out.cpu(), cpu(x))


def test_aoti_compile_and_package_raises_clear_error(tmp_path):
    _, dev = _pair()
    x = torch.randn(3, 8, device=DEV)
    ep = torch.export.export(dev, (x,))
    with pytest.raises(Exception, match="AOTInductor .* not supported for neuron"):
        torch._inductor.aoti_compile_and_package(ep, package_path=str(tmp_path / "block.pt2"))
