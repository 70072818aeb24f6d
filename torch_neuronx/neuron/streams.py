"""Streams and events on neuron devices: a torch.Stream subclass, and torch.Event factories."""
import torch

from ._utils import _get_device_index


_POOL_SIZE = 32  # streams per priority pool (kPoolSize, csrc/runtime/Stream.h)


def _device(device):
    return torch.device("neuron", _get_device_index(device, optional=True))


class Stream(torch.Stream):
    """An in-order queue of device work. ``priority`` < 0 is high priority."""

    def __new__(cls, device=None, priority=0, **kwargs):
        if "stream_id" in kwargs:  # wrapping an existing stream
            return super().__new__(cls, **kwargs)
        return super().__new__(cls, device=_device(device), priority=priority)

    @property
    def priority(self) -> int:
        """0 (normal) or -1 (high), as ``torch.cuda.Stream.priority``. The runtime
        numbers streams 0 (default), 1..32 (normal pool), 33..64 (high pool)."""
        return -1 if self.stream_id > _POOL_SIZE else 0

    @classmethod
    def _wrap(cls, s: torch.Stream) -> "Stream":
        return cls(stream_id=s.stream_id, device_index=s.device_index, device_type=s.device_type)


class _EventMeta(type):
    def __instancecheck__(cls, obj):
        return isinstance(obj, torch.Event) and obj.device.type == "neuron"


class Event(torch.Event, metaclass=_EventMeta):
    """A marker in a neuron stream, for synchronization and timing.

    Instances are plain ``torch.Event`` objects: torch's C methods
    (``Event.elapsed_time``, ``Stream.record_event``) accept only that exact
    type, not Python subclasses. ``isinstance(e, torch.neuron.Event)`` holds
    for every neuron event.
    """

    def __new__(cls, enable_timing=False, blocking=False, interprocess=False, device=None):
        return torch.Event(device=_device(device), enable_timing=enable_timing, blocking=blocking,
                           interprocess=interprocess)


def current_stream(device=None) -> Stream:
    return Stream._wrap(torch.accelerator.current_stream(_device(device)))


def default_stream(device=None) -> Stream:
    d = _device(device)
    # torch.Stream takes the device type as its c10 enum value (an int), not "neuron".
    device_type = torch.accelerator.current_stream(d).device_type
    return Stream(stream_id=0, device_index=d.index, device_type=device_type)


def set_stream(stream: torch.Stream) -> None:
    if stream is not None:
        torch.accelerator.set_stream(stream)


class StreamContext:
    """Makes ``stream`` current on its device for the block (None: no-op)."""

    def __init__(self, stream):
        self.stream = stream
        self.src_prev = self.dst_prev = None

    def __enter__(self):
        if self.stream is not None:
            # torch.accelerator.set_stream also makes the stream's device
            # current, so remember the current device's stream too (as
            # torch.cuda.StreamContext does) and restore it last.
            self.src_prev = torch.accelerator.current_stream()
            self.dst_prev = torch.accelerator.current_stream(self.stream.device)
            torch.accelerator.set_stream(self.stream)
        return self.stream

    def __exit__(self, *args):
        if self.stream is not None:
            torch.accelerator.set_stream(self.dst_prev)
            torch.accelerator.set_stream(self.src_prev)
        return False


def stream(stream) -> StreamContext:
    return StreamContext(stream)
