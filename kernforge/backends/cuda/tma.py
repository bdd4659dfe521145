"""TMA (``cp.async.bulk.tensor``) + mbarrier stage rings for ``T.Pipelined`` on sm_90a.

Why: on Hopper the copy engine moves a whole tile per instruction and reports
completion on an mbarrier, instead of every thread issuing 16-byte ``cp.async``
chunks and waiting on its own groups.  This module decides which pipelined
loops can use it (render time), renders their ring (issue + per-stage mbarrier
waits), and turns a launch's actual tensors into the arguments of
``cuTensorMapEncodeTiled`` (launch time; both the GPU launcher and the host
emulation's ``kf_emu::encode_tensor_map`` take them).

A loop goes through TMA only when every copy it prefetches qualifies:

* not marked ``T.copy(..., disable_tma=True)`` (``ir.Copy.disable_tma``): such a copy
  keeps its whole loop on the cp.async ring;
* global source whose innermost stride is the constant 1, same dtype as the
  shared tile, a 2-D tile spanning the source's last axis and one other axis,
  rows of a multiple of 16 bytes, each stage 128-byte aligned, source rank <= 4.

How a tile is loaded follows its shared layout (``layout_plan``, ``smem_layouts``):

* **128-byte-swizzled** gemm operand tiles (``LayoutPlan.swizzled``): one box of
  ``min(rows, 256)`` rows x 128 bytes per 128-byte column chunk, through a
  ``CU_TENSOR_MAP_SWIZZLE_128B`` map (so one box per tile when its rows are 128 bytes: a
  64-column bf16 or 128-column fp8 K tile);
* other (row-major) tiles: row-major boxes of at most 256 x 256 elements, no swizzle;
  whole-tile boxes are issued by one thread (thread 0, which also arms the stage's
  mbarrier with the stage's byte count);
* core-matrix-order gemm operand tiles (tiles the swizzle does not take): one box of
  8 rows x 16 bytes per core matrix, the block's threads sharing the boxes.

L2 cache hint (:func:`streamed`): a tile whose source position depends on every block
index, counting a gather through an index tensor that the pipelined loop walks (a page
table), is read by one CTA only, once: it is loaded with an ``EVICT_FIRST`` policy.
Tiles that other CTAs read again (a GEMM's A across N blocks, its weights B across M
blocks: a block index is missing, or only selects through a loop-invariant lookup such as
an expert map) keep the default policy; no ``EVICT_LAST`` is applied (without timings,
pinning weights that may exceed L2 is not obviously a win).

Out-of-bounds elements of a box are written as 0 by the copy engine, which is
the IR's copy semantics.  What cannot be known before the launch (the data
address and the row strides must be multiples of 16 bytes) is checked by
:func:`encode_args`; a launch that fails it runs the cp.async variant of the
kernel, rendered separately (``render_cuda(..., tma=False)``).
"""
from __future__ import annotations

from dataclasses import dataclass
from math import prod
from typing import Optional, Sequence, Union

import numpy as np

from kernforge.codegen import arith, ir
from kernforge.codegen.renderer import safe_identifier
from kernforge.backends.cuda.smem_layouts import SWIZZLE_BYTES

MAX_BOX = 256
MAX_RANK = 4  # kf/tma.cuh has tma_load_{2,3,4}d


@dataclass(frozen=True)
class TensorMapSpec:
    """One ``const __grid_constant__ CUtensorMap`` kernel parameter: a view of global
    buffer ``kernel.params[param_index]`` with box ``box`` (per buffer axis, IR order)."""

    name: str
    param_index: int
    buffer: str
    box: tuple[int, ...]
    elem_bytes: int
    swizzle: int = 0  # bytes: 0 (CU_TENSOR_MAP_SWIZZLE_NONE) or 128 (CU_TENSOR_MAP_SWIZZLE_128B)


@dataclass(frozen=True)
class TensorMapArgs:
    """``cuTensorMapEncodeTiled``'s arguments, dimension 0 innermost (tile mode, no
    interleave, zero fill; ``swizzle`` bytes 0 or 128)."""

    rank: int
    elem_bytes: int
    address: int
    dims: tuple[int, ...]
    strides_bytes: tuple[int, ...]  # dimensions 1..rank-1
    box: tuple[int, ...]
    swizzle: int = 0

    def packed(self) -> np.ndarray:
        """The int64 vector the emulation's host entry decodes (``kf_emu::encode_tensor_map_packed``)."""
        return np.array([self.rank, self.elem_bytes, self.address, *self.dims, *self.strides_bytes, *self.box,
                         self.swizzle], dtype=np.int64)


@dataclass(frozen=True)
class TmaTile:
    """How one prefetched copy is loaded: boxes of ``box_rows x box_cols`` elements, placed in the
    tile's layout (``layout``: "swizzled", "rows" (row-major) or "core" (one box per core matrix))."""

    copy: ir.Copy
    spec: TensorMapSpec
    row_axis: int
    rows: int
    cols: int
    box_rows: int
    box_cols: int
    layout: str
    evict_first: bool

    @property
    def boxes(self) -> int:
        return (self.rows // self.box_rows) * (self.cols // self.box_cols)

    @property
    def bytes(self) -> int:
        return self.rows * self.cols * self.spec.elem_bytes

    def box_offset(self, rb: str, cb: str) -> str:
        """Element offset in the stage of box (row block ``rb``, column block ``cb``)."""
        if self.layout == "swizzled":  # column chunk cb, rows rb * box_rows.. of it
            return f"({cb}) * {self.rows * self.box_cols} + ({rb}) * {self.box_rows * self.box_cols}"
        if self.layout == "core":  # core matrix (rb, cb), in order
            return f"(({rb}) * {self.cols // self.box_cols} + ({cb})) * {self.box_rows * self.box_cols}"
        return f"({rb}) * {self.box_rows * self.cols}"


def _tile(layouts, c: ir.Copy, params: Sequence) -> Optional[tuple]:
    """(param index, row axis, rows, cols, box_rows, box_cols, layout) when ``c`` can be a TMA load."""
    src, dst = c.src.buffer, c.dst.buffer
    if c.disable_tma or src.scope != ir.Scope.GLOBAL or src.dtype != dst.dtype or src not in params:
        return None
    shape = dst.static_shape()
    if len(shape) != 2 or c.src.squeezed() != shape or c.src.extents[-1] != shape[1]:
        return None
    if not 2 <= len(src.shape) <= MAX_RANK or arith.const_int(src.strides[-1]) != 1:
        return None
    row_axes = [i for i, e in enumerate(c.src.extents[:-1]) if e != 1]
    if len(row_axes) != 1:
        return None
    rows, cols = shape
    e = src.dtype.itemsize
    if (cols * e) % 16 or (rows * cols * e) % 128:
        return None
    box_rows = rows if rows <= MAX_BOX else MAX_BOX
    if dst in layouts.swizzled:  # planned: rows % 8 == 0, whole 128-byte column chunks
        if rows % box_rows:
            return None
        return params.index(src), row_axes[0], rows, cols, box_rows, SWIZZLE_BYTES // e, "swizzled"
    if dst in layouts.core_tiles:  # one box per core matrix: 8 rows of 16 bytes
        if e not in (1, 2) or rows % 8 or cols % (16 // e):
            return None
        return params.index(src), row_axes[0], rows, cols, 8, 16 // e, "core"
    if cols > MAX_BOX or rows % box_rows:
        return None
    return params.index(src), row_axes[0], rows, cols, box_rows, cols, "rows"


def _position_vars(e: ir.Expr, loop: ir.For, out: set) -> None:
    """The variables that select the position ``e`` reads from: every variable outside index loads,
    and those inside an index load only when the load also depends on ``loop``'s variable (a
    table the loop walks, such as a page table); a loop-invariant lookup (an expert map) may send
    many blocks to one place, so it does not tell blocks apart."""
    if isinstance(e, ir.Var):
        out.add(e)
        return
    if isinstance(e, ir.Load):
        inner = {n for i in e.indices for n in ir.nodes(i) if isinstance(n, ir.Var)}
        if loop.var in inner:
            out |= inner
        return
    for child in ir.children(e):
        if isinstance(child, ir.Expr):
            _position_vars(child, loop, out)


def streamed(kernel: ir.Kernel, loop: ir.For, c: ir.Copy) -> bool:
    """Whether every block index of ``kernel`` selects which data ``c`` loads across ``loop``
    (directly, through the loop's bounds, or through a table the loop walks): then each block
    reads its own data once and the L2 lines can go first (``EVICT_FIRST``)."""
    found: set = set()
    for s in c.src.starts:
        _position_vars(s, loop, found)
    if loop.var in found:
        for bound in (loop.start, loop.extent):
            _position_vars(bound, loop, found)
    return set(kernel.block_vars) <= found


def plan_tma(kernel: ir.Kernel, layouts, pipes) -> tuple[dict, list[TensorMapSpec]]:
    """The TMA tiles of each qualifying pipelined loop, and the tensor maps they need (in parameter
    order); ``layouts`` and ``pipes`` are the renderer's layout and pipeline plans."""
    params = list(kernel.params)
    loops: dict[ir.For, list[TmaTile]] = {}
    specs: dict[tuple, TensorMapSpec] = {}
    for loop, copies in pipes.prefetch.items():
        found = [_tile(layouts, c, params) for c in copies]
        if not all(found):
            continue
        tiles = []
        for c, (pi, row_axis, rows, cols, br, bc, layout) in zip(copies, found):
            src = c.src.buffer
            box = tuple(bc if i == len(src.shape) - 1 else br if i == row_axis else 1 for i in range(len(src.shape)))
            swizzle = SWIZZLE_BYTES if layout == "swizzled" else 0
            key = (pi, box, swizzle)
            if key not in specs:
                specs[key] = TensorMapSpec(f"kf_tmap_{safe_identifier(src.name)}_{len(specs)}", pi, src.name, box,
                                           src.dtype.itemsize, swizzle)
            tiles.append(TmaTile(c, specs[key], row_axis, rows, cols, br, bc, layout, streamed(kernel, loop, c)))
        loops[loop] = tiles
    return loops, list(specs.values())


# ---------------------------------------------------------------- rendering


def render_init(R, bars: str, stages: int) -> None:
    """One mbarrier per stage, one arrival (the elected thread's expect_tx) per phase."""
    R.open(f"if ({R.tid} == 0)")
    R.emit(f"for (int kf_s = 0; kf_s < {stages}; ++kf_s) kf::mbarrier_init({bars} + kf_s, 1);")
    R.emit("kf::mbarrier_init_fence();")
    R.close()
    R.emit("__syncthreads();")


def render_inval(R, bars: str, stages: int) -> None:
    """After the loop: once every thread is past its last wait, the barriers are invalidated, so
    that entering the loop again initialises fresh objects (re-initialising a live mbarrier is
    undefined)."""
    R.emit("__syncthreads();")
    R.open(f"if ({R.tid} == 0)")
    R.emit(f"for (int kf_s = 0; kf_s < {stages}; ++kf_s) kf::mbarrier_inval({bars} + kf_s);")
    R.close()


def render_issue(R, tiles: list[TmaTile], stage_expr: str, bar: str, leader: int = 0) -> None:
    """Thread ``leader`` (0, or a warp-specialized kernel's producer thread) arms the stage's
    barrier with its bytes and issues the whole-tile boxes (swizzled and row-major tiles,
    unrolled); the block's threads share a core-matrix tile's boxes."""
    policy = R.fresh("pol") if any(t.evict_first for t in tiles) else None
    if policy:
        R.emit(f"const uint64_t {policy} = kf::l2_policy_evict_first();")
    cl = R.cluster if R.cluster is not None and tiles is R.tma_loops.get(R.cluster.ring) else None
    shared = tiles[cl.shared] if cl is not None else None
    R.open(f"if ({R.tid} == {leader})")
    if cl is None:
        R.emit(f"kf::mbarrier_arrive_expect_tx({bar}, {sum(t.bytes for t in tiles)}u);")
    else:  # every CTA's slice of the shared tile lands here too (cuda.cluster)
        own = sum(t.bytes for t in tiles if t is not shared)
        R.emit(f"kf::mbarrier_arrive_expect_tx({bar}, {cl.plan.expect_tx(shared.bytes, own)}u);")
    for t in tiles:
        if t is shared:
            _issue_boxes(R, t, stage_expr, bar, None, R.fresh("q"), 1, "#pragma unroll", multicast=cl.plan)
        elif t.layout != "core":
            _issue_boxes(R, t, stage_expr, bar, policy, R.fresh("q"), 1, "#pragma unroll")
    R.close()
    for t in tiles:
        if t.layout == "core":
            _issue_boxes(R, t, stage_expr, bar, policy, R.fresh("q"), R.k.threads, None, start=R.tid)


def _issue_boxes(R, t: TmaTile, stage_expr: str, bar: str, policy, q: str, step, pragma, start="0",
                 multicast=None) -> None:
    """``multicast`` (a ``cluster.ClusterPlan``): this CTA loads only its slice of each box (rows
    ``kf_cta_rank * slice_rows``.. of a one-row-box tile) and multicasts it to the same place in
    every CTA of the cluster; for a 2-CTA MMA pair (``plan.pair``) into the start of its own
    stage alone, where the pair's MMA reads each CTA's half."""
    c = t.copy
    src = c.src.buffer
    ct = R.ctype(src.dtype)
    base = f"({R.cname(c.dst.buffer)}_ring + ({stage_expr}) * {prod(c.dst.buffer.static_shape())})"
    per_row = t.cols // t.box_cols
    if pragma:
        R.emit(pragma)
    R.open(f"for (int {q} = {start}; {q} < {t.boxes}; {q} += {step})")
    R.emit(f"const int kf_rb = {q} / {per_row}, kf_cb = {q} % {per_row};")
    piece = ""
    if multicast is not None and not multicast.pair:  # the slice's first row, in elements of the stage
        piece = f" + kf_cta_rank * {multicast.slice_rows * t.box_cols}u"
    R.emit(f"{ct}* kf_dst = {base} + {t.box_offset('kf_rb', 'kf_cb')}{piece};")
    coords = []
    last = len(src.shape) - 1
    for axis in reversed(range(len(src.shape))):
        start_ = f"(int32_t)({R.expr(c.src.starts[axis])})"
        if axis == last:
            start_ += f" + kf_cb * {t.box_cols}"
        elif axis == t.row_axis:
            start_ += f" + kf_rb * {t.box_rows}"
            if multicast is not None:
                start_ += f" + (int32_t)kf_cta_rank * {multicast.slice_rows}"
        coords.append(start_)
    if multicast is not None and not multicast.pair:
        R.emit(f"kf::tma_load_{len(coords)}d_multicast(kf_dst, &{t.spec.name}, {', '.join(coords)}, {bar}, "
               f"(uint16_t){multicast.cta_mask}u);")
        R.close()
        return
    hint = f", {policy}" if policy and t.evict_first else ""
    R.emit(f"kf::tma_load_{len(coords)}d(kf_dst, &{t.spec.name}, {', '.join(coords)}, {bar}{hint});")
    R.close()


# ---------------------------------------------------------------- launch time


def _strides(t) -> tuple[tuple[int, ...], tuple[int, ...], int, int]:
    """(shape, strides in elements, data address, element bytes) of a torch tensor or numpy array."""
    if isinstance(t, np.ndarray):
        return t.shape, tuple(s // t.itemsize for s in t.strides), t.ctypes.data, t.itemsize
    return tuple(t.shape), tuple(t.stride()), t.data_ptr(), t.element_size()


def encode_args(spec: TensorMapSpec, tensor) -> Union[TensorMapArgs, str]:
    """The tensor map of ``tensor`` (torch or numpy) for ``spec``, or why TMA cannot read it."""
    shape, strides, address, esize = _strides(tensor)
    if esize != spec.elem_bytes or len(shape) != len(spec.box):
        return f"{spec.buffer}: element size or rank differs from the rendered kernel"
    if any(d == 0 for d in shape):
        return f"{spec.buffer} is empty"
    if address % 16:
        return f"{spec.buffer}'s data address is not 16-byte aligned"
    if strides[-1] != 1 and shape[-1] != 1:
        return f"{spec.buffer}'s innermost stride is {strides[-1]}, not 1"
    dims = tuple(int(d) for d in reversed(shape))
    out_strides = []
    for d, s in zip(reversed(shape[:-1]), reversed(strides[:-1])):
        b = int(s) * esize
        if d == 1:
            b = max(16, -(-abs(b) // 16) * 16)  # never stepped along: any legal stride
        if b <= 0 or b % 16 or b >= 1 << 40:
            return f"{spec.buffer}'s stride of {s} elements is not a positive multiple of 16 bytes"
        out_strides.append(b)
    if any(d >= 1 << 32 for d in dims):
        return f"{spec.buffer} has a dimension of 2^32 elements or more"
    return TensorMapArgs(len(shape), esize, int(address), dims, tuple(out_strides), tuple(reversed(spec.box)),
                         spec.swizzle)


class TensorMapLaunch:
    """What the GPU and the emulation launchers share about TMA kernels: encode this
    launch's tensor maps, or (when an argument breaks TMA's alignment rules) run the
    explicitly rendered cp.async variant instead and record why.  Subclasses provide
    ``_fallback()`` (build that variant's launcher) and set ``_fallback_launcher = None``,
    ``last_variant`` and ``last_fallback_reason``."""

    def maps_or_fallback(self, specs, args, dims, grid) -> Optional[list]:
        """The encoded maps, or None after the cp.async variant has run."""
        maps = [encode_args(spec, args[spec.param_index]) for spec in specs]
        reasons = [m for m in maps if isinstance(m, str)]
        if not reasons:
            return maps
        if self._fallback_launcher is None:
            self._fallback_launcher = self._fallback()
        self._fallback_launcher(args, dims, grid)
        self.last_variant, self.last_fallback_reason = "cp.async", "; ".join(reasons)
        return None
