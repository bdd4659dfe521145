"""Reductions and scans along one axis of a tile."""
from __future__ import annotations

from kernforge.codegen import ir
from kernforge.dsl import builder as B
from kernforge.dsl.handles import TensorHandle


def _tile(x, what, loc) -> ir.Buffer:
    if not isinstance(x, TensorHandle) or x.scope == ir.Scope.GLOBAL:
        raise B.error(f"{what} must be a shared or fragment tile, got {x!r}", loc)
    B.current().check_live(x.buffer, loc)
    return x.buffer


def _reduce(op: ir.Op, src, dst, dim: int, clear: bool) -> None:
    loc = B.user_loc(3)
    s, d = _tile(src, f"T.{op.value} source", loc), _tile(dst, f"T.{op.value} destination", loc)
    if not -s.ndim <= dim < s.ndim:
        raise B.error(f"T.{op.value}: dim {dim} out of range for {s.ndim}-D {s.name}", loc)
    dim %= s.ndim
    want = s.static_shape()[:dim] + s.static_shape()[dim + 1:]
    got = d.static_shape()
    if tuple(x for x in got if x != 1) != tuple(x for x in want if x != 1):
        raise B.error(f"T.{op.value} shape mismatch: reducing {s.name}{s.static_shape()} over dim "
                      f"{dim} gives {want or (1,)}, destination {d.name} is {got}", loc)
    if op == ir.Op.REDUCE_SUM and s.dtype.is_bool:
        raise B.error(f"T.reduce_sum over bool tile {s.name}: cast it first", loc)
    B.current().emit(ir.Reduce(op, s, d, dim, bool(clear), loc))


def reduce_max(buffer, out, dim: int = -1, clear: bool = True) -> None:
    """Row maxima of a tile: ``out = buffer.max(dim)`` (``dim`` defaults to the last axis).

    ``buffer`` and ``out`` are shared or fragment tiles; ``out`` has ``buffer``'s shape
    without ``dim`` (unit dimensions may be added or dropped: a (M, N) tile reduces into
    (M,) or (M, 1)).  With ``clear=False`` the result is combined with ``out``'s current
    values (``out = max(out, buffer.max(dim))``), the running max of a streaming softmax.
    NaN propagates.  Low-precision tiles reduce in float32 and round once into ``out``."""
    _reduce(ir.Op.REDUCE_MAX, buffer, out, dim, clear)


def reduce_min(buffer, out, dim: int = -1, clear: bool = True) -> None:
    """Minima along ``dim``: :func:`reduce_max` with ``min`` (same shapes, ``clear`` and NaN
    rules)."""
    _reduce(ir.Op.REDUCE_MIN, buffer, out, dim, clear)


def reduce_sum(buffer, out, dim: int = -1, clear: bool = True) -> None:
    """Sums along ``dim``: ``out = buffer.sum(dim)``, or ``out += buffer.sum(dim)`` with
    ``clear=False`` (accumulating over tiles of a loop).  Shapes as in :func:`reduce_max`.
    The sum is computed in ``out``'s dtype, float32 for low-precision tiles, so reduce a
    bfloat16 tile into a float32 ``out`` to keep precision; the order of additions is the
    backend's, so results agree to rounding, not bit for bit.  A bool tile must be cast
    first (``T.reduce_sum`` over a mask would otherwise be ambiguous)."""
    _reduce(ir.Op.REDUCE_SUM, buffer, out, dim, clear)


def cumsum(src, dst=None, dim: int = 0, reverse: bool = False) -> None:
    """Inclusive prefix sum along ``dim`` (``dst[i] = src[0] + ... + src[i]``), in place when
    ``dst`` is omitted; ``reverse=True`` sums from the end (``dst[i] = src[i] + ... +
    src[n - 1]``, the suffix counts of a radix select).  ``dst`` has ``src``'s shape; both
    are shared or fragment tiles."""
    loc = B.user_loc(2)
    s = _tile(src, "T.cumsum source", loc)
    d = s if dst is None else _tile(dst, "T.cumsum destination", loc)
    if s.static_shape() != d.static_shape():
        raise B.error(f"T.cumsum shape mismatch: {s.name}{s.static_shape()} -> "
                      f"{d.name}{d.static_shape()}", loc)
    if not -s.ndim <= dim < s.ndim:
        raise B.error(f"T.cumsum: dim {dim} out of range for {s.ndim}-D {s.name}", loc)
    B.current().emit(ir.Cumsum(s, d, dim % s.ndim, bool(reverse), loc))
