"""``neuron-ls``: the NeuronCores of this host and the processes using them,
with the HBM each holds (the ``nvidia-smi`` view)."""
from __future__ import annotations

import argparse
import json
import sys

from . import _registry
from ._units import format_bytes


def snapshot() -> dict:
    procs = _registry.processes()
    known = [(core, name, capacity, True) for core, name, capacity in _registry.cores()]
    seen = {c for c, _, _, _ in known}
    for p in procs:  # cores that processes configured differently use
        for d in p.used():
            if d.physical_core not in seen:
                seen.add(d.physical_core)
                known.append((d.physical_core, p.device_name, d.capacity, False))
    cores = []
    for core, name, capacity, configured in sorted(known):
        used = sum(d.reserved_bytes for p in procs for d in p.devices if d.physical_core == core)
        cores.append({"core": core, "name": name, "hbm_total": capacity, "hbm_used": used, "configured": configured,
                      "pids": [p.pid for p in procs if any(d.physical_core == core for d in p.used())]})
    rows = [{"pid": p.pid, "core": d.physical_core, "device": f"neuron:{d.index}", "hbm_used": d.reserved_bytes,
             "hbm_allocated": d.allocated_bytes, "command": " ".join(p.command.split())}
            for p in procs for d in p.used()]
    return {"cores": cores, "processes": rows}


def render(snap: dict) -> str:
    fb = format_bytes
    lines = [f"{'CORE':>4}  {'NAME':<30} {'HBM USED':>12} {'HBM TOTAL':>12}  PROCESSES"]
    for c in snap["cores"]:
        lines.append(f"{c['core']:>4}  {c['name']:<30} {fb(c['hbm_used']):>12} {fb(c['hbm_total']):>12}  "
                     f"{len(c['pids'])}")
    lines.append("")
    lines.append(f"{'PID':>8}  {'CORE':>4}  {'DEVICE':<9} {'HBM USED':>12}  COMMAND")
    if not snap["processes"]:
        lines.append("    (no process is using a NeuronCore)")
    for r in snap["processes"]:
        lines.append(f"{r['pid']:>8}  {r['core']:>4}  {r['device']:<9} {fb(r['hbm_used']):>12}  {r['command'][:60]}")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="neuron-ls", description=__doc__,
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--json", action="store_true", help="print one JSON document instead of tables")
    args = parser.parse_args(argv)
    snap = snapshot()
    print(json.dumps(snap) if args.json else render(snap))
    return 0


if __name__ == "__main__":
    sys.exit(main())
