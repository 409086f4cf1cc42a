"""One launch at a time under the Triton interpreter.

Triton's interpreter keeps the running launch's grid and program ids in module state
(``triton.runtime.interpreter.interpreter_builder``) and patches ``triton.language`` while a
kernel runs, so two threads launching at once read each other's grid: 16 threads calling
``flashtune.attention`` with gradients failed 56 of 64 calls with ``InterpreterError``
(``x >= grid_dim[0]``; triton 3.6, CPU). ``serialise_launches()`` wraps the interpreter's
launch entry (``InterpretedFunction.run``, which every ``kernel[grid](...)`` and
``kernel.run(...)`` reaches) in one process-wide lock; compiled GPU launches are untouched.
kernels/launch.py, which every kernel launch of flashtune goes through, installs it at import;
the dispatcher's own caches are thread-safe without it.
"""

from __future__ import annotations

import functools
import threading

from flashtune.device import INTERPRETER  # what decided whether the kernels are interpreted

_LOCK = threading.RLock()
_INSTALLED = False


def serialise_launches() -> None:
    """Under the interpreter (TRITON_INTERPRET=1), make every interpreted launch of this
    process take one lock; idempotent, nothing otherwise."""
    global _INSTALLED
    if _INSTALLED or not INTERPRETER:
        return
    with _LOCK:
        if _INSTALLED:
            return
        from triton.runtime.interpreter import InterpretedFunction

        run = InterpretedFunction.run

        @functools.wraps(run)
        def locked_run(self, *args, **kwargs):
            with _LOCK:
                return run(self, *args, **kwargs)

        InterpretedFunction.run = locked_run
        _INSTALLED = True
