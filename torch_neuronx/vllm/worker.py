"""``NeuronWorker``: vLLM's CPU worker placed on a neuron device.

The CPU worker is the closest: no CUDA graphs, no sleep mode. Ours binds one
NeuronCore instead of a NUMA node (rank i on neuron:i, collectives on the
platform's "neuron" c10d backend) and sizes the KV cache from that core's HBM
budget instead of host memory.
"""

from __future__ import annotations

import contextlib

import torch
from vllm.config import CompilationMode
from vllm.logger import init_logger
from vllm.platforms import current_platform
from vllm.utils.mem_utils import format_gib
from vllm.utils.torch_utils import set_random_seed
from vllm.v1.worker.cpu_worker import CPUWorker
from vllm.v1.worker.gpu_worker import Worker, init_worker_distributed_environment

from . import _compat, fast_exit
from .model_runner import NeuronModelRunner

_compat.restore_accelerator_functions()
_compat.neuron_streams_for_cuda_calls()

# Under "vllm." so that vLLM's logging configuration shows it.
logger = init_logger("vllm.torch_neuronx.worker")


def largest_allocation(budget: int) -> int:
    """The largest buffer whose allocation fits in ``budget`` bytes: the caching
    allocator rounds a large request up to a quarter step between powers of two
    (csrc/runtime/CachingAllocator.cpp), and vLLM allocates the cache as one buffer."""
    if budget <= 0:
        return 0
    pow2 = 1 << (budget.bit_length() - 1)
    quarters = budget * 4 // pow2  # 4..7: pow2 * quarters / 4 <= budget
    return pow2 * quarters // 4


class NeuronWorker(CPUWorker):
    def __init__(self, vllm_config, local_rank: int, rank: int, distributed_init_method: str,
                 is_driver_worker: bool = False):
        # Skips CPUWorker.__init__: its NUMA binding and host-memory check size
        # host memory, which holds neither the weights nor the cache here.
        Worker.__init__(self, vllm_config, local_rank, rank, distributed_init_method,
                        is_driver_worker=is_driver_worker)
        self.parallel_config.disable_custom_all_reduce = True
        fast_exit.install()

    def init_device(self):
        # One NeuronCore per rank: local rank i drives neuron:i.
        self.device = torch.device("neuron", self.local_rank % torch.neuron.device_count())
        torch.neuron.set_device(self.device)
        init_worker_distributed_environment(self.vllm_config, self.rank, self.distributed_init_method,
                                            self.local_rank, current_platform.dist_backend)
        set_random_seed(self.model_config.seed)
        self.model_runner = NeuronModelRunner(self.vllm_config, self.device)

    def _maybe_get_memory_pool_context(self, tag: str):
        return contextlib.nullcontext()  # no sleep mode: weights and cache stay put

    def _should_warm_up_model(self) -> bool:
        # Compiled execution: the warm-up run compiles the model (one graph, symbolic token
        # count) before the cache is sized, so the compile's buffers are counted. Eager: nothing.
        return self.compilation_config.mode != CompilationMode.NONE

    def determine_available_memory(self) -> int:
        """Bytes for the KV cache on this core: the explicit size when set
        (--kv-cache-memory-bytes or VLLM_NEURON_KVCACHE_SPACE), else
        --gpu-memory-utilization of the HBM budget less what is allocated (weights)."""
        if self._should_warm_up_model():
            self.model_runner.warming_up_model()
        torch.neuron.synchronize(self.device)
        torch.neuron.empty_cache()  # blocks freed while loading count as in use otherwise
        free, total = torch.neuron.mem_get_info(self.device)
        used = torch.neuron.memory_reserved(self.device)
        explicit = self.cache_config.kv_cache_memory_bytes
        if explicit is not None:
            if explicit > free:
                raise ValueError(
                    f"The KV cache asked for ({format_gib(explicit)} GiB) exceeds the free HBM of "
                    f"{self.device} ({format_gib(free)}/{format_gib(total)} GiB). Lower "
                    "--kv-cache-memory-bytes / VLLM_NEURON_KVCACHE_SPACE or raise NEURON_RT_HBM_BYTES.")
            size = explicit
        else:
            utilization = self.cache_config.gpu_memory_utilization
            size = largest_allocation(int(total * utilization) - used)
            if size <= 0:
                raise ValueError(
                    f"No HBM left for the KV cache on {self.device}: {format_gib(used)} GiB in use of "
                    f"{utilization:.2f} x {format_gib(total)} GiB. Raise --gpu-memory-utilization or "
                    "NEURON_RT_HBM_BYTES.")
        logger.info("KV cache on %s: %s GiB (HBM budget %s GiB, %s GiB held by the weights and buffers).", self.device,
                    format_gib(size), format_gib(total), format_gib(used))
        return size
