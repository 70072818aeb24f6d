"""The `neuron` executor of nki (nki/_device.py): launches on the device's
current stream, host aliases of device memory, and the runtime's compiled
record programs (csrc/runtime/nki). nki loads it through the ``nki.executors``
entry point on its first device kernel; importing it registers nothing by
itself, so ``import torch`` stays light."""
import torch

from .. import _C


class NeuronExecutor:
    device_type = "neuron"
    native_layout = tuple(_C._nki_layout)

    def current_device(self) -> int:
        return torch.neuron.current_device()

    def host_alias(self, tensor):
        return _C._host_alias(tensor)

    def launch(self, index, fn, name="nki_kernel"):
        return _C._launch(index, fn, name)

    def native_program(self, words, imms, buffers, arena_bytes, name):
        return _C._NkiProgram(words, imms, buffers, arena_bytes, name)
