"""STSM + TMA-store epilogues on sm_90a and sm_100a: a whole accumulator tile -> global copy goes
through shared memory and the copy engine instead of 4-byte stores from every thread.

Why: the plain epilogue (``cuda_ops.try_pair_store``) issues one ``STG`` per accumulator pair per
thread (a 128 x 128 bf16 tile: 64 stores per thread, 4 bytes each).  Here every warp writes its
fragment to a staging tile with ``stmatrix`` (16 bytes per lane per matrix row; fp32 tiles, which
``stmatrix`` cannot take, with ``st.shared.v2.f32``), the writers fence for the async proxy and
meet at a barrier, and one thread stores each 64-row block with a few TMA boxes
(``kf/tma_store.cuh``).

Which copies (decided here, for the whole kernel, from the layout plan; :func:`plan_tma_stores`):

* the TMA variant on sm_90a or sm_100a (both have ``stmatrix`` and bulk tensor stores; sm_100a's
  tcgen05 gemms read their accumulator back from TMEM into the same fragment); not
  ``T.copy(..., disable_tma=True)``;
* source: a whole fp32 accumulator fragment (``AccumLayout``) whose row warps form warpgroups
  (``wm % 4 == 0``, so each 64-row block is one warpgroup's wgmma fragment; in tcgen05's M = 128
  row order a warp's 16-row slices belong to other 64-row blocks: :func:`_staging_block`);
* destination: a global kernel parameter of bf16 or fp32 with 2 to 5 dimensions, the region a
  whole ``m x n`` tile in its last two (``D[row0, col0]``, or ``Out[b, s, h0, 0]``: MLA decode's
  rows of one token; the outer extents 1) with the constant innermost stride 1; the tensor map
  keeps every dimension, so the box clips at each (rows past ``heads`` are not written even
  where the next token's rows follow in memory); the tile width per warp column
  (``n / wn``) a multiple of 16 (bf16) or 8 (fp32) columns, at most 256 without a swizzle.
* Bounds: TMA clips the box at the tensor's dimensions, which is the IR's copy semantics for
  a region that overhangs the tensor (the plain epilogue's guards).  Arguments TMA cannot
  describe (a misaligned address or stride) run the cp.async variant, which keeps the plain
  epilogue (``cuda_tma.TensorMapLaunch``).

Staging: its own shared region, ``m * n * elem`` bytes after the kernel's other shared memory
(1024-byte aligned).  It does not reuse the pipeline stages: with a warp-specialized ring the
producer may already refill them while the consumers run the epilogue, and proving the ring
drained is not worth the risk.  A kernel whose shared memory would then exceed the arch's limit
keeps the plain epilogue (:func:`fits`).  A tile over :data:`ROUND_ABOVE` bytes with several warp
columns (MLA decode's 64 x 512 float32 partials) is staged one warp column per round instead
(:attr:`TmaStore.rounds`), so its staging tile is ``1 / wn`` of it.  Each (warpgroup row block, warp column, ``mi``) block of
64 x (n / wn) is staged as slabs of 128 bytes (128-byte swizzle, ``kf/tma_store.cuh``; the
swizzle spreads a stmatrix's eight 16-byte rows over all banks) when the block width is a
multiple of 128 bytes, else as one unswizzled slab.  The issuing thread waits
(``cp.async.bulk.wait_group.read 0``) and a second barrier follows, so the staging tile may be
written again and the CTA may exit; in a persistent tile loop that wait is deferred to right
before the staging tile's next write, so the store overlaps the next tile (:func:`lazy`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from kernforge import dtypes
from kernforge.backends.cuda.layouts import AccumLayout
from kernforge.backends.cuda.tma import TensorMapSpec
from kernforge.codegen import arith, ir
from kernforge.codegen.renderer import safe_identifier

SLAB_BYTES = 128  # one CU_TENSOR_MAP_SWIZZLE_128B row: the inner box extent with a swizzle
MAX_BOX = 256
# a tile whose staging would be larger goes out one warp column per round (see TmaStore.rounds)
ROUND_ABOVE = 64 * 1024


@dataclass(frozen=True)
class TmaStore:
    """How one accumulator -> global copy is stored: ``spec`` describes ``{box_cols, 64}`` boxes."""

    copy: ir.Copy
    layout: AccumLayout
    spec: TensorMapSpec
    elem: int  # bytes of the output element: 2 (bf16, stmatrix) or 4 (fp32)
    swizzle: int  # 0 or 128

    @property
    def block_cols(self) -> int:
        """Columns of one warp column's block (a warpgroup's wgmma fragment width)."""
        return self.layout.n // self.layout.wn

    @property
    def rounds(self) -> int:
        """1: the whole tile is staged, then stored.  ``wn``: a tile over :data:`ROUND_ABOVE` bytes
        with several warp columns (MLA decode's 64 x 512 float32 partials: 128 KiB, which beside
        the KV pipeline would not fit in shared memory) is staged and stored one warp column at a
        time through a staging tile that size, at two more barriers per extra round."""
        lay = self.layout
        return lay.wn if lay.wn > 1 and lay.m * lay.n * self.elem > ROUND_ABOVE else 1

    @property
    def bytes(self) -> int:
        return self.layout.m * self.layout.n * self.elem // self.rounds


def _qualifies(c: ir.Copy, lay, params: list) -> Optional[int]:
    """The output element size when ``c`` can be a TMA-store epilogue."""
    src, dst = c.src.buffer, c.dst.buffer
    if c.disable_tma or not isinstance(lay, AccumLayout) or lay.wm % 4 or src.dtype != dtypes.float32:
        return None
    if dst.scope != ir.Scope.GLOBAL or not any(dst is p for p in params) or not 2 <= len(dst.shape) <= 5 \
            or dst.dtype not in (dtypes.bfloat16, dtypes.float32):
        return None
    extents = tuple(c.dst.extents)
    if extents[-2:] != (lay.m, lay.n) or any(e != 1 for e in extents[:-2]) \
            or arith.const_int(dst.strides[-1]) != 1:
        return None
    elem = dst.dtype.itemsize
    cols = lay.n // lay.wn
    if cols % (16 if elem == 2 else 8) or (cols * elem % SLAB_BYTES and cols > MAX_BOX):
        return None
    return elem


def plan_tma_stores(kernel: ir.Kernel, layouts, enabled: bool) -> tuple[dict, list[TensorMapSpec]]:
    """The TMA-store epilogues of ``kernel`` (copy -> :class:`TmaStore`) and their tensor maps;
    ``enabled``: the TMA variant on an arch with the copy engine and ``stmatrix`` (sm_90a, sm_100a)."""
    if not enabled:
        return {}, []
    params = list(kernel.params)
    stores: dict[ir.Copy, TmaStore] = {}
    specs: dict[tuple, TensorMapSpec] = {}
    for c in ir.nodes(kernel.body):
        if not isinstance(c, ir.Copy):
            continue
        lay = layouts.registers.get(c.src.buffer)
        elem = _qualifies(c, lay, params)
        if elem is None:
            continue
        swizzle = SLAB_BYTES if (lay.n // lay.wn) * elem % SLAB_BYTES == 0 else 0
        box_cols = SLAB_BYTES // elem if swizzle else lay.n // lay.wn
        key = (next(i for i, p in enumerate(params) if p is c.dst.buffer), box_cols, swizzle)
        if key not in specs:
            outer = (1,) * (len(c.dst.buffer.shape) - 2)  # one element of each outer dimension
            specs[key] = TensorMapSpec(f"kf_tmap_store_{safe_identifier(c.dst.buffer.name)}_{len(specs)}", key[0],
                                       c.dst.buffer.name, outer + (64, box_cols), elem, swizzle)
        stores[c] = TmaStore(c, lay, specs[key], elem, swizzle)
    return stores, list(specs.values())


def staging_bytes(stores: dict) -> int:
    """Shared bytes of the largest staging tile (the epilogues run one after another)."""
    return max((s.bytes for s in stores.values()), default=0)


def _staging_block(lay: AccumLayout, mi: int) -> tuple[str, str]:
    """The 64-row staging block (rows ``64 * block ..``, as C) that this warp's ``mi``-th 16 rows
    belong to, and the helper's slice argument (``""``: the warp's index in its warpgroup).
    wgmma / mma.sync order (``layouts._row``): block ``mi * wm / 4 + kf_wg``, slice ``w % 4``.
    tcgen05's M = 128 order: with ``L = mi * wm / 4 + kf_wg``, the rows are
    ``128 (L >> 1) + 32 q + 16 (L & 1) + 0..15`` (``q`` = ``kf_q``, the warp's lane quarter), so
    block ``2 (L >> 1) + q / 2``, slice ``2 (q & 1) + (L & 1)``."""
    L = f"{mi * (lay.wm // 4)} + kf_wg"
    if not lay.m128:
        return L, ""
    return f"2 * (({L}) >> 1) + (kf_q >> 1)", f", 2 * (kf_q & 1) + (({L}) & 1)"


def render(R, s: TmaStore, stage_offset: int) -> None:
    """Per round (:attr:`TmaStore.rounds`): stage the fragment (every thread of the round's warp
    columns), barrier, store + wait (thread 0), barrier.  Lazy (:func:`lazy`): thread 0 first waits
    for the staging tile's previous stores to have been read, a barrier, then stage, barrier and
    store without a wait (:func:`render_drain` waits for the last one)."""
    lay, c = s.layout, s.copy
    wgs = lay.wm // 4  # warpgroups along the rows
    block = 64 * s.block_cols * s.elem  # bytes of one 64-row block
    frag = R.buffer_name(c.src.buffer)
    stage = f"(kf_smem + {stage_offset})"
    R.headers.add("kf/tma_store.cuh")
    helper = "epilogue_stsm_bf16" if s.elem == 2 else "epilogue_st_f32"
    row0, col0 = (R.expr(e) for e in c.dst.starts[-2:])
    outer = [R.expr(e) for e in reversed(c.dst.starts[:-2])]  # the map's coordinates 2.., innermost first
    coords = "".join(f", kf_o{i}" for i in range(len(outer)))
    whole, deferred = s.rounds == 1, lazy(R, s)
    for r in range(s.rounds):
        # the warp columns of this round, and how many of them share the staging tile
        columns, per_stage = (range(lay.wn), lay.wn) if whole else ([r], 1)
        if deferred:  # the previous tile's boxes are read out of the staging tile before it is rewritten
            R.open(f"if ({R.tid} == 0)")
            R.emit("kf::bulk_wait_group_read<0>();")
            R.close()
            R.barrier()
        R.emit("{")  # the staging writes, in their own scope
        R.depth += 1
        if not whole:  # warps past the accumulator's have a column index >= wn: never this round's
            R.open(f"if ((({R.tid} >> 5) / {lay.wm}) == {r})")
        elif lay.used_warps != lay.warps:
            R.open(f"if (({R.tid} >> 5) < {lay.used_warps})")
        if whole:
            R.emit(f"const int kf_wg = (({R.tid} >> 5) % {lay.wm}) / 4, kf_wc = ({R.tid} >> 5) / {lay.wm};")
        else:
            R.emit(f"const int kf_wg = (({R.tid} >> 5) % {lay.wm}) / 4;")
        if lay.m128:
            R.emit(f"const int kf_q = ({R.tid} >> 5) & 3;  // the warp's TMEM lane quarter")
        for mi in range(lay.mt):
            blk, slice_ = _staging_block(lay, mi)
            at = f"(({blk}) * {lay.wn} + kf_wc) * {block}" if whole else f"({blk}) * {block}"
            R.emit(f"kf::{helper}<{s.block_cols}, {s.swizzle}>(*reinterpret_cast<const float(*)[{s.block_cols // 2}]>"
                   f"({frag} + {mi * lay.nt * 4}), {stage} + {at}{slice_});")
        if not whole or lay.used_warps != lay.warps:
            R.close()
        R.close()
        if not (R.uses_wgmma or R.warp_spec is not None):  # those barriers fence for the async proxy already
            R.emit("kf::fence_proxy_async();")
        R.barrier()
        R.open(f"if ({R.tid} == 0)")
        R.emit(f"const int32_t kf_r0 = (int32_t)({row0}), kf_c0 = (int32_t)({col0});")
        if outer:
            R.emit("const int32_t " + ", ".join(f"kf_o{i} = (int32_t)({e})" for i, e in enumerate(outer)) + ";")
        for mi in range(lay.mt):
            for wg in range(wgs):
                for k, wc in enumerate(columns):
                    off = ((mi * wgs + wg) * per_stage + k) * block
                    R.emit(f"kf::epilogue_tma_store<{s.block_cols}, {s.swizzle}, {s.elem}>(&{s.spec.name}, "
                           f"{stage} + {off}, kf_c0 + {wc * s.block_cols}, "
                           f"kf_r0 + {mi * 16 * lay.wm + 64 * wg}{coords});")
        if deferred:
            R.close()
            continue
        R.emit("kf::bulk_wait_group_read<0>();")
        R.close()
        R.barrier()


def lazy(R, s: TmaStore) -> bool:
    """Whether ``s`` waits for its stores lazily: in a persistent tile loop (``cuda.persistent``)
    a whole-tile store's read of the staging tile overlaps the CTA's next tile (its main loop),
    and is waited for only right before the staging tile's next write, as DeepGEMM does; the
    tile loop's own barrier (``persistent.render_tiles``) does not order the staging tile, the
    barrier after that wait does.  Elsewhere (one tile per CTA, or a tile staged in rounds) the
    issuing thread waits at once."""
    return R.persistent is not None and s.rounds == 1


def render_drain(R) -> None:
    """After a persistent tile loop: thread 0 waits for its last tile's lazy stores (:func:`lazy`)
    to have read shared memory, before the CTA may exit."""
    if any(lazy(R, s) for s in R.tma_stores.values()):
        R.open(f"if ({R.tid} == 0)")
        R.emit("kf::bulk_wait_group_read<0>();  // the last tile's TMA stores (their reads of the staging tile)")
        R.close()
