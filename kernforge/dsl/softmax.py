"""``T.online_softmax``: one tile step of a streaming softmax (FlashAttention's online softmax).

One call replaces the eight statements an attention kernel would otherwise write per
KV tile (save the max, fold in the tile's row max, rescale factor, exponentials, row
sums, running-sum update), so a backend can lower the step as a unit: CUDA calls
``kf::online_softmax_step`` on the accumulator registers; other backends run the
primitive spelling (``codegen/passes/composites.py``), with the same numbers.
"""
from __future__ import annotations

from kernforge import dtypes
from kernforge.codegen import ir
from kernforge.dsl import builder as B
from kernforge.dsl.handles import TensorHandle, unwrap_expr


def _tile(x, what: str, loc) -> ir.Buffer:
    if not isinstance(x, TensorHandle) or x.scope not in (ir.Scope.SHARED, ir.Scope.FRAGMENT):
        raise B.error(f"T.online_softmax: {what} must be a shared or fragment tile, got {x!r}", loc)
    B.current().check_live(x.buffer, loc)
    if x.buffer.dtype != dtypes.float32:
        raise B.error(f"T.online_softmax: {what} {x.name} must be float32, is {x.buffer.dtype}", loc)
    return x.buffer


def online_softmax(scores, row_max, row_sum, rescale, scale_log2) -> None:
    """Fold the tile ``scores`` (M, N; ``-inf`` = masked) into the running row max
    ``row_max`` and sum ``row_sum`` (M,), leave the tile's unnormalised probabilities
    ``exp2((s - max) * scale_log2)`` in ``scores`` and the factor earlier accumulations
    must be multiplied by in ``rescale`` (M,).  ``scale_log2`` is the softmax scale
    times log2(e).  Rows that have seen only masked scores keep max ``-inf`` and get
    probabilities and sums of 0 (never NaN).  Exact semantics: ``ir.OnlineSoftmax``."""
    loc = B.user_loc(2)
    if B.current().inside("parallel"):
        raise B.error("T.online_softmax inside T.Parallel: it is a whole-tile step; call it "
                      "between the loops that build the scores and use the probabilities", loc)
    s = _tile(scores, "scores", loc)
    if s.ndim != 2:
        raise B.error(f"T.online_softmax: scores {s.name} must be 2-D (rows, keys), is {s.static_shape()}", loc)
    rows = s.static_shape()[0]
    vecs = [_tile(v, what, loc) for v, what in ((row_max, "row_max"), (row_sum, "row_sum"), (rescale, "rescale"))]
    for v in vecs:
        if v.static_shape() != (rows,):
            raise B.error(f"T.online_softmax: {v.name}{v.static_shape()} must hold one value per row "
                          f"of {s.name}{s.static_shape()}, i.e. shape ({rows},)", loc)
    if len({id(b) for b in (s, *vecs)}) != 4:
        raise B.error("T.online_softmax: scores, row_max, row_sum and rescale must be four distinct tiles", loc)
    scale = unwrap_expr(scale_log2, dtypes.float32)
    if not scale.dtype.is_float:
        raise B.error(f"T.online_softmax: scale_log2 must be a float, got {scale} ({scale.dtype})", loc)
    B.current().emit(ir.OnlineSoftmax(s, *vecs, scale, loc))
