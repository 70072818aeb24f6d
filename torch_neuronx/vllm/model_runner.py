"""``NeuronModelRunner``: vLLM's model runner with a neuron device.

vLLM's CPU runner is its GPU runner with every device-side buffer replaced by its
host twin. Ours keeps the GPU runner's split: host buffers (pinned) are prepared by
the scheduler side and copied to the device each step by queued copies, the weights
and KV cache live in device memory, and sampling runs on the device. Its streams and
events are the device's (_compat.neuron_streams_for_cuda_calls, done by worker.py), so
the GPU runner's async scheduling works unchanged when turned on (platform.py): the
host prepares step n+1 while the device still runs step n.
"""

from __future__ import annotations

import torch
from vllm.v1.worker.cpu_model_runner import CPUModelRunner
from vllm.v1.worker.gpu_model_runner import GPUModelRunner


class NeuronModelRunner(CPUModelRunner):
    def __init__(self, vllm_config, device: torch.device):
        # CPUModelRunner.__init__ asserts a CPU device and points the device
        # buffers at the host ones; we construct the GPU runner directly.
        GPUModelRunner.__init__(self, vllm_config, device)
        self.use_cuda_graph = False

    def _sync_device(self) -> None:
        torch.neuron.synchronize(self.device)
