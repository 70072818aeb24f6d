#!/usr/bin/env bash
# The test suite: runtime unit tests (GoogleTest via CTest), the packaging
# check (wheel installed into a fresh venv), the device/ops/OpInfo-subset and
# NKI tests in protect mode, a subset with synchronous launches, then the
# Python tests (device, ops incl. the OpInfo differential subset, autograd, HF, Diffusers, NKI, tools, and
# torch.distributed on the `neuron` backend: world-2 jobs in tests/distributed,
# about 10 minutes; pass -m "not distributed" to skip them).
set -euo pipefail
cd "$(dirname "$0")/.."
ctest --test-dir build/cmake --output-on-failure
bash scripts/check_wheel.sh
# Protect mode: device memory only through the runtime API (docs/runtime.md).
NEURON_RT_PROTECT=1 python3 -m pytest -q -p no:cacheprovider tests/test_protect.py tests/test_device.py \
  tests/test_errors.py tests/test_memory.py tests/test_autograd.py tests/test_compile.py tests/test_opinfo.py tests/test_nki.py \
  tests/test_async.py tests/test_streams.py tests/test_graphs.py tests/test_graphs_replay.py tests/distributed/test_collectives.py \
  tests/device_generic/test_direct_kernels.py tests/device_generic/test_gemv.py
# Synchronous launches (NEURON_RT_LAUNCH_BLOCKING=1): the same semantics without the executors.
NEURON_RT_LAUNCH_BLOCKING=1 python3 -m pytest -q -p no:cacheprovider tests/test_streams.py tests/test_graphs.py tests/test_graphs_replay.py tests/test_errors.py \
  tests/test_memory.py tests/test_autograd.py tests/test_random.py tests/device_generic/test_gemv.py
python3 -m pytest -q -p no:cacheprovider tests "$@"
