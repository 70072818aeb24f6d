"""The ``neuron`` torch.distributed backend.

``init_process_group("neuron")`` (or ``device_id=torch.device("neuron", r)``,
``"cpu:gloo,neuron:neuron"``, or no backend at all) creates a
``ProcessGroupNeuron`` (csrc/distributed/): a C++ c10d backend that serves
neuron *and* cpu tensors. Its transport is a per-group ``ProcessGroupGloo``
working on zero-copy host views of device memory; the backend adds
PREMUL_SUM, fp8 data movement, futures on the neuron device, split(),
abort and timeouts that name the collective.

Registered when ``torch_neuronx`` is imported (``import torch`` autoloads it);
``torch.distributed`` is already imported by then, so this costs nothing.
"""
import atexit
import os
from datetime import timedelta

import torch
import torch.distributed as dist

from . import _C

__all__ = ["ProcessGroupNeuron", "BACKEND_NAME", "is_available"]

BACKEND_NAME = "neuron"

ProcessGroupNeuron = _C._distributed.ProcessGroupNeuron


def is_available() -> bool:
    """True when torch.distributed and its Gloo transport are built in."""
    return dist.is_available() and dist.is_gloo_available()


# The vendor product's collective variables (its "Distributed" environment
# table). They size how it splits large all_gather / reduce_scatter into
# several device collectives (bucket size, minimum bucket count, on/off).
# This backend has nothing to split: Gloo moves whole messages and the
# shared-memory path steps through fixed 4 MiB halves whatever the size. So
# they are accepted (code written for the product sets them) and checked,
# a malformed value raising ValueError naming the variable, but change nothing.
_PRODUCT_COLLECTIVE_ENV = {
    "NEURON_USE_SPLIT_ALLGATHER": "bool",
    "NEURON_USE_SPLIT_REDUCE_SCATTER": "bool",
    "COLLECTIVE_BUCKETSIZE_IN_MB": "positive",
    "COLLECTIVE_MIN_BUCKETS": "non-negative",
}


def _check_product_env():
    for name, kind in _PRODUCT_COLLECTIVE_ENV.items():
        value = os.environ.get(name)
        if value is None or value == "":
            continue
        v = value.strip()
        if kind == "bool":
            if v.lower() not in ("0", "1", "true", "false"):
                raise ValueError(f"{name} must be 0, 1, true or false, got {value!r}")
            continue
        try:
            number = int(v, 10)
        except ValueError:
            number = None
        low = 1 if kind == "positive" else 0
        if number is None or number < low:
            raise ValueError(f"{name} must be a {kind} integer, got {value!r}")


def _create_backend(backend_opts, pg_options):
    """``Backend.register_backend`` creator (extended API).

    ``backend_opts`` is the c10d ``_DistributedBackendOptions`` of the new
    group; ``pg_options`` is ``init_process_group(pg_options=...)``/
    ``new_group(pg_options=...)``: ``None`` or a ``ProcessGroupNeuron.Options``.
    """
    _check_product_env()
    if pg_options is not None and not isinstance(pg_options, ProcessGroupNeuron.Options):
        raise TypeError(
            f"the neuron backend takes pg_options of type ProcessGroupNeuron.Options, got {type(pg_options).__name__}")
    timeout = backend_opts.timeout
    if not isinstance(timeout, timedelta):
        timeout = timedelta(seconds=float(timeout))
    # Our own copy: the caller's options object is not modified.
    options = ProcessGroupNeuron.Options(timeout) if pg_options is None else pg_options.__deepcopy__({})
    options._timeout = timeout
    options.group_name = backend_opts.group_id
    options.global_ranks_in_group = list(backend_opts.global_ranks_in_group)
    # The store protocol (a per-attempt prefix, the transport's keys below it)
    # is defined once, in C++ (csrc/distributed/StoreKeys.h).
    store = dist.PrefixStore(_C._distributed._attempt_prefix(), backend_opts.store)
    transport_store = dist.PrefixStore(_C._distributed._TRANSPORT_PREFIX, store)
    transport = dist.ProcessGroupGloo(transport_store, backend_opts.group_rank,
                                      backend_opts.group_size, timeout)
    return ProcessGroupNeuron(transport, backend_opts.group_rank, backend_opts.group_size, options, store=store)


def _register():
    if not is_available() or BACKEND_NAME.upper() in dist.Backend._plugins:
        return
    # "cpu" too: object collectives and barrier() pick the cpu backend of a
    # group, and compiled graphs hand collectives host aliases.
    dist.Backend.register_backend(BACKEND_NAME, _create_backend, extended_api=True, devices=["neuron", "cpu"])
    from . import _compile

    _compile.install("distributed")
    # Before finalization: completions that finish on transport threads drop
    # tensor references (and take the GIL); see quiesceCompletions.
    atexit.register(_C._distributed._quiesce_completions, timedelta(seconds=30))
