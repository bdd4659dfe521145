"""On-chip buffer planning: sizes, offsets and lifetimes in one block's memory.

Each ``Allocate`` is live from its statement to the end of the enclosing
``Seq`` (ir docstring).  The planner numbers statements in program order,
gives each selected buffer the interval it is live in, and packs buffers into
one region first-fit, largest first, letting buffers whose intervals do not
overlap share bytes.  The CPU renderer places shared/fragment tiles in a
per-thread arena with it; a CUDA renderer can plan its dynamic shared memory
the same way (``include=lambda b: b.scope is ir.Scope.SHARED``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from kernforge.codegen import ir


@dataclass(frozen=True)
class Slot:
    """Where one buffer lives: ``[offset, offset + size)`` during statements ``[first, last]``."""

    buffer: ir.Buffer
    offset: int
    size: int
    first: int
    last: int


@dataclass(frozen=True)
class MemoryPlan:
    slots: tuple[Slot, ...]
    total: int  # bytes, a multiple of the alignment
    align: int

    def offset(self, buffer: ir.Buffer) -> int:
        for s in self.slots:
            if s.buffer is buffer:
                return s.offset
        raise KeyError(f"buffer {buffer.name} is not in the memory plan")

    def __contains__(self, buffer: ir.Buffer) -> bool:
        return any(s.buffer is buffer for s in self.slots)


def buffer_bytes(buffer: ir.Buffer) -> int:
    n = buffer.dtype.itemsize
    for d in buffer.static_shape():
        n *= d
    return n


def lifetimes(body: ir.Stmt) -> dict[ir.Buffer, tuple[int, int]]:
    """``{buffer: (first, last)}`` statement numbers for every allocation in ``body``."""
    out: dict[ir.Buffer, tuple[int, int]] = {}
    counter = [0]

    def visit(s: ir.Stmt) -> None:
        counter[0] += 1
        if isinstance(s, ir.Seq):
            opened = []
            for x in s.body:
                if isinstance(x, ir.Allocate):
                    out[x.buffer] = (counter[0] + 1, -1)
                    opened.append(x.buffer)
                visit(x)
            for b in opened:
                out[b] = (out[b][0], counter[0])
            return
        for c in ir.children(s):
            if isinstance(c, ir.Stmt):
                visit(c)

    visit(body)
    return out


def _round(n: int, align: int) -> int:
    return (n + align - 1) // align * align


def plan_memory(kernel: ir.Kernel, include: Callable[[ir.Buffer], bool], align: int = 64) -> MemoryPlan:
    """Pack the allocations selected by ``include`` into one aligned region."""
    live = [(b, f, l) for b, (f, l) in lifetimes(kernel.body).items() if include(b)]
    live.sort(key=lambda t: (-buffer_bytes(t[0]), t[1]))
    placed: list[Slot] = []
    for b, first, last in live:
        size = _round(buffer_bytes(b), align)
        busy = sorted((s.offset, s.offset + s.size) for s in placed if s.first <= last and first <= s.last)
        offset = 0
        for lo, hi in busy:
            if offset + size <= lo:
                break
            offset = max(offset, hi)
        placed.append(Slot(b, offset, size, first, last))
    total = max((s.offset + s.size for s in placed), default=0)
    return MemoryPlan(tuple(sorted(placed, key=lambda s: s.offset)), total, align)
