"""Streams and events on neuron devices, as torch.Stream/torch.Event subclasses."""
import torch

from ._utils import _get_device_index


def _device(device):
    return torch.device("neuron", _get_device_index(device, optional=True))


class Stream(torch.Stream):
    """An in-order queue of device work. ``priority`` < 0 is high priority."""

    def __new__(cls, device=None, priority=0, **kwargs):
        if "stream_id" in kwargs:  # wrapping an existing stream
            return super().__new__(cls, **kwargs)
        return super().__new__(cls, device=_device(device), priority=priority)

    @classmethod
    def _wrap(cls, s: torch.Stream) -> "Stream":
        return cls(stream_id=s.stream_id, device_index=s.device_index, device_type=s.device_type)


class Event(torch.Event):
    def __new__(cls, enable_timing=False, blocking=False, interprocess=False, device=None):
        return super().__new__(cls, device=_device(device), enable_timing=enable_timing, blocking=blocking,
                               interprocess=interprocess)


def current_stream(device=None) -> Stream:
    return Stream._wrap(torch.accelerator.current_stream(_device(device)))


def default_stream(device=None) -> Stream:
    d = _device(device)
    return Stream(stream_id=0, device_index=d.index, device_type=d.type)


def set_stream(stream: torch.Stream) -> None:
    if stream is not None:
        torch.accelerator.set_stream(stream)


class StreamContext:
    """Makes ``stream`` current on its device for the block (None: no-op)."""

    def __init__(self, stream):
        self.stream = stream
        self.prev = None

    def __enter__(self):
        if self.stream is not None:
            self.prev = torch.accelerator.current_stream(self.stream.device)
            torch.accelerator.set_stream(self.stream)
        return self.stream

    def __exit__(self, *args):
        if self.stream is not None:
            torch.accelerator.set_stream(self.prev)
        return False


def stream(stream) -> StreamContext:
    return StreamContext(stream)
