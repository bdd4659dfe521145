"""Auto-tuning: ``kernforge.tune.tune(kernel, backend=..., problem=...)`` sweeps a library
kernel's ``@T.tunable`` space, verifies and times each configuration, and records the
results in a SQLite database that the ops consult through :func:`lookup`
(docs/tuning.md)."""
import sys as _sys
import types as _types

from kernforge.tune.db import Database, Key, Row, default_path
from kernforge.tune.consult import lookup, reset
from kernforge.tune.errors import BadShapeError, EmptySpaceError, TuneError, UnknownKernelError, UnknownTunableError
from kernforge.tune.sweep import STRATEGIES, TuneResult, tune

__all__ = ["STRATEGIES", "BadShapeError", "Database", "EmptySpaceError", "Key", "Row", "TuneError", "TuneResult",
           "UnknownKernelError", "UnknownTunableError", "default_path", "lookup", "reset", "tune"]


class _CallableModule(_types.ModuleType):
    """Lets ``import kernforge.tune`` then ``kernforge.tune(kernel, ...)`` call :func:`tune`,
    the spelling the tuning issue and TileLang/Triton users expect."""

    def __call__(self, *args, **kwargs) -> TuneResult:
        return tune(*args, **kwargs)


_sys.modules[__name__].__class__ = _CallableModule
