"""GEMM operand layout: give the on-chip tiles that feed a ``T.gemm`` the layout and
type its micro-kernel reads, so that the copy that fills a tile does the packing
once and the GEMM call does none.

Two rewrites of an operand buffer's declaration, both invisible to the program:

* **orientation**: a B operand used transposed (``trans_b``, the ``nt`` layout of
  every DeepGEMM kernel and of MLA's ``Q K^T``) is stored with its N dimension
  contiguous; its strides change, its shape and indices do not.  The copy that
  fills it writes the transposed order, and the micro-kernel then loads whole
  vectors of B along N.
* **widening**: a low-precision float operand (bf16, fp16, fp8 e4m3) is stored
  as float32 when the target's micro-kernel multiplies in float anyway.  This is
  exact only if every value the tile holds is already representable in the narrow
  type, so it applies only when every write is a ``Copy`` from a buffer of the
  same dtype or a store of such a value (a load of that dtype, a cast to it, zero,
  a select between them: MLA's masked KV tile, its bf16 probabilities) and every
  read is a GEMM operand.  Where the target multiplies bf16 natively, an fp8 e4m3
  tile is stored as bf16 instead (every e4m3 value is a bf16 value): the copy
  converts each element once, and the GEMM runs the bf16 kernels instead of
  converting both operands again in a per-call packing (the fp8 GEMM ran at a
  quarter of the bf16 one's rate).

A buffer is rewritten only when every use agrees (one orientation over all its
GEMMs) and every access goes through its strides (copies, loads, stores, GEMM
operands): a tile handed whole to ``Reduce`` or ``Cumsum``, which read it as
row-major, keeps its layout.  Like a fragment layout on CUDA, this is chosen here,
once, not by hand in each kernel.  The pass runs before copies are lowered.

A third rewrite, **direct operands** (``direct=True``; the CPU, whose GEMM reads any
address), removes a copy altogether: a tile filled by one in-bounds ``Copy`` from a
global tensor the kernel never writes, in a type the micro-kernel reads as it is (the
compute type, or a narrow type the target multiplies natively and neither widens nor
converts), and read only by GEMMs right after the copy in the same sequence (as statements,
or inside the branches of a statement that touches the tile in no other way: a host
kernel's runtime choice among row-tile sizes), is replaced in those GEMMs by the global
region itself.  Always for A (the micro-kernel broadcasts its elements from any stride);
for B only when few rows use it (``direct_b_rows``): a decode GEMM streams its weight tile
once, where the copy doubled the traffic, but a B tile that many row blocks reuse is better
copied into a contiguous tile, clear of the cache-set conflicts of a power-of-two row stride --
unless the micro-kernel packs such a B itself (``packed_b``: avx512bf16's bf16 B, which
``kf::gemm_bf16_nn`` packs into its (k, k+1)-pair panels straight from the global rows, so the
copy was a second pass over the same bytes; only for a tile that one GEMM reads).
A tile filled by several copies, each followed by the one GEMM reading exactly what it wrote (a
host kernel's row-ladder rungs), is read in place by those GEMMs in **guarded pairs** (when every
GEMM read of the tile is in one): ``if (the rows lie inside the tensor) GEMM from global; else copy
+ GEMM``, the interior test the copy made anyway, so a symbolic M does not keep A's copy.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Optional

from kernforge import dtypes
from kernforge.codegen import ir
from kernforge.codegen.passes import ranges
from kernforge.codegen.passes.masks import tile_mask

_ON_CHIP = (ir.Scope.SHARED, ir.Scope.FRAGMENT)
NARROW = (dtypes.bfloat16, dtypes.float16, dtypes.float8_e4m3)


class _Uses:
    """How one on-chip buffer is used: as which GEMM operands, written how, read how."""

    def __init__(self):
        self.b_orientations: set[tuple[int, int, bool]] = set()  # (k dim, n dim, trans_b)
        self.gemm_reads = 0
        self.copy_writes_same_dtype = True
        self.other_reads = False
        self.strided_only = True  # every access goes through the buffer's strides


def _representable(e: ir.Expr, b: ir.Buffer) -> bool:
    """Whether every value ``e`` can take is exactly representable in ``b``'s narrow dtype, so
    storing it into a float32 copy of ``b`` keeps the same value: a load of that dtype (``b``
    itself included), a cast to it, a constant it holds, or a select between such."""
    if isinstance(e, ir.Load):
        return e.buffer.dtype == b.dtype
    if isinstance(e, ir.Cast):
        return e.dtype == b.dtype
    if isinstance(e, ir.Const):
        return float(e.value) == 0.0
    if isinstance(e, ir.Select):
        return _representable(e.a, b) and _representable(e.b, b)
    return False


def _dims(r: ir.Region) -> tuple[int, int]:
    """The buffer dimensions a GEMM operand region spans (rows, cols), as the CPU
    renderer reads them."""
    if len(r.extents) <= 2:
        return (0, 1) if len(r.extents) == 2 else (0, 0)
    spanned = [d for d, e in enumerate(r.extents) if e != 1]
    return tuple(spanned) if len(spanned) == 2 else (len(r.extents) - 2, len(r.extents) - 1)


def _collect(kernel: ir.Kernel) -> dict[ir.Buffer, _Uses]:
    uses: dict[ir.Buffer, _Uses] = {}

    def use(b: ir.Buffer) -> Optional[_Uses]:
        if b.scope not in _ON_CHIP or not b.is_static:
            return None
        return uses.setdefault(b, _Uses())

    own_reads: set[int] = set()  # loads of a tile inside a store back into it (a mask in place)
    for node in ir.nodes(kernel.body):
        if isinstance(node, (ir.Buffer, ir.Region)) or id(node) in own_reads:
            continue
        if isinstance(node, ir.Gemm):
            for role, r in (("a", node.a), ("b", node.b)):
                u = use(r.buffer)
                if u is None:
                    continue
                u.gemm_reads += 1
                if role == "b":
                    rows, cols = _dims(r)
                    k_dim, n_dim = (cols, rows) if node.trans_b else (rows, cols)
                    u.b_orientations.add((k_dim, n_dim, node.trans_b))
            u = use(node.c.buffer)
            if u is not None:
                u.other_reads = True
            continue
        if isinstance(node, ir.Copy):
            src, dst = use(node.src.buffer), use(node.dst.buffer)
            if src is not None:
                src.other_reads = True
            if dst is not None and node.src.buffer.dtype != node.dst.buffer.dtype:
                dst.copy_writes_same_dtype = False
            continue
        if isinstance(node, ir.Allocate):
            continue
        for name in ir.field_names(node):
            v = getattr(node, name)
            for x in v if isinstance(v, tuple) else (v,):
                b = x.buffer if isinstance(x, ir.Region) else x
                if not isinstance(b, ir.Buffer):
                    continue
                u = use(b)
                if u is None:
                    continue
                if isinstance(node, ir.Load):
                    u.other_reads = True
                elif isinstance(node, ir.Store):
                    if not _representable(node.value, b):
                        u.copy_writes_same_dtype = False
                    own_reads.update(id(x) for x in ir.nodes(node.value)
                                     if isinstance(x, ir.Load) and x.buffer is b)
                else:  # a tile op reading the buffer whole (Reduce, Cumsum, Fill, ...)
                    u.strided_only = False
                    u.other_reads = True
                    u.copy_writes_same_dtype = False
    return uses


def _n_contiguous(b: ir.Buffer, k_dim: int, n_dim: int) -> tuple[ir.Expr, ...]:
    """Strides with ``n_dim`` contiguous, then ``k_dim``, then the other dimensions in order."""
    shape = b.static_shape()
    order = [d for d in range(b.ndim) if d not in (k_dim, n_dim)] + [k_dim, n_dim]
    strides = [0] * b.ndim
    acc = 1
    for d in reversed(order):
        strides[d] = acc
        acc *= shape[d]
    return tuple(ir.const(s) for s in strides)


def _plan(kernel: ir.Kernel, widen: frozenset, k_major_b: frozenset, to_bf16: frozenset) -> dict[ir.Buffer, ir.Buffer]:
    table: dict[ir.Buffer, ir.Buffer] = {}
    for b, u in _collect(kernel).items():
        if u.gemm_reads == 0:
            continue
        changes = {}
        exact = u.copy_writes_same_dtype and not u.other_reads and u.strided_only
        stored = dtypes.float32 if b.dtype in widen and exact else \
            dtypes.bfloat16 if b.dtype in to_bf16 and exact else b.dtype
        if u.strided_only and len(u.b_orientations) == 1:
            (k_dim, n_dim, trans) = next(iter(u.b_orientations))
            if trans and k_dim != n_dim and stored not in k_major_b:
                changes["strides"] = _n_contiguous(b, k_dim, n_dim)
        if stored != b.dtype:
            changes["dtype"] = stored
            if "strides" not in changes:
                changes["strides"] = b.strides
        if changes:
            table[b] = replace(b, **changes)
    return table


class _Rebuffer(ir.Mutator):
    """Replaces buffers by identity everywhere they appear (declarations, regions, loads, stores).
    A store into a widened tile stores its (representable) value cast to float32; a load of the
    tile inside that value reads it back in the narrow type, exactly, so the expression's types
    are unchanged."""

    def __init__(self, table: dict[ir.Buffer, ir.Buffer]):
        self.table = table
        self.narrowing: Optional[ir.Buffer] = None  # the widened tile whose store value is visited

    def visit_Store(self, node: ir.Store):
        new = self.table.get(node.buffer)
        if new is None or new.dtype == node.buffer.dtype:
            return self.generic(node)
        indices = tuple(self.visit(i) for i in node.indices)
        self.narrowing = node.buffer
        try:
            value = self.visit(node.value)
        finally:
            self.narrowing = None
        return replace(node, buffer=new, indices=indices, value=ir.Cast(value, new.dtype))

    def visit_Load(self, node: ir.Load):
        out = self.generic(node)
        if self.narrowing is not None and node.buffer is self.narrowing:
            return ir.Cast(out, node.buffer.dtype)
        return out

    def generic(self, node):
        if isinstance(node, ir.Buffer):
            return self.table.get(node, node)
        node = super().generic(node)
        changes = {}
        for name in ir.field_names(node):
            v = getattr(node, name)
            if isinstance(v, ir.Buffer) and v in self.table:
                changes[name] = self.table[v]
            elif isinstance(v, tuple) and any(isinstance(x, ir.Buffer) and x in self.table for x in v):
                changes[name] = tuple(self.table.get(x, x) if isinstance(x, ir.Buffer) else x for x in v)
        return replace(node, **changes) if changes else node


_DIRECT_DTYPES = (dtypes.float32, dtypes.float64)  # the compute types: read as they are on every target


def _written_globals(kernel: ir.Kernel) -> set:
    out = set()
    for n in ir.nodes(kernel.body):
        if isinstance(n, (ir.Store, ir.Atomic)):
            out.add(n.buffer)
        elif isinstance(n, (ir.Copy, ir.Fill)):
            out.add(n.dst.buffer)
        elif isinstance(n, (ir.Reduce, ir.Cumsum)):
            out.add(n.dst)
    return out


def _whole(r: ir.Region) -> bool:
    return all(isinstance(s, ir.Const) and s.value == 0 for s in r.starts) and \
        tuple(r.extents) == r.buffer.static_shape()


class _Direct(ir.Mutator):
    """Within each ``Seq``: a copy into an eligible tile, then GEMMs reading it, become the
    GEMMs reading the copy's source."""

    def __init__(self, kernel: ir.Kernel, direct_b_rows: int, in_place: tuple, k_major_b: frozenset,
                 paired: Optional[frozenset] = None, packed_b: frozenset = frozenset()):
        self.uses = _collect(kernel)
        self.paired = paired  # tiles whose (copy, GEMM) pairs are rewritten; None: only count them
        self.paired_reads: dict[ir.Buffer, int] = {}  # GEMM reads of a tile found in such pairs
        self.extra_reads: dict[ir.Buffer, int] = {}  # reads of other tiles by the GEMMs the rewrite duplicates
        self.in_place = in_place  # the dtypes a GEMM reads from global memory as they are
        self.counts: dict[ir.Buffer, int] = {}
        for n in ir.nodes(kernel.body):
            if isinstance(n, ir.Region) and n.buffer.scope in _ON_CHIP:
                self.counts[n.buffer] = self.counts.get(n.buffer, 0) + 1
            elif isinstance(n, (ir.Load, ir.Store, ir.Atomic)) and n.buffer.scope in _ON_CHIP:
                self.counts[n.buffer] = self.counts.get(n.buffer, 0) + 1
        self.written = _written_globals(kernel)
        self.table = ranges.var_ranges(kernel)
        self.direct_b_rows = direct_b_rows
        self.k_major_b = k_major_b
        self.packed_b = packed_b
        self.removed: set = set()

    def source(self, copy: ir.Copy, whole: bool = True) -> Optional[ir.Region]:
        """The copy's global source, when the tile it fills may be replaced by it (``whole``: the
        copy fills the whole tile and the source is provably in bounds)."""
        src, dst = copy.src, copy.dst
        g, t = src.buffer, dst.buffer
        u = self.uses.get(t)
        if (g.scope != ir.Scope.GLOBAL or t.scope not in _ON_CHIP or u is None or g in self.written
                or g.dtype != t.dtype or t.dtype not in self.in_place
                or u.other_reads or not u.strided_only or not u.copy_writes_same_dtype
                or not all(isinstance(x, ir.Const) for x in g.strides) or src.squeezed() != dst.squeezed()):
            return None
        if whole and (not _whole(dst) or tile_mask(src, self.table) is not None):
            return None
        return src

    def _pair(self, copy: ir.Stmt, nxt: ir.Stmt) -> Optional[ir.Stmt]:
        """A copy into part of a tile followed by one GEMM reading exactly that part (a host
        kernel's row-tile rung; such a tile is filled by several copies, so the whole-tile rewrite
        of :meth:`visit_Seq` cannot drop it): the GEMM reading the copy's global source when that
        lies inside its tensor, the pair as it was otherwise.  Only when every GEMM read of the tile
        is in such a pair (``paired``, from a first, counting walk) does no GEMM depend on a copy
        that a rewritten pair skips."""
        if not (isinstance(copy, ir.Copy) and isinstance(nxt, ir.Gemm)):
            return None
        src, tile = self.source(copy, whole=False), copy.dst.buffer
        if src is None:
            return None
        operands = [r for r in (nxt.a, nxt.b) if r.buffer is tile]
        same = all(len(r.starts) == len(copy.dst.starts) and tuple(r.extents) == tuple(copy.dst.extents) and
                   all(isinstance(x, ir.Const) and isinstance(y, ir.Const) and x.value == y.value
                       for x, y in zip(r.starts, copy.dst.starts)) for r in operands)
        if len(operands) != 1 or not same or nxt.c.buffer is tile:
            return None
        if nxt.b.buffer is tile and not self._b_in_place(nxt):
            return None
        if self.paired is None:
            self.paired_reads[tile] = self.paired_reads.get(tile, 0) + 1
            return None
        if tile not in self.paired:
            return None
        direct = _ReadFrom(tile, ir.Region(src.buffer, src.starts, src.extents)).visit(nxt)
        other = nxt.b.buffer if nxt.a.buffer is tile else nxt.a.buffer
        self.extra_reads[other] = self.extra_reads.get(other, 0) + 1  # the guarded pair keeps its GEMM
        self.counts[other] = self.counts.get(other, 0) + 1
        mask = tile_mask(src, self.table)
        return direct if mask is None else ir.If(mask, direct, ir.seq([copy, nxt]))

    def _b_in_place(self, g: ir.Gemm) -> bool:
        """A B tile the micro-kernel reads as it is: a decode GEMM's (few rows) N-major one, or a
        K-major (``trans_b``) one of a ``k_major_b`` dtype, or an N-major one of a ``packed_b``
        dtype that no other GEMM reads; the micro-kernel packs the last two per call anyway (so the
        copy would only move the bytes once more)."""
        if g.trans_b:
            return g.b.buffer.dtype in self.k_major_b
        u = self.uses.get(g.b.buffer)
        if g.b.buffer.dtype in self.packed_b and u is not None and u.gemm_reads == 1:
            return True
        return g.a.extents[1 if g.trans_a else 0] <= self.direct_b_rows

    def visit_Seq(self, s: ir.Seq):
        body = [self.visit(x) for x in s.body]
        for i in range(len(body) - 1):
            pair = self._pair(body[i], body[i + 1]) if body[i] is not None else None
            if pair is not None:
                body[i], body[i + 1] = None, pair
        body = [x for x in body if x is not None]
        for i, st in enumerate(body):
            src = self.source(st) if isinstance(st, ir.Copy) else None
            if src is None:
                continue
            tile = st.dst.buffer
            # the GEMMs reading the tile later in this sequence, as statements or inside one
            # (the branches of an If: a host kernel's choice among row-tile sizes); any other
            # statement that touches it ends the search (and the rewrite)
            found, gemms, clean = [], [], True
            for j in range(i + 1, len(body)):
                inner = _gemm_reads(body[j], tile)
                if inner is None:
                    clean = False
                    break
                if inner:
                    found.append(j)
                    gemms += inner
            reads = sum((g.a.buffer is tile) + (g.b.buffer is tile) for g in gemms)
            ok = (clean and gemms and reads == self.uses[tile].gemm_reads + self.extra_reads.get(tile, 0)
                  and self.counts.get(tile, 0) == reads + 1)
            ok = ok and all(_whole(g.a) if g.a.buffer is tile else _whole(g.b) for g in gemms)
            ok = ok and all(g.b.buffer is not tile or self._b_in_place(g) for g in gemms)
            if not ok:
                continue
            region = ir.Region(src.buffer, src.starts, src.extents)
            for j in found:
                body[j] = _ReadFrom(tile, region).visit(body[j])
            body[i] = None
            self.removed.add(tile)
        return replace(s, body=tuple(x for x in body if x is not None))


def _gemm_reads(x: ir.Stmt, tile: ir.Buffer) -> Optional[list]:
    """The GEMMs in statement ``x`` that read ``tile``; None when something else in ``x``
    touches it (a copy, a load, a store, a tile op)."""
    all_nodes = list(ir.nodes(x))
    gemms = [n for n in all_nodes if isinstance(n, ir.Gemm) and tile in (n.a.buffer, n.b.buffer)]
    # every mention of the tile (each region, load or store names it once; a tile op names it bare)
    mentions = sum(1 for n in all_nodes if n is tile)
    reads = sum((g.a.buffer is tile) + (g.b.buffer is tile) for g in gemms)
    return gemms if mentions == reads else None


class _ReadFrom(ir.Mutator):
    """GEMMs reading ``tile`` read ``region`` instead."""

    def __init__(self, tile: ir.Buffer, region: ir.Region):
        self.tile, self.region = tile, region

    def visit_Gemm(self, g: ir.Gemm):
        if g.a.buffer is self.tile:
            g = replace(g, a=self.region)
        if g.b.buffer is self.tile:
            g = replace(g, b=self.region)
        return g


class _DropAllocations(ir.Mutator):
    def __init__(self, buffers: set):
        self.buffers = buffers

    def visit_Seq(self, s: ir.Seq):
        body = [self.visit(x) for x in s.body if not (isinstance(x, ir.Allocate) and x.buffer in self.buffers)]
        return replace(s, body=tuple(body))


def gemm_operand_layout(kernel: ir.Kernel, widen=NARROW, direct: bool = False, direct_b_rows: int = 16,
                        k_major_b=(), to_bf16=(), packed_b=()) -> ir.Kernel:
    """``kernel`` with its GEMM operand tiles re-laid-out (see the module docstring);
    ``widen``: the narrow dtypes to store as float32 (none on a target whose GEMM
    multiplies them natively); ``direct``: let GEMMs read eligible global tiles in place (a
    narrow dtype that is not widened is read in place too: avx512bf16 reads bf16 A and B rows
    from global memory as (k, k+1) pairs, so copying them into a tile only moves bytes);
    ``k_major_b``: dtypes whose transposed B stays K-contiguous (not oriented) and may be read
    in place from global memory, because the target's micro-kernel reads that layout best
    (avx512bf16: a K-major bf16 B already holds VDPBF16PS's (k, k+1) pairs as 32-bit words,
    which it packs by 16 x 16 register transposes; an oriented tile costs a scalar transposing
    copy); ``to_bf16``: narrow dtypes every value of which bf16 holds exactly (fp8 e4m3) to store as
    bf16 where the target multiplies bf16 natively, so that the copy converts them once and the GEMM
    takes the bf16 kernels (the tile's orientation is then decided as for bf16), rather than
    re-converting them in a per-call packing; such tiles are not read in place; ``packed_b``: dtypes
    whose N-major B (read by one GEMM) the target's micro-kernel packs itself, so that it is read in
    place however many rows use it (avx512bf16's bf16: ``kf::gemm_bf16_nn``)."""
    if not any(isinstance(n, ir.Gemm) for n in ir.nodes(kernel.body)):
        return kernel  # nothing to lay out; the in-place analysis walks the body twice (~10 ms on TopK)
    k_major_b, to_bf16, packed_b = frozenset(k_major_b), frozenset(to_bf16), frozenset(packed_b)
    if direct:
        in_place = tuple(x for x in NARROW if x not in widen and x not in to_bf16)
        dtypes_ = _DIRECT_DTYPES + in_place
        count = _Direct(kernel, direct_b_rows, dtypes_, k_major_b, packed_b=packed_b)
        count.visit(kernel.body)
        # a tile the whole-tile rewrite removes keeps that rewrite
        paired = frozenset(t for t, n in count.paired_reads.items()
                           if n == count.uses[t].gemm_reads and t not in count.removed)
        d = _Direct(kernel, direct_b_rows, dtypes_, k_major_b, paired, packed_b)
        body = d.visit(kernel.body)
        if d.removed:
            kernel = kernel.with_body(_DropAllocations(d.removed).visit(body))
    table = _plan(kernel, frozenset(widen), k_major_b, to_bf16)
    if not table:
        return kernel
    return kernel.with_body(_Rebuffer(table).visit(kernel.body))


def layout_for(widen, direct: bool = False, k_major_b=(), to_bf16=(), packed_b=()) -> "callable":
    """The pass, named for the pipeline, for a target that widens ``widen`` (and reads
    global GEMM operands in place when ``direct``; keeps ``k_major_b`` transposed B K-major;
    stores ``to_bf16`` tiles as bf16; reads ``packed_b`` N-major B in place for any rows)."""
    def gemm_layout(kernel: ir.Kernel) -> ir.Kernel:
        return gemm_operand_layout(kernel, widen, direct, k_major_b=k_major_b, to_bf16=to_bf16,
                                   packed_b=packed_b)
    return gemm_layout
