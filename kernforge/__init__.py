"""kernforge: tile kernels written once in Python, generated for CPU C++, CUDA and Ascend C.

``import kernforge.dsl as T`` to author kernels; ``kernforge.compile(f, backend=...)``
to build and call them.  Submodules load on first use, so that ``import kernforge``
stays cheap for processes that only touch the runtime or the recipe layer.
"""
import importlib

__version__ = "0.1.0"
_LAZY = {"compile": "kernforge.jit", "CompiledKernel": "kernforge.jit",
         "ArgumentError": "kernforge.jit", "ShapeError": "kernforge.jit",
         "BackendError": "kernforge.jit"}
__all__ = sorted(_LAZY) + ["__version__"]


def __getattr__(name):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'kernforge' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
