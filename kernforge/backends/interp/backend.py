"""Backend "interp": the numpy reference interpreter behind the common backend contract.

The interpreter runs the tile IR itself, so its "renderer" has no transforms and
its program's source is the IR listing.  Composite ops stay whole: the
interpreter evaluates each through the same expansion other backends get
(``passes.composites``), one statement at a time, so its errors point at the
composite's line.  Checked mode (``Target.checks``) runs the shared checks pass and
the interpreter evaluates its ``ir.Check`` nodes, raising :class:`kernforge.CheckError`
as the compiled backends' launchers do (its own bounds checks stay on either way)."""
from __future__ import annotations

from typing import Optional, Sequence

from kernforge.backends.base import Backend
from kernforge.codegen import ir
from kernforge.codegen.passes.checks import insert_checks
from kernforge.codegen.renderer import Program, Renderer, Target
from kernforge.interp.executor import Interpreter


class IrRenderer(Renderer):
    name = "interp"

    def pipeline(self, kernel: ir.Kernel, target: Target) -> tuple:
        return (insert_checks,) if target.checks else ()

    def native(self, kernel: ir.Kernel, target: Target) -> tuple[type, ...]:
        return ir.COMPOSITES

    def emit_program(self, kernel: ir.Kernel, facts: dict, target: Target) -> Program:
        return Program(repr(kernel), kernel.name)


class InterpLauncher:
    def __init__(self, kernel: ir.Kernel, program: Program):
        self.program = program
        self.interpreter = Interpreter(kernel)

    def __call__(self, args: Sequence, dims: Sequence[int], grid: Sequence[int]) -> None:
        self.interpreter.run(args, dims, grid)


class InterpBackend(Backend):
    renderer = IrRenderer()
    speed_path = False
    supports_checks = True

    def build(self, kernel: ir.Kernel, target: Optional[Target] = None) -> InterpLauncher:
        target = target or self.target()
        program = self.render(kernel, target)
        return InterpLauncher(self.renderer.lower(kernel, target)[0] if target.checks else kernel, program)
