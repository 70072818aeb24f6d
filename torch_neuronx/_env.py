"""The Python layer's environment variables, the vendor TorchNeuron names among
them (docs/env.md, docs/compat.md).

The runtime parses its own ``NEURON_RT_*`` variables (and the product's
``NEURON_LAUNCH_BLOCKING`` alias) in C++. The variables here are read when
used; a malformed value raises ``ValueError`` naming the variable, at first
device use as for the runtime's (``check()``) and wherever it is read.
"""
import os

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")

# name -> default, for the boolean variables this layer reads.
FLAGS = {
    # Product: a neuron implementation that fails raises instead of retrying on
    # the CPU. Ours never retries, so both values behave as 1 (docs/compat.md).
    "TORCH_NEURONX_FALLBACK_ONLY_FOR_UNIMPLEMENTED_OPS": True,
    # A torch.compile(backend="neuron") graph that fails to compile raises (1)
    # or runs eagerly (0); the `fallback_execution` option overrides it.
    "TORCH_NEURONX_DISABLE_FALLBACK_EXECUTION": True,
    # Compile artifacts are never deleted here: accepted for compatibility.
    "TORCH_NEURONX_PRESERVE_COMPILATION_ARTIFACTS": False,
    # The product's two spellings: no persistent compile cache for neuron graphs.
    "TORCH_NEURONX_DISABLE_NEFF_CACHE": False,
    "TORCH_NEURONX_NEFF_DISABLE_CACHE": False,
}


def flag(name: str) -> bool:
    """The boolean variable ``name`` (its default when unset or empty)."""
    return parse_flag(name, os.environ.get(name, ""), FLAGS[name])


def parse_flag(name: str, value: str, default: bool) -> bool:
    """``value`` of boolean variable ``name``; ``default`` when empty."""
    if not value:
        return default
    if value.lower() in _TRUE:
        return True
    if value.lower() in _FALSE:
        return False
    raise ValueError(f"{name}={value!r} is invalid. Accepted: 0 or 1 (also false/true, no/yes, off/on).")


def path(name: str):
    """The directory variable ``name``, or None when unset or empty."""
    value = os.environ.get(name, "")
    return value or None


def neff_cache_disabled() -> bool:
    """Either of the product's spellings of "no persistent compile cache"."""
    return flag("TORCH_NEURONX_DISABLE_NEFF_CACHE") or flag("TORCH_NEURONX_NEFF_DISABLE_CACHE")


def check() -> None:
    """Validates every variable of this layer (called where the runtime's are)."""
    for name in FLAGS:
        flag(name)


def apply_cache_dir() -> None:
    # The product's persistent compile cache directory is Inductor's cache
    # directory here (compiled graphs and kernels); an explicit
    # TORCHINDUCTOR_CACHE_DIR wins.
    cache = path("TORCH_NEURONX_NEFF_CACHE_DIR")
    if cache and not os.environ.get("TORCHINDUCTOR_CACHE_DIR"):
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache
