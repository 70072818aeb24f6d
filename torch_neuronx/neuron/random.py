"""Random number state of the neuron devices (one Philox generator each)."""
import torch

from .. import _C
from ._utils import _get_device_index



# One default generator per device, created at import so that the name
# re-exported as torch.neuron.default_generators is the populated tuple.
default_generators: tuple = tuple(_C._default_generator(i) for i in range(_C._device_count()))


def _generators():
    return default_generators


def _gen(device):
    gens = _generators()
    return gens[_get_device_index(device, optional=True)] if not isinstance(device, int) else gens[device]


def manual_seed(seed: int) -> None:
    _gen(None).manual_seed(int(seed))


def manual_seed_all(seed: int) -> None:
    for g in _generators():
        g.manual_seed(int(seed))


def seed() -> None:
    _gen(None).seed()


def seed_all() -> None:
    s = _gen(None).seed()
    for g in _generators():
        g.manual_seed(s)


def initial_seed() -> int:
    return _gen(None).initial_seed()


def get_rng_state(device="neuron") -> torch.Tensor:
    """16-byte ByteTensor: Philox seed then offset (little-endian u64 each)."""
    return _gen(device).get_state()


def set_rng_state(new_state: torch.Tensor, device="neuron") -> None:
    _gen(device).set_state(new_state.cpu() if new_state.device.type != "cpu" else new_state)


def get_rng_state_all() -> list:
    return [g.get_state() for g in _generators()]


def set_rng_state_all(new_states) -> None:
    for g, state in zip(_generators(), new_states):
        g.set_state(state)
