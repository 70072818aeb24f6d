"""Compatibility steps for torch.distributed releases that need one.

Each step is gated on the torch version that needs it and removed when the
minimum supported torch no longer does (tests/distributed/test_init.py names
the upstream fix for each).

torch < 2.14: bare ``init_process_group()`` (also called by
``init_device_mesh`` and FSDP2's default mesh) binds the backend of the
accelerator to the "neuron" device only and marks GLOO as the group's
default backend type (torch/distributed/distributed_c10d.py,
``BackendConfig.__init__`` and ``_new_process_group_helper``). No Gloo
backend exists in that group, so DDP fails with "Could not find backend
type 1" and cpu collectives (object collectives, barrier) find no backend.
Fixed upstream by pytorch/pytorch#179901. The step: after such a group is
created, make the neuron backend its default and bind it to "cpu" as well,
which is what ``init_process_group("neuron")`` does.
"""
import functools

import torch
import torch.distributed as dist

_BARE_INIT_FIXED_IN = (2, 14)


def _torch_version() -> tuple:
    return tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2])


def bare_init_needs_fix() -> bool:
    return _torch_version() < _BARE_INIT_FIXED_IN


def _bind_bare_group(pg) -> None:
    neuron = torch.device("neuron")
    try:
        backend = pg._get_backend(neuron)
    except RuntimeError:
        return
    if backend.name() != "neuron":
        return
    pg._set_default_backend(dist.ProcessGroup.BackendType.CUSTOM)
    cpu = torch.device("cpu")
    try:
        pg._get_backend(cpu)
    except RuntimeError:
        pg._register_backend(cpu, dist.ProcessGroup.BackendType.CUSTOM, backend)


def install() -> None:
    if not bare_init_needs_fix():
        return
    c10d = dist.distributed_c10d
    original = c10d._new_process_group_helper
    if getattr(original, "_neuron_bare_init_fix", False):
        return

    @functools.wraps(original)
    def _new_process_group_helper(group_size, group_rank, global_ranks_in_group, backend, *args, **kwargs):
        pg, store = original(group_size, group_rank, global_ranks_in_group, backend, *args, **kwargs)
        if str(backend) == dist.Backend.UNDEFINED and isinstance(pg, dist.ProcessGroup):
            _bind_bare_group(pg)
        return pg, store

    _new_process_group_helper._neuron_bare_init_fix = True
    c10d._new_process_group_helper = _new_process_group_helper
