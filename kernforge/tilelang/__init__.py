"""TileLang programs on kernforge: ``kernforge.tilelang`` is a TileLang-compatible surface
(``jit``, ``compile``, ``language``, ``autotune``, ``profiler``, a ``tvm`` expression
subset) over kernforge's DSL and backends, so that a TileLang kernel runs unchanged on
interp, cpu, cuda-emu and cuda.

``python -m kernforge.tilelang script.py`` runs a TileLang script with ``tilelang`` and
``tvm`` aliased to this package for that script only; nothing is installed under those
names, so the real TileLang stays usable side by side.  docs/tilelang.md has the table of
TileLang constructs and what kernforge does with each.
"""
from kernforge.dsl.compat import UnsupportedError, unsupported
from kernforge.tilelang import cuda, language, layout, math, profiler, tvm, utils  # noqa: F401
from kernforge.tilelang.autotune import autotune
from kernforge.tilelang.jit import ENV, BackendChoiceError, JITKernel, compile, jit, select_backend
from kernforge.tilelang.math import cdiv
from kernforge.tilelang.profiler import TensorSupplyType
from kernforge.tilelang.tvm import DataType


class _PassConfigKeys:
    """``tilelang.PassConfigKey.TL_*``: keys of TileLang's ``pass_configs``, which configure
    its own compiler passes; ``compile``/``jit`` accept and ignore them, so any key is its
    name (``tl.disable_tma_lower`` for ``TL_DISABLE_TMA_LOWER``)."""

    def __getattr__(self, name: str) -> str:
        if name.startswith("__"):
            raise AttributeError(name)
        return "tl." + name[3:].lower() if name.startswith("TL_") else name


PassConfigKey = _PassConfigKeys()

__all__ = ["ENV", "BackendChoiceError", "DataType", "JITKernel", "PassConfigKey", "TensorSupplyType", "UnsupportedError", "autotune",
           "cdiv", "compile", "cuda", "disable_cache", "enable_cache", "jit", "language", "layout", "math", "profiler",
           "select_backend", "tvm", "utils"]


def disable_cache() -> None:
    """TileLang's kernel cache switch.  kernforge's JIT cache is content-addressed (a changed
    kernel never hits a stale entry), so there is nothing to disable; accepted."""


def enable_cache() -> None:
    """See :func:`disable_cache`."""


def __getattr__(name: str):
    if name.startswith("__"):
        raise AttributeError(name)
    return unsupported(f"tilelang.{name}", "this part of TileLang's Python API (toolchain, carver, "
                       "intrinsics) has no kernforge counterpart; docs/tilelang.md lists what does")
