"""kernforge: tile kernels written once in Python, generated for CPU C++, CUDA and Ascend C.

``import kernforge.dsl as T`` to author kernels; ``kernforge.compile(f, backend=...)``
to build and call them.  The names in ``__all__`` load on first use (``kernforge.jit``
pulls in the backends and codegen, about 0.3 s), so that ``import kernforge`` stays cheap
for processes that only touch the runtime or the recipe layer.  ``dir(kernforge)``,
``from kernforge import *`` and editors (through the ``TYPE_CHECKING`` imports below) see
them all the same.
"""
import importlib as _importlib
import typing as _typing

if _typing.TYPE_CHECKING:  # what editors and type checkers resolve the lazy names to
    from kernforge.codegen.ir import CheckError
    from kernforge.jit import ArgumentError, BackendError, CompiledKernel, ShapeError, compile
    from kernforge import tune

__version__ = "0.1.0"
_LAZY = {"compile": "kernforge.jit", "CompiledKernel": "kernforge.jit",
         "ArgumentError": "kernforge.jit", "ShapeError": "kernforge.jit",
         "BackendError": "kernforge.jit", "CheckError": "kernforge.codegen.ir"}
# subpackages that are also entry points: ``kernforge.tune(...)`` calls the (callable) module
_SUBPACKAGES = ("tune",)
__all__ = sorted(_LAZY) + list(_SUBPACKAGES) + ["__version__"]


def __getattr__(name):
    if name in _SUBPACKAGES:
        return _importlib.import_module(f"kernforge.{name}")  # the import binds it as an attribute
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'kernforge' has no attribute {name!r}")
    value = getattr(_importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip this hook
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))
