#!/usr/bin/env python3
"""Where a replayed token's time goes outside its replay (examples/generate.py --graphs).

Runs greedy ``generate()`` of SmolLM2-135M on neuron with the eager-captured decode
graph (``DecodeGraph``, the ``graphs-eager`` variant of benchmarks/generate.py) and
splits each decode token, from one token reaching the host to the next, with
``perf_counter`` stamps only (no profiler, which inflates small ops tenfold):

* ``loop``   -- generate()'s own host work from the token on the host (the
  streamer's put) to the next forward() call: stopping criteria and their
  ``bool()`` sync, the kwargs update, ``prepare_inputs_for_generation`` and the
  causal mask (Transformers' Python and the small ops it launches);
* ``graph``  -- DecodeGraph.__call__: the graph key, the input copies, the replay's
  launch (with ``--device cpu``: the eager forward, for the loop's CPU figure);
* ``rest``   -- the token minus the two above: the replay on the device, then the
  token's selection kernels queued behind it (the logits copy, logits processors,
  argmax), the token's device-to-host copy and the wake-ups between them;
* ``replay`` -- the replay alone (``replay(); synchronize()`` of the same graph after
  generate(), its cache reset, one wake-up included), so ``rest - replay`` is what
  follows the replay.

Minimum and median over the decode tokens of ``--runs`` generate() calls (the host is
shared: the minimum is the least disturbed figure).

    python benchmarks/decode_gap.py --threads 1 --runs 3 --max-new-tokens 32
"""
import argparse
import functools
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
import generate as ex  # noqa: E402


class Stamped:
    """Records when each call of ``forward`` enters and returns."""

    def __init__(self, forward):
        functools.update_wrapper(self, forward)  # generate() reads forward's signature
        self.forward = forward
        self.stamps: list[tuple[float, float]] = []

    def __call__(self, *args, **kwargs):
        entered = time.perf_counter()
        output = self.forward(*args, **kwargs)
        self.stamps.append((entered, time.perf_counter()))
        return output


def split(puts, stamps):
    """Per decode token: (token, loop, graph) in seconds. puts[0] is the prompt, puts[1]
    the prefill's token; stamps[0] is prefill, stamps[1] the capture step."""
    rows = []
    for i in range(2, len(puts) - 1):  # token i+1 is made by forward call i (a replay)
        entered, returned = stamps[i]
        rows.append((puts[i + 1] - puts[i], entered - puts[i], returned - entered))
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="neuron", help="neuron: the decode graph; cpu: the same loop, eager")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--replays", type=int, default=20, help="samples of the replay alone")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    ex.import_backend(args.device)
    tokenizer, model, _ = ex.load(args.device, torch.float32)
    inputs = ex.chat_inputs(tokenizer, ex.DEFAULT_PROMPT, args.device)
    on_neuron = ex.device_type(args.device) == "neuron"
    graphed = ex.DecodeGraph(model.forward) if on_neuron else model.forward
    stamped = model.forward = Stamped(graphed)
    kwargs = ex.generation_kwargs(args.max_new_tokens, "static", no_compile=True,
                                  min_new_tokens=args.max_new_tokens)
    ex.run_generate(model, inputs, kwargs)  # warm-up (and the first capture)
    rows = []
    for _ in range(args.runs):
        stamped.stamps.clear()
        streamer, clock = ex.make_streamer(echo=False)
        with torch.inference_mode():
            model.generate(**inputs, **kwargs, streamer=streamer)
        rows += split(clock.times, stamped.stamps)
    replay = []
    if on_neuron:
        for _ in range(args.replays):
            # Each replay advances the cache's length in place: from its start
            # again, so that any number of replays stays within the cache.
            with torch.inference_mode():
                graphed.cache.reset()
            torch.neuron.synchronize()
            t0 = time.perf_counter()
            graphed.graph.replay()
            torch.neuron.synchronize()
            replay.append(time.perf_counter() - t0)
    del model.forward

    token, loop, graph = (sorted(column) for column in zip(*rows))
    rest = sorted(tok - before - call for tok, before, call in rows)

    def show(name, values):
        print(f"{name:8s} min {min(values) * 1e3:7.3f} ms  median {statistics.median(values) * 1e3:7.3f} ms")

    print(f"SmolLM2-135M fp32 on {args.device}, {args.threads} thread(s), {len(rows)} decode tokens, load {Path('/proc/loadavg').read_text().split()[:3]}")
    show("token", token)
    show("loop", loop)
    show("graph", graph)
    show("rest", rest)
    if not replay:  # cpu: the forward is the eager step, "graph" and "rest" are its time
        return 0
    show("replay", replay)
    print(f"rest - replay (min - min): {(min(rest) - min(replay)) * 1e3:.3f} ms; "
          f"token - replay: {(min(token) - min(replay)) * 1e3:.3f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
