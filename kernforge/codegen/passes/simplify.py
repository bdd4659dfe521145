"""Constant folding and algebraic identities on integer and boolean expressions.

Index math written by authors and produced by lowering (``by * 64 + 0``,
``(k * 1) // 1``, conditions on constants) is folded here so that renderers see
the smallest expression and can spot contiguous inner loops.  Floating-point
expressions are left alone: folding them in Python (double precision) would not
round like the float32 arithmetic every backend performs, and ``x + 0.0`` is
not ``x`` for ``x = -0.0``.  Statements whose condition or extent folds to a
constant are pruned (dead branches, empty loops).
"""
from __future__ import annotations

from dataclasses import replace
from typing import Optional

from kernforge import dtypes
from kernforge.codegen import arith, ir

_FOLD = {
    ir.Op.ADD: lambda a, b: a + b, ir.Op.SUB: lambda a, b: a - b, ir.Op.MUL: lambda a, b: a * b,
    ir.Op.FLOORDIV: lambda a, b: a // b if b else None, ir.Op.MOD: lambda a, b: a % b if b else None,
    ir.Op.MAX: max, ir.Op.MIN: min,
    ir.Op.LT: lambda a, b: a < b, ir.Op.LE: lambda a, b: a <= b, ir.Op.GT: lambda a, b: a > b,
    ir.Op.GE: lambda a, b: a >= b, ir.Op.EQ: lambda a, b: a == b, ir.Op.NE: lambda a, b: a != b,
    ir.Op.AND: lambda a, b: a & b, ir.Op.OR: lambda a, b: a | b, ir.Op.XOR: lambda a, b: a ^ b,
    ir.Op.SHL: lambda a, b: a << b if 0 <= b < 64 else None,
    ir.Op.SHR: lambda a, b: a >> b if 0 <= b < 64 else None,
}


def _fits(value: int, dt: dtypes.DType) -> bool:
    if dt.is_bool:
        return True
    lo, hi = (-(1 << (dt.bits - 1)), (1 << (dt.bits - 1)) - 1) if dt.kind == "int" else (0, (1 << dt.bits) - 1)
    return lo <= value <= hi


def _exact(e: ir.Expr) -> bool:
    """Integer or boolean: safe to fold in Python."""
    return e.dtype.is_int or e.dtype.is_bool


def _const(e: ir.Expr) -> Optional[int]:
    return e.value if isinstance(e, ir.Const) and _exact(e) else None


def _size(e: ir.Expr, memo: dict) -> int:
    """Binary nodes in ``e`` counted as a tree (what the printer emits), memoised by identity."""
    found = memo.get(id(e))
    if found is None:
        found = (1 if isinstance(e, ir.Binary) else 0) + sum(
            _size(c, memo) for c in ir.children(e) if isinstance(c, ir.Expr))
        memo[id(e)] = found
    return found


def _canonical_sum(e: ir.Binary, memo: dict) -> ir.Expr:
    """Rewrite a sum/difference as ``x*a + y*b + c`` (terms in first-use order) when
    that is smaller: ``(i + 3) + 4`` -> ``i + 7``, ``2 + (n - 2)`` -> ``n``.  Only
    when every term already has the sum's dtype, so no cast is dropped or added."""
    lin = arith.linear(e, atoms=True)
    if lin is None or any(k is not None and k.dtype != e.dtype for k in lin):
        return e
    out: Optional[ir.Expr] = None
    for k, c in lin.items():
        if k is None or c == 0:
            continue
        term = k if abs(c) == 1 else ir.Binary(ir.Op.MUL, k, ir.const(abs(c), e.dtype), e.dtype)
        if out is None:
            out = term if c > 0 else ir.Binary(ir.Op.SUB, ir.const(0, e.dtype), term, e.dtype)
        else:
            out = ir.Binary(ir.Op.ADD if c > 0 else ir.Op.SUB, out, term, e.dtype)
    c = lin.get(None, 0)
    if not _fits(c, e.dtype):
        return e
    if out is None:
        out = ir.const(c, e.dtype)
    elif c:
        out = ir.Binary(ir.Op.ADD if c > 0 else ir.Op.SUB, out, ir.const(abs(c), e.dtype), e.dtype)
    return out if _size(out, {}) < _size(e, memo) else e


def _as(e: ir.Expr, dt: dtypes.DType) -> ir.Expr:
    return e if e.dtype == dt else ir.cast(e, dt)


class _Simplify(ir.Mutator):
    """Expressions are DAGs (the tracer shares subexpressions), so results are
    memoised by identity: each shared node is simplified once and stays shared."""

    def __init__(self):
        self.done: dict[int, tuple] = {}
        self.sizes: dict[int, int] = {}

    def visit(self, node):
        if not isinstance(node, ir.Expr):
            return super().visit(node)
        hit = self.done.get(id(node))
        if hit is None:
            hit = (node, super().visit(node))  # holding `node` keeps its id unique
            self.done[id(node)] = hit
        return hit[1]

    def visit_Binary(self, e: ir.Binary):
        e = self.generic(e)
        a, b = e.a, e.b
        ca, cb = _const(a), _const(b)
        if not (_exact(a) and _exact(b)):
            return e
        if ca is not None and cb is not None and e.op in _FOLD:
            v = _FOLD[e.op](ca, cb)
            if v is not None and _fits(int(v), e.dtype):
                return ir.const(v, e.dtype)
            return e
        if e.dtype.is_bool and e.op in (ir.Op.AND, ir.Op.OR):
            for x, cx, y in ((a, ca, b), (b, cb, a)):
                if cx is not None:
                    keep = bool(cx) if e.op == ir.Op.AND else not bool(cx)
                    return y if keep else ir.const(bool(cx))
            return e
        if not e.dtype.is_int:
            return e
        if e.op == ir.Op.ADD and cb == 0 or e.op == ir.Op.SUB and cb == 0:
            return _as(a, e.dtype)
        if e.op == ir.Op.ADD and ca == 0:
            return _as(b, e.dtype)
        if e.op == ir.Op.MUL:
            if cb == 1:
                return _as(a, e.dtype)
            if ca == 1:
                return _as(b, e.dtype)
            if 0 in (ca, cb):
                return ir.const(0, e.dtype)
        if e.op == ir.Op.FLOORDIV and cb == 1:
            return _as(a, e.dtype)
        if e.op == ir.Op.MOD and cb == 1:
            return ir.const(0, e.dtype)
        if e.op in (ir.Op.ADD, ir.Op.SUB):
            return _canonical_sum(e, self.sizes)
        return e

    def visit_Select(self, e: ir.Select):
        e = self.generic(e)
        c = _const(e.cond)
        if c is None:
            return e
        return e.a if c else e.b

    def visit_Cast(self, e: ir.Cast):
        e = self.generic(e)
        c = _const(e.a)
        if c is not None and e.dtype.is_int and _fits(int(c), e.dtype):
            return ir.const(int(c), e.dtype)
        return e

    def visit_If(self, s: ir.If):
        s = self.generic(s)
        c = _const(s.cond)
        if c is None:
            return s
        return s.then if c else (s.orelse if s.orelse is not None else ir.Seq((), s.loc))

    def visit_For(self, s: ir.For):
        s = self.generic(s)
        n = _const(s.extent)
        if n is not None and n <= 0:
            return ir.Seq((), s.loc)
        return s


def simplify(kernel: ir.Kernel) -> ir.Kernel:
    """Fold integer/boolean constants, drop identities, prune constant branches and empty loops."""
    m = _Simplify()
    return replace(kernel, body=m.visit(kernel.body), grid=tuple(m.visit(g) for g in kernel.grid))


def simplify_expr(e: ir.Expr) -> ir.Expr:
    """One expression through the same rules (renderers use it on expressions they build)."""
    return _Simplify().visit(e)
