#!/usr/bin/env python3
"""SFT training step time on ``neuron`` against CPU, eager and compiled, in one process.

A llama-family model that is tiny but not trivial (hidden 256, 4 layers, 8 heads / 4 KV heads,
intermediate 688, vocab 4096; 5.0M parameters) is fine-tuned with TRL's ``SFTTrainer`` exactly as a
user script would do it, once with ``use_cpu=True`` and once on neuron (Trainer's default
device), both from the same initial weights and the same pre-tokenized data, every batch padded
to the same static shape ``[--batch-size, --seq-len]``. A step is everything the Trainer does
between ``on_step_begin`` and ``on_step_end``: forward (with TRL's loss), backward, gradient
clipping, fused AdamW, the LR scheduler, zeroing the gradients; the device is synchronized
at both ends.

Modes:

* ``eager``    -- TRL's defaults (``loss_type="chunked_nll"``);
* ``compiled`` -- ``torch_compile=True``: Trainer picks backend ``"neuron"`` on neuron and
  ``"inductor"`` on CPU; ``loss_type="nll"`` and ``automatic_dynamic_shapes=False`` so that the
  whole forward is one graph (the chunked loss loops over a data-dependent trip count).

Goal: neuron median step time <= 1.1x CPU (ratio = neuron / CPU) in each mode. Both devices run
the same ATen CPU kernels (eager) or the same Inductor C++ code (compiled), so the ratio is the
backend overhead.

Method: one model per (device, mode); each round builds an SFTTrainer around each model in turn
and calls ``train()`` for ``--steps`` steps (fresh optimizer each time, weights carried over), so
drift on a shared machine hits both devices alike. Round 0 is warm-up (compilation) and is not counted; from
the other rounds the first ``--skip`` steps of every ``train()`` call are dropped. The median
over all remaining steps is reported. Both devices use ``torch.get_num_threads()`` threads
(``--threads``, default 1 for a low-noise comparison on a shared machine).

Examples::

    nice -n 10 python benchmarks/train.py
    python benchmarks/train.py --json results.json --rounds 4 --steps 8
    python benchmarks/train.py --only eager --bf16
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402

GOAL = 1.1
VOCAB = 4096


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--only", choices=("eager", "compiled"), default=None, help="run one mode only")
    p.add_argument("--rounds", type=int, default=3, help="measured rounds after the warm-up round (default: 3)")
    p.add_argument("--steps", type=int, default=6, help="steps per train() call (default: 6)")
    p.add_argument("--skip", type=int, default=1, help="steps dropped at the start of each train() call (default: 1)")
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--bf16", action="store_true", help="bf16 autocast on both devices")
    p.add_argument("--gradient-checkpointing", action="store_true", help="TRL's default; off by default here")
    p.add_argument("--threads", type=int, default=1, help="torch.set_num_threads (default: 1)")
    p.add_argument("--json", metavar="PATH", help="also write the results as JSON ('-' for stdout)")
    return p.parse_args(argv)


def make_model(args):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=VOCAB, hidden_size=args.hidden, intermediate_size=688 * args.hidden // 256,
                         num_hidden_layers=args.layers, num_attention_heads=8, num_key_value_heads=4,
                         max_position_embeddings=max(512, args.seq_len), pad_token_id=0, bos_token_id=1,
                         eos_token_id=2, tie_word_embeddings=False)
    torch.manual_seed(0)
    return LlamaForCausalLM(config)


def make_tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {t: i for i, t in enumerate(["<pad>", "<s>", "</s>", "<unk>"] + [f"w{i}" for i in range(VOCAB - 4)])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<s>", eos_token="</s>",
                                   unk_token="<unk>")


def make_dataset(args, n_rows):
    """Pre-tokenized rows of varying length (3/4 to all of seq_len), padded per batch to seq_len."""
    from datasets import Dataset

    g = torch.Generator().manual_seed(0)
    lengths = torch.randint(3 * args.seq_len // 4, args.seq_len + 1, (n_rows,), generator=g)
    rows = [torch.randint(4, VOCAB, (int(n),), generator=g).tolist() for n in lengths]
    return Dataset.from_dict({"input_ids": rows})


def make_timer(device):
    from transformers import TrainerCallback

    def sync():
        if device != "cpu":
            torch.neuron.synchronize()

    class StepTimer(TrainerCallback):
        def __init__(self):
            self.calls: list[list[float]] = []

        def on_train_begin(self, args, state, control, **kwargs):
            self.calls.append([])

        def on_step_begin(self, args, state, control, **kwargs):
            sync()
            self._t = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            sync()
            self.calls[-1].append(time.perf_counter() - self._t)

    return StepTimer()


def make_trainer(args, device, mode, model, timer, tokenizer, dataset, out_dir):
    """A fresh SFTTrainer around ``model`` (Accelerate's state is a process-wide singleton, so a
    trainer is built right before each ``train()``; building is not timed)."""
    from transformers.trainer_callback import PrinterCallback
    from trl import SFTConfig, SFTTrainer

    compiled = mode == "compiled"
    config = SFTConfig(
        output_dir=os.path.join(out_dir, f"{device}-{mode}"), report_to="none", use_cpu=device == "cpu",
        seed=0, max_steps=args.steps, per_device_train_batch_size=args.batch_size, learning_rate=1e-4,
        bf16=args.bf16, gradient_checkpointing=args.gradient_checkpointing,
        loss_type="nll" if compiled else "chunked_nll", torch_compile=compiled,
        max_length=args.seq_len, padding_free=False, pad_to_multiple_of=args.seq_len, dataloader_drop_last=True,
        logging_steps=args.steps, save_strategy="no", disable_tqdm=True, log_level="error",
    )
    trainer = SFTTrainer(model=model, args=config, train_dataset=dataset, processing_class=tokenizer,
                         callbacks=[timer])
    trainer.remove_callback(PrinterCallback)  # no per-log dict printing
    assert trainer.args.device.type == device, trainer.args.device
    if compiled:
        assert trainer.args.torch_compile_backend == ("neuron" if device == "neuron" else "inductor")
    return trainer


def main(argv=None) -> int:
    args = parse_args(argv)
    import torch_neuronx  # noqa: F401  (registers `neuron` if autoload is off)

    torch.set_num_threads(args.threads)
    torch._dynamo.config.automatic_dynamic_shapes = False
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    import datasets

    datasets.disable_progress_bars()

    modes = [args.only] if args.only else ["eager", "compiled"]
    tokenizer = make_tokenizer()
    dataset = make_dataset(args, args.batch_size * args.steps * 2)
    out_dir = tempfile.mkdtemp(prefix="bench-train-")
    runs = {(d, m): (make_model(args), make_timer(d)) for m in modes for d in ("cpu", "neuron")}
    n_params = sum(p.numel() for p in next(iter(runs.values()))[0].parameters())
    torch_neuronx.reset_fallback_report()

    for r in range(args.rounds + 1):
        for (device, mode), (model, timer) in runs.items():
            trainer = make_trainer(args, device, mode, model, timer, tokenizer, dataset, out_dir)
            start = time.perf_counter()
            trainer.train()
            print(f"  round {r}{' (warm-up)' if r == 0 else ''} {mode:8s} {device:6s} {time.perf_counter() - start:6.1f}s",
                  file=sys.stderr, flush=True)

    results = []
    for mode in modes:
        row = {"mode": mode}
        for device in ("cpu", "neuron"):
            timer = runs[(device, mode)][1]
            samples = [t for call in timer.calls[1:] for t in call[args.skip:]]
            row[device] = {"median_ms": 1e3 * statistics.median(samples),
                           "min_ms": 1e3 * min(samples), "samples": len(samples),
                           "warmup_first_step_s": timer.calls[0][0]}
        row["ratio"] = row["neuron"]["median_ms"] / row["cpu"]["median_ms"]
        row["goal_met"] = row["ratio"] <= GOAL
        results.append(row)

    print(f"SFT step, llama hidden {args.hidden} x {args.layers} layers ({n_params / 1e6:.1f}M params), "
          f"batch {args.batch_size}x{args.seq_len}, {'bf16 autocast' if args.bf16 else 'fp32'}, "
          f"{torch.get_num_threads()} thread(s)")
    print("| mode     | CPU ms/step | neuron ms/step | neuron/CPU | goal <= 1.1 | first step CPU / neuron (s) |")
    print("|----------|-------------|----------------|------------|-------------|-----------------------------|")
    for row in results:
        print(f"| {row['mode']:8s} | {row['cpu']['median_ms']:11.1f} | {row['neuron']['median_ms']:14.1f} | "
              f"{row['ratio']:10.3f} | {'yes' if row['goal_met'] else 'NO':11s} | "
              f"{row['cpu']['warmup_first_step_s']:12.1f} / {row['neuron']['warmup_first_step_s']:<12.1f} |")
    fallback = torch_neuronx.fallback_report()
    print(f"(median over {results[0]['cpu']['samples']} steps per cell; fallback ops on neuron: {fallback or 'none'})")

    if args.json:
        doc = {
            "benchmark": "train",
            "config": {k: v for k, v in vars(args).items() if k != "json"},
            "params": n_params,
            "torch": torch.__version__,
            "threads": torch.get_num_threads(),
            "python": platform.python_version(),
            "machine": platform.machine(),
            "goal_ratio": GOAL,
            "results": results,
            "fallback_ops": fallback,
        }
        text = json.dumps(doc, indent=2)
        if args.json == "-":
            print(text)
        else:
            with open(args.json, "w") as f:
                f.write(text)
            print(f"wrote {args.json}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
