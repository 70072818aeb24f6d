import torch

# The op namespace is the kernel's metadata id, so two kernel versions loaded
# side by side register distinct operators.
_NAMESPACE = "_rmsnorm_nki_neuron_7c31e5a"
ops = torch.ops._rmsnorm_nki_neuron_7c31e5a


def add_op_namespace_prefix(op_name: str) -> str:
    return f"{_NAMESPACE}::{op_name}"
