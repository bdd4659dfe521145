"""Shared layouts of gemm operand tiles on CUDA (``smem_layouts``) and which tiles the layout
planner swizzles (no nvcc, no emulation).

The offset formulas are C text; the tests evaluate those very strings in Python (all operands
are non-negative, so C ``/`` is ``//``; ``^ & >> <<`` rank the same in both languages) against
an independent statement of the hardware's 128B swizzle: the tile's unswizzled byte address with
bits [4:6] XORed by bits [7:9].
"""
from __future__ import annotations

import re

from hypothesis import given, settings
from hypothesis import strategies as st

import kernforge.dsl as T
from kernforge.backends.cuda import smem_layouts
from kernforge.backends.cuda.renderer import CudaRenderer, render_cuda
from kernforge.codegen.renderer import Target
from tests.backends.test_cuda_semantics import gemm


def _compiled(expr: str):
    code = compile(expr.replace("/", "//"), "<offset>", "eval")
    return lambda **env: int(eval(code, {}, env))  # noqa: S307 - our own integer expressions


def _hardware_byte(rows, itemsize, r, c):
    """Where the 128B-swizzled tile keeps (r, c): chunk c // W holds R rows of 128 bytes."""
    w = 128 // itemsize
    flat = (c // w) * rows * 128 + r * 128 + (c % w) * itemsize
    return flat ^ (((flat >> 7) & 7) << 4)


@settings(max_examples=15, deadline=None)
@given(rows8=st.integers(1, 8), chunks=st.integers(1, 4), itemsize=st.sampled_from([1, 2]))
def test_swizzled_offsets_are_the_hardware_pattern_and_a_permutation(rows8, chunks, itemsize):
    rows, cols = rows8 * 8, chunks * 128 // itemsize
    offset = _compiled(smem_layouts.element_offset((rows, cols), itemsize, True, "r", "c"))
    seen = set()
    for r in range(rows):
        for c in range(cols):
            off = offset(r=r, c=c)
            assert off * itemsize == _hardware_byte(rows, itemsize, r, c)
            seen.add(off)
    assert seen == set(range(rows * cols))


def test_descriptor_starts_are_unswizzled_addresses_inside_row_zero_of_an_atom():
    rows, cols = 64, 128  # bf16: two 64-element chunks
    start = _compiled(smem_layouts.descriptor_start((rows, cols), 2, True, "r", "c"))
    for r in (0, 8, 56):
        for k0 in range(0, cols, 16):  # K-major: a k16 step moves 32 bytes, a chunk every 64 elements
            byte = start(r=r, c=k0) * 2
            assert byte == (k0 // 64) * rows * 128 + r * 128 + (k0 % 64) * 2
            assert (byte // 128) % 8 == 0  # base offset 0 holds
    assert smem_layouts.descriptor_strides((rows, cols), 2, True, True) == (16, 1024, 1)
    assert smem_layouts.descriptor_strides((32, 512), 2, True, False) == (32 * 128, 1024, 1)  # LBO: next chunk
    assert smem_layouts.descriptor_strides((64, 32), 2, False, True) == (128, 512, 0)


def _swizzled(kernel, arch="sm_90a"):
    _, facts = CudaRenderer().lower(kernel, Target("cuda", arch, "", False))
    return {b.name for b in facts["layouts"].swizzled}


def test_the_planner_swizzles_only_whole_128_byte_rows_read_by_wgmma_or_tcgen05():
    # bk = 64: both K tiles have 128-byte rows (B stored K x N, one warp column of 64)
    assert _swizzled(gemm(bk=64).ir) == {"A_s", "B_s"}
    # bk = 32: A's rows are 64 bytes (core-matrix order); B (32 x 64, MN-major) still swizzles
    assert _swizzled(gemm(bk=32).ir) == {"B_s"}
    # 8 warps: a 64 x 64 accumulator as 4 x 2 warps, 32 columns per warp: an MN-major slice
    # would start inside a 128-byte chunk, so B keeps core-matrix order
    assert _swizzled(gemm(bk=64, threads=256).ir) == {"A_s"}
    assert _swizzled(gemm(bk=64, trans_b=True, threads=256).ir) == {"A_s", "B_s"}  # K-major: fine
    # under 64 rows: mma.sync + ldmatrix read core matrices
    assert _swizzled(gemm(bm=32, bk=64).ir) == set()
    # sm_80: mma.sync + ldmatrix, no swizzle (its sources are unchanged by this layout)
    assert _swizzled(gemm(bk=64).ir, "sm_80") == set()
    # sm_100a: tcgen05.mma reads the same swizzled tiles through UMMA descriptors (layout type 2);
    # under 64 rows it keeps mma.sync and core matrices
    assert _swizzled(gemm(bk=64).ir, "sm_100a") == {"A_s", "B_s"}
    assert _swizzled(gemm(bk=32).ir, "sm_100a") == {"B_s"}
    assert _swizzled(gemm(bm=32, bk=64).ir, "sm_100a") == set()


def test_swizzled_tiles_start_on_1024_byte_boundaries():
    @T.prim_func
    def kern(A: T.Tensor((64, 64), "bfloat16"), B: T.Tensor((64, 64), "bfloat16"), C: T.Tensor((64, 64), "float32"),
             S: T.Tensor((40,), "float32")):
        with T.Kernel(1, threads=128) as bx:
            pad = T.alloc_shared((40,), "float32")  # 160 bytes before the tiles
            A_s = T.alloc_shared((64, 64), "bfloat16")
            B_s = T.alloc_shared((64, 64), "bfloat16")
            acc = T.alloc_fragment((64, 64), "float32")
            T.copy(S[0], pad)
            T.copy(A[0, 0], A_s)
            T.copy(B[0, 0], B_s)
            T.gemm(A_s, B_s, acc, transpose_B=True, clear_accum=True)
            T.copy(acc, C[0, 0])
            T.copy(pad, S[0])

    src = render_cuda(kern.ir, "sm_90a").source
    offsets = {m.group(1): int(m.group(2)) for m in
               re.finditer(r"(\w+) = reinterpret_cast<\w+\*>\(kf_smem \+ (\d+)\)", src)}
    assert offsets["pad"] == 0 and offsets["A_s"] == 1024 and offsets["B_s"] % 1024 == 0
    assert "extern __shared__ __align__(1024) unsigned char kf_smem[];" in src
    assert "__align__(1024)" not in render_cuda(kern.ir, "sm_80").source
