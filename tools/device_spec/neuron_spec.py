"""Device spec for running Transformers' and Diffusers' own test suites on `neuron`.

    cd tools/device_spec
    TRANSFORMERS_TEST_DEVICE=neuron TRANSFORMERS_TEST_DEVICE_SPEC=neuron_spec.py \
        python -m pytest <transformers checkout>/tests/models/llama
    DIFFUSERS_TEST_DEVICE=neuron DIFFUSERS_TEST_DEVICE_SPEC=neuron_spec.py \
        python -m pytest <diffusers checkout>/tests/models

Both libraries import this file by the file name given (relative to the working
directory, hence the `cd`) and read the names below.
"""
import torch
import torch_neuronx  # noqa: F401  (registers the device even with autoload disabled)

DEVICE_NAME = "neuron"

MANUAL_SEED_FN = torch.neuron.manual_seed
EMPTY_CACHE_FN = torch.neuron.empty_cache
DEVICE_COUNT_FN = torch.neuron.device_count

# Diffusers only.
SUPPORTS_TRAINING = True
RESET_PEAK_MEMORY_STATS_FN = torch.neuron.reset_peak_memory_stats
RESET_MAX_MEMORY_ALLOCATED_FN = torch.neuron.reset_max_memory_allocated
MAX_MEMORY_ALLOCATED_FN = torch.neuron.max_memory_allocated
