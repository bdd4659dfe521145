"""STSM + TMA-store epilogues on sm_90a: a whole accumulator tile -> global copy goes through
shared memory and the copy engine instead of 4-byte stores from every thread.

Why: the plain epilogue (``cuda_ops.try_pair_store``) issues one ``STG`` per accumulator pair per
thread (a 128 x 128 bf16 tile: 64 stores per thread, 4 bytes each).  Here every warp writes its
fragment to a staging tile with ``stmatrix`` (16 bytes per lane per matrix row; fp32 tiles, which
``stmatrix`` cannot take, with ``st.shared.v2.f32``), the writers fence for the async proxy and
meet at a barrier, and one thread stores each 64-row block with a few TMA boxes
(``kf/tma_store.cuh``).

Which copies (decided here, for the whole kernel, from the layout plan; :func:`plan_tma_stores`):

* the TMA variant on an arch with wgmma (sm_90a); not ``T.copy(..., disable_tma=True)``;
* source: a whole fp32 accumulator fragment (``AccumLayout``) whose row warps form warpgroups
  (``wm % 4 == 0``, so each 64-row block is one warpgroup's wgmma fragment);
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
written again (a persistent kernel's next tile) and the CTA may exit.
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
    if c.disable_tma or not isinstance(lay, AccumLayout) or lay.m128 or lay.wm % 4 or src.dtype != dtypes.float32:
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
    ``enabled``: the TMA variant on a wgmma arch."""
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


def render(R, s: TmaStore, stage_offset: int) -> None:
    """Per round (:attr:`TmaStore.rounds`): stage the fragment (every thread of the round's warp
    columns), barrier, store + wait (thread 0), barrier."""
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
    whole = s.rounds == 1
    for r in range(s.rounds):
        # the warp columns of this round, and how many of them share the staging tile
        columns, per_stage = (range(lay.wn), lay.wn) if whole else ([r], 1)
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
        for mi in range(lay.mt):
            at = f"(({mi * wgs} + kf_wg) * {lay.wn} + kf_wc) * {block}" if whole else f"({mi * wgs} + kf_wg) * {block}"
            R.emit(f"kf::{helper}<{s.block_cols}, {s.swizzle}>(*reinterpret_cast<const float(*)[{s.block_cols // 2}]>"
                   f"({frag} + {mi * lay.nt * 4}), {stage} + {at});")
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
        R.emit("kf::bulk_wait_group_read<0>();")
        R.close()
        R.barrier()
