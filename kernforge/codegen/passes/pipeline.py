"""Running an ordered list of passes: each named, each output verified, optionally dumped.

A pipeline is a plain list.  Its entries are ``Kernel -> Kernel`` transforms
and :class:`Analysis` steps, which read the kernel as it stands and record a
result (a memory plan, fragment layouts) under their name for the renderer.
Renderers own their lists (target differences are extra entries, never
``if target`` inside a pass), and every one of them runs through
:func:`run_pipeline`, so that a malformed pass output is caught at the pass
that produced it, with its name, and ``dump`` shows every step, analyses too.

An analysis keys its result by node identity, so a transform may not follow
one: the IR it described would be gone.  :func:`run_pipeline` rejects that.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence, TextIO, Union

from kernforge.codegen import ir
from kernforge.codegen.passes.composites import lower_composites
from kernforge.codegen.verify import verify

Pass = Callable[[ir.Kernel], ir.Kernel]
Dump = Union[Callable[[str, ir.Kernel], None], TextIO]


class PassError(ir.KernelError):
    """A pass produced IR that does not verify (a bug in the pass, not in the kernel)."""


@dataclass(frozen=True)
class Analysis:
    """A pipeline step that computes ``fn(kernel, facts)`` and stores it as ``facts[name]``.

    ``facts`` holds the results of the analyses before it, so one can build on another
    (CUDA's pipeline plan reads its layout plan)."""

    name: str
    fn: Callable[[ir.Kernel, dict], Any]

    def __call__(self, kernel: ir.Kernel, facts: dict) -> Any:
        return self.fn(kernel, facts)


def analysis(name: str):
    """Decorator: ``@analysis("memory")`` turns ``fn(kernel, facts)`` into an :class:`Analysis`."""
    return lambda fn: Analysis(name, fn)


def pass_name(p: Union[Pass, Analysis]) -> str:
    return p.name if isinstance(p, Analysis) else getattr(p, "__name__", type(p).__name__)


def run_pipeline(kernel: ir.Kernel, pipeline: Sequence[Union[Pass, Analysis]], dump: Optional[Dump] = None,
                 native: tuple[type, ...] = (), facts: Optional[dict] = None) -> ir.Kernel:
    """Apply ``pipeline`` in order.  After each transform the result is verified; ``dump``
    (a ``callable(name, kernel)`` or a text stream) sees the IR after every transform,
    and each analysis' result (as ``callable(name, result)`` or a ``# analysis`` block).
    Analysis results go into ``facts`` (pass a dict to receive them).

    Composite tile ops (``ir.COMPOSITES``) whose type is not in ``native`` (the ones the
    caller's renderer lowers itself) are first expanded into primitive statements; when
    there were any, that step is verified and dumped as ``lower_composites``."""
    facts = {} if facts is None else facts
    expanded = lower_composites(kernel, native)
    steps = [("lower_composites", lambda k: expanded)] if expanded is not kernel else []
    analysed = None
    verified = None  # the last kernel verified: a pass that changes nothing returns its input
    for name, p in steps + [(pass_name(p), p) for p in pipeline]:
        if isinstance(p, Analysis):
            facts[name] = result = p(kernel, facts)
            analysed = name
            if callable(dump):
                dump(name, result)
            elif dump is not None:
                dump.write(f"# analysis {name}\n{result!r}\n")
            continue
        if analysed is not None:
            raise PassError(f"pass {name} follows analysis {analysed}, whose result describes the IR "
                            f"before it; run transforms first", kernel.loc)
        kernel = p(kernel)
        if kernel is not verified:  # the IR is immutable: the same object verifies the same
            try:
                verify(kernel)
            except ir.KernelError as e:
                raise PassError(f"pass {name} produced invalid IR: {e.message}", e.loc) from e
            verified = kernel
        if dump is None:
            continue
        if callable(dump):
            dump(name, kernel)
        else:
            dump.write(f"# after {name}\n{kernel!r}\n")
    return kernel
