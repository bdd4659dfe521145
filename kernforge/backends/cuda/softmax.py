"""CUDA lowering of ``T.online_softmax`` (``ir.OnlineSoftmax``).

On an accumulator held in registers (``AccumLayout``, its row vectors in the matching
``RowLayout``; the layout planner arranges both) the step is one call of
``kf::online_softmax_step`` (``kf/softmax.cuh``) on the thread's registers, with a
private shared scratch when several warps share a row.  Any other placement has
every operand in shared memory (the planner stages them) and one thread per row
runs ``kf::online_softmax_row``.
"""
from __future__ import annotations

from kernforge.codegen import ir
from kernforge.backends.cuda.layouts import AccumLayout
from kernforge.backends.cuda.ops import I32


def native(R, s: ir.OnlineSoftmax) -> AccumLayout | None:
    """The accumulator layout when ``s`` runs on registers, else None."""
    lay = R.plan.registers.get(s.scores)
    if not isinstance(lay, AccumLayout):
        return None
    if any(R.plan.registers.get(v) != lay.rows for v in (s.row_max, s.row_sum, s.rescale)):
        return None
    return lay


def scratch_floats(R, s: ir.OnlineSoftmax) -> int:
    """Shared floats the register path needs: row max and row sum per warp column."""
    lay = native(R, s)
    if lay is None or not (lay.wn > 1 or lay.used_warps < lay.warps):
        return 0
    return 2 * lay.m * lay.wn


def render_online_softmax(R, s: ir.OnlineSoftmax) -> None:
    scale = f"(float)({R.expr(s.scale_log2)})"
    names = [R.buffer_name(b) for b in (s.scores, s.row_max, s.row_sum, s.rescale)]
    lay = native(R, s)
    if lay is not None:
        scratch = "kf_softmax_scratch" if scratch_floats(R, s) else "nullptr"
        R.emit(f"kf::online_softmax_step<{lay.mt}, {lay.nt}, {lay.wm}, {lay.wn}, {lay.warps}>("
               f"{', '.join(names)}, {scale}, {scratch});")
        return
    rows, cols = s.scores.static_shape()
    row, col = ir.Var(R.fresh("row"), I32), ir.Var(R.fresh("j"), I32)
    R.nonneg_vars |= {row, col}
    R.open(f"for (int32_t {R.cname(row)} = {R.tid}; {R.cname(row)} < {rows}; {R.cname(row)} += {R.k.threads})")
    at = f"{names[0]}[{R.offset(s.scores, (row, col))}]"
    vec = [f"{n}[{R.offset(b, (row,))}]" for n, b in zip(names[1:], (s.row_max, s.row_sum, s.rescale))]
    R.emit(f"kf::online_softmax_row([&](int32_t {R.cname(col)}) -> float& {{ return {at}; }}, {cols}, "
           f"{', '.join(vec)}, {scale});")
    R.close()
