"""Which fp8 gemms run natively on sm_90a (fp8 wgmma on the fp8 tiles) and which keep the
bf16 shadow tiles, and what the native path renders (no nvcc needed)."""
from __future__ import annotations

import re

import pytest

import kernforge.dsl as T
from kernforge import dtypes
from kernforge.backends.cuda.fp8_operands import cuda_fp8_operands_wgmma
from kernforge.backends.cuda.renderer import render_cuda
from kernforge.codegen import ir


def _gemm(m=64, n=64, k=64, trans_b=True, threads=128):
    b_shape = (n, k) if trans_b else (k, n)

    @T.prim_func
    def kern(A: T.Tensor((m, k), "float8_e4m3"), B: T.Tensor(b_shape, "float8_e4m3"), C: T.Tensor((m, n), "float32")):
        with T.Kernel(1, threads=threads) as bx:
            A_s = T.alloc_shared((m, k), "float8_e4m3")
            B_s = T.alloc_shared(b_shape, "float8_e4m3")
            acc = T.alloc_fragment((m, n), "float32")
            T.copy(A[0, 0], A_s)
            T.copy(B[0, 0], B_s)
            T.gemm(A_s, B_s, acc, transpose_B=trans_b, clear_accum=True)
            T.copy(acc, C[0, 0])
    return kern.ir


def _operand_dtype(kernel):
    return next(n for n in ir.walk(kernel.body) if isinstance(n, ir.Gemm)).a.buffer.dtype


@pytest.mark.parametrize("case, native", [
    (dict(), True),                       # K-major, 64 rows, K % 32 == 0
    (dict(trans_b=False), False),         # B stored K x N: 8-bit wgmma has no transpose
    (dict(m=32), False),                  # under a warpgroup's 64 rows: mma.sync on shadows
    (dict(k=48), False),                  # K not a multiple of the k32 instruction
])
def test_native_or_shadow(case, native):
    k = _gemm(**case)
    assert (_operand_dtype(cuda_fp8_operands_wgmma(k)) == dtypes.float8_e4m3) == native
    sm90 = render_cuda(k, "sm_90a").source
    assert ("wgmma_m64nNk32_f32_e4m3" in sm90) == native
    assert ("A_s_bf16" in sm90) != native
    # sm_100a: the same gemms run tcgen05.mma kind::f8f6f4 on the fp8 tiles; sm_80 always shadows
    sm100 = render_cuda(k, "sm_100a").source
    assert ("tcgen05_mma_f8f6f4" in sm100) == native
    assert ("A_s_bf16" in sm100) != native
    assert "A_s_bf16" in render_cuda(k, "sm_80").source


def test_native_descriptors_step_32_k_per_instruction():
    # K = 96: 96-byte rows, not whole 128-byte chunks, so core-matrix order (8 rows x 16 bytes):
    # 3 k32 instructions; LBO 128 bytes (next 16 K), SBO (K/16) * 128 = 768 bytes (next 8 rows)
    src = render_cuda(_gemm(k=96), "sm_90a").source
    assert "kf_kk < 3;" in src
    assert re.search(r"make_smem_desc\(A_s \+ \(\(\(\(kf_row0\) >> 3\) \* 6 \+ \(\(kf_kk \* 32\) >> 4\)\) \* 128 "
                     r"\+ \(\(kf_row0\) & 7\) \* 16 \+ \(\(kf_kk \* 32\) & 15\)\), 128, 768\)", src)
    # outside a pipeline the fp8 tiles are filled by 16-byte cp.async chunks, one core-matrix row
    # each, at the 8 x 16-element core-matrix offset
    assert "kf::cp_async_cg_16" in src and ">> 4)) * 128 + ((" in src


def test_native_descriptors_on_128b_swizzled_tiles():
    # K = 256: two 128-byte chunks of 64 rows (8192 bytes each); a k32 step moves 32 bytes inside
    # a row, then to the next chunk; SBO 1024 (next 8 rows), layout type 1 (128B swizzle)
    src = render_cuda(_gemm(k=256), "sm_90a").source
    assert "kf_kk < 8;" in src and "__align__(1024)" in src
    assert re.search(r"make_smem_desc\(A_s \+ \(\(\(kf_kk \* 32\) >> 7\) \* 8192 \+ \(kf_row0\) \* 128 "
                     r"\+ \(\(kf_kk \* 32\) & 127\)\), 16, 1024, 1\)", src)
    # cp.async chunks land at the swizzled 16-byte piece: piece ^ (row % 8)
    assert ">> 4) ^ ((" in src