"""``NeuronPlatform``: vLLM's platform for the ``neuron`` device.

It subclasses vLLM's CPU platform: our device runs every ATen op (and, through
the host fallback, vLLM's own CPU custom ops) in place on device memory, so the
CPU platform's choices — its attention backend (CPU_ATTN), its kernels, no CUDA
graphs — are the right ones. What differs is the device (``neuron``), where the
weights and KV cache live, how the cache is sized (from the device's HBM budget,
not host memory) and the collectives (our c10d backend); see docs/serving.md.
"""

from __future__ import annotations

import os

import torch
from vllm.platforms.cpu import CpuPlatform
from vllm.platforms.interface import PlatformEnum

from .._env import parse_flag
from . import env_flag

WORKER = "torch_neuronx.vllm.worker.NeuronWorker"
# KV cache size in GiB on each device, as VLLM_CPU_KVCACHE_SPACE on the CPU platform;
# unset: a share of the HBM budget (--gpu-memory-utilization), see worker.py.
KVCACHE_ENV = "VLLM_NEURON_KVCACHE_SPACE"
# "0": the model runs eagerly even where vLLM would compile it (as enforce_eager=True).
COMPILE_ENV = "TORCH_NEURONX_VLLM_COMPILE"
# "0": no async scheduling; unset or "1": as vLLM decides it (on unless excluded).
ASYNC_SCHEDULING_ENV = "TORCH_NEURONX_VLLM_ASYNC_SCHEDULING"
# libgomp's wait settings: the platform sets the first for the processes vLLM spawns
# unless either is set (passive_openmp_waits).
OPENMP_WAIT_ENVS = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")


def async_scheduling_from_env() -> bool:
    return parse_flag(ASYNC_SCHEDULING_ENV, os.environ.get(ASYNC_SCHEDULING_ENV, "").strip(), True)


def kv_cache_bytes_from_env() -> int | None:
    value = os.environ.get(KVCACHE_ENV, "").strip()
    if not value:
        return None
    try:
        gib = float(value)
    except ValueError:
        gib = -1.0
    if not gib > 0:
        raise ValueError(f"{KVCACHE_ENV}={value!r} is invalid: a positive number of GiB (e.g. 1 or 0.5).")
    return int(gib * (1 << 30))


def passive_openmp_waits() -> None:
    """OMP_WAIT_POLICY=PASSIVE for the processes vLLM spawns from here on (the engine core, its
    workers), unless the user chose a wait policy. At more than one thread an engine process
    runs two OpenMP teams (its Python thread's and the stream executor's, which runs vLLM's
    attention and Inductor's kernels) beside the runtime's GEMM worker; with libgomp's default a
    thread that waits at a team's barrier spins for milliseconds, and when its partner has lost
    its core every barrier costs scheduler time slices (a decode-like step 2-5x slower than at one
    thread, docs/serving.md). libgomp reads this when torch loads it, so it can only be set for
    processes not started yet; the caller's own process is unchanged."""
    if not any(os.environ.get(name) for name in OPENMP_WAIT_ENVS):
        os.environ["OMP_WAIT_POLICY"] = "PASSIVE"


class NeuronPlatform(CpuPlatform):
    # Out of tree, not CPU: vLLM's `is_cpu()` branches prepack weights into
    # host-side oneDNN objects and call host-only kernels; as OOT the layers run
    # their native torch code (forward_native, F.linear) on the device tensors.
    _enum = PlatformEnum.OOT
    device_name: str = "neuron"
    device_type: str = "neuron"
    dispatch_key: str = "PrivateUse1"
    # Launchers (and ours) select cores with the runtime's own variable.
    device_control_env_var: str = "NEURON_RT_VISIBLE_CORES"
    # Tensor parallel collectives over our c10d backend (docs/distributed.md): it takes the
    # device tensors in place; vLLM's CPU process groups stay on gloo.
    dist_backend: str = "neuron"

    @classmethod
    def get_device_communicator_cls(cls) -> str:
        # torch.distributed on the device group. Not the CPU communicator: its shared-memory
        # path calls vLLM's host-only kernels on the tensors' raw pointers.
        return "vllm.distributed.device_communicators.base_device_communicator.DeviceCommunicatorBase"

    @classmethod
    def get_device_name(cls, device_id: int = 0) -> str:
        return torch.neuron.get_device_name(device_id)

    @classmethod
    def get_device_total_memory(cls, device_id: int = 0) -> int:
        # The HBM budget of the core (NEURON_RT_HBM_BYTES), not host memory.
        return torch.neuron.mem_get_info(device_id)[1]

    @classmethod
    def is_pin_memory_available(cls) -> bool:
        # The runner's host buffers are pinned, so their non_blocking copies to the device are
        # queued (docs/runtime.md): with async scheduling the next step's inputs are prepared
        # and sent while the device still runs the previous step.
        return True

    @classmethod
    def set_device(cls, device: torch.device) -> None:
        torch.neuron.set_device(device)

    @classmethod
    def manual_seed_all(cls, seed: int) -> None:
        torch.neuron.manual_seed_all(seed)

    @classmethod
    def get_current_memory_usage(cls, device: torch.types.Device | None = None) -> float:
        return float(torch.neuron.memory_allocated(device))

    @classmethod
    def import_kernels(cls) -> None:
        super().import_kernels()  # vLLM's CPU kernels (its _C library)
        from . import kernels

        kernels.register()

    @classmethod
    def register_triton_kernel_overrides(cls) -> None:
        from . import _compat

        with _compat.llvmlite_hidden():
            super().register_triton_kernel_overrides()

    @classmethod
    def check_and_update_config(cls, vllm_config) -> None:
        # Our own version of the CPU platform's settings that apply to this device
        # (its own method asserts the device type is "cpu" and tunes host threads,
        # NUMA binding and LD_PRELOAD, which do not concern device memory).
        from vllm.config import CompilationMode

        cache_config = vllm_config.cache_config
        if not cache_config.user_specified_block_size:
            cache_config.block_size = 128  # CPU_ATTN's preferred block size
        cache_bytes = kv_cache_bytes_from_env()
        if cache_bytes is not None and cache_config.kv_cache_memory_bytes is None:
            cache_config.kv_cache_memory_bytes = cache_bytes

        # Async scheduling (the host prepares step n+1 while the device runs step n) runs on
        # the device's streams and events (model_runner.py) and stays as vLLM decided it: on
        # the idle 2-core host it made offline serving faster in three of four pairs
        # (docs/serving.md). TORCH_NEURONX_VLLM_ASYNC_SCHEDULING=0 turns it off.
        if not async_scheduling_from_env():
            vllm_config.scheduler_config.async_scheduling = False

        parallel_config = vllm_config.parallel_config
        if parallel_config.worker_cls == "auto":
            parallel_config.worker_cls = WORKER
        parallel_config.enable_dbo = False
        parallel_config.disable_custom_all_reduce = True

        # No CUDA graphs. Where vLLM would compile (its default mode, not enforce_eager), the
        # model's forward is traced once by Dynamo with the token count symbolic and compiled
        # by Inductor, as on the CPU platform: neuron is an Inductor device (docs/compile.md),
        # so backend "inductor" compiles for it, and vLLM hands its Inductor options only to
        # that backend name. TORCH_NEURONX_VLLM_COMPILE=0 runs eagerly instead.
        compilation_config = vllm_config.compilation_config
        compilation_config.cudagraph_capture_sizes = []
        if compilation_config.mode == CompilationMode.VLLM_COMPILE:
            if not env_flag(COMPILE_ENV):
                compilation_config.mode = CompilationMode.NONE
            else:
                compilation_config.mode = CompilationMode.DYNAMO_TRACE_ONCE
                compilation_config.backend = "inductor"
                # The CPU platform's Inductor settings; no combo kernels (vLLM turns them on for
                # any platform but CPU; Inductor's C++ backend, which neuron's uses, has none).
                compilation_config.inductor_compile_config.update(
                    {"dce": True, "size_asserts": False, "nan_asserts": False, "epilogue_fusion": True,
                     "combo_kernels": False, "benchmark_combo_kernel": False})
                compilation_config.ir_enable_torch_wrap = False
        if vllm_config.lora_config is not None:
            compilation_config.mode = CompilationMode.NONE
        vllm_config.profiler_config.torch_profiler_dump_cuda_time_total = False

        # Workers start by spawn: a forked child would inherit the parent's
        # runtime threads (docs/runtime.md, fork safety).
        os.environ["VLLM_WORKER_MULTIPROC_METHOD"] = "spawn"
        os.environ["LOCAL_WORLD_SIZE"] = str(parallel_config.tensor_parallel_size)
        passive_openmp_waits()
