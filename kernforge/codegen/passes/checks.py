"""Checked mode: a bounds test in front of every access the kernel cannot prove in bounds.

``kernforge.compile(..., checks=True)`` (or ``KERNFORGE_CHECKS=1``) puts this pass in
every backend's pipeline, so the cpu, cuda and cuda-emu sources (and the interpreter,
which evaluates the same nodes) test exactly the same accesses, with the same rules as
the interpreter's own bounds checks (``kernforge/interp/executor.py``):

* every element access -- a ``Load`` anywhere in an expression (both sides of a
  ``T.where``, which evaluates both), a ``Store``, an ``Atomic`` -- of a global, shared,
  fragment or local buffer must have every index in ``[0, dim)`` (per dimension: a
  flat offset that happens to land inside the buffer is still a bug);
* a tile op's region on an *on-chip* buffer (``Copy``/``Fill``/``Gemm``) must lie inside
  it.  A region on a *global* buffer may leave it: a copy reads 0 there and skips the
  writes (the ir docstring), which every backend masks, so that is not a violation;
  ``Reduce``/``Cumsum``/composites work on whole tiles and have nothing to test.

Each access gets an :class:`ir.Check` naming it (buffer, indices, shape, kind, the
author's line) followed by an ``If`` on the same condition around the rest, so a
violating access is never executed: the kernel records the first violation, and the
launcher raises :class:`ir.CheckError`.  Checks nest in the order the interpreter
evaluates (an index's own loads first, a store's target before its value), so a
check's condition only reads memory an earlier check has cleared.  Tests proven by
the kernel's variable ranges (``passes.ranges``: a ``T.Parallel`` index into its own
tile, constant indices that fit) are dropped, which keeps most on-chip accesses free.

Races between ``T.Parallel`` iterations are not checked here; the interpreter reports
them (docs/checked-mode.md).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Optional, Sequence

from kernforge.codegen import ir
from kernforge.codegen.passes import ranges
from kernforge.codegen.passes.simplify import simplify_expr

#: dimensions a violation record holds (indices and shape); deeper buffers report the first ones
MAX_DIMS = 8
#: int64 slots of a launch's violation record: state, site, rank, MAX_DIMS indices, MAX_DIMS dims
RECORD_LEN = 3 + 2 * MAX_DIMS


@dataclass(frozen=True)
class CheckSite:
    """What the launcher needs to name a violation: the access and the author's line."""

    kind: str
    name: str
    extents: tuple[int, ...]
    loc: Optional[ir.SourceLoc]


class _Checks:
    def __init__(self, kernel: ir.Kernel):
        self.kernel = kernel
        self.table = ranges.var_ranges(kernel)
        self.grid = dict(zip(kernel.block_vars, kernel.grid))  # bx < its grid extent, symbolic or not
        self.facts: list[ir.Expr] = []  # the conjuncts of the enclosing ifs' conditions
        self.site = 0

    # -- conditions -------------------------------------------------------------
    def inside(self, indices: Sequence[ir.Expr], shape: Sequence[ir.Expr], extents=()) -> Optional[ir.Expr]:
        """The unproven part of "``indices`` (region starts, with ``extents``) lie inside ``shape``":
        None when the variable ranges prove it all, a constant false when it never holds."""
        conds = []
        for d, (i, n) in enumerate(zip(indices, shape)):
            lo = ir.binary(ir.Op.GE, i, ir.const(0, i.dtype))
            hi = (ir.binary(ir.Op.LE, ir.fold(ir.binary(ir.Op.ADD, i, extents[d])), n) if extents
                  else ir.binary(ir.Op.LT, i, n))
            conds += [c for c in (lo, hi) if not self.proven(c)]
        if not conds:
            return None
        cond = conds[0]
        for c in conds[1:]:
            cond = ir.binary(ir.Op.AND, cond, c)
        cond = simplify_expr(cond)
        return None if isinstance(cond, ir.Const) and cond.value else cond

    def proven(self, cond: ir.Binary) -> bool:
        """By the variable ranges; or ``bx < G`` where the grid's extent along ``bx`` is ``G``
        itself (``T.Kernel(batch)`` indexing a ``batch``-sized dimension); or because an
        enclosing ``if`` tests exactly this (``if j < N: B[j] = ...``, the edge-tile guard) on
        values that cannot change in between (no memory reads)."""
        if ranges.proves(cond, self.table) or self.proves_bits(cond):
            return True
        g = self.grid.get(cond.a) if cond.op == ir.Op.LT and isinstance(cond.a, ir.Var) else None
        if g is not None and ir.structural_equal(g, cond.b):
            return True
        return any(ir.structural_equal(cond, f) for f in self.facts)

    def bits_range(self, e: ir.Expr) -> ranges.Range:
        """``ranges.expr_range`` plus what bit operations bound, which index math on keys uses
        (``(key >> 5) & 2047``, ``i & 3``): ``x & c`` is in ``[0, c]`` for ``c >= 0``, a shift
        right of a non-negative value shrinks it, unsigned values are non-negative."""
        if isinstance(e, ir.Binary) and e.dtype.is_int and e.op == ir.Op.AND:
            masks = [c.value for c in (e.a, e.b) if isinstance(c, ir.Const) and c.value >= 0]
            if masks:
                return 0, min(masks)
        if isinstance(e, ir.Binary) and e.dtype.is_int and e.op == ir.Op.SHR and isinstance(e.b, ir.Const):
            lo, hi = self.bits_range(e.a)
            if lo is not None and lo >= 0 and 0 <= e.b.value < 64:
                return lo >> e.b.value, None if hi is None else hi >> e.b.value
        if isinstance(e, ir.Cast) and e.dtype.is_int and e.a.dtype.is_int:
            lo, hi = self.bits_range(e.a)
            if lo is not None and hi is not None and e.dtype.kind == "int" and hi < 2 ** (e.dtype.bits - 1) \
                    and lo >= -2 ** (e.dtype.bits - 1):
                return lo, hi
        if isinstance(e, (ir.Load, ir.Var)) and e.dtype.kind == "uint":
            return 0, 2 ** e.dtype.bits - 1
        return ranges.expr_range(e, self.table)

    def proves_bits(self, cond: ir.Binary) -> bool:
        (al, ah), (bl, bh) = self.bits_range(cond.a), self.bits_range(cond.b)
        if cond.op == ir.Op.GE:
            return al is not None and bh is not None and al >= bh
        if cond.op == ir.Op.LT:
            return ah is not None and bl is not None and ah < bl
        return cond.op == ir.Op.LE and ah is not None and bl is not None and ah <= bl

    @staticmethod
    def conjuncts(e: ir.Expr) -> list[ir.Expr]:
        if isinstance(e, ir.Binary) and e.op == ir.Op.AND and e.dtype.is_bool:
            return _Checks.conjuncts(e.a) + _Checks.conjuncts(e.b)
        return [e]

    def stable(self, cond: ir.Expr) -> list[ir.Expr]:
        """The conjuncts of ``cond`` that stay true under it: those reading no memory (a value
        in memory may change before the access it would vouch for)."""
        return [c for c in self.conjuncts(cond) if not any(isinstance(n, ir.Load) for n in ir.nodes(c))]

    def check(self, kind: str, buf: ir.Buffer, indices, loc, extents=()) -> Optional[ir.Check]:
        cond = self.inside(indices, buf.shape, extents)
        if cond is None:
            return None
        self.site += 1
        self.facts += self.stable(cond)  # what later checks nested inside this one may rely on
        return ir.Check(cond, buf.name, tuple(indices), buf.shape, kind, self.site - 1, tuple(extents),
                        loc or self.kernel.loc)

    def loads(self, exprs: Sequence[ir.Expr], loc, out: list, seen: set) -> None:
        """Checks of the loads in ``exprs``, in evaluation order (a load's indices before it)."""
        for e in exprs:
            if id(e) in seen or isinstance(e, (ir.Const, ir.Var)):
                continue
            seen.add(id(e))
            self.loads([c for c in ir.children(e) if isinstance(c, ir.Expr)], loc, out, seen)
            if isinstance(e, ir.Load):
                c = self.check("read", e.buffer, e.indices, loc)
                if c is not None:
                    out.append(c)

    def regions(self, op: str, named: Sequence[tuple[str, ir.Region]], loc) -> list[ir.Check]:
        out: list[ir.Check] = []
        seen: set = set()
        for _, r in named:
            self.loads(r.starts, loc, out, seen)
        for role, r in named:
            if r.buffer.scope != ir.Scope.GLOBAL:
                c = self.check(f"{op} {role}", r.buffer, r.starts, loc, r.extents)
                if c is not None:
                    out.append(c)
        return out

    # -- statements ---------------------------------------------------------------
    def guard(self, checks: list[ir.Check], s: ir.Stmt) -> list[ir.Stmt]:
        """``check_1; if ok_1 { check_2; if ok_2 { ... s } }``."""
        out = s
        for c in reversed(checks[1:]):
            out = ir.Seq((c, ir.If(c.cond, out, None, c.loc)), c.loc)
        return [checks[0], ir.If(checks[0].cond, out, None, checks[0].loc)] if checks else [s]

    def block(self, s: ir.Stmt) -> ir.Stmt:
        out = self.stmt(s)
        return out[0] if len(out) == 1 else ir.Seq(tuple(out), s.loc)

    def stmt(self, s: ir.Stmt) -> list[ir.Stmt]:
        known = len(self.facts)
        try:
            return self.rewrite(s)
        finally:
            del self.facts[known:]  # facts of this statement's checks and ifs end with it

    def rewrite(self, s: ir.Stmt) -> list[ir.Stmt]:
        loc = getattr(s, "loc", None)
        if isinstance(s, ir.Seq):
            return [replace(s, body=tuple(y for x in s.body for y in self.stmt(x)))]
        if isinstance(s, (ir.Allocate, ir.Sync, ir.Check)):
            return [s]
        if isinstance(s, ir.For):
            checks: list = []
            self.loads((s.start, s.extent), loc, checks, set())
            return self.guard(checks, replace(s, body=self.block(s.body)))
        if isinstance(s, ir.Parallel):
            return [replace(s, body=self.block(s.body))]
        if isinstance(s, ir.If):
            checks = []
            self.loads((s.cond,), loc, checks, set())
            orelse = None if s.orelse is None else self.block(s.orelse)
            known = len(self.facts)
            self.facts += self.stable(s.cond)
            then = self.block(s.then)
            del self.facts[known:]
            return self.guard(checks, replace(s, then=then, orelse=orelse))
        if isinstance(s, (ir.Store, ir.Atomic)):
            checks, seen = [], set()
            self.loads(s.indices, loc, checks, seen)
            own = self.check("write" if isinstance(s, ir.Store) else "atomic", s.buffer, s.indices, loc)
            checks += [own] if own is not None else []
            self.loads((s.value,), loc, checks, seen)
            return self.guard(checks, s)
        if isinstance(s, ir.Copy):
            return self.guard(self.regions("copy", (("from", s.src), ("into", s.dst)), loc), s)
        if isinstance(s, ir.Fill):
            checks = self.regions("fill", (("of", s.dst),), loc)
            self.loads((s.value,), loc, checks, set())
            return self.guard(checks, s)
        if isinstance(s, ir.Gemm):
            return self.guard(self.regions("gemm", (("operand", s.a), ("operand", s.b), ("into", s.c)), loc), s)
        # whole-tile statements (Reduce, Cumsum, composites): only their scalar operands read memory
        checks = []
        self.loads([c for c in ir.children(s) if isinstance(c, ir.Expr)], loc, checks, set())
        return self.guard(checks, s)


def insert_checks(kernel: ir.Kernel) -> ir.Kernel:
    """``kernel`` with an :class:`ir.Check` (and a guard) before every access not proven in bounds."""
    return kernel.with_body(_Checks(kernel).block(kernel.body))


def sites(kernel: ir.Kernel) -> dict[int, CheckSite]:
    """The checks of a lowered kernel by site number: what a launcher reports a violation with."""
    return {n.site: CheckSite(n.kind, n.name, n.extents, n.loc) for n in ir.nodes(kernel.body)
            if isinstance(n, ir.Check)}


def violation(record: Sequence[int], table: dict[int, CheckSite]) -> ir.CheckError:
    """The error for a launch's violation record (``RECORD_LEN`` int64s written by
    ``kf_check_fail``, ``kf/check.h`` and ``kf/check.cuh``)."""
    site, rank = int(record[1]), min(int(record[2]), MAX_DIMS)
    where = table.get(site)
    if where is None:
        return ir.CheckError("access", f"<unknown check site {site}>", [], [])
    index = [int(x) for x in record[3:3 + rank]]
    shape = [int(x) for x in record[3 + MAX_DIMS:3 + MAX_DIMS + rank]]
    return ir.CheckError(where.kind, where.name, index, shape, where.loc, where.extents)
