"""``NeuronModelRunner``: vLLM's model runner with a neuron device.

vLLM's CPU runner is its GPU runner with every device-side buffer replaced by its
host twin. Ours keeps the GPU runner's split: host buffers are prepared by the
scheduler side and copied to the device each step, the weights and KV cache
live in device memory, and sampling runs on the device.
"""

from __future__ import annotations

import torch
from vllm.v1.worker.cpu_model_runner import CPUModelRunner
from vllm.v1.worker.gpu_model_runner import GPUModelRunner

from . import _compat


class NeuronModelRunner(CPUModelRunner):
    def __init__(self, vllm_config, device: torch.device):
        # CPUModelRunner.__init__ asserts a CPU device and points the device
        # buffers at the host ones; we construct the GPU runner directly, with
        # CUDA streams and events stubbed out while it builds them.
        with _compat.no_cuda_streams():
            GPUModelRunner.__init__(self, vllm_config, device)
        self.use_cuda_graph = False

    def _sync_device(self) -> None:
        torch.neuron.synchronize(self.device)
