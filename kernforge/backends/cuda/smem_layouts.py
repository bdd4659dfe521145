"""Where element ``(r, c)`` of a gemm operand tile sits in shared memory, and the wgmma descriptor
that reads it: the two layouts ``layout_plan`` chooses between.

Why two: wgmma (and TMA) read a 128-byte-swizzled tile as whole 128-byte rows, so one TMA box
fills a whole tile (per 128-byte column chunk) and wgmma reads it without bank conflicts; the
core-matrix ("interleave", no swizzle) order is kept where the swizzle does not apply (rows not a
whole number of 128-byte chunks, ldmatrix/mma.sync readers, MN-major slices inside a chunk).

* **core matrices** (``kf/wgmma.cuh``): 8 rows x 16 bytes per core matrix, 128 contiguous bytes;
  core matrix ``(r/8, c/V)`` at ``((r/8) * (C/V) + c/V) * 128`` bytes (``V = 16 / itemsize``).
* **128-byte swizzle** (``CU_TENSOR_MAP_SWIZZLE_128B``; wgmma layout type 1): the ``R x C`` tile is
  cut into column chunks of ``W = 128 / itemsize`` elements; chunk ``j`` holds columns
  ``[jW, (j+1)W)`` of every row, ``R`` rows of 128 bytes, at byte ``j * R * 128``.  Inside a chunk
  row ``r`` starts at byte ``r * 128`` and its 16-byte piece ``p`` is stored at piece
  ``p ^ (r % 8)``: address bits [4:6] ^= bits [7:9] of the shared address, which is what TMA
  writes and wgmma reads when the tile starts on a 1024-byte boundary (``SWIZZLE_ALIGN``).

Descriptors (PTX "matrix descriptor"; start address = the *unswizzled* address of the
instruction's first element, ``kf::make_smem_desc(ptr, lbo, sbo, layout_type)``):

* K-major swizzled (A as M x K, B as N x K): start = row ``mn0``'s byte ``(k0 % W) * itemsize`` in
  chunk ``k0 / W``; SBO = 1024 (next 8 rows); LBO unused (16).
* MN-major swizzled (A as K x M, B as K x N): start = row ``k0``'s byte ``(mn0 % W) * itemsize`` in
  chunk ``mn0 / W`` (``mn0 % W == 0`` where the planner swizzles); LBO = ``R * 128`` (next ``W``
  M/N elements: the next chunk), SBO = 1024 (next 8 K rows).
"""
from __future__ import annotations

from kernforge.codegen import ir

SWIZZLE_BYTES = 128  # the swizzled layout's row: CU_TENSOR_MAP_SWIZZLE_128B, wgmma layout type 1
SWIZZLE_ALIGN = 1024  # its atom (8 rows x 128 bytes): every swizzled tile (each ring stage) starts on one
SMEM_ALIGN = 128  # every other tile of the kernel's shared-memory arena

LAYOUT_INTERLEAVE = 0  # the descriptor's layout type (bits 62-63 on sm_90a)
LAYOUT_SWIZZLE_128B = 1
# the same layouts in the sm_100 (UMMA) descriptor's layout-type field, bits 61-63
UMMA_LAYOUT = {LAYOUT_INTERLEAVE: 0, LAYOUT_SWIZZLE_128B: 2}


def _shift(n: int) -> int:
    return n.bit_length() - 1  # n is a power of two


def element_offset(shape: tuple[int, int], itemsize: int, swizzled: bool, r: str, c: str) -> str:
    """C expression: the element offset of ``(r, c)`` in the tile (the swizzle applied)."""
    rows, cols = shape
    v = 16 // itemsize
    sv = _shift(v)
    if swizzled:
        w = SWIZZLE_BYTES // itemsize
        return (f"((({c}) >> {_shift(w)}) * {rows * w} + ({r}) * {w} + ((((({c}) & {w - 1}) >> {sv}) ^ (({r}) & 7)) "
                f"<< {sv}) + (({c}) & {v - 1}))")
    return f"(((({r}) >> 3) * {cols // v} + (({c}) >> {sv})) * {8 * v} + (({r}) & 7) * {v} + (({c}) & {v - 1}))"


def descriptor_start(shape: tuple[int, int], itemsize: int, swizzled: bool, r: str, c: str) -> str:
    """C expression: the element offset a descriptor starts at for the instruction whose first
    element is ``(r, c)`` (``r`` a multiple of 8, ``c`` of 16 bytes): the unswizzled address."""
    if not swizzled:
        return element_offset(shape, itemsize, False, r, c)
    w = SWIZZLE_BYTES // itemsize
    return f"((({c}) >> {_shift(w)}) * {shape[0] * w} + ({r}) * {w} + (({c}) & {w - 1}))"


def descriptor_strides(shape: tuple[int, int], itemsize: int, swizzled: bool, k_major: bool) -> tuple[int, int, int]:
    """``(lbo, sbo, layout type)`` in bytes of a tile read K-major (rows along M/N) or MN-major
    (rows along K)."""
    rows, cols = shape
    if swizzled:
        return (16 if k_major else rows * SWIZZLE_BYTES), SWIZZLE_ALIGN, LAYOUT_SWIZZLE_128B
    row_of_cores = cols * itemsize // 16 * 128  # the next 8 rows
    return ((128, row_of_cores) if k_major else (row_of_cores, 128)) + (LAYOUT_INTERLEAVE,)


def smem_desc(R, tile: ir.Buffer, r: str, c: str, k_major: bool, umma: bool = False) -> str:
    """``kf::make_smem_desc`` (``umma``: the sm_100 ``kf::make_umma_desc``) of ``tile`` for the
    instruction whose first element is ``(r, c)``, in the tile's layout (128B-swizzled or
    core-matrix order; ``R``: the renderer, which knows which tiles are swizzled and their names)."""
    shape, size, swizzled = tile.static_shape(), tile.dtype.itemsize, tile in R.plan.swizzled
    lbo, sbo, layout = descriptor_strides(shape, size, swizzled, k_major)
    start = descriptor_start(shape, size, swizzled, r, c)
    if umma:
        return f"kf::make_umma_desc({R.buffer_name(tile)} + {start}, {lbo}, {sbo}, {UMMA_LAYOUT[layout]})"
    mode = f", {layout}" if layout != LAYOUT_INTERLEAVE else ""
    return f"kf::make_smem_desc({R.buffer_name(tile)} + {start}, {lbo}, {sbo}{mode})"
