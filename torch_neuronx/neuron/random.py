"""Random number state of the neuron devices (docs/api.md, "Random numbers").

Each device has a default generator whose state is 16 bytes, seed then offset
(little-endian u64 each). In rng mode "cpu" (the default) random ops draw
from CPU engines, the default generators from the CPU default generator's, so
a seeded neuron run gives the numbers of its CPU run; in mode "philox" they
draw from the counter-based stream (seed, offset).
"""
import torch

from .. import _C
from ._utils import _get_device_index


# One default generator per device, created at import so that the name
# re-exported as torch.neuron.default_generators is the populated tuple.
default_generators: tuple = tuple(_C._default_generator(i) for i in range(_C._device_count()))

_RNG_MODES = ("cpu", "philox")


def _gen(device):
    return default_generators[_get_device_index(device, optional=True)]


def manual_seed(seed: int) -> None:
    _gen(None).manual_seed(int(seed))


def manual_seed_all(seed: int) -> None:
    for g in default_generators:
        g.manual_seed(int(seed))


def seed() -> None:
    _gen(None).seed()


def seed_all() -> None:
    s = _gen(None).seed()
    for g in default_generators:
        g.manual_seed(s)


def initial_seed() -> int:
    return _gen(None).initial_seed()


def get_rng_state(device="neuron") -> torch.Tensor:
    """16-byte ByteTensor: seed then offset (little-endian u64 each)."""
    return _gen(device).get_state()


def set_rng_state(new_state: torch.Tensor, device="neuron") -> None:
    """Restores a state from get_rng_state (16 bytes), or seeds from an 8-byte seed."""
    _gen(device).set_state(new_state.cpu())


def get_rng_state_all() -> list:
    return [g.get_state() for g in default_generators]


def set_rng_state_all(new_states) -> None:
    for g, state in zip(default_generators, new_states):
        g.set_state(state.cpu())


def get_rng_mode() -> str:
    """Where neuron random ops draw from: ``"cpu"`` or ``"philox"``."""
    return _C._get_rng_mode()


def set_rng_mode(mode: str) -> None:
    """Selects where neuron random ops draw from, from their next draw on.

    ``"cpu"`` (the default, also ``TORCH_NEURONX_RNG=cpu``): CPU engines, so
    after ``torch.manual_seed(s)`` neuron random tensors equal the CPU's.
    ``"philox"`` (``TORCH_NEURONX_RNG=philox``): the counter-based stream at
    each generator's (seed, offset), independent of the CPU generator.
    """
    if mode not in _RNG_MODES:
        raise ValueError(f"rng mode must be one of {_RNG_MODES}, got {mode!r}")
    _C._set_rng_mode(mode)
