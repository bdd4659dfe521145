"""What a backend is, to the rest of kernforge: a renderer + templates + runtime glue.

A backend turns a verified tile-IR :class:`~kernforge.codegen.ir.Kernel` into
something that runs.  Registering one (``register``) is all it takes to make
``kernforge.compile(f, backend=NAME)``, ``kernforge emit/run --backend NAME``
and the ops' ``backend=`` keyword reach it; the DSL never changes.

Launch contract (what :class:`kernforge.jit.kernel.CompiledKernel` hands to
``Launcher.__call__`` after checking every argument):

* ``args``: one entry per kernel parameter, in order.  Buffers arrive as numpy
  arrays for host backends (``device == "cpu"``; zero-copy views of torch CPU
  tensors, bf16/fp8 viewed through ml-dtypes) or as torch tensors for device
  backends (``device == "cuda"``).  Scalars arrive as Python int/float.
* ``dims``: the values of ``kernel.symbols`` (symbolic shapes and strides, in
  elements), in order.
* ``grid``: the launch grid, already evaluated to ints.
"""
from __future__ import annotations

from typing import Callable, Optional, Protocol, Sequence

from kernforge.codegen import ir


class BackendError(Exception):
    """An unknown backend, or one whose toolchain or device is missing."""


class Launcher(Protocol):
    def __call__(self, args: Sequence, dims: Sequence[int], grid: Sequence[int]) -> None: ...


class Backend(Protocol):
    name: str
    device: str  # "cpu" (host arrays) or "cuda" (torch CUDA tensors)

    def source(self, kernel: ir.Kernel, arch: Optional[str] = None) -> str:
        """The generated source text (``kernforge emit``)."""

    def build(self, kernel: ir.Kernel, arch: Optional[str] = None) -> Launcher:
        """Compile (through kernforge.runtime) and load; return a launcher."""


_REGISTRY: dict[str, Callable[[], Backend]] = {}
_BUILTIN = {
    "interp": "kernforge.interp.backend",
    "cpu": "kernforge.codegen.render.cpu_backend",
    "cuda": "kernforge.codegen.render.cuda_backend",
    "cuda-emu": "kernforge.codegen.render.cuda_emu_backend",
    "ascend": None,
}


def register(name: str, factory: Callable[[], Backend]) -> None:
    _REGISTRY[name] = factory


def names() -> list[str]:
    return sorted(set(_REGISTRY) | set(_BUILTIN))


def get(name: str) -> Backend:
    """The backend called ``name``; a clear :class:`BackendError` if it does not exist."""
    if name not in _REGISTRY and name in _BUILTIN:
        module = _BUILTIN[name]
        if module is None:
            raise BackendError(f"backend {name!r} is not implemented yet in this version of kernforge "
                               f"(available: {', '.join(available())})")
        import importlib

        try:
            importlib.import_module(module)
        except ModuleNotFoundError as e:
            if e.name and e.name.startswith("kernforge"):
                raise BackendError(f"backend {name!r} is not implemented yet ({e.name} missing)") from e
            raise
    if name not in _REGISTRY:
        raise BackendError(f"unknown backend {name!r}; known: {', '.join(names())}")
    return _REGISTRY[name]()


def available() -> list[str]:
    out = []
    for n, m in _BUILTIN.items():
        if m is None:
            continue
        try:
            get(n)
        except BackendError:
            continue
        out.append(n)
    return out + [n for n in _REGISTRY if n not in _BUILTIN]
