"""Reader of the per-host process registry that the runtime keeps in
/dev/shm (csrc/runtime/Registry.h: one fixed-layout file per process). It imports
neither torch nor torch_neuronx."""
from __future__ import annotations

import glob
import os
import struct
from dataclasses import dataclass, field

MAX_DEVICES = 128
_HEADER = struct.Struct("<8sIiQii256s")          # magic .. command: 288 bytes
_DEVICE = struct.Struct("<QQQQQii")               # 48 bytes
RECORD_SIZE = _HEADER.size + MAX_DEVICES * _DEVICE.size
MAGIC = b"NRTREG1\0"
PATTERN = "/dev/shm/neuron-rt.*"


@dataclass
class DeviceUse:
    index: int
    physical_core: int
    capacity: int
    allocated_bytes: int
    reserved_bytes: int
    busy_ns: int
    launches: int


@dataclass
class Process:
    pid: int
    command: str
    start_unix_ns: int
    devices: list = field(default_factory=list)

    def used(self):
        """Devices this process has touched (memory held or kernels run)."""
        return [d for d in self.devices if d.reserved_bytes or d.launches]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def parse(data: bytes) -> Process | None:
    if len(data) < RECORD_SIZE:
        return None
    magic, version, pid, start, count, _, command = _HEADER.unpack_from(data, 0)
    if magic != MAGIC or version != 1:
        return None
    proc = Process(pid, command.split(b"\0", 1)[0].decode(errors="replace").strip(), start)
    for i in range(min(count, MAX_DEVICES)):
        alloc, reserved, busy, launches, capacity, core, _ = _DEVICE.unpack_from(data, _HEADER.size + i * _DEVICE.size)
        proc.devices.append(DeviceUse(i, core, capacity, alloc, reserved, busy, launches))
    return proc


def processes(pattern: str = PATTERN) -> list[Process]:
    """Live processes using the runtime on this host (stale records of dead
    processes are skipped), ordered by pid."""
    out = []
    for path in glob.glob(pattern):
        try:
            with open(path, "rb") as f:
                proc = parse(f.read(RECORD_SIZE))
        except OSError:
            continue
        if proc is not None and _alive(proc.pid) and path.endswith(f".{proc.pid}"):
            out.append(proc)
    return sorted(out, key=lambda p: p.pid)


_UNITS = {"": 1, "B": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


def _size(text: str) -> int:
    t = text.strip().upper().replace("IB", "").rstrip("B") or "0"
    num = t.rstrip("KMGT")
    return int(float(num) * _UNITS[t[len(num):]])


def cores():
    """The NeuronCores this environment exposes, [(core, name, capacity)],
    from the variables the runtime reads (docs/env.md) without importing torch
    (so the tools start at once); the runtime itself validates them."""
    visible = os.environ.get("NEURON_RT_VISIBLE_CORES", "").strip()
    try:
        if visible:
            ids = []
            for item in filter(None, visible.split(",")):
                lo, _, hi = item.partition("-")
                ids += range(int(lo), int(hi or lo) + 1)
        else:
            ids = range(int(os.environ.get("NEURON_RT_NUM_CORES", "") or 2))
        capacity = _size(os.environ.get("NEURON_RT_HBM_BYTES", "") or "16G")
    except (ValueError, KeyError):
        raise SystemExit("neuron tools: malformed NEURON_RT_VISIBLE_CORES, NEURON_RT_NUM_CORES or "
                         "NEURON_RT_HBM_BYTES (see docs/env.md)")
    return [(core, "NeuronCore-v3 (host runtime)", capacity) for core in ids]


def format_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"
