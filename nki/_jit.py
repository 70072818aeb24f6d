"""``nki.jit``: specialise, trace once, cache, execute.

The framework comes from the argument types: torch tensors (on ``neuron``,
or CPU — the CPU kernel of an nki_op), NumPy arrays, or FakeTensors (shape
inference under torch.compile: the kernel is traced, not executed)."""
import contextlib
import functools
import inspect
import itertools
import os
import threading

import numpy as np
import torch

from . import _device, _dtypes, _native, _philox, _target, _trace
from ._errors import NKIError
from ._exec import execute
from ._tensor import NkiTensor, shared_hbm

_ARG_BUFFER = shared_hbm  # kernel arguments live in (shared) HBM


def _is_fake(t):
    if t.device.type == "meta":
        return True
    # A plain tensor that wraps nothing is the common case; is_fake's
    # traversal of wrapper subclasses costs microseconds per call.
    if type(t) is torch.Tensor and not torch._is_functional_tensor(t):
        return False
    from torch._subclasses.fake_tensor import is_fake
    return is_fake(t)


def _precise():
    return os.environ.get("NKI_PRECISE_FP", "1") != "0"


def _constant_key(name, v):
    if isinstance(v, (torch.Tensor, np.ndarray)):
        raise NKIError(f"nki.jit: argument '{name}' nests a tensor in a tuple or dict; pass tensors as "
                       f"separate arguments")
    if isinstance(v, list):
        raise NKIError(f"nki.jit: argument '{name}' is a list; pass a tuple (kernel arguments are constants "
                       f"hashed into the specialisation)")
    if isinstance(v, dict):
        if any(not isinstance(k, str) for k in v):
            raise NKIError(f"nki.jit: argument '{name}' has non-string dictionary keys")
        return ("dict", tuple(sorted((k, _constant_key(name, x)) for k, x in v.items())))
    if isinstance(v, tuple):
        return ("tuple", tuple(_constant_key(name, x) for x in v))
    try:
        hash(v)
    except TypeError:
        raise NKIError(f"nki.jit: argument '{name}' of type {type(v).__name__} is neither a tensor nor a "
                       f"hashable constant") from None
    if isinstance(v, float):  # 0.0 == -0.0: the hex string tells them apart
        return (type(v).__name__, v.hex())
    return (type(v).__name__, v)


class _Bound:
    """The ``arguments`` of a call bound without inspect (Kernel._bind)."""
    __slots__ = ("arguments",)

    def __init__(self, arguments):
        self.arguments = arguments


class Kernel:
    """A jitted kernel; ``kernel[grid](...)`` launches an SPMD grid."""

    def __init__(self, fn, grid=(), options=None, cache=None, fast=None):
        self.fn = fn
        self.grid = grid
        self.options = options or {}
        self._cache = {} if cache is None else cache  # specialisation -> traced Program
        self._fast = {} if fast is None else fast  # launch fast path (_fast_key) -> entry
        self._sig = inspect.signature(fn)
        # Names of a signature of plain positional parameters: a call with
        # exactly that many positional arguments binds without inspect.
        kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
        params = list(self._sig.parameters.values())
        self._plain = tuple(p.name for p in params) if all(p.kind in kinds for p in params) else None
        functools.update_wrapper(self, fn)

    def __getitem__(self, grid):
        grid = grid if isinstance(grid, tuple) else (grid,)
        try:
            grid = tuple(int(g) for g in grid)
        except TypeError:
            raise NKIError(f"nki.jit: the launch grid must be integers, got {grid!r}") from None
        if any(g < 1 for g in grid):
            raise NKIError(f"nki.jit: launch grid {grid} has an empty axis")
        return Kernel(self.fn, grid, self.options, self._cache, self._fast)

    def __repr__(self):
        return f"<nki.jit kernel {self.fn.__qualname__} grid={list(self.grid)}>"

    # -- specialisation --------------------------------------------------------
    def _bind(self, args, kwargs):
        if not kwargs and self._plain is not None and len(args) == len(self._plain):
            return _Bound(dict(zip(self._plain, args)))
        try:
            bound = self._sig.bind(*args, **kwargs)
        except TypeError as e:
            raise NKIError(f"nki.jit: {self.fn.__qualname__}: {e}") from None
        bound.apply_defaults()
        return bound

    def trace(self, args, kwargs=None):
        """The Program for these arguments (traced once per specialisation)."""
        return self._specialise(self._bind(args, kwargs or {}))[0]

    def _specialise(self, bound):
        specs, tensors, frameworks = [], [], set()
        for name, v in bound.arguments.items():
            if isinstance(v, torch.Tensor):
                frameworks.add("torch")
                dtype = _dtypes.check(v.dtype, name, "nki.jit")
                # int() specialises symbolic sizes (a guard under torch.compile):
                # the trace unrolls loops over them.
                specs.append(("tensor", tuple(int(s) for s in v.shape), dtype))
                tensors.append((name, v))
            elif isinstance(v, np.ndarray):
                frameworks.add("numpy")
                dtype = _dtypes.from_numpy(v.dtype)
                specs.append(("tensor", tuple(v.shape), dtype))
                tensors.append((name, v))
            else:
                specs.append(_constant_key(name, v))
        if len(frameworks) > 1:
            raise NKIError("nki.jit: a kernel takes either torch tensors or NumPy arrays, not both")
        key = (tuple(specs), self.grid, _target.current())
        program = self._cache.get(key)
        if program is None:
            program = self._trace(bound)
            self._cache[key] = program
        return program, tensors, (frameworks.pop() if frameworks else "numpy")

    def _trace(self, bound):
        tracer = _trace.Tracer(_target.current(), self.grid)
        with _trace.tracing(tracer):
            call = {}
            for name, v in bound.arguments.items():
                if isinstance(v, (torch.Tensor, np.ndarray)):
                    dtype = _dtypes.check(v.dtype, name, "nki.jit") if isinstance(v, torch.Tensor) \
                        else _dtypes.from_numpy(v.dtype)
                    shape = tuple(int(s) for s in v.shape)
                    st = tracer.new_storage(_ARG_BUFFER, dtype, shape, name, arg=name)
                    call[name] = NkiTensor(st, shape, _check=False)
                else:
                    call[name] = v
            call = inspect.BoundArguments(self._sig, call)
            result = None
            instances = list(itertools.product(*[range(g) for g in self.grid])) or [()]
            for n, pid in enumerate(instances):
                tracer.instance, tracer.shared_cursor, tracer.program_id = n, 0, pid
                r = self.fn(*call.args, **call.kwargs)
                if n == 0:
                    result = r
        _trace.check_returned(result)
        program = _trace.Program(tracer.storages, tracer.instrs, result, tracer.target)
        program.name = getattr(self.fn, "__name__", "kernel")  # the launch's name (profiler, errors)
        return program

    # -- launch ---------------------------------------------------------------
    def __call__(self, *args, **kwargs):
        if _trace.active() is not None:  # a kernel calling a kernel: inline it
            return self.fn(*args, **kwargs)
        return _launch(self, args, kwargs)


_observers = threading.local()


@contextlib.contextmanager
def observe_writes():
    """Collects the tensors that kernel launches in this block write (known
    from the trace, so FakeTensor launches report them too): nki_op checks
    them against its ``mutates_args``."""
    stack = _observers.__dict__.setdefault("stack", [])
    written = []
    stack.append(written)
    try:
        yield written
    finally:
        stack.pop()


def _launch_impl(kernel, args, kwargs):
    stack = getattr(_observers, "stack", None)
    key = None if kwargs else _fast_key(kernel, args)
    if key is not None:
        entry = kernel._fast.get(key)
        if entry is not None:
            if stack:  # nki_op checks the arguments the kernel writes
                stack[-1].extend(args[i] for i in entry[5])
            return _fast_launch(entry, args, key[-4])
    bound = kernel._bind(args, kwargs)
    program, tensors, framework = kernel._specialise(bound)
    if stack:
        written = _written(program)
        stack[-1].extend(t for n, t in tensors if n in written)
    if framework == "torch":
        result = _run_torch(program, tensors)
        if key is not None:
            entry = _fast_entry(kernel, program, key[-4])  # the key ends: device, target, precise, mode
            if entry is not None:
                kernel._fast[key] = entry
        return result
    return _run_numpy(program, tensors)


# The launch fast path: a repeated call with the same argument signature, of
# plain contiguous tensors on one device and constants of builtin types, goes
# straight to its native program (what _specialise and _run_torch would do,
# without their checks and lookups: about half of a small kernel's call cost).
# Inside nki_op it reports the written arguments as the full path does.
# Anything else, and the first call of a signature, takes the path above.
_CONSTANTS = (int, float, bool, str, type(None))


def _fast_key(kernel, args):
    """The call's fast-path key, or None when it does not qualify."""
    if kernel._plain is None or len(args) != len(kernel._plain):
        return None
    key = [kernel.grid]
    device = None
    for a in args:
        if type(a) is torch.Tensor:
            if not a.is_contiguous() or torch._is_functional_tensor(a):
                return None
            d = a.device
            if device is None:
                device = d
            elif d != device:
                return None
            key.append((a.shape, a.dtype))
        elif type(a) in _CONSTANTS:
            # float.hex tells 0.0 from -0.0 (equal keys otherwise); NaN never hits
            key.append((type(a), a.hex() if type(a) is float else a))
        else:
            return None
    if device is None or device.type in ("cpu", "meta"):
        return None
    key += (device, _target.current(), _precise(), _native.mode())
    return tuple(key)


def _fast_entry(kernel, program, device):
    """What _fast_launch needs for ``program``, or None to keep the full path."""
    if not hasattr(_device.executor(device.type), "native_program"):
        return None
    native = _native.plan(program, _precise())
    if native is None or native.seed is not None or native.prints:
        return None
    # Tensors by index into (*arguments, *outputs, None): the launch's list in
    # native.bound's order, and the result when it is one tensor.
    n = len(kernel._plain)
    index = {sid: kernel._plain.index(name) for sid, name in _arg_storages(program)}
    outs = _output_storages(program)
    index.update((st.id, n + j) for j, st in enumerate(outs))
    order = [index.get(sid, n + len(outs)) for sid in native.bound]
    result = program.result
    if isinstance(result, NkiTensor):
        arg = result.storage.arg
        result = kernel._plain.index(arg) if arg is not None else index[result.storage.id]
    written = [i for i, name in enumerate(kernel._plain) if name in _written(program)]
    return native, order, [(st.id, st.shape, st.dtype) for st in outs], result, kernel._plain, written


def _fast_launch(entry, args, device):
    native, order, out_specs, result, names, _written_args = entry
    pool = (*args, *(torch.empty(shape, dtype=dtype, device=device) for _sid, shape, dtype in out_specs), None)
    native.launch([pool[i] for i in order])
    if type(result) is int:
        return pool[result]
    n = len(names)  # a tuple (or None): _rebuild by storage and argument name
    outs = {sid: pool[n + j] for j, (sid, _shape, _dtype) in enumerate(out_specs)}
    return _rebuild(result, outs, dict(zip(names, args)))


# Dynamo cannot trace the interpreter: a raw kernel call in a compiled region
# is a graph break (an error under fullgraph=True) that names the fix.
_launch = torch.compiler.disable(
    _launch_impl, reason="an NKI kernel call runs eagerly; register it with torch_neuronx.nki_op to keep it in "
                         "a torch.compile graph (fullgraph=True)")


def _rebuild(result, outs, callers):
    """The kernel's result in the caller's objects: a returned argument is
    the tensor (or array) the caller passed, an allocated output is new."""
    if isinstance(result, NkiTensor):
        arg = result.storage.arg
        return callers[arg] if arg is not None else outs[result.storage.id]
    if isinstance(result, (tuple, list)):
        return type(result)(_rebuild(r, outs, callers) for r in result)
    return None


# Strided arguments: HBM is addressed row-major, so a non-contiguous argument
# runs on a contiguous copy, and a written one is copied back afterwards.
# Counted for tests (argument_copies()): one copy each way.
_copies = {"materialized": 0, "copied_back": 0}


def argument_copies(reset=False):
    """How many non-contiguous kernel arguments were copied to a contiguous
    buffer (``materialized``) and how many written ones were copied back
    (``copied_back``) since the last reset."""
    counts = dict(_copies)
    if reset:
        _copies.update(materialized=0, copied_back=0)
    return counts


def _written(program):
    cached = program.__dict__.get("_written")
    if cached is None:
        cached = program.__dict__["_written"] = frozenset(_trace.written_args(program))
    return cached


def _overlaps(shape, strides):
    """Whether two elements of a strided view may share memory: sorted by
    stride, each dim must step past the whole extent of the smaller ones."""
    extent = 0
    for stride, size in sorted((abs(st), n) for n, st in zip(shape, strides) if n > 1):
        if stride <= extent:
            return True
        extent += stride * (size - 1)
    return False


def _row_major(items, program):
    """``items`` (name, tensor or array) with each non-contiguous one
    replaced by a contiguous copy; and the (caller's, copy) pairs of the
    written ones, to copy back after the kernel."""
    written = _written(program)
    out, back = [], []
    for name, t in items:
        if isinstance(t, torch.Tensor):
            if t.is_contiguous():
                out.append((name, t))
                continue
            if name in written and _overlaps(t.shape, t.stride()):
                raise NKIError(f"nki.jit: argument '{name}' is written by the kernel, but elements of it share "
                               f"memory (an expanded view); pass a tensor that owns its elements")
            c = t.contiguous()
        else:
            if t.flags.c_contiguous:
                out.append((name, t))
                continue
            if name in written and t.flags.writeable and _overlaps(t.shape, [s // t.itemsize for s in t.strides]):
                raise NKIError(f"nki.jit: argument '{name}' is written by the kernel, but elements of it share "
                               f"memory (a broadcast view); pass an array that owns its elements")
            c = np.ascontiguousarray(t)
        _copies["materialized"] += 1
        out.append((name, c))
        if name in written:
            back.append((name, t, c))
    return out, back


def _copy_back(back):
    for _name, t, c in back:
        if isinstance(t, torch.Tensor):
            t.copy_(c)
        elif t.flags.writeable:
            t[...] = c
        else:
            continue
        _copies["copied_back"] += 1


def _run_torch(program, tensors):
    devices = {t.device for _n, t in tensors}
    if len(devices) > 1:
        raise NKIError(f"nki.jit: tensor arguments are on different devices: {sorted(map(str, devices))}")
    device = devices.pop() if devices else torch.device("cpu")
    fake = any(_is_fake(t) for _n, t in tensors)
    outs = {st.id: torch.empty(st.shape, dtype=st.dtype, device=device) for st in _output_storages(program)}
    result = _rebuild(program.result, outs, dict(tensors))
    if fake:  # shape inference: the trace gave shapes and dtypes
        return result
    # The device's executor (nki/_device.py); an NKIError names a device no backend serves.
    ex = None if device.type == "cpu" else _device.executor(device.type)
    tensors, back = _row_major(tensors, program)  # on a device: copies on the current stream
    if ex is None:
        _execute(program, _bind_storages(program, {n: t for n, t in tensors}, outs), outs)
        _copy_back(back)
        return result
    native = _native.plan(program, _precise()) if hasattr(ex, "native_program") else None
    if native is not None:  # one runtime launch on the current stream, over device memory
        native.run(_bind_storages(program, {n: t for n, t in tensors}, outs, flat=False))
        _copy_back(back)
        return result
    index = device.index if device.index is not None else ex.current_device()
    host = {n: ex.host_alias(t) for n, t in tensors}
    host_outs = {sid: ex.host_alias(t) for sid, t in outs.items()}
    bound = _bind_storages(program, host, host_outs)

    def kernel():
        _execute(program, bound, host_outs)
    ex.launch(index, kernel, getattr(program, "name", "nki_kernel"))
    _copy_back(back)
    return result


def _run_numpy(program, arrays):
    callers = dict(arrays)
    arrays, back = _row_major(arrays, program)
    for name, t, c in back:
        if not t.flags.writeable:
            callers[name] = c  # a read-only view cannot take the result: its copy is what comes back
    args = {}
    for name, a in arrays:
        if not a.flags.writeable:
            a = a.copy()  # the caller cannot see writes into it: the copy is what a returned argument gives
            callers[name] = a
        args[name] = torch.from_numpy(a) if a.ndim else torch.from_numpy(a.reshape(1)).reshape(())
    outs = {st.id: torch.empty(st.shape, dtype=st.dtype) for st in _output_storages(program)}
    for st in _output_storages(program):
        _dtypes.to_numpy(st.dtype)
    _execute(program, _bind_storages(program, args, outs), outs)
    _copy_back(back)
    return _rebuild(program.result, {sid: t.numpy() for sid, t in outs.items()}, callers)


def _output_storages(program):
    cached = program.__dict__.get("_output_storages")  # a traced program does not change
    if cached is None:
        seen = {}
        for t in program.outputs():
            seen[t.storage.id] = t.storage
        cached = program.__dict__["_output_storages"] = list(seen.values())
    return cached


def _arg_storages(program):
    cached = program.__dict__.get("_arg_storages")  # (storage id, argument name)
    if cached is None:
        cached = program.__dict__["_arg_storages"] = [
            (st.id, st.arg) for st in program.storages.values() if st.arg is not None]
    return cached


def _bind_storages(program, args, outs, flat=True):
    """Storage id -> tensor. ``flat``: 1-D views, as the interpreter indexes
    them; the native program takes any contiguous tensor of the storage's
    size, so its launches skip the views (microseconds per argument)."""
    bound = {}
    for sid, arg in _arg_storages(program):
        bound[sid] = args[arg].reshape(-1) if flat else args[arg]
    for sid, t in outs.items():
        bound[sid] = t.reshape(-1) if flat else t
    if "_seed" not in program.__dict__:
        program.__dict__["_seed"] = _philox.seed_storage(program)
    if program.__dict__["_seed"] is not None:  # one Philox key per call, from torch's generator
        bound[_philox.SEED] = _philox.draw_key()
    return bound


def _execute(program, bound, outs):
    # Fresh outputs hold the NaN sentinel, as every new buffer does (the
    # native program fills them itself). Filled here, inside the launch: it
    # is device work like the kernel itself. No autograd: kernels write into
    # their arguments in place (autograd for a kernel comes from
    # nki_op(...).register_autograd).
    with torch.no_grad():
        precise = _precise()
        native = _native.plan(program, precise)
        if native is not None:
            native.run(bound)
            return
        for sid in outs:
            bound[sid].fill_(_dtypes.sentinel(bound[sid].dtype))
        execute(program, bound, precise)


def jit(fn=None, mode=None, platform_target=None, **options):
    """Marks a kernel. ``mode`` is ignored (the framework comes from the
    arguments); the target comes from NEURON_PLATFORM_TARGET_OVERRIDE."""
    if platform_target is not None:
        raise NKIError("nki.jit: platform_target= was removed in NKI 0.3; set NEURON_PLATFORM_TARGET_OVERRIDE "
                       "(trn1, trn2 or trn3) instead")
    if fn is None:
        return lambda f: jit(f, mode=mode, **options)
    if isinstance(fn, Kernel):
        return fn
    return Kernel(fn, options=options)


def simulate(kernel):
    """Runs ``kernel`` on the CPU simulator (ours is the same interpreter that
    backs the ``neuron`` device): NumPy arrays in, NumPy arrays out; torch
    tensors in, torch tensors out."""
    return kernel if isinstance(kernel, Kernel) else Kernel(kernel)
