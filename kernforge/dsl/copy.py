"""Tile data movement: ``T.copy``, ``T.fill``, ``T.clear``."""
from __future__ import annotations

from kernforge.codegen import ir
from kernforge.dsl import builder as B
from kernforge.dsl import hints as _hints
from kernforge.dsl.handles import TensorHandle, VarHandle, to_region, unwrap_expr


def _shape_of(x):
    if isinstance(x, TensorHandle) and x.buffer.is_static:
        return x.buffer.static_shape()
    if isinstance(x, ir.Region):
        return x.extents
    return None


def copy(src, dst, **hints) -> None:
    """Copy a tile, converting dtype: global -> shared/fragment, shared -> fragment, back.

    Each side is a buffer, a slice (``A[0:32, k:k + 16]``) or an element ``A[i, j]``: an
    element names the tile that starts there, with the other side's shape (TileLang's
    rule), so ``T.copy(A[by * BM, k * BK], A_s)`` loads an (BM, BK) tile.  Unit dimensions
    may differ between the sides.  Edge tiles are masked by the buffers' shapes: elements
    read outside ``src`` become 0, elements written outside ``dst`` are skipped, so sizes
    that are not multiples of the tile need no extra code.

    TileLang's hints: ``disable_tma=True`` is recorded (``ir.Copy.disable_tma``) and keeps the
    copy off TMA on CUDA; ``coalesced_width`` and an ``eviction_policy`` other than
    ``"evict_normal"`` are rejected, as is any other keyword (``docs/tilelang-hints.md``)."""
    loc = B.user_loc(2)
    fields = _hints.copy_hints(hints, loc)
    s = to_region(src, _shape_of(dst), "copy source")
    d = to_region(dst, s.extents, "copy destination")
    if isinstance(src, ir.Load) and not isinstance(dst, ir.Load):
        s = to_region(src, d.extents, "copy source")
    if s.squeezed() != d.squeezed():
        raise B.error(f"T.copy shape mismatch: source {s!r} has tile shape {s.extents}, "
                      f"destination {d!r} has {d.extents}", loc)
    B.current().emit(ir.Copy(s, d, loc, **fields))


def _one_element(x):
    """The tile shape of an element operand of fill/clear (one element), else None."""
    return (1,) * len(x.indices) if isinstance(x, ir.Load) else None


def _fill_region(x, what: str) -> ir.Region:
    """fill/clear's destination: a tile, an element (a one-element tile, as in TileLang) or a
    ``T.alloc_var`` variable (its one element: ``T.clear(acc)``)."""
    if isinstance(x, VarHandle):
        return ir.whole(x.buffer)
    return to_region(x, _one_element(x), what)


def fill(buffer, value) -> None:
    """Set every element of a tile (a buffer, or a slice ``A[r0:r1, :]``) to ``value``, cast
    to the tile's dtype: ``T.fill(m, -T.infinity("float32"))``.  Elements of a slice that
    fall outside its buffer are skipped, as in :func:`copy`.  An element (``T.fill(s[0], 0)``)
    is a one-element tile, as in TileLang."""
    loc = B.user_loc(2)
    if getattr(buffer, "owns_fill", False):  # a thread's own array, a reducer (compat, reducer)
        return buffer.fill_own(value, loc)
    r = _fill_region(buffer, "fill destination")
    v = ir.cast(unwrap_expr(value, r.buffer.dtype), r.buffer.dtype)
    B.current().emit(ir.Fill(r, v, loc))


def clear(buffer) -> None:
    """Zero a tile: ``T.fill(tile, 0)``, spelled as TileLang does before accumulating into
    it (``T.clear(C_f)`` then ``T.gemm(..., C_f)``)."""
    loc = B.user_loc(2)
    if getattr(buffer, "owns_fill", False):  # a thread's own array, a reducer (compat, reducer)
        return buffer.fill_own(0, loc)
    r = _fill_region(buffer, "clear destination")
    B.current().emit(ir.Fill(r, ir.cast(0, r.buffer.dtype), loc))
