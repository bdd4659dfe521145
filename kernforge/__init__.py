"""kernforge: tile kernels written once in Python, generated for CPU C++, CUDA and Ascend C.

``import kernforge.dsl as T`` to author kernels; ``kernforge.compile(f, backend=...)``
to build and call them.
"""
from kernforge.jit import ArgumentError, BackendError, CompiledKernel, ShapeError, compile

__version__ = "0.1.0"
__all__ = ["ArgumentError", "BackendError", "CompiledKernel", "ShapeError", "compile", "__version__"]
