"""Edge masks of tile copies and fills, made explicit as element loops.

A ``Copy`` reads 0 outside its source and skips writes outside its destination
(ir docstring).  Backends that execute tiles as loops (CPU) want that as
ordinary IR: this pass turns each ``Copy``/``Fill`` into a ``Parallel`` map
over the tile, guarded by per-element conditions only on the dimensions that
can leave their global buffer.  When a mask is needed, the whole-tile test is
hoisted in front of the loop, so interior tiles run an unmasked copy and only
edge tiles pay for the per-element test::

    if (tile inside every buffer) parallel: dst[..] = cast(src[..])
    else parallel: if (dst in) { if (src in) dst[..] = cast(src[..]) else dst[..] = 0 }

Dimensions proven in bounds from variable ranges (static shapes, constant
grids) get no mask at all.  On-chip buffers have static shapes that the author's
tile indices stay inside (the verifier checks constant starts), so they are
never masked.

The mask logic itself (which dimensions of a region need a bounds test, the
per-element condition, the whole-tile test of the fast path) is shared with the
backends that keep ``Copy`` as a tile op: :func:`edge_conditions`,
:func:`element_mask` and :func:`tile_mask` take a *bounds prover*.  This pass
uses :class:`RangeBounds` (the kernel's variable-range table).  The CUDA
renderer (``backends/cuda/ops.py``: scalar copies and fills, the edge chunks
of its 16-byte ``cp.async`` copies, the paired accumulator stores) calls the
same functions with :class:`ConstBounds`, which proves a dimension in bounds
only from constant starts and shapes: its generated sources are pinned byte for
byte, and the range table would drop masks CUDA has always emitted (switching
it is a one-argument change, and a deliberate change of CUDA output).  CUDA
keeps its per-element tests without the hoisted whole-tile branch: its copies
are spread over a block's threads, the vector path tests per 16-byte chunk.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Optional, Union

from kernforge.codegen import arith, ir
from kernforge.codegen.passes import ranges


def _all(conds: list[ir.Expr]) -> Optional[ir.Expr]:
    out = None
    for c in conds:
        out = c if out is None else ir.binary(ir.Op.AND, out, c)
    return out


@dataclass(frozen=True)
class RangeBounds:
    """Proves a tile dimension in bounds from the kernel's variable ranges (``ranges.var_ranges``)."""

    table: dict

    def needs(self, start: ir.Expr, ext: int, dim: ir.Expr) -> tuple[bool, bool]:
        """``(needs a lower test, needs an upper test)`` for ``[start, start + ext)`` in ``[0, dim)``."""
        return (not ranges.proves(ir.binary(ir.Op.GE, start, 0), self.table),
                not ranges.proves(ir.binary(ir.Op.LE, ir.fold(ir.binary(ir.Op.ADD, start, ext)), dim), self.table))


@dataclass(frozen=True)
class ConstBounds:
    """The weaker prover CUDA uses: a dimension is in bounds only when its start and size are
    constants that fit; otherwise it is tested above, and below unless ``start`` is provably
    non-negative (``arith.nonnegative`` over the variables in ``known``)."""

    known: Union[set, frozenset] = frozenset()

    def needs(self, start: ir.Expr, ext: int, dim: ir.Expr) -> tuple[bool, bool]:
        s0, d0 = arith.const_int(start), arith.const_int(dim)
        if s0 is not None and d0 is not None and s0 >= 0 and s0 + ext <= d0:
            return False, False
        return not arith.nonnegative(start, self.known), True


Bounds = Union[RangeBounds, ConstBounds]


def _bounds(b: Union[Bounds, dict]) -> Bounds:
    return RangeBounds(b) if isinstance(b, dict) else b


def edge_conditions(region: ir.Region, bounds: Union[Bounds, dict]) -> list[tuple[int, bool, bool]]:
    """``(dim, needs_lower, needs_upper)`` for each dimension of a *global* region
    that may fall outside its buffer (empty for on-chip regions).  ``bounds`` is a
    prover (:class:`RangeBounds`, :class:`ConstBounds`) or a variable-range table."""
    if region.buffer.scope != ir.Scope.GLOBAL:
        return []
    bounds = _bounds(bounds)
    out = []
    for d, (start, ext, dim) in enumerate(zip(region.starts, region.extents, region.buffer.shape)):
        lower, upper = bounds.needs(start, ext, dim)
        if lower or upper:
            out.append((d, lower, upper))
    return out


def element_mask(region: ir.Region, indices, bounds: Union[Bounds, dict], upper_first: bool = False
                 ) -> Optional[ir.Expr]:
    """The condition that element ``indices`` (full indices into ``region.buffer``) of the
    tile lies inside the buffer, None when :func:`edge_conditions` finds no dimension to
    test: ``idx >= 0`` and ``idx < dim`` per tested dimension, ANDed in dimension order
    (``upper_first`` puts each dimension's upper test first, CUDA's order)."""
    conds = []
    for d, lower, upper in edge_conditions(region, bounds):
        lo = [ir.binary(ir.Op.GE, indices[d], 0)] if lower else []
        hi = [ir.binary(ir.Op.LT, indices[d], region.buffer.shape[d])] if upper else []
        conds += hi + lo if upper_first else lo + hi
    return _all(conds)


def tile_mask(region: ir.Region, bounds: Union[Bounds, dict]) -> Optional[ir.Expr]:
    """The condition that the whole tile lies inside its buffer (the interior fast path's
    test), None when no dimension needs one."""
    conds = []
    for d, lower, upper in edge_conditions(region, bounds):
        start, ext, dim = region.starts[d], region.extents[d], region.buffer.shape[d]
        if lower:
            conds.append(ir.binary(ir.Op.GE, start, 0))
        if upper:
            conds.append(ir.binary(ir.Op.LE, ir.fold(ir.binary(ir.Op.ADD, start, ext)), dim))
    return _all(conds)


class _Tile:
    """Element indices of one region inside a map over the squeezed tile shape."""

    def __init__(self, region: ir.Region, vars_: tuple[ir.Var, ...], table: dict):
        self.region = region
        it = iter(vars_)
        self.indices = tuple(ir.fold(ir.binary(ir.Op.ADD, s, next(it))) if e != 1 else s
                             for s, e in zip(region.starts, region.extents))
        bounds = RangeBounds(table)
        self.tile_cond = tile_mask(region, bounds)
        self.elem_cond = element_mask(region, self.indices, bounds)


class _Lower(ir.Mutator):
    def __init__(self, table: dict):
        self.table = table
        self.count = 0
        self.inside_parallel = False

    def _vars(self, shape: tuple[int, ...]) -> tuple[ir.Var, ...]:
        self.count += 1
        vs = tuple(ir.Var(f"t{self.count}_{k}") for k in range(len(shape)))
        for v, e in zip(vs, shape):
            self.table[v] = (0, e - 1)
        return vs

    def visit(self, node):
        # only statements change; expressions (shared DAGs) are returned untouched
        return node if isinstance(node, ir.Expr) else super().visit(node)

    def visit_Parallel(self, s: ir.Parallel) -> ir.Stmt:
        self.inside_parallel = True
        try:
            return self.generic(s)
        finally:
            self.inside_parallel = False

    def _loop(self, vs, shape, body, loc) -> ir.Stmt:
        """A map over the tile; inside another map (no nesting allowed) serial loops."""
        if not self.inside_parallel:
            return ir.Parallel(vs, shape, body, loc)
        for v, e in reversed(list(zip(vs, shape))):
            body = ir.For(v, ir.const(e), body, loc=loc)
        return body

    def visit_Copy(self, s: ir.Copy) -> ir.Stmt:
        shape = s.src.squeezed() or (1,)

        def body(vs, masked):
            src, dst = _Tile(s.src, vs, self.table), _Tile(s.dst, vs, self.table)
            store = ir.Store(s.dst.buffer, dst.indices, ir.cast(ir.Load(s.src.buffer, src.indices), s.dst.buffer.dtype), s.loc)
            if masked and src.elem_cond is not None:
                zero = ir.Store(s.dst.buffer, dst.indices, ir.cast(0, s.dst.buffer.dtype), s.loc)
                store = ir.If(src.elem_cond, store, zero, s.loc)
            if masked and dst.elem_cond is not None:
                store = ir.If(dst.elem_cond, store, None, s.loc)
            return store, _all([c for c in (src.tile_cond, dst.tile_cond) if c is not None])

        return self._guarded(shape, body, s.loc)

    def visit_Fill(self, s: ir.Fill) -> ir.Stmt:
        shape = s.dst.extents
        value, prelude = s.value, []
        if any(isinstance(n, ir.Load) and n.buffer is s.dst.buffer for n in ir.walk(value)):
            # the value reads the tile being filled: evaluate it once, before the map
            tmp = ir.Buffer(f"fill{self.count}", (ir.const(1),), value.dtype, ir.Scope.LOCAL)
            prelude = [ir.Allocate(tmp, s.loc), ir.Store(tmp, (ir.const(0),), value, s.loc)]
            value = ir.Load(tmp, (ir.const(0),))

        def body(vs, masked):
            dst = _Tile(s.dst, vs, self.table)
            store = ir.Store(s.dst.buffer, dst.indices, value, s.loc)
            if masked and dst.elem_cond is not None:
                store = ir.If(dst.elem_cond, store, None, s.loc)
            return store, dst.tile_cond

        lowered = self._guarded(tuple(e for e in shape if e != 1) or (1,), body, s.loc)
        return ir.Seq(tuple(prelude) + (lowered,), s.loc) if prelude else lowered

    def _guarded(self, shape, body, loc) -> ir.Stmt:
        fast_vars = self._vars(shape)
        fast, tile_cond = body(fast_vars, masked=False)
        fast_loop = self._loop(fast_vars, shape, fast, loc)
        if tile_cond is None:
            return fast_loop
        slow_vars = self._vars(shape)
        slow, _ = body(slow_vars, masked=True)
        return ir.If(tile_cond, fast_loop, self._loop(slow_vars, shape, slow, loc), loc)


def lower_copies(kernel: ir.Kernel) -> ir.Kernel:
    """Replace every ``Copy`` and ``Fill`` with element maps carrying explicit edge masks."""
    return replace(kernel, body=_Lower(ranges.var_ranges(kernel)).visit(kernel.body))
