"""init_process_group forms and launcher contracts of the neuron backend."""
import os

import pytest
import torch
import torch.distributed as dist
from torch.testing._internal.common_utils import run_tests

from _common import NeuronDistTestCase, torchrun

pytestmark = pytest.mark.distributed


class TestInitForms(NeuronDistTestCase):
    def _check_group(self, cpu_backend):
        rank, dev = self.rank, torch.device("neuron", self.rank)
        pg = dist.group.WORLD
        assert pg._get_backend(dev).name() == "neuron"
        assert pg._get_backend(torch.device("cpu")).name() == cpu_backend
        t = torch.full((3,), float(rank + 1), device=dev)
        dist.all_reduce(t)
        torch.testing.assert_close(t.cpu(), torch.full((3,), 3.0))
        out = [None, None]
        dist.all_gather_object(out, rank)
        assert out == [0, 1]
        dist.barrier()

    def test_init_forms(self):
        forms = [
            ({"backend": "neuron"}, "neuron"),
            ({"device_id": torch.device("neuron", self.rank)}, "neuron"),
            ({"backend": "cpu:gloo,neuron:neuron"}, "gloo"),
        ]
        for i, (kwargs, cpu_backend) in enumerate(forms):
            torch.neuron.set_device(self.rank)
            store = dist.FileStore(f"{self.file_name}.{i}", self.world_size)
            dist.init_process_group(store=store, rank=self.rank, world_size=self.world_size, **kwargs)
            try:
                self._check_group(cpu_backend)
            finally:
                dist.destroy_process_group()


def test_set_device_initializes(tmp_path):
    """torch.neuron.set_device marks the device initialized (as torch.cuda and
    torch.xpu do): FakeTensor and DeviceMesh read is_initialized() to map a
    bare "neuron" to the current device; without it rank 1 mixed neuron:0
    and neuron:1 in DTensor sharding propagation."""
    from conftest import run_json

    out = run_json("""
        import json, torch
        before = torch.neuron.is_initialized()
        torch.neuron.set_device(1)
        print(json.dumps([before, torch.neuron.is_initialized(), torch.neuron.current_device()]))
    """, env={"NEURON_RT_NUM_CORES": "2"})
    assert out == [False, True, 1]


def test_launcher_default_device_and_bare_init():
    """Under torchrun: the current device is LOCAL_RANK % device_count() with
    no set_device (Accelerate builds torch.device("neuron", current_device())
    but gives DDP device_ids=[LOCAL_RANK]); bare init_process_group() works
    and DDP trains on it.

    Bare init_process_group() needs torch_neuronx/_compile/bare_init.py on
    torch < 2.14: torch 2.13 binds the backend to "neuron" only and marks
    GLOO (absent from the group) as its default backend, so DDP failed with
    "Could not find backend type 1" and cpu collectives found no backend.
    Fixed upstream in pytorch/pytorch#179901; the compat step is gated on
    that version."""
    proc, _ = torchrun("""
        import json, os, torch, torch.distributed as dist
        from torch_neuronx._compile import bare_init
        local = int(os.environ["LOCAL_RANK"])
        assert torch.neuron.current_device() == local % torch.neuron.device_count()
        assert torch.ones(1, device="neuron").device == torch.device("neuron", local)
        wrapped = getattr(dist.distributed_c10d._new_process_group_helper, "_neuron_bare_init_fix", False)
        assert wrapped == bare_init.bare_init_needs_fix()
        dist.init_process_group()
        pg = dist.group.WORLD
        assert pg._get_backend(torch.device("neuron")).name() == "neuron"
        assert pg._get_backend(torch.device("cpu")).name() == "neuron"
        # DDP: one step, gradients averaged across ranks, equal to CPU math.
        torch.manual_seed(0)
        model = torch.nn.Linear(4, 2)
        ref = torch.nn.Linear(4, 2)
        ref.load_state_dict(model.state_dict())
        ddp = torch.nn.parallel.DistributedDataParallel(model.to("neuron"), device_ids=[local])
        x = torch.arange(8.0).reshape(2, 4) * (local + 1)
        ddp(x.to("neuron")).sum().backward()
        xs = torch.cat([torch.arange(8.0).reshape(2, 4) * (r + 1) for r in range(dist.get_world_size())])
        ref(xs).sum().backward()
        torch.testing.assert_close(model.weight.grad.cpu(), ref.weight.grad / dist.get_world_size())
        out = [None, None]
        dist.all_gather_object(out, local)
        assert out == [0, 1]
        dist.barrier()
        dist.destroy_process_group()
        print("OK", local)
    """)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    assert proc.stdout.count("OK") == 2


if __name__ == "__main__":
    run_tests()
