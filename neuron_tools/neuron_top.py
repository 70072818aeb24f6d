"""``neuron-top``: a live view of the host's NeuronCores: per-core busy time
(from the runtime's kernel accounting), HBM in use, and the processes using
them. Refreshes every second; ``q`` quits. ``--once --json`` prints one
sample for scripts."""
from __future__ import annotations

import argparse
import json
import sys
import time

from . import _registry
from ._units import format_bytes
from .neuron_ls import snapshot as ls_snapshot


class Sampler:
    """Busy percentages from the change of kernel time between two samples."""

    def __init__(self):
        self.last = None

    def sample(self) -> dict:
        now = time.monotonic()
        procs = _registry.processes()
        busy = {(p.pid, p.start_unix_ns, d.index): d.busy_ns for p in procs for d in p.devices}
        snap = ls_snapshot()
        prev_t, prev = self.last if self.last else (now, busy)
        dt = max(now - prev_t, 1e-9)

        def pct(delta_ns):
            return round(min(100.0, 100.0 * delta_ns / 1e9 / dt), 1) if self.last else 0.0

        core_busy = {}
        rows = []
        for p in procs:
            for d in p.used():
                key = (p.pid, p.start_unix_ns, d.index)
                delta = busy[key] - prev.get(key, busy[key])
                core_busy[d.physical_core] = core_busy.get(d.physical_core, 0) + delta
                rows.append({"pid": p.pid, "core": d.physical_core, "device": f"neuron:{d.index}",
                             "busy_percent": pct(delta), "hbm_used": d.reserved_bytes,
                             "launches": d.launches, "graph_replays": d.graph_replays, "command": " ".join(p.command.split())})
        for c in snap["cores"]:
            c["busy_percent"] = pct(core_busy.get(c["core"], 0))
        self.last = (now, busy)
        return {"cores": snap["cores"], "processes": rows}


def render(s: dict) -> list[str]:
    fb = format_bytes
    lines = [f"neuron-top - {time.strftime('%H:%M:%S')}  (q quits)", "",
             f"{'CORE':>4}  {'BUSY':>6}  {'':<20} {'HBM USED':>12} {'HBM TOTAL':>12}"]
    for c in s["cores"]:
        bar = "#" * int(c["busy_percent"] / 5)
        lines.append(f"{c['core']:>4}  {c['busy_percent']:>5.1f}%  [{bar:<20}] {fb(c['hbm_used']):>11} "
                     f"{fb(c['hbm_total']):>12}")
    lines += ["", f"{'PID':>8}  {'CORE':>4}  {'BUSY':>6}  {'HBM USED':>12}  {'REPLAYS':>8}  COMMAND"]
    for r in s["processes"]:
        lines.append(f"{r['pid']:>8}  {r['core']:>4}  {r['busy_percent']:>5.1f}%  {fb(r['hbm_used']):>12}  "
                     f"{r['graph_replays']:>8}  {r['command'][:50]}")
    if not s["processes"]:
        lines.append("    (no process is using a NeuronCore)")
    return lines


def _live(interval: float) -> int:
    import curses

    def loop(screen):
        curses.curs_set(0)
        screen.timeout(int(interval * 1000))
        sampler = Sampler()
        while True:
            s = sampler.sample()
            screen.erase()
            height, width = screen.getmaxyx()
            for y, line in enumerate(render(s)[: height - 1]):
                screen.addnstr(y, 0, line, width - 1)
            screen.refresh()
            if screen.getch() in (ord("q"), ord("Q")):
                return

    curses.wrapper(loop)
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="neuron-top", description=__doc__,
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--once", action="store_true", help="print one sample and exit")
    parser.add_argument("--json", action="store_true", help="with --once: print JSON")
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between refreshes / samples")
    args = parser.parse_args(argv)
    if args.interval <= 0:
        parser.error("--interval must be positive")
    if args.once:
        sampler = Sampler()
        sampler.sample()
        time.sleep(args.interval)
        s = sampler.sample()
        print(json.dumps(s) if args.json else "\n".join(render(s)))
        return 0
    return _live(args.interval)


if __name__ == "__main__":
    sys.exit(main())
