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


def expand_radix_find_bucket(s: ir.RadixFindBucket) -> ir.Stmt:
    """``s`` as a reverse Cumsum, a Parallel flagging the buckets that reach ``need``, a
    Reduce counting them and two scalar stores (the semantics in ``ir.RadixFindBucket``)."""
    i32 = dtypes.int32
    (nb,) = s.hist.static_shape()
    reached = ir.Buffer(f"{s.hist.name}_reached", (ir.const(nb),), i32, ir.Scope.FRAGMENT)
    count = ir.Buffer(f"{s.hist.name}_nreached", (ir.const(1),), i32, ir.Scope.FRAGMENT)
    b = ir.Var("b")
    need = ir.Load(s.need, (ir.const(0),))
    n = ir.Load(count, (ir.const(0),))
    flag = ir.select(ir.binary(ir.Op.GE, ir.Load(s.above, (b,)), need), 1, 0)
    return ir.Seq((
        ir.Allocate(reached, s.loc),
        ir.Allocate(count, s.loc),
        ir.Cumsum(s.hist, s.above, 0, True, s.loc),
        ir.Parallel((b,), (nb,), ir.Store(reached, (b,), ir.cast(flag, i32), s.loc), s.loc),
        ir.Reduce(ir.Op.REDUCE_SUM, reached, count, 0, True, s.loc),
        ir.If(ir.binary(ir.Op.LT, n, nb),
              ir.Store(s.need, (ir.const(0),), ir.cast(ir.binary(ir.Op.SUB, need, ir.Load(s.above, (n,))),
                                                      s.need.dtype), s.loc), None, s.loc),
        ir.Store(s.bucket, (ir.const(0),), ir.cast(ir.binary(ir.Op.SUB, n, 1), s.bucket.dtype), s.loc),
    ), s.loc)


EXPANSIONS = {ir.OnlineSoftmax: expand_online_softmax, ir.RadixFindBucket: expand_radix_find_bucket}


def expand(s: ir.Stmt) -> ir.Stmt:
    """The primitive spelling of composite statement ``s``."""
    return EXPANSIONS[type(s)](s)


class _Expand(ir.Mutator):
    def __init__(self, native: tuple[type, ...]):
        self.native = native

    def visit_OnlineSoftmax(self, s: ir.OnlineSoftmax):
        return s if type(s) in self.native else expand(s)

    visit_RadixFindBucket = visit_OnlineSoftmax


def lower_composites(kernel: ir.Kernel, native: tuple[type, ...] = ()) -> ir.Kernel:
    """``kernel`` with every composite op whose type is not in ``native`` expanded."""
    body = _Expand(native).visit(kernel.body)
    return kernel if body is kernel.body else kernel.with_body(body)
