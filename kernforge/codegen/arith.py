"""Small integer arithmetic analysis on index expressions.

Tile extents must be compile-time constants even when written as
``A[by * BM:(by + 1) * BM]``; :func:`linear` turns such expressions into
linear forms over variables so that their difference folds to an int.
Renderers use :func:`nonnegative` to emit plain C ``/`` and ``%`` (instead of
floor-division helpers) where both operands are provably non-negative.
"""
from __future__ import annotations

import operator
from typing import Callable, Optional

from kernforge.codegen import ir

Linear = dict  # {Var or None (constant term): int coefficient}


def linear(e: ir.Expr, atoms: bool = False) -> Optional[Linear]:
    """``e`` as {var: coeff, None: const}, or None when it is not linear in its vars.

    With ``atoms``, a non-linear integer subterm (``off = p % 16``) counts as one
    more variable, keyed by identity, so ``(off + 16) - off`` still folds to 16."""
    if atoms and e.dtype.is_int and not isinstance(e, (ir.Const, ir.Var)):
        lin = linear(e, False)
        if lin is not None:
            return lin
        if isinstance(e, ir.Binary) and e.op in (ir.Op.ADD, ir.Op.SUB, ir.Op.MUL):
            a, b = linear(e.a, True), linear(e.b, True)
            combined = _combine(e.op, a, b)
            if combined is not None:
                return combined
        return {e: 1}
    if isinstance(e, ir.Const) and e.dtype.is_int:
        return {None: int(e.value)}
    if isinstance(e, ir.Var) and e.dtype.is_int:
        return {e: 1}
    if isinstance(e, ir.Cast) and e.dtype.is_int and e.a.dtype.is_int:
        return linear(e.a)
    if isinstance(e, ir.Binary) and e.dtype.is_int:
        return _combine(e.op, linear(e.a), linear(e.b))
    return None


def _combine(op: ir.Op, a: Optional[Linear], b: Optional[Linear]) -> Optional[Linear]:
    """The linear form of ``a op b`` (+, -, or * by a constant), else None."""
    if a is None or b is None:
        return None
    if op in (ir.Op.ADD, ir.Op.SUB):
        sign = 1 if op == ir.Op.ADD else -1
        out = dict(a)
        for k, v in b.items():
            out[k] = out.get(k, 0) + sign * v
        return {k: v for k, v in out.items() if v != 0 or k is None}
    if op == ir.Op.MUL:
        for x, y in ((a, b), (b, a)):
            if set(x) <= {None}:
                c = x.get(None, 0)
                return {k: v * c for k, v in y.items()}
    return None


def const_int(e) -> Optional[int]:
    """The integer value of ``e`` if it folds to a constant."""
    if isinstance(e, int):
        return e
    lin = linear(e) if isinstance(e, ir.Expr) else None
    if lin is not None and set(lin) <= {None}:
        return lin.get(None, 0)
    return None


def difference(a: ir.Expr, b: ir.Expr) -> Optional[int]:
    """``a - b`` as an int when it is constant (non-linear subterms cancel by identity)."""
    lin = linear(ir.binary(ir.Op.SUB, a, b), atoms=True)
    if lin is not None and set(lin) <= {None}:
        return lin.get(None, 0)
    return None


def nonnegative(e: ir.Expr, known: frozenset = frozenset()) -> bool:
    """Conservative proof that ``e >= 0``: constants, unsigned values, variables in
    ``known`` (loop/block indices, shape symbols), and + * // % of such."""
    if isinstance(e, ir.Const):
        return e.value >= 0
    if e.dtype.kind in ("uint", "bool"):
        return True
    if isinstance(e, ir.Var):
        return e in known
    if isinstance(e, ir.Cast):
        return e.a.dtype.is_int and nonnegative(e.a, known)
    if isinstance(e, ir.Binary) and e.op in (ir.Op.ADD, ir.Op.MUL, ir.Op.FLOORDIV, ir.Op.MOD,
                                             ir.Op.MIN, ir.Op.MAX, ir.Op.SHR, ir.Op.AND):
        if e.op == ir.Op.MAX:
            return nonnegative(e.a, known) or nonnegative(e.b, known)
        return nonnegative(e.a, known) and nonnegative(e.b, known)
    return False


_PY_OPS = {ir.Op.ADD: operator.add, ir.Op.SUB: operator.sub, ir.Op.MUL: operator.mul,
           ir.Op.FLOORDIV: operator.floordiv, ir.Op.MOD: operator.mod, ir.Op.MAX: max, ir.Op.MIN: min}


def compile_int(e: ir.Expr) -> Callable[[dict], int]:
    """An integer expression of launch-time values (grid, shapes, strides) as a Python
    closure over an environment ``{Var: int}``: built once per kernel, called per launch."""
    if isinstance(e, ir.Const):
        value = e.value
        return lambda env: value
    if isinstance(e, ir.Var):
        def var(env, v=e):
            try:
                return env[v]
            except KeyError:
                raise ir.KernelError(f"{v.name} is not known at launch") from None
        return var
    if isinstance(e, ir.Cast):
        inner = compile_int(e.a)
        return lambda env: int(inner(env))
    if isinstance(e, ir.Binary) and e.op in _PY_OPS:
        fa, fb, op = compile_int(e.a), compile_int(e.b), _PY_OPS[e.op]
        return lambda env: op(fa(env), fb(env))
    raise ir.KernelError(f"cannot evaluate {e} at launch")


def evaluate(e: ir.Expr, env: dict) -> int:
    """Evaluate an integer expression of launch-time values once."""
    return compile_int(e)(env)
