"""Running an ordered list of passes: each named, each output verified, optionally dumped.

A pipeline is a plain list of ``Kernel -> Kernel`` functions.  Renderers own
their lists (target differences are extra entries, never ``if target`` inside
a pass), and every one of them runs through :func:`run_pipeline` so that a
malformed pass output is caught at the pass that produced it, with its name.
"""
from __future__ import annotations

from typing import Callable, Optional, Sequence, TextIO, Union

from kernforge.codegen import ir
from kernforge.codegen.passes.composites import lower_composites
from kernforge.codegen.verify import verify

Pass = Callable[[ir.Kernel], ir.Kernel]
Dump = Union[Callable[[str, ir.Kernel], None], TextIO]


class PassError(ir.KernelError):
    """A pass produced IR that does not verify (a bug in the pass, not in the kernel)."""


def pass_name(p: Pass) -> str:
    return getattr(p, "__name__", type(p).__name__)


def run_pipeline(kernel: ir.Kernel, pipeline: Sequence[Pass], dump: Optional[Dump] = None,
                 native: tuple[type, ...] = ()) -> ir.Kernel:
    """Apply ``pipeline`` in order.  After each pass the result is verified; ``dump``
    (a ``callable(name, kernel)`` or a text stream) sees the IR after every pass.

    Composite tile ops (``ir.COMPOSITES``) whose type is not in ``native`` (the ones the
    caller's renderer lowers itself) are first expanded into primitive statements; when
    there were any, that step is verified and dumped as ``lower_composites``."""
    expanded = lower_composites(kernel, native)
    steps = [("lower_composites", lambda k: expanded)] if expanded is not kernel else []
    for name, p in steps + [(pass_name(p), p) for p in pipeline]:
        kernel = p(kernel)
        try:
            verify(kernel)
        except ir.KernelError as e:
            raise PassError(f"pass {name} produced invalid IR: {e.message}", e.loc) from e
        if dump is None:
            continue
        if callable(dump):
            dump(name, kernel)
        else:
            dump.write(f"# after {name}\n{kernel!r}\n")
    return kernel
