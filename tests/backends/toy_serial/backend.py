"""The "cpu-serial" glue: compile through kernforge.runtime and launch with the CPU backend's launcher
(the launch ABI is the CPU one; only the generated skeleton differs)."""
from __future__ import annotations

from typing import Optional

from kernforge import runtime
from kernforge.backends.base import Backend
from kernforge.backends.cpu.backend import CpuLauncher
from kernforge.backends.cpu.renderer import INCLUDE_DIR
from kernforge.codegen import ir
from kernforge.codegen.renderer import Target

from tests.backends.toy_serial.renderer import SerialRenderer


class SerialBackend(Backend):
    renderer = SerialRenderer()

    def build(self, kernel: ir.Kernel, target: Optional[Target] = None) -> CpuLauncher:
        program = self.render(kernel, target)
        module = runtime.compile(f"serial_{kernel.artifact_name}", program.source, backend="cpu",
                                 options=("-ffp-contract=off", "-fno-openmp"), include_dirs=(INCLUDE_DIR,))
        return CpuLauncher(kernel, module.get_function(program.entry), program)
