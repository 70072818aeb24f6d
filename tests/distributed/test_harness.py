"""Our tests in the style of PyTorch's distributed test harness, on neuron.

The harness classes ship in the torch wheel; the device shims live in
_harness.py. Each test method runs in 2 spawned ranks (the harness's crash
isolation: the parent pytest process only collects their exit codes).
"""
import copy

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
from torch.testing._internal.common_fsdp import MLP, check_sharded_parity
from torch.testing._internal.distributed._tensor.common_dtensor import MLPModule, with_comms

from _harness import NeuronDTensorTestBase, NeuronFSDPTest

pytestmark = pytest.mark.distributed


class TestDTensorOnNeuron(NeuronDTensorTestBase):
    @with_comms
    def test_ops_over_every_sharding_match_cpu(self):
        mesh = self.build_device_mesh()
        self.assertEqual(mesh.device_type, "neuron")
        torch.manual_seed(0)
        a = torch.randn(6, 4, device=self.device_type)
        b = torch.randn(4, 8, device=self.device_type)
        c = torch.randn(6, 4, device=self.device_type)
        cases = [(torch.mm, (a, b)), (torch.add, (a, c)), (lambda x: x.sum(0), (a,)),
                 (lambda x: F.softmax(x, dim=-1), (a,))]
        for op, args in cases:
            # The harness runs the op on DTensors of every Shard/Replicate
            # combination of the arguments and compares the full tensor with
            # the op on the plain (neuron) tensors ...
            self._test_op(mesh, op, *args)
            # ... which in turn equal CPU.
            self.assertEqual(op(*args).cpu(), op(*[t.cpu() for t in args]), atol=1e-5, rtol=1e-5)

    @with_comms
    def test_tensor_parallel_mlp_matches_replicated(self):
        mesh = self.build_device_mesh()
        torch.manual_seed(0)
        model = MLPModule(self.device_type)
        ref = copy.deepcopy(model).cpu()
        tp = parallelize_module(model, mesh, {"net1": ColwiseParallel(), "net2": RowwiseParallel()})
        self.assertEqual(tp.net1.weight.placements, (Shard(0),))
        self.assertEqual(tp.net2.weight.placements, (Shard(1),))
        x = torch.randn(4, 10)  # same seed on every rank: TP inputs are replicated
        out = tp(x.to(self.device_type))
        out.sum().backward()
        ref_out = ref(x)
        ref_out.sum().backward()
        self.assertEqual(out.device, torch.device(self.device_type, self.rank))
        self.assertEqual(out.cpu(), ref_out, atol=1e-5, rtol=1e-5)
        for (name, p), q in zip(tp.named_parameters(), ref.parameters()):
            self.assertIsInstance(p.grad, DTensor)
            self.assertEqual(p.grad.full_tensor().cpu(), q.grad, atol=1e-5, rtol=1e-5, msg=name)
        # A redistribute round trip through the harness's mesh.
        d = distribute_tensor(ref_out.detach().to(self.device_type), mesh, [Shard(1)])
        self.assertEqual(d.redistribute(mesh, [Replicate()]).to_local().cpu(), ref_out.detach())


class TestFullyShardOnNeuron(NeuronFSDPTest):
    def test_train_parity_with_replicated_model(self):
        # fully_shard against the same model replicated on each rank with
        # gradients averaged by all_reduce; losses per step and, after each
        # step, every parameter and gradient shard (the harness's
        # check_sharded_parity).
        self.run_subtests({"reshard_after_forward": [True, False]}, self._train_parity)

    def _train_parity(self, reshard_after_forward):
        torch.manual_seed(42)
        model = torch.nn.Sequential(MLP(8, self.device), MLP(8, self.device))
        ref = copy.deepcopy(model)
        for layer in model:
            fully_shard(layer, reshard_after_forward=reshard_after_forward)
        fully_shard(model, reshard_after_forward=reshard_after_forward)
        self.assertEqual(next(model.parameters()).to_local().device, self.device)
        opt = torch.optim.SGD(model.parameters(), lr=1e-2)
        ref_opt = torch.optim.SGD(ref.parameters(), lr=1e-2)
        torch.manual_seed(42 + self.rank + 1)  # each rank its own data
        for _ in range(3):
            x = torch.randn(4, 8, device=self.device)
            losses = []
            for m, o in ((model, opt), (ref, ref_opt)):
                o.zero_grad()
                loss = m(x).sum()
                loss.backward()
                if m is ref:
                    for p in ref.parameters():
                        dist.all_reduce(p.grad, op=dist.ReduceOp.AVG)
                losses.append(loss.detach())
            self.assertEqual(losses[0], losses[1])
            check_sharded_parity(self, ref, model)
            opt.step()
            ref_opt.step()
