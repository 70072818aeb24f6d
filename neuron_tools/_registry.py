"""Reader of the per-host process registry that the runtime keeps in
/dev/shm (csrc/runtime/Registry.h: one fixed-layout file per process). The
layout and the environment's resolved configuration come from the runtime's
own code through ``neuron_tools._rtinfo``, a small extension without torch,
so nothing here repeats the runtime's definitions."""
from __future__ import annotations

import functools
import glob
import os
from dataclasses import dataclass, field

from . import _rtinfo

LAYOUT = _rtinfo.registry_layout()


@dataclass
class DeviceUse:
    index: int
    physical_core: int
    capacity: int
    allocated_bytes: int
    reserved_bytes: int
    busy_ns: int
    launches: int
    graph_replays: int = 0


@dataclass
class Process:
    pid: int
    command: str
    start_unix_ns: int
    target: str = ""
    device_name: str = ""
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


@functools.lru_cache(maxsize=1)
def _boot_unix_s() -> int | None:
    """The host's boot time (read once: neuron-top asks per record per refresh)."""
    try:
        with open("/proc/stat") as f:
            for line in f:
                if line.startswith("btime "):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def _started_unix_ns(pid: int) -> int | None:
    """When process `pid` started (Linux: /proc/<pid>/stat), or None."""
    boot = _boot_unix_s()
    try:
        with open(f"/proc/{pid}/stat") as f:
            ticks = int(f.read().rsplit(")", 1)[1].split()[19])
    except (OSError, ValueError, IndexError):
        return None
    if boot is None:
        return None
    return boot * 10**9 + ticks * 10**9 // os.sysconf("SC_CLK_TCK")


# /proc's boot time is whole seconds: a live owner may seem to start up to a
# second after it wrote its record.
_START_SLACK_NS = 2 * 10**9


def _owner_alive(proc: Process) -> bool:
    """Whether the record's process still runs: the pid exists and was not
    reused by a process started after the record was written (a killed
    process's record stays in /dev/shm, and its pid comes back)."""
    if not _alive(proc.pid):
        return False
    started = _started_unix_ns(proc.pid)
    return started is None or started <= proc.start_unix_ns + _START_SLACK_NS


def _field(data: bytes, base: int, fields: dict, name: str):
    offset, size = fields[name]
    raw = data[base + offset:base + offset + size]
    if name in ("magic", "command", "target", "device_name"):
        return raw
    return int.from_bytes(raw, "little", signed=name in ("pid", "device_count", "physical_core"))


def _text(raw: bytes) -> str:
    return raw.split(b"\0", 1)[0].decode(errors="replace").strip()


def parse(data: bytes) -> Process | None:
    head = LAYOUT["header"]
    if len(data) < LAYOUT["record_size"] or _field(data, 0, head, "magic") != LAYOUT["magic"]:
        return None
    if _field(data, 0, head, "version") != LAYOUT["version"]:
        return None  # a process of another build of the runtime
    proc = Process(_field(data, 0, head, "pid"), _text(_field(data, 0, head, "command")),
                   _field(data, 0, head, "start_unix_ns"), _text(_field(data, 0, head, "target")),
                   _text(_field(data, 0, head, "device_name")))
    dev = LAYOUT["device"]
    for i in range(min(_field(data, 0, head, "device_count"), LAYOUT["max_devices"])):
        base = LAYOUT["devices_offset"] + i * LAYOUT["device_size"]
        proc.devices.append(DeviceUse(i, *(_field(data, base, dev, name) for name in (
            "physical_core", "capacity", "allocated_bytes", "reserved_bytes", "busy_ns", "launches", "graph_replays"))))
    return proc


def processes(prefix: str = LAYOUT["path_prefix"]) -> list[Process]:
    """Live processes using the runtime on this host (stale records of dead
    processes are skipped, also when their pid was reused), ordered by pid."""
    out = []
    for path in glob.glob(prefix + "*"):
        try:
            with open(path, "rb") as f:
                proc = parse(f.read(LAYOUT["record_size"]))
        except OSError:
            continue
        if proc is not None and _owner_alive(proc) and path.endswith(f".{proc.pid}"):
            out.append(proc)
    return sorted(out, key=lambda p: p.pid)


def cores():
    """The NeuronCores a process started in this environment would have,
    [(core, name, capacity)], as the runtime resolves them (NEURON_RT_TARGET,
    NEURON_RT_VISIBLE_CORES/NUM_CORES, NEURON_RT_HBM_BYTES)."""
    config = _rtinfo.configuration()
    if config["error"]:
        raise SystemExit(f"neuron tools: {config['error']} (see docs/env.md)")
    return [(d["physical_core"], d["name"], d["capacity"]) for d in config["devices"]]
