"""The CUDA renderer's output computes what the tile program means, checked on host emulation.

No GPU here: these kernels go through ``render_cuda`` unchanged and run on the
"cuda-emu" backend (g++ with ``-DKF_HOST_EMULATION``: threads, barriers, warp
shuffles, mma.sync/wgmma/cp.async emulated from the PTX ISA).  Each kernel
exercises one mapping decision of the renderer -- tensor-core accumulators
and their row reductions (warp shuffles plus a cross-warp pass), staged
fragments, cp.async rings with ragged edges, per-block statements -- against
a float64 torch reference on random data with poisoned outputs.

The kernels are also the compile set of ``test_cuda_compile.py``.
"""
from __future__ import annotations

import pytest
import torch

import kernforge
import kernforge.dsl as T


def gemm(M=96, N=80, K=72, bm=64, bn=64, bk=32, stages=2, threads=128, trans_b=False, dtype="bfloat16",
         trans_a=False):
    @T.prim_func
    def kf_test_gemm(A: T.Tensor(((K, M) if trans_a else (M, K)), dtype),
                     B: T.Tensor(((N, K) if trans_b else (K, N)), dtype), C: T.Tensor((M, N), dtype)):
        with T.Kernel(T.ceildiv(N, bn), T.ceildiv(M, bm), threads=threads) as (bx, by):
            A_s = T.alloc_shared(((bk, bm) if trans_a else (bm, bk)), dtype)
            B_s = T.alloc_shared(((bn, bk) if trans_b else (bk, bn)), dtype)
            C_f = T.alloc_fragment((bm, bn), "float32")
            T.clear(C_f)
            for k in T.Pipelined(T.ceildiv(K, bk), num_stages=stages):
                if trans_a:
                    T.copy(A[k * bk, by * bm], A_s)
                else:
                    T.copy(A[by * bm, k * bk], A_s)
                if trans_b:
                    T.copy(B[bx * bn, k * bk], B_s)
                else:
                    T.copy(B[k * bk, bx * bn], B_s)
                T.gemm(A_s, B_s, C_f, transpose_A=trans_a, transpose_B=trans_b)
            T.copy(C_f, C[by * bm, bx * bn])
    return kf_test_gemm


def scores_softmax(M=64, N=64, D=64, threads=256):
    """softmax(Q K^T) row-wise: an accumulator, its row max/sum in registers (warps share rows)."""
    @T.prim_func
    def kf_test_scores_softmax(Q: T.Tensor((M, D), "bfloat16"), Kt: T.Tensor((N, D), "bfloat16"),
                               P: T.Tensor((M, N), "float32")):
        with T.Kernel(1, threads=threads) as bx:
            Q_s = T.alloc_shared((M, D), "bfloat16")
            K_s = T.alloc_shared((N, D), "bfloat16")
            S = T.alloc_fragment((M, N), "float32")
            mx = T.alloc_fragment((M,), "float32")
            sm = T.alloc_fragment((M,), "float32")
            T.copy(Q[0, 0], Q_s)
            T.copy(Kt[0, 0], K_s)
            T.gemm(Q_s, K_s, S, transpose_B=True, clear_accum=True)
            T.reduce_max(S, mx, dim=1)
            for i, j in T.Parallel(M, N):
                S[i, j] = T.exp(S[i, j] - mx[i])
            T.reduce_sum(S, sm, dim=1)
            for i, j in T.Parallel(M, N):
                S[i, j] = S[i, j] / sm[i]
            T.copy(S, P[0, 0])
    return kf_test_scores_softmax


def row_softmax(N=100, block_M=8, threads=64):
    """softmax over rows read into a copied (striped) fragment: the reduction goes through shared memory."""
    M = T.symbolic("M")

    @T.prim_func
    def kf_test_row_softmax(X: T.Tensor((M, N), "bfloat16"), Y: T.Tensor((M, N), "bfloat16")):
        with T.Kernel(T.ceildiv(M, block_M), threads=threads) as bx:
            x = T.alloc_fragment((block_M, N), "float32")
            mx = T.alloc_fragment((block_M,), "float32")
            sm = T.alloc_fragment((block_M,), "float32")
            T.copy(X[bx * block_M, 0], x)
            T.reduce_max(x, mx, dim=1)
            for i, j in T.Parallel(block_M, N):
                x[i, j] = T.exp(x[i, j] - mx[i])
            T.reduce_sum(x, sm, dim=1)
            for i, j in T.Parallel(block_M, N):
                x[i, j] = x[i, j] / sm[i]
            T.copy(x, Y[bx * block_M, 0])
    return kf_test_row_softmax


def scan_and_total(W=48, block_M=4, threads=64):
    """Edge copies into shared memory, an inclusive scan per row, per-block scalar work, an atomic."""
    M = T.symbolic("M")

    @T.prim_func
    def kf_test_scan(X: T.Tensor((M, W), "int32"), Y: T.Tensor((M, W), "int32"), total: T.Tensor((1,), "int32"),
                     first: T.Tensor((M,), "int32")):
        with T.Kernel(T.ceildiv(M, block_M), threads=threads) as bx:
            tile = T.alloc_shared((block_M, W), "int32")
            acc = T.alloc_var("int32", 0)
            T.copy(X[bx * block_M, 0], tile)
            T.cumsum(tile, dim=1)
            T.copy(tile, Y[bx * block_M, 0])
            for i in T.serial(block_M):
                acc = acc + tile[i, W - 1]
            T.atomic_add(total[0], acc)
            for i in T.Parallel(block_M):
                if bx * block_M + i < M:
                    first[bx * block_M + i] = tile[i, 0] * 2 - 1
    return kf_test_scan


def block_scans(n=300, threads=96, dtype="int32"):
    """1-D shared scans, forward and reverse, done by the whole block."""
    @T.prim_func
    def kf_test_block_scans(X: T.Tensor((n,), dtype), F: T.Tensor((n,), dtype), R: T.Tensor((n,), dtype)):
        with T.Kernel(1, threads=threads) as bx:
            a = T.alloc_shared((n,), dtype)
            b = T.alloc_shared((n,), dtype)
            T.copy(X[0], a)
            T.cumsum(a, b, reverse=True)
            T.cumsum(a)
            T.copy(a, F[0])
            T.copy(b, R[0])
    return kf_test_block_scans


def local_maps(n=6, threads=64):
    """Fills and copies into thread-local arrays: every thread holds the whole array (a block-uniform value)."""
    @T.prim_func
    def kf_test_local_maps(X: T.Tensor((n,), "float32"), Y: T.Tensor((n,), "float32"), S: T.Tensor((1,), "float32")):
        with T.Kernel(1, threads=threads) as bx:
            loc = T.alloc_local((n,), "float32")
            ones = T.alloc_local((n,), "float32")
            tot = T.alloc_var("float32", 0.0)
            T.fill(ones, 1.0)
            T.copy(X[0], loc)
            for i in T.serial(n):
                loc[i] = ones[i] + loc[i] * 2.0
                tot = tot + loc[i]
            S[0] = tot
            T.copy(loc, Y[0])
    return kf_test_local_maps


def striped_map(rows=7, cols=5, threads=64):
    """A copied fragment kept in registers (striped, last run overhanging), a map, a float atomic max."""
    @T.prim_func
    def kf_test_striped(X: T.Tensor((rows, cols), "bfloat16"), Y: T.Tensor((rows, cols), "float32"),
                        top: T.Tensor((1,), "float32")):
        with T.Kernel(1, threads=threads) as bx:
            f = T.alloc_fragment((rows, cols), "float32")
            T.copy(X[0, 0], f)
            for i, j in T.Parallel(rows, cols):
                f[i, j] = T.tanh(f[i, j]) * (i + 1) - j
                T.atomic_max(top[0], f[i, j])
            T.copy(f, Y[0, 0])
    return kf_test_striped


def scalar_helpers(n=64):
    """Floor division/modulo (negative and zero divisors), float remainder, NaN-propagating max."""
    @T.prim_func
    def kf_test_scalar_helpers(A: T.Tensor((n,), "int32"), B: T.Tensor((n,), "int32"), X: T.Tensor((n,), "float32"),
                               Y: T.Tensor((n,), "float32"), Q: T.Tensor((n,), "int32"), R: T.Tensor((n,), "int32"),
                               F: T.Tensor((n,), "float32"), M: T.Tensor((n,), "float32")):
        with T.Kernel(1, threads=32) as bx:
            for i in T.Parallel(n):
                Q[i] = A[i] // B[i]
                R[i] = A[i] % B[i]
                F[i] = X[i] % Y[i]
                M[i] = T.max(X[i], Y[i])
    return kf_test_scalar_helpers


def _bf16(*shape):
    return torch.randn(*shape).bfloat16()


@pytest.fixture(scope="module")
def emu():
    from kernforge import backends

    try:
        backends.get("cuda-emu")
    except backends.BackendError as e:
        pytest.skip(f"cuda-emu backend unavailable: {e}")


@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
@pytest.mark.parametrize("trans_b", [False, True])
def test_gemm_ragged_tiles(emu, arch, trans_b):
    torch.manual_seed(1)
    M, N, K = 96, 80, 72
    k = kernforge.compile(gemm(M, N, K, trans_b=trans_b), backend="cuda-emu", arch=arch)
    a = _bf16(M, K)
    b = _bf16(N, K) if trans_b else _bf16(K, N)
    c = torch.full((M, N), float("nan")).bfloat16()
    k(a, b, c)
    ref = a.double() @ (b.double().T if trans_b else b.double())
    torch.testing.assert_close(c.double(), ref, atol=0.05, rtol=0.02)


@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_gemm_transposed_a_and_idle_warps(emu, arch):
    """A stored K x M (ldmatrix.trans / wgmma transposed A); 8 warps for a tile 4 warps fill."""
    torch.manual_seed(8)
    M, N, K = 64, 40, 48
    k = kernforge.compile(gemm(M, N, K, bm=64, bn=8, bk=16, threads=256, trans_a=True), backend="cuda-emu",
                          arch=arch)
    a, b = _bf16(K, M), _bf16(K, N)
    c = torch.full((M, N), float("nan")).bfloat16()
    k(a, b, c)
    torch.testing.assert_close(c.double(), a.double().T @ b.double(), atol=0.05, rtol=0.02)


@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_scores_softmax_row_reductions_across_warps(emu, arch):
    torch.manual_seed(2)
    k = kernforge.compile(scores_softmax(), backend="cuda-emu", arch=arch)
    q, kt = _bf16(64, 64), _bf16(64, 64)
    p = torch.full((64, 64), float("nan"))
    k(q, kt, p)
    ref = torch.softmax(q.double() @ kt.double().T, dim=1)
    torch.testing.assert_close(p.double(), ref, atol=1e-5, rtol=1e-4)


def test_row_softmax_staged_fragment_and_symbolic_rows(emu):
    torch.manual_seed(3)
    k = kernforge.compile(row_softmax(), backend="cuda-emu", arch="sm_80")
    x = (torch.randn(13, 100) * 4).bfloat16()
    y = torch.full((13, 100), float("nan")).bfloat16()
    k(x, y)
    ref = torch.softmax(x.double(), dim=1)
    torch.testing.assert_close(y.double(), ref, atol=4e-3, rtol=1e-2)


def test_scan_edges_block_scalars_and_atomics(emu):
    torch.manual_seed(4)
    M, W = 10, 48
    k = kernforge.compile(scan_and_total(W=W), backend="cuda-emu", arch="sm_90a")
    x = torch.randint(-50, 50, (M, W), dtype=torch.int32)
    y = torch.full((M, W), -7, dtype=torch.int32)
    total = torch.zeros(1, dtype=torch.int32)
    first = torch.full((M,), -7, dtype=torch.int32)
    k(x, y, total, first)
    assert torch.equal(y, x.cumsum(dim=1).int())
    # rows past M in the last block read as 0 and add nothing
    assert total.item() == int(x.sum())
    assert torch.equal(first, x[:, 0] * 2 - 1)


@pytest.mark.parametrize("dtype", ["int32", "float32"])
def test_block_scans_forward_and_reverse(emu, dtype):
    torch.manual_seed(5)
    n = 300
    k = kernforge.compile(block_scans(n=n, dtype=dtype), backend="cuda-emu", arch="sm_80")
    x = torch.randint(-9, 10, (n,)).to(getattr(torch, dtype))
    f = torch.full((n,), -5).to(x.dtype)
    r = torch.full((n,), -5).to(x.dtype)
    k(x, f, r)
    assert torch.equal(f, x.cumsum(0).to(x.dtype))
    assert torch.equal(r, x.flip(0).cumsum(0).flip(0).to(x.dtype))


def test_fills_and_copies_into_local_arrays_reach_every_element_of_every_thread(emu):
    torch.manual_seed(6)
    k = kernforge.compile(local_maps(), backend="cuda-emu", arch="sm_80")
    x = torch.randn(6)
    y = torch.full((6,), float("nan"))
    s = torch.full((1,), float("nan"))
    k(x, y, s)
    torch.testing.assert_close(y, 1.0 + 2.0 * x)
    torch.testing.assert_close(s, (1.0 + 2.0 * x).sum().reshape(1))


def test_striped_fragment_map_and_atomic_max(emu):
    torch.manual_seed(7)
    pf = striped_map()
    from kernforge.backends.cuda.layouts import StripedLayout
    from kernforge.backends.cuda.renderer import CudaRenderer
    from kernforge.codegen.renderer import Target

    layouts = CudaRenderer().lower(pf.ir, Target("cuda", "sm_80"))[1]["layouts"]
    assert isinstance(next(iter(layouts.registers.values())), StripedLayout)
    k = kernforge.compile(pf, backend="cuda-emu", arch="sm_80")
    x = _bf16(7, 5)
    y = torch.full((7, 5), float("nan"))
    top = torch.full((1,), -1e30)
    k(x, y, top)
    i = torch.arange(1, 8, dtype=torch.float64)[:, None]
    j = torch.arange(5, dtype=torch.float64)[None, :]
    ref = torch.tanh(x.double()) * i - j
    torch.testing.assert_close(y.double(), ref, atol=1e-6, rtol=1e-5)
    assert abs(top.item() - ref.max().item()) < 1e-5


def test_scalar_helpers_follow_numpy(emu):
    import numpy as np

    rng = np.random.default_rng(9)
    n = 64
    a = rng.integers(-20, 20, n).astype(np.int32)
    b = rng.integers(-4, 5, n).astype(np.int32)
    b[:3] = (0, -1, 0)
    x = rng.normal(size=n).astype(np.float32) * 5
    y = rng.normal(size=n).astype(np.float32)
    x[3], y[4] = np.nan, np.nan
    x[5], y[5] = 2.0, 1.0  # exact zero remainder: takes the divisor's sign
    k = kernforge.compile(scalar_helpers(n), backend="cuda-emu", arch="sm_80")
    outs = [np.full(n, -7, np.int32), np.full(n, -7, np.int32), np.full(n, np.nan, np.float32),
            np.full(n, np.nan, np.float32)]
    k(a, b, x, y, *outs)
    with np.errstate(divide="ignore", invalid="ignore"):
        np.testing.assert_array_equal(outs[0], np.floor_divide(a, b))
        np.testing.assert_array_equal(outs[1], np.remainder(a, b))
        np.testing.assert_allclose(outs[2], np.remainder(x, y), rtol=1e-6, atol=1e-6)
    assert np.signbit(outs[2][5]) == np.signbit(np.remainder(x[5], y[5]))
    np.testing.assert_array_equal(outs[3], np.maximum(x, y))
