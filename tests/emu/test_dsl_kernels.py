"""Generated CUDA of small DSL kernels, run on the host emulation, against the
interpreter (the semantic oracle): exact for integers, bf16 tolerance otherwise.

Each kernel aims at one mechanism: tensor-core gemm (mma.sync + ldmatrix +
cp.async on sm_80, wgmma on sm_90a), accumulator row reductions (warp shuffles
plus a shared-memory pass), and edge-masked copies with symbolic shapes.
"""
import ml_dtypes
import numpy as np
import pytest

from hypothesis import given
from hypothesis import strategies as st

import kernforge

from .dsl_kernels import gemm, masked_copy, row_stats, scaled_shift

BF16 = ml_dtypes.bfloat16


def bf16_close(actual, expected):
    """Within one bf16 rounding of the oracle (both round an fp32 accumulation)."""
    a, e = np.asarray(actual, np.float32), np.asarray(expected, np.float32)
    np.testing.assert_allclose(a, e, rtol=2.0 ** -7, atol=1e-3)


def run_both(pf, arch, inputs, outputs):
    """Run ``pf`` under cuda-emu and interp on copies of ``inputs`` whose
    ``outputs`` indices are poisoned; return (emu outputs, interp outputs)."""
    results = []
    for backend in ("cuda-emu", "interp"):
        k = kernforge.compile(pf, backend=backend, arch=arch if backend == "cuda-emu" else None)
        args = [x.copy() for x in inputs]
        k(*args)
        results.append([args[i] for i in outputs])
    return results


@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_tensor_core_gemm_with_edges(arch, rng):
    M, N, K = 80, 72, 72  # one full and one partial tile each way; K ends mid-tile
    A = rng.standard_normal((M, K)).astype(BF16)
    B = rng.standard_normal((K, N)).astype(BF16)
    C = np.full((M, N), np.nan, np.float32).astype(BF16)
    (emu,), (ref,) = run_both(gemm(M, N, K), arch, [A, B, C], [2])
    assert not np.isnan(emu.astype(np.float32)).any()
    bf16_close(emu, ref)
    exact = np.maximum(A.astype(np.float64) @ B.astype(np.float64), 0)
    np.testing.assert_allclose(emu.astype(np.float64), exact, rtol=2.0 ** -7, atol=2e-2)


def test_accumulator_row_reduction(rng):
    M, K = 80, 64
    A = rng.standard_normal((M, K)).astype(BF16)
    B = rng.standard_normal((K, 64)).astype(BF16)
    rmax = np.full(M, np.nan, np.float32)
    rsum = np.full(M, np.nan, np.float32)
    emu, ref = run_both(row_stats(M, K), "sm_80", [A, B, rmax, rsum], [2, 3])
    prod = A.astype(np.float64) @ B.astype(np.float64)
    np.testing.assert_allclose(emu[0], ref[0], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(emu[1], ref[1], rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(emu[0], prod.max(1), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(emu[1], prod.sum(1), rtol=1e-4, atol=1e-3)


_COPY = {}


def _copy_kernels():
    if not _COPY:
        _COPY["emu"] = kernforge.compile(masked_copy(), backend="cuda-emu", arch="sm_90a")
        _COPY["ref"] = kernforge.compile(masked_copy(), backend="interp")
    return _COPY["emu"], _COPY["ref"]


@given(st.integers(1, 70), st.integers(1, 90), st.integers(0, 2 ** 31 - 1))
def test_masked_copy_random_shapes(M, N, seed):
    emu_k, ref_k = _copy_kernels()
    A = np.random.default_rng(seed).integers(-1000, 1000, size=(M, N)).astype(np.int32)
    got = np.full((M, N), -77, np.int32)
    want = np.full((M, N), -77, np.int32)
    emu_k(A, got)
    ref_k(A, want)
    np.testing.assert_array_equal(got, want)


def test_masked_copy_symbolic_shapes(rng):
    emu_k, ref_k = _copy_kernels()
    for M, N in [(1, 1), (16, 32), (17, 33), (5, 70), (33, 4)]:
        A = rng.integers(-1000, 1000, size=(M, N)).astype(np.int32)
        got = np.full((M, N), -77, np.int32)
        want = np.full((M, N), -77, np.int32)
        emu_k(A, got)
        ref_k(A, want)
        np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(got, A + 1)


def test_narrow_scalar_parameters(rng):
    x = rng.standard_normal(200).astype(BF16)
    alpha, shift = 1.7, -3
    k = kernforge.compile(scaled_shift(), backend="cuda-emu", arch="sm_80")
    got = np.full(200, np.nan, np.float32)
    k(x, got, alpha, shift)
    want = np.full(200, np.nan, np.float32)
    kernforge.compile(scaled_shift(), backend="interp")(x, want, alpha, shift)
    np.testing.assert_array_equal(got, want)
    exact = (x.astype(np.float32) * np.float32(BF16(alpha))).astype(BF16).astype(np.float32) + shift
    np.testing.assert_array_equal(got, exact)
