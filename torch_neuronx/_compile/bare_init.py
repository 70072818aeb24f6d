"""Bare ``init_process_group()`` makes the neuron backend the group's default,
as ``init_process_group("neuron")`` does (torch < 2.14; docs/distributed.md)."""
import functools

import torch
import torch.distributed as dist


def bare_init_needs_fix() -> bool:
    """Probe: this torch predates the upstream fix (pytorch/pytorch#179901, 2.14)."""
    return tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2]) < (2, 14)


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
    """Wraps ``_new_process_group_helper``: a group created without a backend
    gets ``_bind_bare_group`` applied."""
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
