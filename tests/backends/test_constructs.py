"""Every DSL construct, on every host backend, against independent numpy references.

Kernels use symbolic shapes, so each (backend, specialisation) compiles once and
hypothesis then sweeps many shapes through it, edge tiles included.  Output
buffers are poisoned so that an element a backend forgets to write fails.
"""
from __future__ import annotations

import functools

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import kernforge
import kernforge.dsl as T
from tests.conftest import host_backends

BACKENDS = host_backends()
F32_TOL = dict(rtol=2e-5, atol=2e-5)


def _rand(rng, shape, dtype):
    if dtype in ("int8", "int32", "int64"):
        return rng.integers(-50, 50, size=shape).astype(dtype)
    if dtype == "bool":
        return rng.random(shape) < 0.5
    x = rng.standard_normal(shape).astype(np.float32) + 0.1  # never all zeros
    return x.astype(np.dtype(kernforge.dtypes.dtype(dtype).np_dtype))


def _poison(shape, dtype):
    dt = kernforge.dtypes.dtype(dtype)
    if dt.is_float:
        return np.full(shape, np.nan, np.float32).astype(dt.np_dtype)
    if dt.is_bool:
        return np.ones(shape, bool)
    return np.full(shape, 77, dt.np_dtype)


@functools.lru_cache(maxsize=None)
def _build(name, backend, **params):
    return kernforge.compile(FACTORIES[name], backend=backend, **params)


def build(name, backend, **params):
    return _build(name, backend, **params)


# ---------------------------------------------------------------- kernels

def copy_kernel(BM=16, BN=8, src="float32", dst="float32"):
    """global -> shared -> fragment -> global, with masked edge tiles and a dtype change."""
    M, N = T.symbolic("M"), T.symbolic("N")

    @T.prim_func
    def main(A: T.Tensor((M, N), src), B: T.Tensor((M, N), dst)):
        with T.Kernel(T.ceildiv(N, BN), T.ceildiv(M, BM), threads=64) as (bx, by):
            s = T.alloc_shared((BM, BN), src)
            f = T.alloc_fragment((BM, BN), dst)
            T.copy(A[by * BM, bx * BN], s)
            T.copy(s, f)
            T.copy(f, B[by * BM, bx * BN])
    return main


def gemm_kernel(BM=16, BN=16, BK=8, dtype="float16", trans_a=False, trans_b=False, clear=True):
    M, N, K = T.symbolic("M"), T.symbolic("N"), T.symbolic("K")
    a_shape = (K, M) if trans_a else (M, K)
    b_shape = (N, K) if trans_b else (K, N)

    @T.prim_func
    def main(A: T.Tensor(a_shape, dtype), B: T.Tensor(b_shape, dtype), C: T.Tensor((M, N), "float32")):
        with T.Kernel(T.ceildiv(N, BN), T.ceildiv(M, BM), threads=128) as (bx, by):
            a_s = T.alloc_shared((BK, BM) if trans_a else (BM, BK), dtype)
            b_s = T.alloc_shared((BN, BK) if trans_b else (BK, BN), dtype)
            acc = T.alloc_fragment((BM, BN), "float32")
            if clear:
                T.clear(acc)
            else:
                T.copy(C[by * BM, bx * BN], acc)  # accumulate onto C's current values
            for k in T.Pipelined(T.ceildiv(K, BK), num_stages=2):
                if trans_a:
                    T.copy(A[k * BK, by * BM], a_s)
                else:
                    T.copy(A[by * BM, k * BK], a_s)
                if trans_b:
                    T.copy(B[bx * BN, k * BK], b_s)
                else:
                    T.copy(B[k * BK, bx * BN], b_s)
                T.gemm(a_s, b_s, acc, transpose_A=trans_a, transpose_B=trans_b)
            T.copy(acc, C[by * BM, bx * BN])
    return main


def reduce_kernel(BM=8, BN=32, op="max", dim=1, clear=True):
    """Row/column reductions of one tile per block; ``clear=False`` folds in the old output."""
    M = T.symbolic("M")
    out_len = BM if dim == 1 else BN
    fn = {"max": T.reduce_max, "min": T.reduce_min, "sum": T.reduce_sum}[op]

    @T.prim_func
    def main(A: T.Tensor((M, BN), "float32"), O: T.Tensor((T.ceildiv(M, BM) * out_len,), "float32")):
        with T.Kernel(T.ceildiv(M, BM), threads=32) as bx:
            t = T.alloc_fragment((BM, BN), "float32")
            r = T.alloc_fragment((out_len,), "float32")
            T.copy(A[bx * BM, 0], t)
            if not clear:
                T.copy(O[bx * out_len], r)
            fn(t, r, dim=dim, clear=clear)
            T.copy(r, O[bx * out_len])
    return main


def cumsum_kernel(BM=4, BN=16, dim=1, reverse=False):
    M = T.symbolic("M")

    @T.prim_func
    def main(A: T.Tensor((M, BN), "float32"), O: T.Tensor((M, BN), "float32")):
        with T.Kernel(T.ceildiv(M, BM), threads=32) as bx:
            t = T.alloc_shared((BM, BN), "float32")
            T.copy(A[bx * BM, 0], t)
            T.cumsum(t, dim=dim, reverse=reverse)
            T.copy(t, O[bx * BM, 0])
    return main


def atomic_kernel(BN=32, op="add"):
    """Histogram by global atomics (many blocks hit the same bins) plus a global max."""
    N = T.symbolic("N")

    @T.prim_func
    def main(X: T.Tensor((N,), "int32"), V: T.Tensor((N,), "float32"),
             H: T.Tensor((16,), "int32"), Mx: T.Tensor((1,), "float32")):
        with T.Kernel(T.ceildiv(N, BN), threads=32) as bx:
            for i in T.Parallel(BN):
                if bx * BN + i < N:
                    if op == "add":
                        T.atomic_add(H[X[bx * BN + i] % 16], 1)
                    else:
                        T.atomic_max(Mx[0], V[bx * BN + i])
    return main


def elementwise_kernel(BN=32):
    """Math ops, casts, where and a runtime if/else inside T.Parallel."""
    N = T.symbolic("N")

    @T.prim_func
    def main(A: T.Tensor((N,), "float32"), B: T.Tensor((N,), "bfloat16"),
             O: T.Tensor((8, N), "float32"), I: T.Tensor((N,), "int32")):
        with T.Kernel(T.ceildiv(N, BN), threads=32) as bx:
            for i in T.Parallel(BN):
                j = bx * BN + i
                if j < N:
                    a = A[j]
                    O[0, j] = T.exp(a) + T.exp2(a * 0.5)
                    O[1, j] = T.log(T.abs(a) + 1.0) * T.sqrt(T.abs(a))
                    O[2, j] = T.rsqrt(T.abs(a) + 0.5)
                    O[3, j] = T.where(a > 0, T.max(a, 0.25), T.min(a, -0.25))
                    O[4, j] = T.cast(a, "bfloat16") + B[j]  # bf16 rounding, then f32 add
                    O[5, j] = T.cast(T.cast(a * 10.0, "int32"), "float32")  # truncation
                    if a > 0.5:
                        O[6, j] = a * 2.0
                    else:
                        O[6, j] = -a
                    O[7, j] = T.tanh(a) + T.floor(a) + T.ceil(a)
                    I[j] = T.cast(a * 7.0, "int32") // 3 + T.cast(a * 7.0, "int32") % 3
    return main


def loops_kernel(K=5):
    """serial / unroll loops, alloc_var accumulation, alloc_local, a scalar param and a
    runtime if on it, integer floor division and modulo of negatives."""
    N = T.symbolic("N")

    @T.prim_func
    def main(A: T.Tensor((N, K), "int64"), O: T.Tensor((N,), "int64"), bias: T.int64):
        with T.Kernel(N, threads=1) as bx:
            acc = T.alloc_var("int64")
            acc = 0
            tmp = T.alloc_local((2,), "int64")
            tmp[0] = 0
            for k in T.serial(K):
                acc = acc + A[bx, k] * (k + 1)
            for u in T.unroll(2):
                tmp[0] = tmp[0] + u
            if bias > 0:
                O[bx] = acc + bias + tmp[0]
            else:
                O[bx] = (acc - bias) // 3 + acc % 7
    return main


FACTORIES = {"copy": copy_kernel, "gemm": gemm_kernel, "reduce": reduce_kernel,
             "cumsum": cumsum_kernel, "atomic": atomic_kernel, "elementwise": elementwise_kernel,
             "loops": loops_kernel}

# ---------------------------------------------------------------- tests

pytestmark = pytest.mark.parametrize("backend", BACKENDS)


@given(m=st.integers(1, 40), n=st.integers(1, 20), seed=st.integers(0, 2**16),
       types=st.sampled_from([("float32", "float32"), ("float32", "bfloat16"), ("float16", "float32"),
                              ("bfloat16", "float8_e4m3"), ("int8", "int32"), ("int64", "int64"),
                              ("bool", "bool"), ("float32", "int32")]))
def test_copy_masked_edges_and_conversion(backend, m, n, seed, types):
    src, dst = types
    rng = np.random.default_rng(seed)
    a = _rand(rng, (m, n), src)
    out = _poison((m, n), dst)
    build("copy", backend, src=src, dst=dst)(a, out)
    if src in ("float32", "float16", "bfloat16") and dst in ("int32", "int64"):
        expected = np.trunc(a.astype(np.float64)).astype(dst)
    else:
        expected = a.astype(np.float32).astype(out.dtype) if a.dtype != out.dtype else a
    np.testing.assert_array_equal(out.view(np.uint8), np.asarray(expected, out.dtype).view(np.uint8))


@given(m=st.integers(1, 40), n=st.integers(1, 40), k=st.integers(1, 30), seed=st.integers(0, 2**16),
       cfg=st.sampled_from([("float16", False, False, True), ("bfloat16", True, False, True),
                            ("float32", False, True, True), ("float16", True, True, False),
                            ("float8_e4m3", False, True, True)]))
def test_gemm_transposes_and_accumulate(backend, m, n, k, seed, cfg):
    dtype, ta, tb, clear = cfg
    rng = np.random.default_rng(seed)
    a = _rand(rng, (k, m) if ta else (m, k), dtype)
    b = _rand(rng, (n, k) if tb else (k, n), dtype)
    c = rng.standard_normal((m, n)).astype(np.float32)
    c0 = c.copy()
    build("gemm", backend, dtype=dtype, trans_a=ta, trans_b=tb, clear=clear)(a, b, c)
    a64 = a.astype(np.float64).T if ta else a.astype(np.float64)
    b64 = b.astype(np.float64).T if tb else b.astype(np.float64)
    expected = a64 @ b64 + (0 if clear else c0)
    np.testing.assert_allclose(c, expected, rtol=1e-4, atol=1e-4 * max(1, k))


@given(m=st.integers(1, 30), seed=st.integers(0, 2**16),
       cfg=st.sampled_from([("max", 1, True), ("sum", 1, True), ("min", 0, True), ("sum", 0, False),
                            ("max", 0, False), ("min", 1, False)]))
def test_reduce_along_each_axis(backend, m, seed, cfg):
    op, dim, clear = cfg
    BM, BN = 8, 32
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((m, BN)).astype(np.float32)
    blocks = -(-m // BM)
    out_len = BM if dim == 1 else BN
    old = rng.standard_normal(blocks * out_len).astype(np.float32)
    out = old.copy()
    build("reduce", backend, op=op, dim=dim, clear=clear)(a, out)
    padded = np.zeros((blocks * BM, BN), np.float64)  # masked copy reads 0 past the edge
    padded[:m] = a
    tiles = padded.reshape(blocks, BM, BN)
    f = {"max": np.max, "min": np.min, "sum": np.sum}[op]
    r = f(tiles, axis=1 + dim).reshape(-1)
    if not clear:
        r = {"max": np.maximum, "min": np.minimum, "sum": np.add}[op](r, old)
    if dim == 1:  # rows past the edge are not written back by the masked store
        keep = np.arange(blocks * BM) < m
        np.testing.assert_allclose(out[keep], r[keep], **F32_TOL)
    else:
        np.testing.assert_allclose(out, r, **F32_TOL)


@given(m=st.integers(1, 13), seed=st.integers(0, 2**16), dim=st.sampled_from([0, 1]),
       reverse=st.booleans())
def test_cumsum_inclusive_and_reverse(backend, m, seed, dim, reverse):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((m, 16)).astype(np.float32)
    out = _poison((m, 16), "float32")
    build("cumsum", backend, dim=dim, reverse=reverse)(a, out)
    BM = 4
    blocks = -(-m // BM)
    padded = np.zeros((blocks * BM, 16))
    padded[:m] = a
    tiles = padded.reshape(blocks, BM, 16)
    ax = 1 + dim
    ref = np.flip(np.cumsum(np.flip(tiles, ax), ax), ax) if reverse else np.cumsum(tiles, ax)
    np.testing.assert_allclose(out, ref.reshape(-1, 16)[:m], rtol=1e-5, atol=1e-5)


@given(n=st.integers(1, 200), seed=st.integers(0, 2**16))
def test_atomic_add_and_max_across_blocks(backend, n, seed):
    rng = np.random.default_rng(seed)
    x = rng.integers(-1000, 1000, n).astype(np.int32)
    v = rng.standard_normal(n).astype(np.float32)
    h = rng.integers(0, 5, 16).astype(np.int32)
    h0 = h.copy()
    mx = np.array([-np.inf], np.float32)
    build("atomic", backend, op="add")(x, v, h, mx)
    np.testing.assert_array_equal(h - h0, np.bincount(x % 16, minlength=16))
    build("atomic", backend, op="max")(x, v, h, mx)
    assert mx[0] == v.max()


@given(n=st.integers(1, 100), seed=st.integers(0, 2**16))
def test_math_casts_where_and_runtime_if(backend, n, seed):
    rng = np.random.default_rng(seed)
    a = (rng.standard_normal(n) * 2).astype(np.float32)
    b = rng.standard_normal(n).astype(ml_dtypes.bfloat16)
    o = _poison((8, n), "float32")
    i = _poison((n,), "int32")
    build("elementwise", backend)(a, b, o, i)
    a64 = a.astype(np.float64)
    np.testing.assert_allclose(o[0], np.exp(a64) + np.exp2(a64 * 0.5), rtol=1e-5)
    np.testing.assert_allclose(o[1], np.log(np.abs(a64) + 1) * np.sqrt(np.abs(a64)), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(o[2], 1 / np.sqrt(np.abs(a64) + 0.5), rtol=1e-5)
    np.testing.assert_array_equal(o[3], np.where(a > 0, np.maximum(a, 0.25), np.minimum(a, -0.25)))
    np.testing.assert_array_equal(o[4], a.astype(ml_dtypes.bfloat16).astype(np.float32) + b.astype(np.float32))
    np.testing.assert_array_equal(o[5], np.trunc((a * np.float32(10)).astype(np.float64)))
    np.testing.assert_array_equal(o[6], np.where(a > 0.5, a * 2, -a))
    np.testing.assert_allclose(o[7], np.tanh(a64) + np.floor(a64) + np.ceil(a64), rtol=1e-5, atol=1e-6)
    t = np.trunc((a * np.float32(7)).astype(np.float64)).astype(np.int64)
    np.testing.assert_array_equal(i, t // 3 + t % 3)  # floor semantics on negatives


@given(n=st.integers(1, 12), seed=st.integers(0, 2**16), bias=st.integers(-50, 50))
def test_loops_vars_locals_scalar_param(backend, n, seed, bias):
    rng = np.random.default_rng(seed)
    a = rng.integers(-100, 100, (n, 5)).astype(np.int64)
    o = _poison((n,), "int64")
    build("loops", backend)(a, o, bias)
    acc = (a * np.arange(1, 6)).sum(axis=1)
    expected = acc + bias + 1 if bias > 0 else (acc - bias) // 3 + acc % 7
    np.testing.assert_array_equal(o, expected)


def test_torch_tensors_in_and_out(backend):
    import torch

    k = kernforge.compile(copy_kernel, backend=backend, out_idx=[-1], src="bfloat16", dst="float32")
    a = torch.randn(19, 11, dtype=torch.bfloat16)
    out = k(a)
    assert isinstance(out, torch.Tensor) and out.dtype == torch.float32
    torch.testing.assert_close(out, a.float(), rtol=0, atol=0)


def test_argument_errors_before_launch(backend):
    import torch

    k = build("copy", backend, src="float32", dst="float32")
    a = torch.randn(8, 8)
    with pytest.raises(kernforge.ArgumentError, match="must be float32"):
        k(a.double(), torch.empty(8, 8))
    with pytest.raises(kernforge.ShapeError, match="M = 7 here but 8"):
        k(a, torch.empty(7, 8))
    with pytest.raises(kernforge.ShapeError, match="stride"):
        k(a.t(), torch.empty(8, 8))
    with pytest.raises(kernforge.ArgumentError, match="takes 2 arguments"):
        k(a)
    with pytest.raises(kernforge.ShapeError, match="dimensions"):
        k(a[0], torch.empty(8))
