"""Which tile copies and fills the Ascend renderer keeps as DMA / vector instructions.

Ascend's data movement is DMA between GM and the Unified Buffer (``DataCopyPad``:
rows of any byte length, each landing at a 32-byte-aligned UB address).  A
``Copy`` between a global region and a UB tile becomes one ``kf_copy_in`` /
``kf_copy_out`` (``templates/include/kf/copy.h``) when the hardware's rules can
be met at render time; every other copy or fill is lowered to element maps by
the shared edge-mask pass (``codegen/passes/masks.py``), which the renderer then
prints as scalar loops.  :func:`dma_plan` is the one decision, used by the pass
(:func:`lower_other_copies`) and by the emitter, so they cannot disagree.

Rules a DMA copy must meet (spec section 4):

* one side global, the other a UB tile of the same dtype, the same squeezed
  shape of rank 1 or 2, at most 4095 rows (``blockCount``);
* the global side's innermost non-unit dimension has stride 1, its starts are
  provably non-negative (the in-bounds extents are then ``clamp(dim - start)``);
* the UB side's innermost dimension is contiguous, its start offset is a
  constant multiple of 32 bytes, its row pitch a multiple of 32 bytes; a
  GM->UB copy whose rows are not whole 32-byte blocks must end at the end of its
  buffer (DataCopyPad writes each row's pad up to the next 32-byte boundary).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Optional

from kernforge import dtypes
from kernforge.codegen import ir
from kernforge.codegen.passes import allocate, masks, ranges, simplify_expr

# dtypes Duplicate exists for (A2/A3 and 950)
DUPLICATE_DTYPES = frozenset({dtypes.float16, dtypes.float32, dtypes.int16, dtypes.uint16, dtypes.int32,
                              dtypes.uint32})
MAX_ROWS = 4095
STACK_BYTES = 64  # LOCAL buffers up to this size are scalar-unit stack arrays, larger ones live in UB


def in_ub(b: ir.Buffer) -> bool:
    """On-chip buffers held in the Unified Buffer (everything but small per-thread scalars)."""
    if b.scope == ir.Scope.GLOBAL:
        return False
    return b.scope != ir.Scope.LOCAL or allocate.buffer_bytes(b) > STACK_BYTES


@dataclass(frozen=True)
class DmaPlan:
    """One GM<->UB copy: ``rows x cols`` tile, the UB side's flat start and row pitch
    (elements), the GM side's flat start, row pitch (elements, an expression) and in-bounds
    extents (expressions; the unit dimensions' bounds tests are folded into ``inside``)."""

    direction: str  # "in" (GM -> UB) or "out"
    gm: ir.Region
    ub: ir.Region
    rows: int
    cols: int
    ub_start: int
    ub_pitch: int
    gm_start: tuple[ir.Expr, ...]
    gm_pitch: ir.Expr
    valid_rows: ir.Expr
    valid_cols: ir.Expr


def _nonunit(r: ir.Region) -> list[int]:
    return [d for d, e in enumerate(r.extents) if e != 1]


def _const(e: ir.Expr) -> Optional[int]:
    e = ir.fold(e)
    return int(e.value) if isinstance(e, ir.Const) and e.dtype.is_int else None


def _clamp_extent(start: ir.Expr, ext: int, dim: ir.Expr) -> ir.Expr:
    """``min(ext, dim - start)`` as int64 (may be <= 0: the helper clamps at 0)."""
    left = ir.binary(ir.Op.SUB, ir.cast(dim, dtypes.int64), ir.cast(start, dtypes.int64))
    return simplify_expr(ir.binary(ir.Op.MIN, left, ir.const(ext, dtypes.int64)))


def dma_plan(s: ir.Copy, table: dict) -> Optional[DmaPlan]:
    """The DMA form of ``s``, or None when the renderer must copy element by element."""
    src, dst = s.src, s.dst
    if (src.buffer.scope == ir.Scope.GLOBAL) == (dst.buffer.scope == ir.Scope.GLOBAL):
        return None
    gm, ub, direction = (src, dst, "in") if src.buffer.scope == ir.Scope.GLOBAL else (dst, src, "out")
    if not in_ub(ub.buffer) or src.buffer.dtype != dst.buffer.dtype or not ub.buffer.is_static:
        return None
    shape = src.squeezed() or (1,)
    if shape != (dst.squeezed() or (1,)) or len(shape) > 2:
        return None
    rows, cols = (1, shape[0]) if len(shape) == 1 else shape
    if rows > MAX_ROWS:
        return None
    size = ub.buffer.dtype.itemsize
    # UB side: contiguous innermost dim, constant 32-byte-aligned start and pitch
    ud = _nonunit(ub) or [len(ub.extents) - 1]
    ustr = [_const(x) for x in ub.buffer.strides]
    if ustr[ud[-1]] != 1 or any(_const(x) is None for x in ub.starts):
        return None
    ub_start = sum(_const(x) * st for x, st in zip(ub.starts, ustr))
    ub_pitch = ustr[ud[0]] if len(ud) == 2 else cols
    if (ub_start * size) % 32 or (rows > 1 and (ub_pitch * size) % 32):
        return None
    if direction == "in" and (cols * size) % 32:
        if rows > 1 or ub_start + cols != allocate.buffer_bytes(ub.buffer) // size:
            return None
    # GM side: innermost non-unit dim contiguous, starts provably >= 0
    gd = _nonunit(gm) or [len(gm.extents) - 1]
    if _const(gm.buffer.strides[gd[-1]]) != 1:
        return None
    if not all(ranges.proves(ir.binary(ir.Op.GE, x, 0), table) for x in gm.starts):
        return None
    inside = None
    for d, e in enumerate(gm.extents):
        if e == 1 and d not in gd:
            if masks.RangeBounds(table).needs(gm.starts[d], 1, gm.buffer.shape[d])[1]:
                c = ir.binary(ir.Op.LT, gm.starts[d], gm.buffer.shape[d])
                inside = c if inside is None else ir.binary(ir.Op.AND, inside, c)
    valid_cols = _clamp_extent(gm.starts[gd[-1]], cols, gm.buffer.shape[gd[-1]])
    valid_rows = (_clamp_extent(gm.starts[gd[0]], rows, gm.buffer.shape[gd[0]]) if len(gd) == 2
                  else ir.const(1, dtypes.int64))
    if inside is not None:
        valid_rows = ir.Select(inside, valid_rows, ir.const(0, dtypes.int64), dtypes.int64)
    gm_pitch = gm.buffer.strides[gd[0]] if len(gd) == 2 else ir.const(cols, dtypes.int64)
    return DmaPlan(direction, gm, ub, rows, cols, ub_start, ub_pitch, gm.starts, gm_pitch, valid_rows, valid_cols)


def duplicate_fill(s: ir.Fill) -> bool:
    """A fill of a whole UB tile with a Duplicate-able dtype becomes one ``Duplicate``."""
    b = s.dst.buffer
    return (in_ub(b) and b.is_static and b.dtype in DUPLICATE_DTYPES and tuple(s.dst.extents) == b.static_shape()
            and all(_const(x) == 0 for x in s.dst.starts)
            and not any(isinstance(n, ir.Load) and n.buffer is b for n in ir.walk(s.value)))


class _Lower(masks._Lower):
    """The shared edge-mask lowering, for the copies and fills that stay scalar on Ascend."""

    def visit_Copy(self, s: ir.Copy) -> ir.Stmt:
        return s if dma_plan(s, self.table) is not None else super().visit_Copy(s)

    def visit_Fill(self, s: ir.Fill) -> ir.Stmt:
        return s if duplicate_fill(s) and not self.inside_parallel else super().visit_Fill(s)


def lower_other_copies(kernel: ir.Kernel) -> ir.Kernel:
    """Keep the DMA copies and Duplicate fills as tile ops; lower every other copy and fill."""
    return replace(kernel, body=_Lower(ranges.var_ranges(kernel)).visit(kernel.body))

