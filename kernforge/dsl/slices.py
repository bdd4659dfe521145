"""Compile-time slice lengths whose bounds re-read the same runtime values.

``X[off + r * 8 : off + (r + 1) * 8]`` (TileLang's group FP8 cast, with ``off`` a
``T.alloc_var``) builds two *separate* reads of ``off``: every read of a variable is a
new ``ir.Load``, and :func:`kernforge.codegen.arith.difference` cancels non-linear
subterms only by identity.  Both bounds of one slice are evaluated at the same program
point, so structurally equal subterms hold the same value there: unifying them (the
stop's copy replaced by the start's node) lets the difference fold to 8.
"""
from __future__ import annotations

from typing import Optional

from kernforge.codegen import arith, ir


def length(stop: ir.Expr, start: ir.Expr) -> Optional[int]:
    """``stop - start`` as an int when it is a compile-time constant, else None."""
    ext = arith.difference(stop, start)
    if ext is not None:
        return ext
    pool = [n for n in ir.nodes(start) if isinstance(n, (ir.Load, ir.Binary, ir.Cast))]
    return arith.difference(_unify(stop, pool), start) if pool else None


def _unify(e: ir.Expr, pool: list) -> ir.Expr:
    """``e`` with every subterm structurally equal to a node of ``pool`` replaced by it
    (only through the + - * and integer casts that the linear analysis reads)."""
    for p in pool:
        if ir.structural_equal(e, p):
            return p
    if isinstance(e, ir.Binary):
        a, b = _unify(e.a, pool), _unify(e.b, pool)
        return e if (a is e.a and b is e.b) else ir.Binary(e.op, a, b, e.dtype)
    if isinstance(e, ir.Cast):
        a = _unify(e.a, pool)
        return e if a is e.a else ir.Cast(a, e.dtype)
    return e
