"""Default ``torch.compile`` (Inductor) on neuron tensors.

``torch.compile(model)`` and Transformers' automatic decode compilation use
``backend="inductor"``, which hands graphs to
``torch._inductor.compile_fx.compile_fx``. For graphs whose inputs live on
``neuron`` we select the neuron lowering (torch_neuronx._dynamo), which runs
Inductor's C++ code generation on the host view of device memory, instead of
lowering for a device type Inductor's C++ backend does not know.

Installed at ``import torch_neuronx`` as a one-shot import hook, so nothing of
Dynamo or Inductor is imported until the user compiles.
"""
from __future__ import annotations

import functools
import importlib.abc
import importlib.util
import sys

_TARGET = "torch._inductor.compile_fx"


def _has_neuron_tensor(example_inputs) -> bool:
    import torch

    return any(isinstance(t, torch.Tensor) and t.device.type == "neuron" for t in example_inputs)


def _wrap(module) -> None:
    original = module.compile_fx
    if getattr(original, "_neuron_aware", False):
        return

    @functools.wraps(original)
    def compile_fx(model_, example_inputs_, *args, **kwargs):
        if not args and set(kwargs) <= {"config_patches", "compile_region_name"} and _has_neuron_tensor(example_inputs_):
            from ._dynamo import neuron_backend

            return neuron_backend(model_, example_inputs_, options=kwargs.get("config_patches"))
        return original(model_, example_inputs_, *args, **kwargs)

    compile_fx._neuron_aware = True
    module.compile_fx = compile_fx


class _Loader(importlib.abc.Loader):
    def __init__(self, loader):
        self._loader = loader

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        _wrap(module)


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != _TARGET:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.loader is not None:
            spec.loader = _Loader(spec.loader)
        return spec


def install() -> None:
    module = sys.modules.get(_TARGET)
    if module is not None:
        _wrap(module)
    elif not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())
