"""Choose where every fragment of a kernel lives on CUDA: registers in one layout, or shared memory.

DESIGN.md §2 without a general inference engine: the op that produces a
fragment picks its layout (a tensor-core gemm's accumulator takes
:class:`~kernforge.backends.cuda.layouts.AccumLayout`, a row reduction of it a
:class:`~kernforge.backends.cuda.layouts.RowLayout`, a copy a striped layout), a
``Parallel`` map hands its output's layout to fragments it writes at the same
element, and every access that a thread cannot serve from its own registers
moves the fragment to shared memory ("staged").  Staging is the explicit
conversion: a staged fragment is an ordinary shared-memory tile, so any
thread may read any element after a barrier.  The renderer then never has to
guess: each fragment access is either ``frag[register]`` or a shared load.

Gemm operand tiles get a shared layout here too (``core_tiles``, ``swizzled``): the
128-byte swizzle where only wgmma / tcgen05.mma read a tile of whole 128-byte rows (TMA then
loads it in whole-tile boxes), core-matrix order otherwise (``smem_layouts`` has both).

On sm_100a (``tcgen05``) accumulators take the warpgroup layout of sm_90a where it tiles them,
and a gemm whose accumulator fits :func:`tcgen05_ok` runs as ``tcgen05.mma`` into tensor
memory (``gemm_kind`` "tcgen05", :mod:`kernforge.backends.cuda.tcgen05`); the rest keep mma.sync.

The result is a :class:`LayoutPlan` (analysis, not a rewrite: the IR keeps
saying "fragment"); ``kernel`` itself is not changed.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from kernforge import dtypes
from kernforge.codegen import ir
from kernforge.backends.cuda.layouts import (AccumLayout, Layout, RowLayout, StripedLayout, accum_layout,
                                       striped_layout)
from kernforge.backends.cuda.smem_layouts import SWIZZLE_BYTES
from kernforge.backends.cuda.tcgen05 import (TMEM_COLUMNS, plan_block_scaled, plan_m128, plan_resident, scale_columns,
                                             tcgen05_columns)

TENSOR_CORE_DTYPES = (dtypes.bfloat16, dtypes.float16)


@dataclass
class LayoutPlan:
    """Per-fragment placement and per-gemm instruction choice."""

    registers: dict[ir.Buffer, Layout] = field(default_factory=dict)
    staged: set[ir.Buffer] = field(default_factory=set)  # fragments living in shared memory
    # shared tiles in core-matrix order (8 rows x 16 bytes per core matrix: 8x8 16-bit, 8x16 fp8)
    core_tiles: set[ir.Buffer] = field(default_factory=set)
    # the core tiles stored in the 128-byte-swizzled layout instead (``smem_layouts``; sm_90a wgmma)
    swizzled: set[ir.Buffer] = field(default_factory=set)
    gemm_kind: dict[ir.Gemm, str] = field(default_factory=dict)  # "wgmma" | "tcgen05" | "mma" | "scalar"
    # tcgen05 gemms whose accumulator stays in TMEM across their loop (``tcgen05.plan_resident``)
    tmem_resident: dict[ir.Gemm, ir.For] = field(default_factory=dict)
    # of those, the UE8M0-scaled fp8 gemms whose promotion folds into block-scaled MMAs
    # (``tcgen05.plan_block_scaled``): gemm -> tcgen05.BlockScaled
    block_scaled: dict = field(default_factory=dict)

    def tmem_columns(self) -> int:
        """Tensor-memory columns the kernel allocates once (0 without a tcgen05 gemm): the largest
        accumulator's (``tcgen05_columns``; every tcgen05 gemm reuses the same columns, its
        result is in registers when it returns), plus a block-scaled gemm's scale-factor columns
        (``tcgen05.scale_columns``), rounded up to a power of two >= 32 as ``tcgen05.alloc``
        requires."""
        need = max((tcgen05_columns(self.registers[g.c.buffer]) +
                    (scale_columns(self.registers[g.c.buffer]) if g in self.block_scaled else 0)
                    for g, k in self.gemm_kind.items() if k == "tcgen05"), default=0)
        return max(32, 1 << (need - 1).bit_length()) if need else 0


def _whole(r: ir.Region) -> bool:
    return r.buffer.is_static and r.extents == r.buffer.static_shape() and \
        all(isinstance(s, ir.Const) and s.value == 0 for s in r.starts)


def _tensor_core_gemm(g: ir.Gemm, wgmma: bool = False) -> bool:
    """Operand types and tile shapes a tensor-core instruction takes (``wgmma``: fp8 too, see
    :func:`native_fp8_gemm`)."""
    a, b, c = g.a.buffer, g.b.buffer, g.c.buffer
    if not (_whole(g.a) and _whole(g.b) and _whole(g.c)) or c.scope != ir.Scope.FRAGMENT:
        return False
    fp8 = wgmma and a.dtype == dtypes.float8_e4m3 and not g.trans_a and g.trans_b
    if a.dtype != b.dtype or not (a.dtype in TENSOR_CORE_DTYPES or fp8) or c.dtype != dtypes.float32:
        return False
    if a.scope == ir.Scope.GLOBAL or b.scope == ir.Scope.GLOBAL or a.ndim != 2 or b.ndim != 2:
        return False
    m, k = a.static_shape()[::-1] if g.trans_a else a.static_shape()
    n = b.static_shape()[0] if g.trans_b else b.static_shape()[1]
    return m % 16 == 0 and n % 8 == 0 and k % (32 if fp8 else 16) == 0 and m % 8 == 0


def native_fp8_gemm(g: ir.Gemm, threads: int, tcgen05: bool = False) -> bool:
    """Whether sm_90a runs ``g`` as fp8 wgmma (``m64nNk32 .e4m3``, SASS ``QGMMA``) straight from
    its fp8 tiles: both operands whole e4m3 shared tiles, K-major (A stored M x K, B stored
    N x K: PTX has no transpose for 8-bit wgmma operands), K a multiple of 32, and an
    accumulator a warpgroup layout tiles.  ``cuda_fp8_operands`` gives every other fp8 gemm
    bf16 shadow tiles; a gemm this admits whose accumulator the planner later stages runs the
    scalar loop (still exact), never mma.sync.  ``tcgen05`` (sm_100a, ``kind::f8f6f4``, SASS
    ``UTCQMMA``): the same tiles, and the accumulator within tensor memory (:func:`tcgen05_ok`)."""
    a, b = g.a.buffer, g.b.buffer
    if a.scope != ir.Scope.SHARED or b.scope != ir.Scope.SHARED or not _tensor_core_gemm(g, wgmma=True):
        return False
    if a.dtype != dtypes.float8_e4m3:
        return False
    m, n = a.static_shape()[0], b.static_shape()[0]
    lay = accum_layout(m, n, threads, wgmma=True, policy=g.policy)
    return lay is not None and (not tcgen05 or tcgen05_ok(lay, a.dtype))


def tcgen05_ok(lay: AccumLayout, dtype) -> bool:
    """Whether sm_100a runs a gemm with accumulator layout ``lay`` and operand type ``dtype`` as
    tcgen05.mma (``cta_group::1``, ``M = 64``, ``kind::f16`` or ``kind::f8f6f4``): bf16/fp16/e4m3 operands, warps along M in
    whole warpgroups (the ld's lane quarters), ``N = n / wn`` a multiple of 8 up to 256, and the
    accumulator within the 512 TMEM columns."""
    return dtype in TENSOR_CORE_DTYPES + (dtypes.float8_e4m3,) and lay.wm % 4 == 0 and lay.m % 64 == 0 and lay.n // lay.wn <= 256 \
        and tcgen05_columns(lay) <= TMEM_COLUMNS


def _identity(indices, vars_) -> bool:
    return len(indices) == len(vars_) and all(i is v for i, v in zip(indices, vars_))


class _Planner:
    def __init__(self, kernel: ir.Kernel, wgmma: bool, tcgen05: bool = False):
        self.k = kernel
        self.wgmma = wgmma
        self.tcgen05 = tcgen05
        self.frags = [n.buffer for n in ir.nodes(kernel.body)
                      if isinstance(n, ir.Allocate) and n.buffer.scope == ir.Scope.FRAGMENT]
        self.plan = LayoutPlan()

    # -- proposals -------------------------------------------------------
    def propose(self) -> None:
        regs = self.plan.registers
        for g in self._nodes(ir.Gemm):
            if not _tensor_core_gemm(g, self.wgmma or self.tcgen05):
                continue
            m, n = g.c.buffer.static_shape()
            warpgroups = self.wgmma or self.tcgen05
            lay = (accum_layout(m, n, self.k.threads, wgmma=True, policy=g.policy) if warpgroups else None) \
                or accum_layout(m, n, self.k.threads, wgmma=False, policy=g.policy)
            if lay is None:
                continue
            if regs.setdefault(g.c.buffer, lay) != lay:
                self.plan.staged.add(g.c.buffer)
            for op in (g.a.buffer, g.b.buffer):
                if op.scope == ir.Scope.FRAGMENT:
                    self.plan.staged.add(op)
        changed = True
        while changed:
            changed = False
            for r in self._nodes(ir.Reduce):
                src = regs.get(r.src)
                if isinstance(src, AccumLayout) and r.dim == 1 and r.dst.ndim == 1 and r.dst not in regs:
                    regs[r.dst] = src.rows
                    changed = True
            for s in self._nodes(ir.OnlineSoftmax):
                src = regs.get(s.scores)
                if isinstance(src, AccumLayout):
                    for v in (s.row_max, s.row_sum, s.rescale):
                        if v.scope == ir.Scope.FRAGMENT and v not in regs:
                            regs[v] = src.rows
                            changed = True
            for p in self._nodes(ir.Parallel):
                changed |= self._propagate(p)
            for c in self._nodes(ir.Copy):
                s, d = c.src.buffer, c.dst.buffer
                if d.scope == ir.Scope.FRAGMENT and d not in regs and s in regs and _whole(c.src) \
                        and _whole(c.dst) and s.static_shape() == d.static_shape():
                    regs[d] = regs[s]
                    changed = True
        for f in self.frags:
            if f not in regs:
                regs[f] = striped_layout(f.static_shape(), self.k.threads, f.dtype.itemsize)

    def _propagate(self, p: ir.Parallel) -> bool:
        regs = self.plan.registers
        accesses = self._accesses(p.body)
        known = [regs[b] for b, idx in accesses if b in regs and _identity(idx, p.vars)
                 and b.static_shape() == p.extents]
        if not known:
            return False
        driver = known[0]
        changed = False
        for b, idx in accesses:
            if b.scope != ir.Scope.FRAGMENT or b in regs:
                continue
            if _identity(idx, p.vars) and b.static_shape() == p.extents:
                regs[b] = driver
                changed = True
            elif isinstance(driver, AccumLayout) and len(p.vars) == 2 and len(idx) == 1 \
                    and idx[0] is p.vars[0] and b.static_shape() == (driver.m,):
                regs[b] = driver.rows
                changed = True
        return changed

    # -- demotion --------------------------------------------------------
    def settle(self) -> None:
        while True:
            bad = self._violations() - self.plan.staged
            if not bad:
                break
            self.plan.staged |= bad
        for b in self.plan.staged:
            self.plan.registers.pop(b, None)
        for g in self._nodes(ir.Gemm):
            self.plan.gemm_kind[g] = self._gemm_kind(g)
            if self.plan.gemm_kind[g] != "scalar":
                self.plan.core_tiles |= {g.a.buffer, g.b.buffer}
        self.plan.swizzled = {b for b in self.plan.core_tiles if self._swizzle_128b(b)}
        if self.tcgen05:
            plan_m128(self.k, self.plan)
            self.plan.tmem_resident = plan_resident(self.k, self.plan.gemm_kind)
            self.plan.block_scaled = plan_block_scaled(self.k, self.plan)
            self.plan.tmem_resident.update({g: bs.loop for g, bs in self.plan.block_scaled.items()})

    def _swizzle_128b(self, b: ir.Buffer) -> bool:
        """Whether core tile ``b`` can take the 128-byte-swizzled layout (``smem_layouts``): only
        wgmma reads it (ldmatrix/mma.sync address core matrices), it is whole 128-byte rows of
        whole 8-row atoms, and every wgmma that reads it MN-major starts each warp's slice at a
        whole 128-byte chunk (so a descriptor never starts inside a swizzled row)."""
        if not (self.wgmma or self.tcgen05) or b.ndim != 2 or b.dtype.itemsize not in (1, 2):
            return False
        rows, cols = b.static_shape()
        if rows % 8 or (cols * b.dtype.itemsize) % SWIZZLE_BYTES:
            return False
        chunk = SWIZZLE_BYTES // b.dtype.itemsize
        for g in self._nodes(ir.Gemm):
            if b not in (g.a.buffer, g.b.buffer):
                continue
            if self.plan.gemm_kind[g] not in ("wgmma", "tcgen05"):
                return False
            lay = self.plan.registers[g.c.buffer]
            if g.b.buffer is b and not g.trans_b and (lay.n // lay.wn) % chunk:
                return False
        return True

    def _gemm_kind(self, g: ir.Gemm) -> str:
        lay = self.plan.registers.get(g.c.buffer)
        if not (_tensor_core_gemm(g, self.wgmma or self.tcgen05) and isinstance(lay, AccumLayout)):
            return "scalar"
        if any(op in self.plan.registers for op in (g.a.buffer, g.b.buffer)):
            return "scalar"
        if self.wgmma and lay.wm % 4 == 0 and lay.m % 64 == 0 and lay.n // lay.wn <= 256:
            return "wgmma"
        if self.tcgen05 and tcgen05_ok(lay, g.a.buffer.dtype):
            return "tcgen05"
        # mma.sync has no fp8 path here (fp8 reaches this planner only as a native wgmma candidate)
        return "scalar" if g.a.buffer.dtype == dtypes.float8_e4m3 else "mma"

    def _violations(self) -> set:
        regs = {b: lay for b, lay in self.plan.registers.items() if b not in self.plan.staged}
        bad: set = set()
        self._scan(self.k.body, None, regs, bad)
        return bad

    def _scan(self, s: ir.Stmt, par: ir.Parallel | None, regs, bad: set) -> None:
        if isinstance(s, ir.Parallel):
            if par is not None:
                bad |= {b for b, _ in self._accesses(s.body) if b in regs}
                return
            self._check_parallel(s, regs, bad)
            return
        if isinstance(s, (ir.Seq,)):
            for x in s.body:
                self._scan(x, par, regs, bad)
            return
        if isinstance(s, ir.For):
            self._scan_exprs([s.extent, s.start], regs, bad)
            self._scan(s.body, par, regs, bad)
            return
        if isinstance(s, ir.If):
            self._scan_exprs([s.cond], regs, bad)
            self._scan(s.then, par, regs, bad)
            if s.orelse is not None:
                self._scan(s.orelse, par, regs, bad)
            return
        if isinstance(s, (ir.Store, ir.Atomic)):
            if s.buffer in regs:
                bad.add(s.buffer)
            self._scan_exprs(list(s.indices) + [s.value], regs, bad)
            return
        if isinstance(s, ir.Copy):
            self._check_copy(s, regs, bad)
            return
        if isinstance(s, ir.Fill):
            if s.dst.buffer in regs and not _whole(s.dst):
                bad.add(s.dst.buffer)
            self._scan_exprs([s.value] + list(s.dst.starts), regs, bad)
            return
        if isinstance(s, ir.Gemm):
            for r in (s.a, s.b):
                if r.buffer in regs:
                    bad.add(r.buffer)
            if s.c.buffer in regs and not _whole(s.c):
                bad.add(s.c.buffer)
            return
        if isinstance(s, ir.Reduce):
            src, dst = regs.get(s.src), regs.get(s.dst)
            warp_path = isinstance(src, AccumLayout) and s.dim == 1 and dst == src.rows
            if src is not None and not warp_path:
                bad.add(s.src)
            return
        if isinstance(s, ir.Cumsum):
            bad |= {b for b in (s.src, s.dst) if b in regs}
            return
        if isinstance(s, ir.RadixFindBucket):  # the whole block scans the histogram in shared memory
            bad |= {b for b in (s.hist, s.above) if b in regs}
            return
        if isinstance(s, ir.OnlineSoftmax):
            # registers only as an accumulator with its row vectors; otherwise all in shared memory
            operands = (s.scores, s.row_max, s.row_sum, s.rescale)
            lay = regs.get(s.scores)
            if not (isinstance(lay, AccumLayout) and all(regs.get(v) == lay.rows for v in operands[1:])):
                bad |= {b for b in operands if b in regs}
            return

    def _check_copy(self, c: ir.Copy, regs, bad: set) -> None:
        s, d = c.src.buffer, c.dst.buffer
        for r in (c.src, c.dst):
            if r.buffer in regs and not _whole(r):
                bad.add(r.buffer)
        if s in regs and d in regs and regs[s] != regs[d]:
            bad.add(s)
        self._scan_exprs(list(c.src.starts) + list(c.dst.starts), regs, bad)

    def _check_parallel(self, p: ir.Parallel, regs, bad: set) -> None:
        accesses = self._accesses(p.body)
        cands = [regs[b] for b, idx in accesses if b in regs and _identity(idx, p.vars)
                 and b.static_shape() == p.extents]
        driver = self._pick_driver(cands)
        for b, idx in accesses:
            if b not in regs:
                continue
            lay = regs[b]
            same = driver is not None and lay == driver and _identity(idx, p.vars)
            rows = isinstance(driver, AccumLayout) and lay == driver.rows and len(idx) == 1 \
                and len(p.vars) == 2 and idx[0] is p.vars[0]
            if not (same or rows):
                bad.add(b)
        for n in ir.nodes(p.body):
            if isinstance(n, (ir.Parallel, ir.Copy, ir.Fill, ir.Gemm, ir.Reduce, ir.Cumsum, ir.OnlineSoftmax,
                              ir.RadixFindBucket)):
                bad |= {b for b, _ in accesses if b in regs}

    @staticmethod
    def _pick_driver(cands):
        for kind in (AccumLayout, RowLayout, StripedLayout):
            for c in cands:
                if isinstance(c, kind):
                    return c
        return None

    def _scan_exprs(self, exprs, regs, bad: set) -> None:
        for e in exprs:
            for n in ir.nodes(e):
                if isinstance(n, ir.Load) and n.buffer in regs:
                    bad.add(n.buffer)

    # -- helpers ---------------------------------------------------------
    def _nodes(self, cls):
        if not hasattr(self, "_all"):
            self._all = list(ir.nodes(self.k.body))
        return [n for n in self._all if isinstance(n, cls)]

    @staticmethod
    def _accesses(body) -> list[tuple[ir.Buffer, tuple]]:
        out = []
        for n in ir.nodes(body):
            if isinstance(n, ir.Load) and n.buffer.scope == ir.Scope.FRAGMENT:
                out.append((n.buffer, n.indices))
            elif isinstance(n, (ir.Store, ir.Atomic)) and n.buffer.scope == ir.Scope.FRAGMENT:
                out.append((n.buffer, n.indices))
        return out


def plan_layouts(kernel: ir.Kernel, wgmma: bool, tcgen05: bool = False) -> LayoutPlan:
    """Place every fragment of ``kernel`` (``wgmma``: the target has warpgroup MMA; ``tcgen05``:
    it has tcgen05.mma with tensor memory, sm_100a)."""
    planner = _Planner(kernel, wgmma, tcgen05)
    planner.propose()
    planner.settle()
    return planner.plan
