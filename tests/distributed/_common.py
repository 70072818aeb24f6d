"""Shared pieces of the torch.distributed tests (world 2).

Every check runs a collective twice in the same process: on neuron tensors
through the ``neuron`` backend, and on the same values as CPU tensors through
a plain CPU Gloo group. The neuron result must equal the Gloo result rank by
rank (bit for bit: the same values are reduced in the same order), or, where
Gloo has no answer (PREMUL_SUM, fp8), the result of the equivalent Gloo
computation.
"""
import json
import os
import socket
import subprocess
import sys
import textwrap
import time
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.testing._internal.common_distributed import MultiProcessTestCase

WORLD = 2

FLOAT_DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.float64]
INT_DTYPES = [torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8]
FP8_DTYPES = [torch.float8_e4m3fn, torch.float8_e5m2]
ALL_DTYPES = FLOAT_DTYPES + INT_DTYPES + [torch.bool] + FP8_DTYPES
# Dtypes CPU Gloo has no kernels for (the neuron backend moves them as bytes).
GLOO_LACKS = FP8_DTYPES + [torch.int16]


def make(dtype, shape, seed):
    """Deterministic CPU test data; small integers so products stay exact."""
    g = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=g).bool()
    if dtype.is_floating_point:
        return (torch.randn(shape, generator=g) * 2).to(dtype)
    if dtype == torch.uint8:
        return torch.randint(0, 8, shape, generator=g).to(dtype)
    return torch.randint(-8, 8, shape, generator=g).to(dtype)


def bits(t):
    t = t.detach().cpu()
    return t.view(torch.uint8) if t.dtype in FP8_DTYPES else t


def same(got, ref, what):
    """``got`` (neuron) equals ``ref`` (cpu) exactly, dtype included."""
    assert got.device.type == "neuron", f"{what}: result on {got.device}"
    assert got.dtype == ref.dtype, f"{what}: dtype {got.dtype} != {ref.dtype}"
    torch.testing.assert_close(bits(got), bits(ref), rtol=0, atol=0, equal_nan=True, msg=lambda m: f"{what}: {m}")


class Failures:
    """Collects failing cases so one run reports all of them."""

    def __init__(self, rank):
        self.rank = rank
        self.items = []

    def check(self, what, fn):
        try:
            fn()
        except Exception as e:  # noqa: BLE001 - reported below with the case name
            self.items.append(f"rank {self.rank}: {what}: {type(e).__name__}: {str(e).splitlines()[0][:300]}")

    def raise_if_any(self):
        if self.items:
            raise AssertionError(f"{len(self.items)} failing cases:\n" + "\n".join(self.items))


class NeuronDistTestCase(MultiProcessTestCase):
    """World-2 MultiProcessTestCase: each test method runs in 2 spawned ranks."""

    @property
    def world_size(self):
        return WORLD

    def setUp(self):
        super().setUp()
        self._spawn_processes()

    def tearDown(self):
        super().tearDown()
        try:
            os.remove(self.file_name)
        except OSError:
            pass

    def init_neuron(self, backend="neuron", reference=True, **kwargs):
        """Default group on the neuron backend plus (``reference``) a CPU Gloo
        reference group ``self.gloo``."""
        torch.neuron.set_device(self.rank)
        store = dist.FileStore(self.file_name, self.world_size)
        # Short timeouts: a desynchronized case fails in seconds, not 30 min.
        kwargs.setdefault("timeout", timedelta(seconds=60))
        dist.init_process_group(backend, store=store, rank=self.rank, world_size=self.world_size, **kwargs)
        self.device = torch.device("neuron", self.rank)
        # (A group bound to neuron by device_id= cannot make a Gloo group:
        # new_group requires the same bound device, which Gloo cannot serve.)
        self.gloo = dist.new_group(backend="gloo", timeout=kwargs["timeout"]) if reference else None
        return dist.group.WORLD


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launcher_env(env=None):
    """Environment for a launcher (torchrun, accelerate) run on this checkout:
    no inherited device or rank configuration, one OpenMP thread, plus ``env``."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    full_env = dict(os.environ)
    for key in ("NEURON_RT_NUM_CORES", "NEURON_RT_VISIBLE_CORES", "LOCAL_RANK", "RANK", "WORLD_SIZE"):
        full_env.pop(key, None)
    full_env["PYTHONPATH"] = root + os.pathsep + full_env.get("PYTHONPATH", "")
    full_env["OMP_NUM_THREADS"] = "1"
    full_env.update(env or {})
    return full_env


def torchrun(script, nproc=WORLD, timeout=120, env=None, args=()):
    """Runs ``script`` (source) under torchrun with ``nproc`` ranks on this
    checkout; returns (CompletedProcess, elapsed seconds)."""
    import tempfile

    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(textwrap.dedent(script))
        path = f.name
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={nproc}", "--master-addr=127.0.0.1",
           f"--master-port={free_port()}", *args, path]
    start = time.monotonic()
    try:
        proc = subprocess.run(cmd, env=launcher_env(env), capture_output=True, text=True, timeout=timeout)
    finally:
        os.remove(path)
    return proc, time.monotonic() - start


# Fault jobs: each rank records every attempted op (error type, message,
# elapsed time) as JSON lines in its own file, FAULT_RESULTS.<rank>: the
# ranks' stdout lines interleave. Prepend to a job that defines ``rank``.
ATTEMPT = """
def attempt(name, fn):
    start = time.monotonic()
    try:
        fn()
        err, msg = None, ""
    except Exception as e:
        err, msg = type(e).__name__, str(e)
    with open(os.environ["FAULT_RESULTS"] + f".{rank}", "a") as f:
        f.write(json.dumps({"rank": rank, "op": name, "error": err, "msg": msg[:2000],
                            "elapsed": time.monotonic() - start}) + "\\n")
"""


def read_attempts(base, ranks):
    """The records ATTEMPT wrote under FAULT_RESULTS=``base`` for ``ranks``, in rank order."""
    out = []
    for rank in ranks:
        try:
            with open(f"{base}.{rank}") as f:
                out += [json.loads(line) for line in f]
        except FileNotFoundError:
            pass
    return out
