"""``T.Pipelined`` as double-buffered ``TQue`` stages (docs/backends/ascend.md).

A pipelined loop whose body starts with GM -> UB tile copies is rendered as the classic Ascend C
double buffer: each such tile gets a ``TQue<VECIN, 1>`` of two buffers; the copy of iteration 0 is
issued before the loop, and iteration k DeQues its tile, issues the copy of k + 1 into the other
buffer (MTE2 then overlaps k's compute on the NPU), computes, and FreeTensors.  The queue's
EnQue/DeQue order the DMA against its consumers (the copy itself does not wait at its end); a
``MTE2_S`` pair after the DeQue covers scalar readers.  Any number of stages the author asked for
becomes two buffers.

A loop is staged only where prefetching cannot change what is read (:func:`plan_stages`), else it
stays an ordinary loop whose copies each wait:

* the staged copies are a prefix of the body, each a DMA copy (:func:`copies.dma_plan`) of a
  whole UB tile, one copy per tile;
* the tile is used nowhere outside the loop and written nowhere in the loop but by its copy;
* the copy reads a global buffer the kernel never writes, at positions that depend only on the
  loop variable and on values fixed before the loop (no variable bound in the body, no load of
  anything but such global buffers): so the copy of k + 1 can be issued early, and the copy of
  k + 1 is a DMA copy too;
* at most 4 staged tiles per kernel (8 queue buffers per position on A2/A3).
"""
from __future__ import annotations

from dataclasses import dataclass

from kernforge.backends.ascend import copies
from kernforge.codegen import ir
from kernforge.codegen.passes import buffer_bytes, ranges, simplify_expr

MAX_STAGED = 4  # 8 VECIN queue buffers (event ids) / 2 buffers each


@dataclass(frozen=True)
class Stage:
    """One staged tile: its queue number, the copy that fills it, the loop it lives in."""

    queue: int
    tile: ir.Buffer
    copy: ir.Copy
    loop: ir.For

    @property
    def bytes(self) -> int:
        return (buffer_bytes(self.tile) + 31) // 32 * 32


class _Subst(ir.Mutator):
    def __init__(self, var: ir.Var, value: ir.Expr):
        self.var, self.value = var, value

    def visit_Var(self, v: ir.Var):
        return self.value if v is self.var else v


def next_copy(stage: Stage) -> ir.Copy:
    """The stage's copy for iteration ``k + 1``."""
    k = stage.loop.var
    return _Subst(k, simplify_expr(ir.binary(ir.Op.ADD, k, ir.const(1, k.dtype)))).visit(stage.copy)


def first_copy(stage: Stage) -> ir.Copy:
    """The stage's copy for the loop's first iteration."""
    return _Subst(stage.loop.var, stage.loop.start).visit(stage.copy)


def _writes(s: ir.Stmt):
    if isinstance(s, (ir.Store, ir.Atomic)):
        return s.buffer
    if isinstance(s, (ir.Copy, ir.Fill)):
        return s.dst.buffer
    if isinstance(s, ir.Gemm):
        return s.c.buffer
    if isinstance(s, (ir.Reduce, ir.Cumsum)):
        return s.dst
    return None


def _buffers_outside(body: ir.Stmt, loop: ir.For) -> set:
    """Buffers referenced anywhere in ``body`` except inside ``loop`` and their declarations."""
    seen, stack = set(), [body]
    while stack:
        n = stack.pop()
        if n is loop:
            continue
        if isinstance(n, ir.Buffer):
            seen.add(n)
            continue
        if isinstance(n, ir.Allocate):
            continue
        stack.extend(ir.children(n))
    return seen


def _whole_tile(r: ir.Region) -> bool:
    b = r.buffer
    return (b.is_static and tuple(r.extents) == b.static_shape()
            and all(isinstance(ir.fold(x), ir.Const) and int(ir.fold(x).value) == 0 for x in r.starts))


def _invariant(e, k: ir.Var, bound: set, written: set) -> bool:
    for n in ir.walk(e):
        if isinstance(n, ir.Var) and n is not k and id(n) in bound:
            return False
        if isinstance(n, ir.Load) and (n.buffer.scope != ir.Scope.GLOBAL or n.buffer in written):
            return False
    return True


def plan_stages(kernel: ir.Kernel, table: dict) -> tuple:
    """The staged tiles of the kernel's pipelined loops (see the module docstring)."""
    statements = list(ranges.statements(kernel.body))
    written = {b for b in map(_writes, statements) if b is not None}
    stages: list[Stage] = []
    for loop in statements:
        if not (isinstance(loop, ir.For) and loop.kind == ir.LoopKind.PIPELINED):
            continue
        body = loop.body.body if isinstance(loop.body, ir.Seq) else (loop.body,)
        if any(isinstance(x, ir.Allocate) for x in body):
            continue
        inner = list(ranges.statements(loop.body))
        bound = {id(v) for s in inner if isinstance(s, (ir.For, ir.Parallel))
                 for v in ((s.var,) if isinstance(s, ir.For) else s.vars)}
        outside = _buffers_outside(kernel.body, loop)
        tiles = []
        for s in body:
            if not isinstance(s, ir.Copy) or len(stages) + len(tiles) >= MAX_STAGED:
                break
            p = copies.dma_plan(s, table)
            tile = s.dst.buffer
            if (p is None or p.direction != "in" or not _whole_tile(s.dst) or tile in outside
                    or any(t.tile is tile for t in tiles) or s.src.buffer in written
                    or any(_writes(x) is tile for x in inner if x is not s)
                    or not all(_invariant(x, loop.var, bound, written) for x in s.src.starts)):
                break
            stage = Stage(len(stages) + len(tiles), tile, s, loop)
            if copies.dma_plan(next_copy(stage), table) is None or copies.dma_plan(first_copy(stage), table) is None:
                break
            tiles.append(stage)
        stages += tiles
    return tuple(stages)
