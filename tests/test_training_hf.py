"""Training on ``neuron`` with the stock Hugging Face stack: TRL's ``SFTTrainer`` (Transformers
``Trainer``), Accelerate and PEFT, unmodified.

Tiny llama-family and qwen3 models are built offline from configs (hidden 64, 2 layers), with a
``tokenizers`` WordLevel tokenizer made in code and in-memory ``datasets.Dataset.from_dict``
data (``text``, prompt/completion and pre-tokenized ``input_ids``). Every training scenario runs
twice from the same initial weights, on neuron and with ``use_cpu=True``, and the per-step
``loss``/``grad_norm`` curves (``logging_steps=1``) and final weights must agree: tightly in
fp32, loosely under bf16 autocast. Each run also checks that the model really trained on
neuron (``trainer.args.device``, parameter and activation devices, autocast state) and that
no op hit the generic fallback.

Also covered: checkpoint save/resume (optimizer, scheduler, RNG incl. ``torch.neuron``),
``torch_compile=True`` (Trainer picks backend ``"neuron"``), Accelerate's device detection and
``accelerate env``, ``torch.amp.GradScaler("neuron")``.

Known gaps of the stock stack (third-party, not torch-neuronx) are ``xfail(strict=True)``:
Accelerate refuses ``fp16`` mixed precision on ``neuron``. (Transformers' Trainer does not
checkpoint the ``torch.neuron`` RNG state, which matters only in rng mode "philox".) See
docs/training.md.
"""

from __future__ import annotations

import os
import random
import subprocess
import sys

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

pytest.importorskip("transformers")
pytest.importorskip("trl")
pytest.importorskip("peft")
pytest.importorskip("datasets")

import torch_neuronx  # noqa: E402
from datasets import Dataset  # noqa: E402
from peft import LoraConfig  # noqa: E402
from tokenizers import Tokenizer, models, pre_tokenizers  # noqa: E402
from transformers import (  # noqa: E402
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedTokenizerFast,
    Qwen3Config,
    Qwen3ForCausalLM,
    TrainerCallback,
)
from trl import SFTConfig, SFTTrainer  # noqa: E402

DEV = "neuron"
WORDS = (
    "the a an cat dog bird fish sat on mat ran to park is was big small red blue green what "
    "color sky grass tree sun moon day night hot cold fast slow up down and or not yes no"
).split()
SPECIAL = ["<pad>", "<s>", "</s>", "<unk>"]
VOCAB = 64  # >= len(SPECIAL) + len(WORDS)
FALLBACKS: dict = {}  # fallback ops seen over the whole module (printed at the end)


# --------------------------------------------------------------------------- fixtures
@pytest.fixture(autouse=True)
def fallback_report():
    torch_neuronx.reset_fallback_report()
    yield
    for op, n in torch_neuronx.fallback_report().items():
        FALLBACKS[op] = FALLBACKS.get(op, 0) + n


@pytest.fixture(scope="module", autouse=True)
def _print_fallbacks():
    yield
    print(f"\nfallback report (test_training_hf): {FALLBACKS or 'empty'}")


@pytest.fixture(scope="module")
def tokenizer():
    vocab = {tok: i for i, tok in enumerate(SPECIAL + WORDS)}
    assert len(vocab) <= VOCAB
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<s>",
                                   eos_token="</s>", unk_token="<unk>")


def _sentence(rng, lo, hi):
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(lo, hi)))


@pytest.fixture(scope="module")
def datasets_(tokenizer):
    rng = random.Random(0)
    n = 64
    text = Dataset.from_dict({"text": [_sentence(rng, 4, 14) for _ in range(n)]})
    # the completion starts with a space so that tokenize(prompt) is a prefix of tokenize(prompt + completion)
    prompt_completion = Dataset.from_dict({
        "prompt": [_sentence(rng, 2, 6) for _ in range(n)],
        "completion": [" " + _sentence(rng, 2, 8) for _ in range(n)],
    })
    input_ids = Dataset.from_dict({
        "input_ids": [tokenizer(_sentence(rng, 4, 14))["input_ids"] + [tokenizer.eos_token_id] for _ in range(n)],
    })
    return {"text": text, "prompt_completion": prompt_completion, "input_ids": input_ids}


def tiny_model(arch: str, layers: int = 2, **overrides):
    """A random-weight causal LM built on CPU under a fixed seed (identical for every call)."""
    common = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                  pad_token_id=0, bos_token_id=1, eos_token_id=2, tie_word_embeddings=False)
    common.update(overrides)
    torch.manual_seed(0)
    if arch == "llama":
        return LlamaForCausalLM(LlamaConfig(**common))
    if arch == "qwen3":
        return Qwen3ForCausalLM(Qwen3Config(head_dim=16, **common))
    raise ValueError(arch)


class Probe(TrainerCallback):
    """Records where training really happens: parameter devices at every step end, and the
    device/dtype/autocast state seen inside the forward of one MLP projection."""

    def __init__(self, model, hook=True):
        self.param_devices: set = set()
        self.forward: set = set()
        if not hook:  # (a Python side effect inside a compiled forward would be traced by Dynamo)
            return
        name, module = next((n, m) for n, m in model.named_modules() if n.endswith("layers.0.mlp.down_proj"))
        module.register_forward_hook(self._hook)

    def _hook(self, module, args, output):
        dev = output.device.type
        self.forward.add((args[0].device.type, module.weight.device.type, dev, output.dtype,
                          torch.is_autocast_enabled(dev)))

    def on_step_end(self, args, state, control, model=None, **kwargs):
        self.param_devices.update(p.device.type for p in model.parameters())


def sft(model, dataset, tokenizer, output_dir, *, use_cpu=False, peft_config=None, trainer_cls=SFTTrainer,
        resume_from_checkpoint=None, hook=True, **config):
    """Builds an SFTTrainer the way a user script would, trains it and returns (trainer, probe)."""
    settings = dict(report_to="none", max_steps=4, logging_steps=1, per_device_train_batch_size=4,
                    learning_rate=1e-3, max_length=32, seed=0, save_strategy="no", disable_tqdm=True)
    settings.update(config)
    args = SFTConfig(output_dir=str(output_dir), use_cpu=use_cpu, **settings)
    trainer = trainer_cls(model=model, args=args, train_dataset=dataset, processing_class=tokenizer,
                          peft_config=peft_config)
    probe = Probe(trainer.model, hook=hook)
    trainer.add_callback(probe)
    trainer.train(resume_from_checkpoint=resume_from_checkpoint)
    return trainer, probe


def curve(trainer, first_step=1):
    """[(step, loss, grad_norm)] from the per-step training logs."""
    return [(h["step"], h["loss"], h["grad_norm"]) for h in trainer.state.log_history
            if "loss" in h and h["step"] >= first_step]


def assert_curves_close(got, ref, *, loss_atol, grad_rtol):
    assert [s for s, _, _ in got] == [s for s, _, _ in ref], (got, ref)
    for (step, loss, gn), (_, ref_loss, ref_gn) in zip(got, ref):
        assert abs(loss - ref_loss) <= loss_atol, f"step {step}: loss {loss} vs {ref_loss}\n{got}\n{ref}"
        assert abs(gn - ref_gn) <= grad_rtol * abs(ref_gn) + 1e-6, f"step {step}: grad_norm {gn} vs {ref_gn}"


def assert_optimizer_state_on_neuron(opt):
    """Moments live on neuron (the ``step`` count is a CPU scalar unless fused/capturable, as on CUDA)."""
    state = [(k, t) for s in opt.state.values() for k, t in s.items() if torch.is_tensor(t)]
    assert state
    fused = bool(opt.defaults.get("fused"))
    assert all(t.device.type == DEV for k, t in state if k != "step" or fused), {(k, t.device) for k, t in state}


def trained_state(trainer):
    """Final weights on CPU, keyed by name (LoRA: the adapter weights only)."""
    return {n: p.detach().float().cpu() for n, p in trainer.model.named_parameters() if p.requires_grad}


LORA = dict(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")

# name -> (dataset, SFTConfig overrides, use LoRA). Unlisted settings are SFTConfig's defaults:
# optim="adamw_torch_fused", loss_type="chunked_nll", gradient_checkpointing=True, max_grad_norm=1.0.
SCENARIOS = {
    "fp32-defaults": ("text", dict(bf16=False), False),
    "fp32-adamw-accum-clip": ("prompt_completion",
                              dict(bf16=False, optim="adamw_torch", gradient_accumulation_steps=2,
                                   gradient_checkpointing=False, max_grad_norm=0.5), False),
    "bf16-autocast": ("input_ids", dict(bf16=True), False),
    "lora-fp32": ("prompt_completion", dict(bf16=False), True),
    "lora-bf16": ("text", dict(bf16=True, gradient_checkpointing=False), True),
}


# --------------------------------------------------------------------------- defaults
def test_example_dataset_is_conversational_prompt_completion():
    """examples/data/sft_sample.jsonl (used by examples/sft.py) is in TRL's conversational
    prompt/completion format, so SFTTrainer applies the chat template and trains on answers only."""
    import json
    from pathlib import Path

    from trl.data_utils import is_conversational

    path = Path(__file__).resolve().parents[1] / "examples" / "data" / "sft_sample.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    assert 100 <= len(rows) <= 200
    assert all(set(r) == {"prompt", "completion"} and is_conversational(r) for r in rows)
    assert all(r["prompt"][-1]["role"] == "user" and r["completion"][0]["role"] == "assistant" for r in rows)


def test_sft_config_defaults(tmp_path):
    """The defaults this suite relies on (trl 1.13): chunked NLL loss, fused AdamW, bf16,
    gradient checkpointing, no padding-free batches."""
    args = SFTConfig(output_dir=str(tmp_path), report_to="none")
    assert args.loss_type == "chunked_nll"
    assert args.optim == "adamw_torch_fused"
    assert args.bf16 is True and args.gradient_checkpointing is True
    assert args.padding_free is False
    assert args.device.type == DEV  # Trainer picks neuron:0 by itself
    assert SFTConfig(output_dir=str(tmp_path), report_to="none", use_cpu=True).device.type == "cpu"


# --------------------------------------------------------------------------- neuron vs CPU
@pytest.mark.parametrize("scenario", list(SCENARIOS))
@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_sft_matches_cpu(arch, scenario, tokenizer, datasets_, tmp_path):
    data, config, lora = SCENARIOS[scenario]
    bf16 = config.get("bf16", True)
    runs = {}
    for device in (DEV, "cpu"):
        peft_config = LoraConfig(**LORA) if lora else None
        runs[device] = sft(tiny_model(arch), datasets_[data], tokenizer, tmp_path / device,
                           use_cpu=device == "cpu", peft_config=peft_config, **config)
    trainer, probe = runs[DEV]
    cpu_trainer, cpu_probe = runs["cpu"]
    report = torch_neuronx.fallback_report()

    # it really ran on neuron (and the reference really on CPU)
    assert trainer.args.device.type == DEV and cpu_trainer.args.device.type == "cpu"
    assert probe.param_devices == {DEV} and cpu_probe.param_devices == {"cpu"}
    act_dtype = torch.bfloat16 if bf16 else torch.float32
    assert probe.forward == {(DEV, DEV, DEV, act_dtype, bf16)}, probe.forward
    assert cpu_probe.forward == {("cpu", "cpu", "cpu", act_dtype, bf16)}, cpu_probe.forward
    opt = trainer.optimizer.optimizer  # inside Accelerate's AcceleratedOptimizer
    assert_optimizer_state_on_neuron(opt)
    assert bool(opt.defaults.get("fused")) == (config.get("optim", "adamw_torch_fused") == "adamw_torch_fused")
    assert trainer.args.loss_type == "chunked_nll"
    base = trainer.model.get_base_model() if lora else trainer.model
    assert base.is_gradient_checkpointing == config.get("gradient_checkpointing", True)
    if lora:
        trainable = [n for n, p in trainer.model.named_parameters() if p.requires_grad]
        assert trainable and all("lora_" in n for n in trainable)

    got, ref = curve(trainer), curve(cpu_trainer)
    print(f"\n{arch}/{scenario} loss neuron: {[round(l, 5) for _, l, _ in got]}"
          f"\n{arch}/{scenario} loss cpu:    {[round(l, 5) for _, l, _ in ref]}")
    assert len(got) == 4
    if "max_grad_norm" in config:  # the clip was active on some step
        assert max(g for _, _, g in got) > config["max_grad_norm"]
    if bf16:
        assert_curves_close(got, ref, loss_atol=1e-2, grad_rtol=5e-2)
    else:
        assert_curves_close(got, ref, loss_atol=1e-5, grad_rtol=1e-4)
    final, cpu_final = trained_state(trainer), trained_state(cpu_trainer)
    assert final.keys() == cpu_final.keys()
    for name in final:
        torch.testing.assert_close(final[name], cpu_final[name], rtol=0, atol=5e-3 if bf16 else 1e-4, msg=name)
    assert report == {}, f"ops hit the generic fallback: {report}"


# --------------------------------------------------------------------------- checkpoint / resume
class NeuronRngSFTTrainer(SFTTrainer):
    """Workaround for the Transformers gap below (needed in rng mode "philox"): also checkpoint the
    ``torch.neuron`` RNG."""

    def _save_rng_state(self, output_dir):
        super()._save_rng_state(output_dir)
        torch.save(torch.neuron.get_rng_state_all(), os.path.join(output_dir, "neuron_rng_state.pth"))

    def _load_rng_state(self, checkpoint):
        super()._load_rng_state(checkpoint)
        path = os.path.join(checkpoint or "", "neuron_rng_state.pth")
        if checkpoint is not None and os.path.isfile(path):
            torch.neuron.set_rng_state_all(torch.load(path, weights_only=True))


RESUME = dict(max_steps=6, save_strategy="steps", save_steps=3, bf16=False)


@pytest.fixture(scope="module")
def uninterrupted(tokenizer, datasets_, tmp_path_factory):
    """6 steps with attention dropout (so the neuron RNG matters), checkpointing at step 3."""
    out = tmp_path_factory.mktemp("resume")
    trainer, _ = sft(tiny_model("llama", attention_dropout=0.2), datasets_["text"], tokenizer, out,
                     trainer_cls=NeuronRngSFTTrainer, **RESUME)
    return out, curve(trainer)


def _resume(trainer_cls, uninterrupted, tokenizer, datasets_, tmp_path, **overrides):
    out, _ = uninterrupted
    # a fresh model (different init) so that everything must come from the checkpoint
    model = tiny_model("llama", attention_dropout=0.2, initializer_range=0.05)
    trainer, probe = sft(model, datasets_["text"], tokenizer, tmp_path, trainer_cls=trainer_cls,
                         resume_from_checkpoint=str(out / "checkpoint-3"), **{**RESUME, **overrides})
    return trainer, probe


def test_checkpoint_resume_matches_uninterrupted(uninterrupted, tokenizer, datasets_, tmp_path):
    out, full = uninterrupted
    ckpt = out / "checkpoint-3"
    for f in ("optimizer.pt", "scheduler.pt", "rng_state.pth", "trainer_state.json", "model.safetensors",
              "neuron_rng_state.pth"):
        assert (ckpt / f).is_file(), f
    trainer, probe = _resume(NeuronRngSFTTrainer, uninterrupted, tokenizer, datasets_, tmp_path)
    assert probe.param_devices == {DEV}
    opt = trainer.optimizer.optimizer
    assert_optimizer_state_on_neuron(opt)
    assert trainer.lr_scheduler.last_epoch == 6
    resumed = curve(trainer, first_step=4)
    print(f"\nuninterrupted: {full}\nresumed:       {resumed}")
    assert resumed == full[3:]  # bit-identical continuation
    assert torch_neuronx.fallback_report() == {}


def test_checkpoint_resume_without_dropout_stock_trainer(tokenizer, datasets_, tmp_path):
    """Without random ops the stock SFTTrainer resumes exactly (optimizer, scheduler, data order)."""
    full, _ = sft(tiny_model("llama"), datasets_["text"], tokenizer, tmp_path / "a", **RESUME)
    resumed, _ = sft(tiny_model("llama", initializer_range=0.05), datasets_["text"], tokenizer, tmp_path / "b",
                     resume_from_checkpoint=str(tmp_path / "a" / "checkpoint-3"), **RESUME)
    assert curve(resumed, first_step=4) == curve(full)[3:]


def test_checkpoint_resume_stock_trainer_restores_neuron_rng(uninterrupted, tokenizer, datasets_, tmp_path):
    """transformers 5.18 Trainer._save_rng_state/_load_rng_state checkpoint CPU/CUDA/NPU/HPU/MLU/MUSA/XLA RNG
    but not torch.neuron. In rng mode "cpu" (the default) the neuron default generators draw from the CPU
    generator, so the CPU state Trainer restores resumes the dropout masks too; in mode "philox" they
    would differ (NeuronRngSFTTrainer above is the workaround there)."""
    _, full = uninterrupted
    trainer, _ = _resume(SFTTrainer, uninterrupted, tokenizer, datasets_, tmp_path)
    assert curve(trainer, first_step=4) == full[3:]


# --------------------------------------------------------------------------- torch.compile
def test_torch_compile_picks_neuron_backend_and_matches_eager(tokenizer, datasets_, tmp_path):
    """``torch_compile=True``: Trainer selects backend "neuron" on neuron. Static shapes (padding
    to ``max_length``, no automatic dynamic shapes) and ``loss_type="nll"`` keep it to one graph;
    the default chunked NLL loss loops over a data-dependent trip count (a graph break per call)."""
    from torch._dynamo.utils import counters

    static = dict(bf16=False, gradient_checkpointing=False, loss_type="nll", max_length=32,
                  pad_to_multiple_of=32, dataloader_drop_last=True)
    eager, _ = sft(tiny_model("llama", layers=1), datasets_["text"], tokenizer, tmp_path / "eager", **static)
    torch._dynamo.reset()
    counters.clear()
    with torch._dynamo.config.patch(automatic_dynamic_shapes=False):
        compiled, probe = sft(tiny_model("llama", layers=1), datasets_["text"], tokenizer, tmp_path / "compiled",
                              torch_compile=True, hook=False, **static)
    assert compiled.args.torch_compile_backend == "neuron"
    assert type(compiled.model_wrapped).__name__ == "OptimizedModule"
    assert compiled.model_wrapped._orig_mod is compiled.model
    assert counters["stats"]["unique_graphs"] >= 1
    assert probe.param_devices == {DEV}
    got, ref = curve(compiled), curve(eager)
    print(f"\ncompiled: {got}\neager:    {ref}\ndynamo: {dict(counters['stats'])}")
    assert_curves_close(got, ref, loss_atol=1e-4, grad_rtol=1e-3)
    assert torch_neuronx.fallback_report() == {}


# --------------------------------------------------------------------------- Accelerate
@pytest.fixture
def fresh_accelerate_state():
    """Accelerate's state is a process-wide singleton (Trainer created one already)."""
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state(reset_partial_state=True)
    yield
    AcceleratorState._reset_state(reset_partial_state=True)


def test_accelerate_detects_neuron(fresh_accelerate_state):
    from accelerate import Accelerator
    from accelerate.utils import is_neuron_available

    assert is_neuron_available() and is_neuron_available(check_device=True)
    acc = Accelerator()
    assert acc.device.type == DEV
    model = acc.prepare(torch.nn.Linear(4, 4))
    assert next(model.parameters()).device.type == DEV


def test_accelerate_bf16_autocast_and_rng_state(fresh_accelerate_state, tmp_path):
    from accelerate import Accelerator

    acc = Accelerator(mixed_precision="bf16")
    net = torch.nn.Sequential(torch.nn.Linear(8, 8))
    model, opt = acc.prepare(net, torch.optim.AdamW(net.parameters()))
    linear = net[0]
    seen = []
    linear.register_forward_hook(lambda m, a, out: seen.append(out.dtype))
    out = model(torch.randn(2, 8, device=DEV))  # prepare() wraps forward in autocast ...
    assert seen == [torch.bfloat16] and out.dtype == torch.float32  # ... and casts outputs back to fp32
    assert out.device.type == DEV and linear.weight.device.type == DEV
    with acc.autocast():
        assert torch.is_autocast_enabled(DEV) and torch.get_autocast_dtype(DEV) == torch.bfloat16
    # save_state/load_state carry the torch.neuron RNG state
    torch.neuron.manual_seed(123)
    acc.save_state(str(tmp_path))
    expected = torch.rand(4, device=DEV).cpu()
    torch.neuron.manual_seed(7)
    acc.load_state(str(tmp_path))
    assert torch.equal(torch.rand(4, device=DEV).cpu(), expected)


def test_accelerate_env_cli_mentions_neuron():
    env = {k: v for k, v in os.environ.items() if not k.startswith("NEURON_RT_")}
    proc = subprocess.run([sys.executable, "-m", "accelerate.commands.accelerate_cli", "env"], env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "PyTorch accelerator: NEURON" in proc.stdout, proc.stdout
    assert "NEURON type:" in proc.stdout, proc.stdout


# --------------------------------------------------------------------------- fp16
def test_grad_scaler_fp16_step():
    """``torch.amp.GradScaler("neuron")`` with fp16 autocast: a finite step equals CPU's, an
    overflowing step is skipped and halves the scale."""
    results = {}
    for device in (DEV, "cpu"):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4)).to(device)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        scaler = torch.amp.GradScaler(device, init_scale=2.0 ** 12)
        x = torch.randn(8, 16, generator=torch.Generator().manual_seed(1)).to(device)
        for poison in (False, True):
            opt.zero_grad()
            with torch.autocast(device, dtype=torch.float16):
                out = model(x)
                assert out.dtype == torch.float16
                loss = out.float().pow(2).mean() * (float("inf") if poison else 1.0)
            scaler.scale(loss).backward()
            before = [p.detach().clone() for p in model.parameters()]
            scaler.step(opt)
            scaler.update()
            unchanged = all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
            assert unchanged == poison
        assert scaler.get_scale() == 2.0 ** 11
        results[device] = [p.detach().cpu() for p in model.parameters()]
    for got, ref in zip(results[DEV], results["cpu"]):
        torch.testing.assert_close(got, ref, rtol=1e-3, atol=1e-4)
    assert torch_neuronx.fallback_report() == {}


@pytest.mark.xfail(strict=True, raises=ValueError, reason=(
    "accelerate 1.15 rejects fp16 mixed precision on 'neuron' (its fp16 device allow-list, and get_grad_scaler() "
    "has no neuron branch); use bf16=True, or GradScaler('neuron') in a custom loop"))
def test_trainer_fp16_on_neuron(tokenizer, datasets_, tmp_path):
    sft(tiny_model("llama"), datasets_["text"], tokenizer, tmp_path, fp16=True, bf16=False, max_steps=1)
