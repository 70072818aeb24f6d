#!/usr/bin/env bash
# The test suite: runtime unit tests (GoogleTest via CTest), the packaging
# check (wheel installed into a fresh venv), then the Python tests (device,
# ops incl. the OpInfo differential subset, autograd, HF smoke).
set -euo pipefail
cd "$(dirname "$0")/.."
ctest --test-dir build/cmake --output-on-failure
bash scripts/check_wheel.sh
python3 -m pytest -q -p no:cacheprovider tests "$@"
