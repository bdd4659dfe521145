"""The registry of the engine's compute steps, each a kernforge kernel or a torch fallback.

Why: issue 15 wants the forward pass to be kernels only. Until it is, every
FLOP-carrying call of the engine goes through a function registered here, so
the remaining torch steps are listed in one place (`torch_steps()`), a run
can record which steps it used (`record()`), and the dispatch-mode test can
attribute each aten op to the step that issued it (`current_step()`).
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass


@dataclass(frozen=True)
class Step:
    name: str
    kind: str  # "kernel" (a kernforge op) or "torch" (a fallback still to replace)
    what: str


STEPS: dict[str, Step] = {}
_CURRENT: contextvars.ContextVar[str | None] = contextvars.ContextVar("kernforge_engine_step", default=None)
_RECORD: contextvars.ContextVar[tuple[dict[str, list], Callable[[], float]] | None] = contextvars.ContextVar(
    "kernforge_engine_record", default=None)


def step(name: str, kind: str, what: str) -> Callable:
    """Register `name` and wrap the function so that calls are attributed to it."""
    if kind not in ("kernel", "torch"):
        raise ValueError(f"step kind must be 'kernel' or 'torch', got {kind!r}")
    if name in STEPS:
        raise ValueError(f"step {name!r} is registered twice")
    STEPS[name] = Step(name, kind, what)

    def wrap(fn: Callable) -> Callable:
        @functools.wraps(fn)
        def run(*args, **kwargs):
            if _CURRENT.get() is not None:  # a step inside a step belongs to the outer one
                return fn(*args, **kwargs)
            recording = _RECORD.get()
            token = _CURRENT.set(name)
            t0 = recording[1]() if recording is not None else 0.0
            try:
                return fn(*args, **kwargs)
            finally:
                _CURRENT.reset(token)
                if recording is not None:
                    entry = recording[0].setdefault(name, [0, 0.0])
                    entry[0] += 1
                    entry[1] += recording[1]() - t0
        return run
    return wrap


def current_step() -> str | None:
    """The outermost step running now (None in the engine's bookkeeping code)."""
    return _CURRENT.get()


@contextlib.contextmanager
def record(clock: Callable[[], float] = time.perf_counter) -> Iterator[dict[str, list]]:
    """Count and time the outermost step calls inside the block: {step name: [calls, seconds]}.
    `clock` is the timer (the wall clock; `time.process_time` for CPU time, so that a profile
    on a loaded machine adds up to the CPU time of the run it sits in)."""
    counts: dict[str, list] = {}
    token = _RECORD.set((counts, clock))
    try:
        yield counts
    finally:
        _RECORD.reset(token)


def kernel_steps() -> list[str]:
    return sorted(n for n, s in STEPS.items() if s.kind == "kernel")


def torch_steps() -> list[str]:
    return sorted(n for n, s in STEPS.items() if s.kind == "torch")
