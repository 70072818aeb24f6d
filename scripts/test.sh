#!/usr/bin/env bash
# The test suite: runtime unit tests (GoogleTest via CTest), then the Python
# tests (device, ops incl. the OpInfo differential subset, autograd, HF smoke,
# and torch.distributed on the `neuron` backend: world-2 jobs in
# tests/distributed, about 6 minutes; pass -m "not distributed" to skip them).
set -euo pipefail
cd "$(dirname "$0")/.."
ctest --test-dir build/cmake --output-on-failure
python3 -m pytest -q -p no:cacheprovider tests "$@"
