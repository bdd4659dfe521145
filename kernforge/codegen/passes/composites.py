"""Composite tile ops spelled in primitive statements, for backends without a native lowering.

A composite op (``ir.COMPOSITES``) is one tile-level step that a backend may lower
to a device helper (CUDA: ``kf::online_softmax_step``) but that every backend can
also run as a short sequence of ordinary statements.  :func:`run_pipeline` expands
the composites a pipeline does not declare ``native`` before its first pass, so the
interpreter, the CPU backend and any future backend execute the same primitive IR
the kernel author would otherwise have written by hand (and hence the same numbers).
"""
from __future__ import annotations

from kernforge import dtypes
from kernforge.codegen import ir


def expand_online_softmax(s: ir.OnlineSoftmax) -> ir.Stmt:
    """``s`` as Copy / Reduce / Parallel statements (the semantics in ``ir.OnlineSoftmax``),
    with two temporaries: the previous running max and the tile's row sums."""
    f32 = dtypes.float32
    (rows,) = s.row_max.static_shape()
    cols = s.scores.static_shape()[1]
    m_prev = ir.Buffer(f"{s.row_max.name}_prev", (ir.const(rows),), s.row_max.dtype, ir.Scope.FRAGMENT)
    tile_sum = ir.Buffer(f"{s.row_sum.name}_tile", (ir.const(rows),), s.row_sum.dtype, ir.Scope.FRAGMENT)
    i, j = ir.Var("i"), ir.Var("j")
    i2 = ir.Var("i")
    i3 = ir.Var("i")

    def shift(row: ir.Var) -> ir.Expr:
        m = ir.Load(s.row_max, (row,))
        return ir.select(ir.binary(ir.Op.EQ, m, -ir.const(float("inf"), f32)), 0.0, m)

    def exp2_scaled(x: ir.Expr, row: ir.Var) -> ir.Expr:
        return ir.unary(ir.Op.EXP2, ir.binary(ir.Op.MUL, ir.binary(ir.Op.SUB, x, shift(row)), s.scale_log2))

    rescale = ir.Store(s.rescale, (i,), ir.cast(exp2_scaled(ir.Load(m_prev, (i,)), i), s.rescale.dtype), s.loc)
    probs = ir.Store(s.scores, (i2, j), ir.cast(exp2_scaled(ir.Load(s.scores, (i2, j)), i2), s.scores.dtype), s.loc)
    update = ir.binary(ir.Op.ADD, ir.binary(ir.Op.MUL, ir.Load(s.row_sum, (i3,)), ir.Load(s.rescale, (i3,))),
                       ir.Load(tile_sum, (i3,)))
    return ir.Seq((
        ir.Allocate(m_prev, s.loc),
        ir.Allocate(tile_sum, s.loc),
        ir.Copy(ir.whole(s.row_max), ir.whole(m_prev), s.loc),
        ir.Reduce(ir.Op.REDUCE_MAX, s.scores, s.row_max, 1, False, s.loc),
        ir.Parallel((i,), (rows,), rescale, s.loc),
        ir.Parallel((i2, j), (rows, cols), probs, s.loc),
        ir.Reduce(ir.Op.REDUCE_SUM, s.scores, tile_sum, 1, True, s.loc),
        ir.Parallel((i3,), (rows,), ir.Store(s.row_sum, (i3,), ir.cast(update, s.row_sum.dtype), s.loc), s.loc),
    ), s.loc)


EXPANSIONS = {ir.OnlineSoftmax: expand_online_softmax}


class _Expand(ir.Mutator):
    def __init__(self, native: tuple[type, ...]):
        self.native = native

    def visit_OnlineSoftmax(self, s: ir.OnlineSoftmax):
        return s if ir.OnlineSoftmax in self.native else EXPANSIONS[ir.OnlineSoftmax](s)


def lower_composites(kernel: ir.Kernel, native: tuple[type, ...] = ()) -> ir.Kernel:
    """``kernel`` with every composite op whose type is not in ``native`` expanded."""
    body = _Expand(native).visit(kernel.body)
    return kernel if body is kernel.body else kernel.with_body(body)
