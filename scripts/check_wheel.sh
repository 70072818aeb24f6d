#!/usr/bin/env bash
# Packaging check: build a wheel (a non-editable install must carry every
# subpackage), install it into a fresh virtual environment that takes torch
# from the system, and use the device from there. The wheel build reuses
# build/cmake (and ccache), so after a normal build it only repackages.
set -euo pipefail
cd "$(dirname "$0")/.."
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
python3 -m pip wheel . --no-deps --no-build-isolation --quiet --wheel-dir "$tmp/dist"
python3 -m venv --system-site-packages "$tmp/venv"
"$tmp/venv/bin/python" -m pip install --no-deps --no-build-isolation --quiet "$tmp"/dist/torch_neuronx-*.whl
# From a neutral directory, so the source tree cannot be imported by accident.
cd "$tmp"
env -u PYTHONPATH "$tmp/venv/bin/python" - "$tmp/venv" <<'PY'
import sys
import torch  # autoloads the installed torch-neuronx
import torch_neuronx
import torch_neuronx.neuron
import nki

venv = sys.argv[1]
for mod in (torch_neuronx, torch_neuronx.neuron, torch_neuronx._C, nki):
    assert mod.__file__.startswith(venv), f"imported {mod.__file__}, not the wheel in {venv}"
assert torch.neuron is torch_neuronx.neuron
# AOTInductor precompiles the neuron device header from the installed package.
from torch_neuronx._compile.cpp_wrapper import AOTI_INCLUDE as _AOTI_INCLUDE
import os
assert os.path.isfile(os.path.join(_AOTI_INCLUDE, "torch/csrc/inductor/aoti_include/neuron.h")), _AOTI_INCLUDE
x = torch.arange(6, dtype=torch.float32)
y = (x.to("neuron") * 2 + 1).sum()
assert y.device.type == "neuron" and y.item() == ((x * 2 + 1).sum()).item()
print(f"wheel OK: {torch_neuronx.__file__}, {y.device}")
PY
# The tools' extension ships too: neuron-ls reads the runtime's configuration.
env -u PYTHONPATH "$tmp/venv/bin/neuron-ls" --json | "$tmp/venv/bin/python" -c \
  'import json, sys; assert json.load(sys.stdin)["cores"], "neuron-ls lists no core"'
echo "neuron-ls OK"
