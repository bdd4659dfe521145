"""Integer ranges of index variables and expressions.

Every loop, block and shape variable of a kernel has one binding site, so one
table ``{Var: (lo, hi)}`` per kernel describes them all (``None`` = unbounded on
that side).  Passes use it to prove a tile inside its buffer (dropping its edge
mask) and renderers to emit plain C ``/`` ``%`` on provably non-negative
operands.  Shape and stride symbols are non-negative by the launch contract.
"""
from __future__ import annotations

from typing import Optional

from kernforge.codegen import ir

Range = tuple[Optional[int], Optional[int]]
_UNKNOWN: Range = (None, None)


def var_ranges(kernel: ir.Kernel) -> dict[ir.Var, Range]:
    """The range of every variable bound in ``kernel`` (scalar params are unbounded)."""
    table: dict[ir.Var, Range] = {s: (0, None) for s in kernel.symbols}
    for v in kernel.scalar_params:
        table[v] = _UNKNOWN
    for v, g in zip(kernel.block_vars, kernel.grid):
        hi = expr_range(g, table)[1]
        table[v] = (0, None if hi is None else hi - 1)
    for node in statements(kernel.body):
        if isinstance(node, ir.Parallel):
            for v, e in zip(node.vars, node.extents):
                table[v] = (0, e - 1)
        elif isinstance(node, ir.For):
            lo = expr_range(node.start, table)[0]
            end = expr_range(ir.binary(ir.Op.ADD, node.start, node.extent), table)[1]
            table[node.var] = (lo, None if end is None else end - 1)
    return table


def statements(s: ir.Stmt):
    """Every statement under ``s`` in program order (expressions are not entered)."""
    yield s
    for c in ir.children(s):
        if isinstance(c, ir.Stmt):
            yield from statements(c)


def nonneg_vars(kernel: ir.Kernel) -> frozenset:
    """Variables that are never negative (loop/block indices from >= 0, shape symbols)."""
    return frozenset(v for v, (lo, _) in var_ranges(kernel).items() if lo is not None and lo >= 0)


def _add(a, b):
    return None if a is None or b is None else a + b


def expr_range(e: ir.Expr, table: dict) -> Range:
    """Conservative inclusive bounds of an integer expression."""
    if isinstance(e, ir.Const):
        return (int(e.value), int(e.value)) if e.dtype.is_int or e.dtype.is_bool else _UNKNOWN
    if isinstance(e, ir.Var):
        return table.get(e, _UNKNOWN)
    if isinstance(e, ir.Cast) and e.dtype.is_int and e.a.dtype.is_int and e.dtype.itemsize >= e.a.dtype.itemsize:
        return expr_range(e.a, table)
    if not isinstance(e, ir.Binary) or not e.dtype.is_int:
        return _UNKNOWN
    (al, ah), (bl, bh) = expr_range(e.a, table), expr_range(e.b, table)
    if e.op == ir.Op.ADD:
        return _add(al, bl), _add(ah, bh)
    if e.op == ir.Op.SUB:
        return (None if al is None or bh is None else al - bh), (None if ah is None or bl is None else ah - bl)
    if e.op == ir.Op.MUL:
        if None not in (al, ah, bl, bh):
            p = (al * bl, al * bh, ah * bl, ah * bh)
            return min(p), max(p)
        if al is not None and bl is not None and al >= 0 and bl >= 0:
            return al * bl, None
        return _UNKNOWN
    if e.op in (ir.Op.FLOORDIV, ir.Op.MOD) and bl is not None and bl == bh and bl > 0:
        if e.op == ir.Op.MOD:
            return 0, bl - 1
        return (None if al is None else al // bl), (None if ah is None else ah // bl)
    if e.op == ir.Op.MIN:
        return (None if al is None or bl is None else min(al, bl)), (
            bh if ah is None else ah if bh is None else min(ah, bh))
    if e.op == ir.Op.MAX:
        return (bl if al is None else al if bl is None else max(al, bl)), (
            None if ah is None or bh is None else max(ah, bh))
    return _UNKNOWN


def proves(cond: ir.Expr, table: dict) -> bool:
    """True when the comparison ``cond`` holds for every value in ``table``'s ranges."""
    if not isinstance(cond, ir.Binary) or cond.op not in (ir.Op.LT, ir.Op.LE, ir.Op.GE, ir.Op.GT):
        return False
    (al, ah), (bl, bh) = expr_range(cond.a, table), expr_range(cond.b, table)
    if cond.op == ir.Op.LT:
        return ah is not None and bl is not None and ah < bl
    if cond.op == ir.Op.LE:
        return ah is not None and bl is not None and ah <= bl
    if cond.op == ir.Op.GE:
        return al is not None and bh is not None and al >= bh
    return al is not None and bh is not None and al > bh
