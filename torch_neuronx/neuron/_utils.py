import torch


def _get_device_index(device=None, optional: bool = False, allow_cpu: bool = False) -> int:
    """Device index of ``device`` ("neuron:1", torch.device, int or None).

    ``torch.load(map_location="neuron:1")`` relies on this to keep the index.
    """
    if device is None:
        if optional:
            return torch.neuron.current_device()
        raise ValueError("Expected a neuron device, got None")
    if isinstance(device, int):
        return device
    if isinstance(device, str):
        device = torch.device(device)
    if isinstance(device, torch.device):
        if allow_cpu and device.type == "cpu":
            return -1
        if device.type != "neuron":
            raise ValueError(f"Expected a neuron device, but got: {device}")
        if device.index is None:
            if optional:
                return torch.neuron.current_device()
            raise ValueError(f"Expected a neuron device with an index, got: {device}")
        return device.index
    raise ValueError(f"Cannot interpret {device!r} as a neuron device")
