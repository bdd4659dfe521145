"""TileLang's safe global memory accesses: element accesses it cannot prove in bounds are guarded.

TileLang (its ``LegalizeSafeMemoryAccess`` pass) makes an element access of a *global* buffer
safe when the compiler cannot prove it in bounds: a store (or atomic) past the end is skipped,
a load past the end reads 0.  TileLang programs rely on it, e.g. the top-k example stores
``topk_gates[bx * blk_m + i, k]`` for every ``i < blk_m`` even when ``blk_m`` exceeds the
number of rows.  kernforge's own ``@T.prim_func`` keeps its stricter contract (such an access
is a bug, which the interpreter and checked mode report), so this pass runs only on programs
traced through the TileLang surface (``kernforge.tilelang`` and the eager ``T.jit``).

It is a plain IR rewrite, so every backend renders the guard it writes:

* ``Store`` / ``Atomic`` into a global buffer -> ``if (in_bounds) { ... }``;
* ``Load`` of a global buffer -> ``select(in_bounds, buf[select(ok_d, i_d, 0)...], 0)``.  The
  indices are made safe too because the interpreter evaluates both sides of a select (and so
  may a vectorising C compiler): the load then reads element 0, which the select discards.

``in_bounds`` holds only the parts the pass cannot prove, with the facts checked mode uses
(:class:`kernforge.codegen.passes.checks._Checks`): the kernel's variable ranges (a tile index
``bx * 64 + i`` of a 256-row buffer with ``bx < 4``), ``bx < G`` for a grid extent ``G``, and
the conditions of enclosing ``if``\\ s that read no memory (the author's own edge guard).  An
access proven in bounds is left untouched, so a kernel whose tiles divide its shapes renders
as before.  On-chip buffers are not guarded (an out-of-range index there is a kernel bug, as in
TileLang), nor are tile operations (``Copy``/``Fill``/``Gemm``), whose global regions every
backend already masks (the ``ir.Copy`` contract: reads past the edge give 0, writes skip).
"""
from __future__ import annotations

from dataclasses import replace

from kernforge.codegen import ir
from kernforge.codegen.passes.checks import _Checks


class _SafeAccess(ir.Mutator):
    def __init__(self, kernel: ir.Kernel):
        self.proofs = _Checks(kernel)  # the range table, the grid and the enclosing ifs' facts

    def bounds(self, buf: ir.Buffer, indices) -> "ir.Expr | None":
        if buf.scope != ir.Scope.GLOBAL:
            return None
        return self.proofs.inside(indices, buf.shape)

    def visit_Load(self, e: ir.Load) -> ir.Expr:
        e = self.generic(e)  # the indices' own loads first
        cond = self.bounds(e.buffer, e.indices)
        if cond is None:
            return e
        safe = []
        for i, n in zip(e.indices, e.buffer.shape):
            ok = self.proofs.inside((i,), (n,))
            safe.append(i if ok is None else ir.select(ok, i, ir.const(0, i.dtype)))
        return ir.select(cond, ir.Load(e.buffer, tuple(safe)), 0)

    def _guard(self, s):
        s = self.generic(s)
        cond = self.bounds(s.buffer, s.indices)
        return s if cond is None else ir.If(cond, s, None, s.loc)

    visit_Store = _guard
    visit_Atomic = _guard

    def visit_If(self, s: ir.If) -> ir.Stmt:
        cond = self.visit(s.cond)
        facts = self.proofs.facts
        known = len(facts)
        facts += self.proofs.stable(cond)
        try:
            then = self.visit(s.then)
        finally:
            del facts[known:]
        orelse = self.visit(s.orelse)
        if cond is s.cond and then is s.then and orelse is s.orelse:
            return s
        return replace(s, cond=cond, then=then, orelse=orelse)

    def visit_Check(self, s: ir.Check) -> ir.Stmt:
        return s  # checked mode's own tests read what they test unguarded, by design


def safe_access(kernel: ir.Kernel) -> ir.Kernel:
    """``kernel`` with every global element access it cannot prove in bounds guarded (module doc)."""
    body = _SafeAccess(kernel).visit(kernel.body)
    return kernel if body is kernel.body else kernel.with_body(body)
