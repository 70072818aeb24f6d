"""Device shims for PyTorch's distributed test harness on neuron (world 2).

The harness ships in the torch wheel (``torch.testing._internal``) and picks
its device and backend from module-level constants written for CUDA/XPU/HPU.
Each class below subclasses one harness class and overrides only what the
neuron device needs; tests written against them read like PyTorch's own:

- ``NeuronDTensorTestBase`` (``common_dtensor.DTensorTestBase``): world 2 on
  neuron; ``init_pg`` accepts only a whitelist of backend strings, of which
  ``"cpu:gloo,neuron:neuron"`` is ours (``"neuron"`` alone is refused).
- ``NeuronFSDPTest`` (``common_fsdp.FSDPTest``): its per-rank ``_run`` inits
  NCCL/XCCL/HCCL or falls back to cpu + gloo, and sets the device only for
  CUDA/XPU; ours inits ``neuron`` on ``neuron:rank``.

Both spawn their ranks through ``common_distributed.MultiProcessTestCase``
(as does ``_common.NeuronDistTestCase``, the conformance tests' base). Only
overrides of the harness's own hooks, no patched torch globals.
"""
import sys

import torch
import torch.distributed as dist
from torch.testing._internal.common_distributed import TEST_SKIPS
from torch.testing._internal.common_fsdp import FSDPTest
from torch.testing._internal.common_utils import set_rng_seed
from torch.testing._internal.distributed._tensor.common_dtensor import DTensorTestBase

DEVICE_TYPE = "neuron"
BACKEND = "neuron"
WORLD_SIZE = 2


def _need_devices(world_size):
    # The harness's own skip code (reported as a skip, not a failure).
    if torch.neuron.device_count() < world_size:
        sys.exit(TEST_SKIPS[f"multi-gpu-{world_size}"].exit_code)


class NeuronDTensorTestBase(DTensorTestBase):
    @property
    def world_size(self):
        return WORLD_SIZE

    @property
    def device_type(self):
        # DTensorTestMixin falls back to "cpu" when it counts too few
        # accelerators; here too few devices is a skip, never a silent cpu run.
        return DEVICE_TYPE

    @property
    def backend(self):
        return f"cpu:gloo,{DEVICE_TYPE}:{BACKEND}"

    def init_pg(self, eager_init, backend=None):
        _need_devices(self.world_size)
        torch.neuron.set_device(self.rank)
        super().init_pg(eager_init, backend)


class NeuronFSDPTest(FSDPTest):
    @property
    def world_size(self):
        return WORLD_SIZE

    @property
    def device(self):
        return torch.device(DEVICE_TYPE, self.rank)

    @classmethod
    def _run(cls, rank, test_name, file_name, pipe, **kwargs):
        # FSDPTest._run with the neuron device and backend.
        self = cls(test_name)
        self.rank = rank
        self.file_name = file_name
        _need_devices(self.world_size)
        torch.neuron.set_device(rank)
        dist.init_process_group(BACKEND, init_method=self.init_method, rank=rank, world_size=self.world_size,
                                device_id=self.device)
        # Every rank is up before the test body, so an early skip is not a hang.
        dist.barrier(device_ids=[rank])
        torch._dynamo.reset()
        set_rng_seed()
        self.run_test(test_name, pipe)
        torch._dynamo.reset()
        dist.barrier(device_ids=[rank])
        dist.destroy_process_group()
