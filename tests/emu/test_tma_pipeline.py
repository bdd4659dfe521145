"""The sm_90a TMA + mbarrier stage ring under host emulation, against the interpreter.

Ragged edge tiles (TMA zero fill), rings deep enough that every stage's mbarrier
goes through several phases (parity flips), and the cp.async variant a launch
falls back to when its tensors break TMA's 16-byte rules.  Results are "CUDA
semantics verified on host emulation" (docs/backends/cuda-emu.md).
"""
import ml_dtypes
import numpy as np
import pytest

import kernforge
from kernforge.backends.cuda.renderer import render_cuda

from .dsl_kernels import gemm

BF16 = ml_dtypes.bfloat16


def _run(M, N, K, rng, a=None, **tiles):
    pf = gemm(M, N, K, **tiles)
    A = rng.standard_normal((M, K)).astype(BF16) if a is None else a
    B = rng.standard_normal((K, N)).astype(BF16)
    C = np.full((M, N), np.nan, np.float32).astype(BF16)
    want = C.copy()
    k = kernforge.compile(pf, backend="cuda-emu", arch="sm_90a")
    k(A, B, C)
    kernforge.compile(pf, backend="interp")(A, B, want)
    np.testing.assert_allclose(C.astype(np.float32), want.astype(np.float32), rtol=2.0 ** -7, atol=1e-3)
    return k.launcher


@pytest.mark.parametrize("shape,tiles", [
    ((80, 72, 200), dict(stages=3)),               # ragged M, N, K; 7 iterations over 3 stages
    ((33, 40, 136), dict(BM=64, BN=64, BK=32, stages=4)),  # one partial tile in every dimension
])
def test_tma_ring_matches_the_interpreter_on_ragged_tiles(shape, tiles, rng):
    assert render_cuda(gemm(*shape, **tiles).ir, "sm_90a").variant == "tma"
    launcher = _run(*shape, rng, **tiles)
    assert launcher.last_variant == "tma"


def test_row_stride_not_a_multiple_of_16_bytes_runs_the_cp_async_variant(rng):
    launcher = _run(40, 24, 36, rng)  # A's rows are 72 bytes
    assert launcher.last_variant == "cp.async"
    assert "A's stride of 36 elements" in launcher.last_fallback_reason


def test_misaligned_data_address_runs_the_cp_async_variant(rng):
    M, K = 48, 64
    storage = rng.standard_normal(M * K + 1).astype(BF16)
    a = storage[1:].reshape(M, K)
    assert a.ctypes.data % 16
    launcher = _run(M, 40, K, rng, a=a)
    assert launcher.last_variant == "cp.async"
    assert "not 16-byte aligned" in launcher.last_fallback_reason


def _block_sum(M, K, BM=16, BK=64, dtype="float32", repeats=1):
    """out[m, j] = repeats * sum_k A[m, k*BK + j]: a pipelined tile no gemm reads (row-major TMA
    boxes); with repeats > 1 the ring is entered again (its mbarriers invalidated and re-initialised)."""
    import kernforge.dsl as T

    @T.prim_func
    def block_sum(A: T.Tensor((M, K), dtype), out: T.Tensor((M, BK), "float32")):
        with T.Kernel(T.ceildiv(M, BM), threads=128) as bx:
            A_s = T.alloc_shared((BM, BK), dtype)
            acc = T.alloc_fragment((BM, BK), "float32")
            T.clear(acc)
            for r in T.serial(repeats):
                for k in T.Pipelined(T.ceildiv(K, BK), num_stages=3):
                    T.copy(A[bx * BM, k * BK], A_s)
                    for i, j in T.Parallel(BM, BK):
                        acc[i, j] = acc[i, j] + A_s[i, j]
            T.copy(acc, out[bx * BM, 0])

    return block_sum


@pytest.mark.parametrize("dtype,repeats", [("float32", 1), ("float8_e4m3", 1), ("float32", 3)])
def test_row_major_tma_boxes_match_the_interpreter(dtype, repeats, rng):
    M, K = 37, 336  # ragged rows and a partial last column block
    pf = _block_sum(M, K, dtype=dtype, repeats=repeats)
    program = render_cuda(pf.ir, "sm_90a")
    assert [t.box for t in program.tensor_maps] == [(16, 64)]
    np_dtype = np.float32 if dtype == "float32" else ml_dtypes.float8_e4m3fn
    A = rng.standard_normal((M, K)).astype(np_dtype)
    out, want = (np.full((M, 64), np.nan, np.float32) for _ in range(2))
    k = kernforge.compile(pf, backend="cuda-emu", arch="sm_90a")
    k(A, out)
    kernforge.compile(pf, backend="interp")(A, want)
    assert k.launcher.last_variant == "tma"
    np.testing.assert_allclose(out, want, rtol=1e-6, atol=1e-6)
