"""A prompt exit for vLLM's engine-core (and worker) processes.

vLLM stops its engine core with SIGTERM and kills it 5 s later. With vLLM,
Transformers and torch loaded, the interpreter's own finalization (collecting
every module's objects) takes longer than that on a busy host, so the process
was killed and its C-level exit handlers never ran — among them the runtime's,
which removes the process's record in /dev/shm (docs/tools.md). In those child
processes we end the interpreter after Python's exit handlers: libc ``exit``
runs the C ones (the runtime's included) and skips the module teardown, which
has nothing left to do for a process that is going away.
"""

from __future__ import annotations

import atexit
import ctypes
import logging
import multiprocessing
import os
import sys

_INSTALLED = False


def _exit_now() -> None:
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # a closed stream: nothing to flush
            pass
    code = 0
    ctypes.CDLL(None).exit(code)


def install() -> bool:
    """Installs the prompt exit in a process vLLM started (not in the user's own process)."""
    global _INSTALLED
    if _INSTALLED or multiprocessing.current_process().name == "MainProcess":
        return False
    if os.environ.get("TORCH_NEURONX_VLLM_FAST_EXIT", "1") == "0":
        return False
    # Registered now, so it runs before the handlers registered earlier (LIFO)
    # ... and after those vLLM registers later; logging is flushed by hand.
    atexit.register(_exit_now)
    _INSTALLED = True
    return True
