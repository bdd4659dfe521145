"""Block barriers made explicit: insert ``ir.Sync`` where threads would race on shared memory.

The threads of a block share its on-chip memory.  Program order alone does not
order two threads, so a statement must wait at a barrier when it

* reads shared memory written since the last barrier (read after write), or
* writes shared memory read or written since the last barrier (write after
  read, write after write),

whichever thread did the earlier access: the analysis is per buffer class, not
per element (a statement's thread mapping is the renderer's), so it is
conservative and never needs to know which thread touches what.

:class:`BarrierInsertion` walks the body in program order with two facts,
*pending writes* and *pending reads* (shared memory written / read since the
last barrier), and puts a ``Sync`` in front of each statement whose accesses
hit them; a ``Sync`` clears both.  Structure:

* ``Seq``: statements in order.
* ``If``: the condition's reads are tested before it; both branches start from
  the same state and the state after it is the union of both ends and the start.
* ``For``: the body's own accesses are pending on entry and on exit (the
  previous / next iteration's), on top of what was pending before the loop.
* ``Parallel``: a map spread over the block's threads is one statement (its
  iterations are independent, there is nothing to order inside it), unless the
  model says the target runs it as a loop in every thread (:meth:`serial_map`),
  which is then walked like a ``For``.
* anything else (stores, tile ops): one statement with the accesses of
  :meth:`effect`; an :class:`Effect` may say that the statement's own lowering
  ends with a barrier (a helper that synchronises internally).

What counts as shared memory (:meth:`shared`), what a statement touches
(:meth:`effect`, :meth:`uses`) and how a target-specific loop is laid out
(:meth:`loop`) are the model's: this module's defaults read buffer scopes only
(``Scope.SHARED``); a target subclasses it when its memory placement or its
lowering decides more (CUDA: :mod:`kernforge.backends.cuda.barriers`, whose
layout plan moves fragments into shared memory and whose pipelined rings and
device helpers carry barriers of their own).

The pass only adds ``Sync`` statements (and a ``Seq`` around a single statement
that gets one); every other node keeps its identity, except the ``Seq``, ``If``,
``For`` and ``Parallel`` nodes on the path to an inserted ``Sync``, which are
rebuilt with the same fields.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Optional

from kernforge.codegen import ir


@dataclass(frozen=True)
class Effect:
    """How one block statement touches shared memory, for the barrier analysis."""

    reads: bool = False
    writes: bool = False
    synced_after: bool = False  # its lowering ends with a barrier: nothing is pending after it


class BarrierInsertion:
    """``BarrierInsertion(kernel).run()``: ``kernel`` with a ``Sync`` before every racing statement."""

    def __init__(self, kernel: ir.Kernel):
        self.k = kernel
        self.pend_w = self.pend_r = False
        self._uses: dict = {}

    # -- the model (override for a target) --------------------------------------
    def shared(self, b: ir.Buffer) -> bool:
        """Whether ``b`` lives in memory every thread of the block may access."""
        return b.scope == ir.Scope.SHARED

    def uses(self, s) -> tuple[bool, bool]:
        """``(reads, writes)`` of shared memory anywhere under ``s`` (a loop body's summary)."""
        got = self._uses.get(s)
        if got is not None:
            return got
        sh = self.shared
        reads = writes = False
        for n in ir.nodes(s):
            if isinstance(n, ir.Load) and sh(n.buffer):
                reads = True
            elif isinstance(n, (ir.Store, ir.Atomic)) and sh(n.buffer):
                writes = True
            elif isinstance(n, ir.Copy):
                reads |= sh(n.src.buffer)
                writes |= sh(n.dst.buffer)
            elif isinstance(n, ir.Fill):
                writes |= sh(n.dst.buffer)
            elif isinstance(n, ir.Gemm):
                reads |= sh(n.a.buffer) or sh(n.b.buffer) or sh(n.c.buffer)
                writes |= sh(n.c.buffer)
            elif isinstance(n, (ir.Reduce, ir.Cumsum)):
                reads |= sh(n.src) or sh(n.dst)
                writes |= sh(n.dst)
            elif isinstance(n, ir.RadixFindBucket):
                reads = writes = True
            elif isinstance(n, ir.OnlineSoftmax):
                touched = any(sh(b) for b in (n.scores, n.row_max, n.row_sum, n.rescale))
                reads |= touched
                writes |= touched
        self._uses[s] = (reads, writes)
        return reads, writes

    def expr_reads(self, e: ir.Expr) -> bool:
        return any(isinstance(n, ir.Load) and self.shared(n.buffer) for n in ir.nodes(e))

    def effect(self, s: ir.Stmt) -> Effect:
        """The accesses of a statement the walk does not enter (stores, tile ops, maps)."""
        return Effect(*self.uses(s))

    def serial_map(self, p: ir.Parallel) -> bool:
        """Whether the target runs map ``p`` as a loop in every thread (then walked as a loop)."""
        return False

    def loop(self, s: ir.For) -> list[ir.Stmt]:
        return self.serial_loop(s, self.expr_reads(s.start) or self.expr_reads(s.extent))

    # -- the walk -----------------------------------------------------------------
    def run(self) -> ir.Kernel:
        body = self.block(self.k.body)
        return self.k if body is self.k.body else self.k.with_body(body)

    def before(self, reads: bool, writes: bool) -> bool:
        """Account for an access; True when a barrier must come first."""
        need = (reads and self.pend_w) or (writes and (self.pend_w or self.pend_r))
        if need:
            self.pend_w = self.pend_r = False
        self.pend_r |= reads
        return need

    def sync(self, loc) -> ir.Sync:
        return ir.Sync("block", loc)

    def block(self, s: ir.Stmt) -> ir.Stmt:
        """``s`` rewritten, as one statement (a ``Seq`` when a ``Sync`` was put in front of it)."""
        out = self.stmt(s)
        return out[0] if len(out) == 1 else ir.Seq(tuple(out), s.loc)

    def stmt(self, s: ir.Stmt) -> list[ir.Stmt]:
        if isinstance(s, ir.Seq):
            body = [y for x in s.body for y in self.stmt(x)]
            same = len(body) == len(s.body) and all(a is b for a, b in zip(body, s.body))
            return [s if same else replace(s, body=tuple(body))]
        if isinstance(s, ir.Allocate):
            return [s]
        if isinstance(s, ir.Sync):
            self.pend_w = self.pend_r = False
            return [s]
        if isinstance(s, ir.If):
            return self.branch(s)
        if isinstance(s, ir.For):
            return self.loop(s)
        if isinstance(s, ir.Parallel) and self.serial_map(s):
            return self.serial_loop(s, False)
        return self.leaf(s, self.effect(s))

    def leaf(self, s: ir.Stmt, eff: Effect) -> list[ir.Stmt]:
        need = self.before(eff.reads, eff.writes)
        self.pend_w |= eff.writes
        if eff.synced_after:
            self.pend_w = self.pend_r = False
        return [self.sync(s.loc), s] if need else [s]

    def branch(self, s: ir.If) -> list[ir.Stmt]:
        need = self.before(self.expr_reads(s.cond), False)
        start = (self.pend_w, self.pend_r)
        then = self.block(s.then)
        after_then = (self.pend_w, self.pend_r)
        orelse = None
        if s.orelse is not None:
            self.pend_w, self.pend_r = start
            orelse = self.block(s.orelse)
        self.pend_w = self.pend_w or after_then[0] or start[0]
        self.pend_r = self.pend_r or after_then[1] or start[1]
        new = s if then is s.then and orelse is s.orelse else replace(s, then=then, orelse=orelse)
        return [self.sync(s.loc), new] if need else [new]

    def serial_loop(self, s, head_reads: bool) -> list[ir.Stmt]:
        """A ``For`` (or a map run as a loop nest by every thread): the body's accesses are
        also those of the iterations before and after it."""
        need = self.before(head_reads, False)
        body_r, body_w = self.uses(s.body)
        self.pend_w |= body_w
        self.pend_r |= body_r
        body = self.block(s.body)
        self.pend_w |= body_w
        self.pend_r |= body_r
        new = s if body is s.body else replace(s, body=body)
        return [self.sync(s.loc), new] if need else [new]


def insert_barriers(kernel: ir.Kernel) -> ir.Kernel:
    """The target-independent default: ``Scope.SHARED`` buffers are shared, every map is spread
    over the block's threads, every statement's lowering is barrier-free."""
    return BarrierInsertion(kernel).run()


def syncs(root) -> list[ir.Sync]:
    """The ``Sync`` statements under ``root`` (a kernel or a statement), in program order."""
    body: Optional[ir.Stmt] = root.body if isinstance(root, ir.Kernel) else root
    return [n for n in ir.nodes(body) if isinstance(n, ir.Sync)]
