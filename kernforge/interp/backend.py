"""Backend "interp": the numpy reference interpreter behind the common backend contract."""
from __future__ import annotations

from typing import Optional

from kernforge.codegen import ir
from kernforge.interp.executor import Interpreter
from kernforge.jit import backend as backends


class InterpBackend:
    name = "interp"
    device = "cpu"

    def source(self, kernel: ir.Kernel, arch: Optional[str] = None) -> str:
        """The interpreter runs the IR itself; its 'source' is the IR listing."""
        return repr(kernel)

    def build(self, kernel: ir.Kernel, arch: Optional[str] = None):
        interp = Interpreter(kernel)
        return interp.run


backends.register("interp", InterpBackend)
