"""What a backend is, to the rest of kernforge: a renderer, a pass list, templates and launch glue.

Every backend follows one contract, so the JIT, the CLI, the ops and the tests
treat them alike:

* ``target(arch, launch=False) -> Target``: what to render for; with
  ``launch=True`` the backend resolves the machine it will really run on (the
  CUDA backend asks the GPU for its arch) instead of its emission default.
* ``render(kernel, target, dump=None) -> Program``: the renderer's pipeline
  (transforms and analyses, each verified and dumped) and then the text.
* ``build(kernel, target) -> Launcher``: render, compile through
  :mod:`kernforge.runtime`, load.  ``launcher.program`` is the program that was
  built, so ``CompiledKernel.get_kernel_source()`` shows what runs.

Launch contract (what :class:`kernforge.jit.kernel.CompiledKernel` hands to
``Launcher.__call__`` after checking every argument):

* ``args``: one entry per kernel parameter, in order.  Buffers arrive as torch
  tensors on the backend's device or, for ``cpu``-device backends, possibly as
  numpy arrays (zero-copy views; bf16/fp8 through ml-dtypes) unless the
  launcher sets ``takes_torch``.  Scalars arrive as Python int/float.
* ``dims``: the values of ``kernel.symbols`` (symbolic shapes and strides, in
  elements), in order.
* ``grid``: the launch grid, already evaluated to ints.
* Optional ``bind(dims, scalars) -> run(args) | None``: a launch with the symbol values and
  the scalars (``{param index: value}``) fixed, which the JIT memoises with the argument
  plan and then calls with the buffers alone (all torch tensors); None when the launcher
  cannot (the CPU launcher's checked builds).

``name``, ``device`` and ``lang`` are set from the backend's line in
:mod:`kernforge.backends.registry` when it is created, so they are written once.
"""
from __future__ import annotations

from typing import Optional, Protocol, Sequence

from kernforge.codegen import ir
from kernforge.codegen.renderer import Program, Renderer, Target


class BackendError(Exception):
    """An unknown backend, or one whose toolchain or device is missing."""


class Launcher(Protocol):
    program: Program

    def __call__(self, args: Sequence, dims: Sequence[int], grid: Sequence[int]) -> None: ...


class Backend:
    """The shared part of every backend: targets, rendering through ``renderer``, emitted source."""

    name: str = ""
    device: str = "cpu"
    lang: str = ""
    renderer: Renderer
    # How tools label a passing check on this backend ("CUDA semantics verified on host emulation").
    verified_label = "verified"
    # False for oracles and emulators: tools give them small problems and time them once.
    speed_path = True

    def workers(self) -> Optional[int]:
        """How many grid blocks the next launch runs at once on a host backend (its thread
        team), so that an op can split work that would leave threads idle; None where the
        backend does not run blocks in parallel (oracles, emulators) or has its own device
        query (CUDA: the SM count)."""
        return None

    def target(self, arch: Optional[str] = None, launch: bool = False) -> Target:
        return Target(self.name, arch)

    def render(self, kernel: ir.Kernel, target: Optional[Target] = None, dump=None) -> Program:
        return self.renderer.render(kernel, target or self.target(), dump)

    def source(self, kernel: ir.Kernel, arch: Optional[str] = None) -> str:
        """The generated source text for ``arch`` (``kernforge emit``)."""
        return self.render(kernel, self.target(arch)).source

    def build(self, kernel: ir.Kernel, target: Optional[Target] = None) -> Launcher:
        raise NotImplementedError

