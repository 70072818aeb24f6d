"""The README snippet and the examples' argument checks, each in a fresh interpreter."""
import re
import textwrap
import time
from pathlib import Path

import pytest
from conftest import run_json, run_python

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"


def _readme_python_blocks():
    return re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), flags=re.S)


def test_readme_snippet_runs_as_written_and_matches_cpu():
    blocks = _readme_python_blocks()
    assert len(blocks) == 1, "the README should have exactly one python snippet"
    # The snippet as written, then a check of what it computed against CPU autocast.
    check = textwrap.dedent("""
        import copy, json
        ref = copy.deepcopy(model).cpu()
        ref.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            ref_loss = ref(x.cpu()).sum()
        ref_loss.backward()
        grads = [(p.grad.device.type, (p.grad.cpu() - r.grad).abs().max().item(), r.grad.abs().max().item())
                 for p, r in zip(model.parameters(), ref.parameters())]
        print(json.dumps({"loss": loss.item(), "ref": ref_loss.item(), "loss_dev": loss.device.type,
                          "grads": grads}))
    """)
    out = run_json(blocks[0] + check)
    assert out["loss_dev"] == "neuron"
    assert out["loss"] == pytest.approx(out["ref"], rel=2e-2, abs=2e-2)
    for device, diff, scale in out["grads"]:
        assert device == "neuron"
        assert diff <= 3e-2 * max(1.0, scale)


# ---- examples/generate.py: --device is checked before the model loads --------------------------------------------

# A GGUF path that does not exist: reaching the model loader fails with FileNotFoundError,
# so a device error proves the check ran first.
_NO_MODEL = {"SMOLLM2_GGUF": "/nonexistent/model.gguf"}


@pytest.mark.parametrize("device,expected", [
    ("neuron:9", "neuron:9 does not exist: there are 2 neuron device(s), neuron:0..neuron:1"),
    ("cuda", "no cuda device is available"),
    ("foo", "'foo' is not a torch device"),
])
def test_generate_rejects_bad_device_before_loading(device, expected):
    start = time.monotonic()
    proc = run_python(f"""
        import sys
        sys.argv = ["generate.py", "--device", {device!r}]
        sys.path.insert(0, {str(EXAMPLES)!r})
        import generate
        sys.exit(generate.main())
    """, env=_NO_MODEL, check=False)
    assert proc.returncode == 2, proc.stderr
    assert f"--device {device}: {expected}" in proc.stderr, proc.stderr
    assert "FileNotFoundError" not in proc.stderr and "[load]" not in proc.stderr
    assert time.monotonic() - start < 60


def test_generate_accepts_a_valid_device_and_then_loads():
    proc = run_python(f"""
        import sys
        sys.argv = ["generate.py", "--device", "neuron:1"]
        sys.path.insert(0, {str(EXAMPLES)!r})
        import generate
        sys.exit(generate.main())
    """, env=_NO_MODEL, check=False)
    assert proc.returncode != 0
    assert "SMOLLM2_GGUF=/nonexistent/model.gguf is not a file" in proc.stderr, proc.stderr


def test_generate_help_shows_defaults():
    proc = run_python(f"""
        import sys
        sys.argv = ["generate.py", "--help"]
        sys.path.insert(0, {str(EXAMPLES)!r})
        import generate
        generate.parse_args()
    """, check=False)
    assert proc.returncode == 0, proc.stderr
    text = " ".join(proc.stdout.split())
    for expected in ("(default: neuron)", "(default: 64)", "(default: static)", "(default: float32)"):
        assert expected in text, text


# ---- examples/generate.py: decode steps captured eagerly into neuron graphs (DecodeGraph) --------------------------

def _generate_module():
    import importlib.util

    spec = importlib.util.spec_from_file_location("generate_example", EXAMPLES / "generate.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _tiny_llama():
    import copy

    from conftest import tiny_llama

    cpu = tiny_llama()
    return cpu, copy.deepcopy(cpu).to("neuron")


def test_decode_graph_replays_each_decode_step_with_cpu_greedy_tokens():
    import torch

    ex = _generate_module()
    cpu, dev = _tiny_llama()
    ids = torch.randint(0, 128, (2, 6), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[1, :2] = 0  # left padding
    new = 12
    kw = dict(max_new_tokens=new, do_sample=False, cache_implementation="static", disable_compile=True)
    ref = cpu.generate(ids, attention_mask=mask, **kw)
    graphed = ex.install_decode_graph(dev)
    for run in range(2):
        with torch.inference_mode():
            out = dev.generate(ids.to("neuron"), attention_mask=mask.to("neuron"), **kw)
        assert torch.equal(out.cpu(), ref)
        # Each generate() makes a new cache: its first decode step captures, and every decode step is a replay.
        assert (graphed.captures, graphed.replays) == (run + 1, (run + 1) * (new - 1))
    assert graphed.failed is None
    # A dynamic cache is not captured: generate() runs eagerly through the wrapper.
    with torch.inference_mode():
        out = dev.generate(ids.to("neuron"), attention_mask=mask.to("neuron"),
                           **{**kw, "cache_implementation": "dynamic"})
    assert torch.equal(out.cpu(), ref) and graphed.replays == 2 * (new - 1)
    del dev.forward
    assert "forward" not in vars(dev)


def test_decode_gap_benchmark_splits_each_replayed_token():
    # benchmarks/decode_gap.py stamps DecodeGraph's calls and the streamer's tokens: every replayed
    # token must split into the loop before its call, the call, and the rest, in that order.
    import importlib.util

    import torch

    spec = importlib.util.spec_from_file_location("decode_gap", ROOT / "benchmarks" / "decode_gap.py")
    gap = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gap)
    cpu, dev = _tiny_llama()
    ids = torch.randint(0, 128, (1, 5), generator=torch.Generator().manual_seed(2))
    new = 8
    kw = dict(max_new_tokens=new, min_new_tokens=new, do_sample=False, cache_implementation="static",
              disable_compile=True)
    ref = cpu.generate(ids, **kw)
    graphed = gap.ex.DecodeGraph(dev.forward)
    stamped = dev.forward = gap.Stamped(graphed)
    streamer, clock = gap.ex.make_streamer(echo=False)
    with torch.inference_mode():
        out = dev.generate(ids.to("neuron"), streamer=streamer, **kw)
    assert torch.equal(out.cpu(), ref)
    assert (graphed.captures, graphed.replays) == (1, new - 1)
    puts, stamps = clock.times, stamped.stamps
    assert (len(puts), len(stamps)) == (new + 1, new)  # the prompt and each token; prefill and each decode call
    rows = gap.split(puts, stamps)
    assert len(rows) == new - 2  # the decode calls after the capture step
    for i, (token, loop, call) in enumerate(rows, start=2):
        assert puts[i] < stamps[i][0] < stamps[i][1] < puts[i + 1]
        assert loop > 0 and call > 0 and token > loop + call
    del dev.forward


def test_decode_graph_falls_back_to_eager_when_the_step_cannot_be_captured(capsys):
    import torch

    ex = _generate_module()
    cpu, dev = _tiny_llama()
    def read_on_host(module, args, out):
        out.sum().item()  # a host synchronization inside the step: capture refuses it

    dev.model.norm.register_forward_hook(read_on_host)
    ids = torch.randint(0, 128, (1, 5), generator=torch.Generator().manual_seed(2))
    kw = dict(max_new_tokens=6, do_sample=False, cache_implementation="static", disable_compile=True)
    ref = cpu.generate(ids, **kw)
    graphed = ex.install_decode_graph(dev)
    with torch.inference_mode():
        out = dev.generate(ids.to("neuron"), **kw)
    assert torch.equal(out.cpu(), ref)
    assert graphed.replays == 0 and graphed.failed and "captur" in graphed.failed
    assert "[graphs] decode step not captured, decoding eagerly" in capsys.readouterr().err


# ---- examples/sft.py: a --max-length that cuts every answer off fails before training ------------------------------

def test_sft_max_length_without_answer_tokens_fails_early():
    pytest.importorskip("trl")
    proc = run_python(f"""
        import sys
        sys.argv = ["sft.py", "--max-length", "32", "--max-steps", "1", "--no-sample"]
        sys.path.insert(0, {str(EXAMPLES)!r})
        import sft
        sys.exit(sft.main())
    """, check=False)
    assert proc.returncode != 0
    err = proc.stderr
    assert "KeyError" not in err and "eval_loss" not in err, err[-2000:]
    assert "error: --max-length 32 leaves no answer tokens to learn from" in err, err[-2000:]
    chats = sum(1 for line in (EXAMPLES / "data" / "sft_sample.jsonl").read_text().splitlines() if line.strip())
    train = chats - 16  # --eval-size defaults to 16
    assert f"{train} of {train} training chats" in err and "16 of 16 held-out chats" in err, err[-2000:]
    assert "[load]" not in err and "[train]" not in err  # stopped before the model was loaded


def test_generate_weights_cache_and_chat(tmp_path):
    """The first run dequantizes the GGUF and keeps the dense weights; the
    second loads them (same answer); --chat streams answers for stdin lines."""
    import subprocess
    import sys

    env_cache = {"TORCH_NEURONX_CACHE": str(tmp_path / "cache")}
    cmd = [str(EXAMPLES / "generate.py"), "--device", "cpu", "--max-new-tokens", "6", "--no-compile"]
    first = run_python(f"import runpy, sys; sys.argv = {cmd!r}; runpy.run_path(sys.argv[0], run_name='__main__')",
                       env=env_cache)
    assert "[load] dequantized" in first.stderr and "kept in" in first.stderr
    cached = list((tmp_path / "cache" / "dequantized").iterdir())
    assert len(cached) == 1 and cached[0].name.endswith("-float32")
    second = run_python(f"import runpy, sys; sys.argv = {cmd!r}; runpy.run_path(sys.argv[0], run_name='__main__')",
                        env=env_cache)
    assert "[load] cached weights" in second.stderr
    answer = lambda out: out.stdout.split("Assistant:", 1)[1].strip()  # noqa: E731
    assert answer(first) and answer(first) == answer(second)

    import os
    env = dict(os.environ, **env_cache)
    chat = subprocess.run([sys.executable, *cmd, "--chat"], input="What is the capital of France?\nexit\n",
                          capture_output=True, text=True, timeout=600, env=env)
    assert chat.returncode == 0, chat.stderr[-2000:]
    assert chat.stdout.count("You: ") == 2 and "Assistant: " in chat.stdout
    assert "tokens/s]" in chat.stderr


# ---- examples/kernelize.py: SmolLM2 with and without the Hub RMSNorm kernel ------------------------------------------

def test_kernelize_reports_tokens_per_second_and_the_same_answer():
    pytest.importorskip("kernels")
    cmd = [str(EXAMPLES / "kernelize.py"), "--max-new-tokens", "4", "--repeats", "1", "--threads", "1"]
    proc = run_python(f"import runpy, sys; sys.argv = {cmd!r}; runpy.run_path(sys.argv[0], run_name='__main__')")
    out = proc.stdout
    assert "61 RMSNorm modules kernelized" in out, out
    rows = re.findall(r"^\| 1 \| (eager ATen RMSNorm|Hub NKI RMSNorm) \| ([0-9.]+) \(", out, flags=re.M)
    assert [name for name, _ in rows] == ["eager ATen RMSNorm", "Hub NKI RMSNorm"], out
    assert all(float(tps) > 0 for _, tps in rows)
    assert "same tokens with and without the Hub kernels: True" in out
