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
  rows of a multiple of 16 bytes, each stage 128-byte aligned, source rank <= 4;
* gemm operand tiles (core-matrix order, ``kf/wgmma.cuh``) of 16-bit types and fp8
  load one box of 8 rows x 16 bytes (8x8 or 8x16 elements, 128 contiguous bytes) per core
  matrix; other tiles load
  row-major boxes of at most 256 x 256 elements.

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


@dataclass(frozen=True)
class TensorMapArgs:
    """``cuTensorMapEncodeTiled``'s arguments, dimension 0 innermost (tile mode, no
    interleave, no swizzle, zero fill)."""

    rank: int
    elem_bytes: int
    address: int
    dims: tuple[int, ...]
    strides_bytes: tuple[int, ...]  # dimensions 1..rank-1
    box: tuple[int, ...]

    def packed(self) -> np.ndarray:
        """The int64 vector the emulation's host entry decodes (``kf_emu::encode_tensor_map_packed``)."""
        return np.array([self.rank, self.elem_bytes, self.address, *self.dims, *self.strides_bytes, *self.box],
                        dtype=np.int64)


@dataclass(frozen=True)
class TmaTile:
    """How one prefetched copy is loaded: boxes of ``box_rows x box_cols`` elements."""

    copy: ir.Copy
    spec: TensorMapSpec
    row_axis: int
    rows: int
    cols: int
    box_rows: int
    box_cols: int
    core: bool

    @property
    def boxes(self) -> int:
        return (self.rows // self.box_rows) * (self.cols // self.box_cols)

    @property
    def bytes(self) -> int:
        return self.rows * self.cols * self.spec.elem_bytes


def _tile(core_tiles, c: ir.Copy, params: Sequence) -> Optional[tuple]:
    """(param index, row axis, rows, cols, box_rows, box_cols, core) when ``c`` can be a TMA load."""
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
    if dst in core_tiles:  # one box per core matrix: 8 rows of 16 bytes
        if e not in (1, 2) or rows % 8 or cols % (16 // e):
            return None
        return params.index(src), row_axes[0], rows, cols, 8, 16 // e, True
    box_rows = rows if rows <= MAX_BOX else MAX_BOX
    if cols > MAX_BOX or rows % box_rows:
        return None
    return params.index(src), row_axes[0], rows, cols, box_rows, cols, False


def plan_tma(kernel: ir.Kernel, layouts, pipes) -> tuple[dict, list[TensorMapSpec]]:
    """The TMA tiles of each qualifying pipelined loop, and the tensor maps they need (in parameter
    order); ``layouts`` and ``pipes`` are the renderer's layout and pipeline plans."""
    params = list(kernel.params)
    loops: dict[ir.For, list[TmaTile]] = {}
    specs: dict[tuple, TensorMapSpec] = {}
    for loop, copies in pipes.prefetch.items():
        found = [_tile(layouts.core_tiles, c, params) for c in copies]
        if not all(found):
            continue
        tiles = []
        for c, (pi, row_axis, rows, cols, br, bc, core) in zip(copies, found):
            src = c.src.buffer
            box = tuple(bc if i == len(src.shape) - 1 else br if i == row_axis else 1 for i in range(len(src.shape)))
            key = (pi, box)
            if key not in specs:
                specs[key] = TensorMapSpec(f"kf_tmap_{safe_identifier(src.name)}_{len(specs)}", pi, src.name, box, src.dtype.itemsize)
            tiles.append(TmaTile(c, specs[key], row_axis, rows, cols, br, bc, core))
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


def render_issue(R, tiles: list[TmaTile], stage_expr: str, bar: str) -> None:
    """Thread 0 expects the stage's bytes; the block's threads share the boxes."""
    R.emit(f"if ({R.tid} == 0) kf::mbarrier_arrive_expect_tx({bar}, {sum(t.bytes for t in tiles)}u);")
    for t in tiles:
        c = t.copy
        src = c.src.buffer
        ct = R.ctype(src.dtype)
        base = f"({R.cname(c.dst.buffer)}_ring + ({stage_expr}) * {prod(c.dst.buffer.static_shape())})"
        q = R.fresh("q")
        per_row = t.cols // t.box_cols
        R.open(f"for (int {q} = {R.tid}; {q} < {t.boxes}; {q} += {R.k.threads})")
        R.emit(f"const int kf_rb = {q} / {per_row}, kf_cb = {q} % {per_row};")
        if t.core:
            R.emit(f"{ct}* kf_dst = {base} + ({q}) * {t.box_rows * t.box_cols};")
        else:
            R.emit(f"{ct}* kf_dst = {base} + kf_rb * {t.box_rows * t.cols};")
        coords = []
        last = len(src.shape) - 1
        for axis in reversed(range(len(src.shape))):
            start = f"(int32_t)({R.expr(c.src.starts[axis])})"
            if axis == last:
                start += f" + kf_cb * {t.box_cols}"
            elif axis == t.row_axis:
                start += f" + kf_rb * {t.box_rows}"
            coords.append(start)
        R.emit(f"kf::tma_load_{len(coords)}d(kf_dst, &{t.spec.name}, {', '.join(coords)}, {bar});")
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
    return TensorMapArgs(len(shape), esize, int(address), dims, tuple(out_strides), tuple(reversed(spec.box)))


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
