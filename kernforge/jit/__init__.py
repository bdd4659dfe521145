"""Kernel objects: specialise a DSL kernel, build it for a backend, check and launch calls."""
from kernforge.backends import BackendError
from kernforge.jit.kernel import ArgumentError, CompiledKernel, ShapeError, compile

__all__ = ["ArgumentError", "BackendError", "CompiledKernel", "ShapeError", "compile"]
