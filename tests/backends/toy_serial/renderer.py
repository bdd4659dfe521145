"""The "cpu-serial" renderer: the CPU renderer's statement lowering, its own skeleton and pass list."""
from __future__ import annotations

import os

from kernforge.backends.cpu.renderer import CpuRenderer
from kernforge.codegen import ir
from kernforge.codegen.passes import simplify


def unroll_nothing(kernel: ir.Kernel) -> ir.Kernel:
    """This backend's own pass, to show where one goes: an identity transform, verified and
    dumped like every other entry of the pipeline."""
    return kernel


class SerialRenderer(CpuRenderer):
    name = "cpu-serial"
    template = "serial_module.cpp.j2"
    template_dir = os.path.join(os.path.dirname(os.path.abspath(__file__)), "templates")
    transforms = CpuRenderer.transforms + (unroll_nothing, simplify)
