"""The CPU backend, compiled with g++ and run: every IR construct against numpy
references (float64 where precision matters) and against the interpreter.

Kernels take symbolic shapes, so each specialisation compiles once (cached per
session) and hypothesis sweeps many shapes, edge tiles and size-1 dims through
it.  Outputs are poisoned (NaN / sentinels) so an unwritten element fails.
"""
from __future__ import annotations

import functools
import shutil

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import kernforge
import kernforge.dsl as T
from kernforge import dtypes
from kernforge.backends.cpu.backend import CpuBackend, CpuKernelError

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")
FEW = settings(max_examples=8, deadline=None)
LOW = {"float16": np.float16, "bfloat16": ml_dtypes.bfloat16, "float8_e4m3": ml_dtypes.float8_e4m3fn}


@functools.lru_cache(maxsize=None)
def compiled(factory, backend="cpu", **params):
    return kernforge.compile(factory(**params), backend=backend)


def run_both(factory, params: dict, args: list, outs: tuple[int, ...]):
    """Run on cpu and interp with identical (copied) arguments; return both output lists."""
    results = []
    for backend in ("cpu", "interp"):
        a = [x.copy() if isinstance(x, np.ndarray) else x for x in args]
        compiled(factory, backend, **params)(*a)
        results.append([a[i] for i in outs])
    return results


def poison(shape, dt: str) -> np.ndarray:
    d = dtypes.dtype(dt)
    if d.is_float:
        return np.full(shape, np.nan, np.float32).astype(d.np_dtype)
    if d.is_bool:
        return np.ones(shape, bool)
    return np.full(shape, 77, d.np_dtype)


def same_bits(got: np.ndarray, want: np.ndarray) -> bool:
    """Bit equality, with every NaN equal to every NaN (payloads are not specified)."""
    if got.dtype != want.dtype or got.shape != want.shape:
        return False
    if got.dtype.kind in "fV" or got.dtype in (ml_dtypes.bfloat16, ml_dtypes.float8_e4m3fn):
        g, w = got.astype(np.float64), want.astype(np.float64)
        nan = np.isnan(g)
        if not np.array_equal(nan, np.isnan(w)):
            return False
        u = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[got.dtype.itemsize]
        return np.array_equal(got.view(u)[~nan], want.view(u)[~nan])
    return np.array_equal(got, want)


# ---------------------------------------------------------------- conversions

def convert_kernel(BN=64):
    """Every cast the renderer spells: RNE narrowing, exact widening, float->int truncation."""
    N = T.symbolic("N")
    narrow = ("float16", "bfloat16", "float8_e4m3", "float64")
    ints = ("int8", "int32", "int64", "bool")

    @T.prim_func
    def main(X: T.Tensor((N,), "float32"), XI: T.Tensor((N,), "float32"),
             H: T.Tensor((N,), "float16"), Bf: T.Tensor((N,), "bfloat16"), F8: T.Tensor((N,), "float8_e4m3"),
             D: T.Tensor((N,), "float64"), I8: T.Tensor((N,), "int8"), I32: T.Tensor((N,), "int32"),
             I64: T.Tensor((N,), "int64"), Bo: T.Tensor((N,), "bool"),
             WH: T.Tensor((N,), "float16"), WB: T.Tensor((N,), "bfloat16"), WF: T.Tensor((N,), "float8_e4m3"),
             OW: T.Tensor((3, N), "float32"), B2F: T.Tensor((N,), "float8_e4m3"), CB: T.Tensor((N,), "bfloat16")):
        with T.Kernel(T.ceildiv(N, BN), threads=64) as bx:
            tile = T.alloc_fragment((BN,), "bfloat16")
            for i in T.Parallel(BN):
                j = bx * BN + i
                if j < N:
                    H[j] = T.cast(X[j], "float16")
                    Bf[j] = T.cast(X[j], "bfloat16")
                    F8[j] = T.cast(X[j], "float8_e4m3")
                    D[j] = T.cast(X[j], "float64")
                    I8[j] = T.cast(XI[j], "int8")
                    I32[j] = T.cast(XI[j], "int32")
                    I64[j] = T.cast(XI[j], "int64")
                    Bo[j] = T.cast(XI[j], "bool")
                    OW[0, j] = T.cast(WH[j], "float32")
                    OW[1, j] = T.cast(WB[j], "float32")
                    OW[2, j] = T.cast(WF[j], "float32")
                    B2F[j] = T.cast(WB[j], "float8_e4m3")
            T.copy(X[bx * BN], tile)  # masked edge tile, rounding on the copy
            T.copy(tile, CB[bx * BN])
    return main


def _specials() -> np.ndarray:
    """Float32 values at every rounding boundary of the three narrow formats."""
    vals = [0.0, -0.0, np.inf, -np.inf, np.nan, 448.0, 464.0, 464.0001, 480.0, 65504.0, 65519.99, 65520.0,
            2.0 ** -6, 2.0 ** -9, 2.0 ** -10, 1.5 * 2.0 ** -9, 2.0 ** -14, 2.0 ** -24, 2.0 ** -25, 3 * 2.0 ** -26,
            1.0 + 2.0 ** -8, 1.0 + 3 * 2.0 ** -8, 1.0 + 2.0 ** -11, 1.0 + 3 * 2.0 ** -11, 3.4e38, 1e-45]
    v = np.array(vals, np.float32)
    return np.concatenate([v, -v])


@FEW
@given(n=st.integers(1, 300), seed=st.integers(0, 2**32 - 1))
def test_casts_round_to_nearest_even_bit_exact(n, seed):
    rng = np.random.default_rng(seed)
    bits = rng.integers(0, 2**32, size=n, dtype=np.uint64).astype(np.uint32)
    x = bits.view(np.float32).copy()
    sp = _specials()
    x[: min(n, sp.size)] = sp[: min(n, sp.size)]
    x[x.size // 2:] = rng.standard_normal(x.size - x.size // 2).astype(np.float32) * 300
    xi = (rng.standard_normal(n) * 60).astype(np.float32)
    wh = rng.integers(0, 2**16, n, dtype=np.uint16).view(np.float16)
    wb = rng.integers(0, 2**16, n, dtype=np.uint16).view(ml_dtypes.bfloat16)
    wf = rng.integers(0, 2**8, n, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn)
    outs = {name: poison(shape, dt) for name, shape, dt in (
        ("H", n, "float16"), ("Bf", n, "bfloat16"), ("F8", n, "float8_e4m3"), ("D", n, "float64"),
        ("I8", n, "int8"), ("I32", n, "int32"), ("I64", n, "int64"), ("Bo", n, "bool"),
        ("OW", (3, n), "float32"), ("B2F", n, "float8_e4m3"), ("CB", n, "bfloat16"))}
    outs["Bo"][:] = False
    k = compiled(convert_kernel)
    with np.errstate(all="ignore"):
        k(x, xi, outs["H"], outs["Bf"], outs["F8"], outs["D"], outs["I8"], outs["I32"], outs["I64"],
          outs["Bo"], wh, wb, wf, outs["OW"], outs["B2F"], outs["CB"])
        want = {"H": x.astype(np.float16), "Bf": x.astype(ml_dtypes.bfloat16),
                "F8": x.astype(ml_dtypes.float8_e4m3fn), "D": x.astype(np.float64),
                "I8": np.trunc(xi).astype(np.int8), "I32": np.trunc(xi).astype(np.int32),
                "I64": np.trunc(xi).astype(np.int64), "Bo": xi != 0,
                "OW": np.stack([wh.astype(np.float32), wb.astype(np.float32), wf.astype(np.float32)]),
                "B2F": wb.astype(np.float32).astype(ml_dtypes.float8_e4m3fn), "CB": x.astype(ml_dtypes.bfloat16)}
    for name, w in want.items():
        assert same_bits(outs[name], w), (name, outs[name][:8], w[:8])
    # and bit for bit with the interpreter
    args = [x, xi] + [poison(o.shape, str(dtypes.dtype(o.dtype))) for o in list(outs.values())[:8]] \
        + [wh, wb, wf] + [poison(o.shape, str(dtypes.dtype(o.dtype))) for o in list(outs.values())[8:]]
    with np.errstate(all="ignore"):
        cpu, ref = run_both(convert_kernel, {}, args, tuple(range(2, 10)) + (13, 14, 15))
    for got, w in zip(cpu, ref):
        assert same_bits(got, w)


# ---------------------------------------------------------------- gemm

def gemm_kernel(BM=16, BN=32, BK=8, dtype="float32", acc="float32", trans_a=False, trans_b=False, clear=True):
    """``clear``: one K step of exactly BK with clear_accum (C's fragment is never
    initialised, so a missed clear shows); otherwise C's old values are loaded and
    a pipelined K loop accumulates onto them."""
    M, N = T.symbolic("M"), T.symbolic("N")
    K = BK if clear else T.symbolic("K")

    @T.prim_func
    def main(A: T.Tensor((K, M) if trans_a else (M, K), dtype), B: T.Tensor((N, K) if trans_b else (K, N), dtype),
             C: T.Tensor((M, N), acc)):
        with T.Kernel(T.ceildiv(N, BN), T.ceildiv(M, BM), threads=128) as (bx, by):
            a_s = T.alloc_shared((BK, BM) if trans_a else (BM, BK), dtype)
            b_s = T.alloc_shared((BN, BK) if trans_b else (BK, BN), dtype)
            c = T.alloc_fragment((BM, BN), acc)
            if not clear:
                T.copy(C[by * BM, bx * BN], c)
            for k in T.Pipelined(T.ceildiv(K, BK), num_stages=2):
                T.copy(A[k * BK, by * BM] if trans_a else A[by * BM, k * BK], a_s)
                T.copy(B[bx * BN, k * BK] if trans_b else B[k * BK, bx * BN], b_s)
                T.gemm(a_s, b_s, c, transpose_A=trans_a, transpose_B=trans_b, clear_accum=clear)
            T.copy(c, C[by * BM, bx * BN])
    return main


GEMM_CASES = [
    dict(dtype="float32", acc="float32", trans_a=False, trans_b=False, clear=True),
    dict(dtype="bfloat16", acc="float32", trans_a=True, trans_b=False, clear=False),
    dict(dtype="float16", acc="float16", trans_a=False, trans_b=True, clear=False),
    dict(dtype="float8_e4m3", acc="float32", trans_a=True, trans_b=True, clear=True),
    dict(dtype="int8", acc="int32", trans_a=False, trans_b=False, clear=False),
]


@pytest.mark.parametrize("case", GEMM_CASES, ids=lambda c: f"{c['dtype']}-ta{int(c['trans_a'])}"
                         f"-tb{int(c['trans_b'])}-clear{int(c['clear'])}")
@FEW
@given(m=st.integers(1, 40), n=st.integers(1, 70), k=st.integers(1, 30), seed=st.integers(0, 2**16))
def test_gemm_layouts_dtypes_and_accumulation(case, m, n, k, seed):
    rng = np.random.default_rng(seed)
    dt, acc = dtypes.dtype(case["dtype"]), dtypes.dtype(case["acc"])
    k = 8 if case["clear"] else k
    if dt.is_int:
        a, b = rng.integers(-128, 128, (m, k)).astype(np.int8), rng.integers(-128, 128, (k, n)).astype(np.int8)
        c0 = rng.integers(-1000, 1000, (m, n)).astype(np.int32)
    else:
        a = rng.standard_normal((m, k)).astype(np.float32).astype(dt.np_dtype)
        b = rng.standard_normal((k, n)).astype(np.float32).astype(dt.np_dtype)
        c0 = rng.standard_normal((m, n)).astype(np.float32).astype(acc.np_dtype)
    A = np.ascontiguousarray(a.T) if case["trans_a"] else a
    B = np.ascontiguousarray(b.T) if case["trans_b"] else b
    C = c0.copy() if not case["clear"] else poison((m, n), case["acc"])
    compiled(gemm_kernel, **case)(A, B, C)
    ref = a.astype(np.float64) @ b.astype(np.float64) + (0 if case["clear"] else c0.astype(np.float64))
    if dt.is_int:
        assert np.array_equal(C, ref.astype(np.int64).astype(np.int32))
        return
    # float32 accumulation over k, plus one rounding into C's dtype per gemm call (K step)
    scale = np.abs(a.astype(np.float64)) @ np.abs(b.astype(np.float64)) + np.abs(c0.astype(np.float64))
    ulp_c = {"float32": 2.0 ** -23, "float16": 2.0 ** -10}[case["acc"]]
    steps = -(-k // 8)
    bound = scale * ((k + 2) * 2.0 ** -23 + steps * ulp_c) + 1e-30
    err = np.abs(C.astype(np.float64) - ref)
    assert np.all(err <= bound), float(np.max(err / bound))


# ---------------------------------------------------------------- reduce / cumsum

def reduce_kernel(BA=3, BB=5, BC=7, dtype="float32"):
    """Every axis of a 3-D tile, max/min/sum, clear and accumulate, plus scans."""
    M = T.symbolic("M")
    acc = "float32" if dtype in LOW else dtype

    @T.prim_func
    def main(X: T.Tensor((M, BB, BC), dtype), R0: T.Tensor((M, BB, BC), acc), R1: T.Tensor((M, BA, BC), acc),
             R2: T.Tensor((M, BA, BB), dtype), S: T.Tensor((M, BB, BC), dtype), P: T.Tensor((M, BB, BC), dtype)):
        with T.Kernel(M, threads=32) as bx:
            t = T.alloc_shared((BA, BB, BC), dtype)
            r0 = T.alloc_fragment((BB, BC), acc)
            r1 = T.alloc_fragment((BA, BC), acc)
            r2 = T.alloc_fragment((BA, BB), dtype)
            s = T.alloc_fragment((BA, BB, BC), dtype)
            for a, b, c in T.Parallel(BA, BB, BC):
                t[a, b, c] = X[bx, b, c] + T.cast(a, dtype) if dtype not in LOW else \
                    T.cast(T.cast(X[bx, b, c], "float32") + a, dtype)
            T.reduce_max(t, r0, dim=0)
            T.copy(R1[bx, 0, 0], r1)
            T.reduce_min(t, r1, dim=1, clear=False)
            T.reduce_sum(t, r2, dim=2)
            T.copy(r0, R0[bx, 0, 0])
            T.copy(r1, R1[bx, 0, 0])
            T.copy(r2, R2[bx, 0, 0])
            T.cumsum(t, s, dim=1)
            T.copy(s[BA - 1, :, :], S[bx, :, :])
            T.cumsum(t, dim=2, reverse=True)
            T.copy(t[0, :, :], P[bx, :, :])
    return main


@pytest.mark.parametrize("dtype", ["float32", "int32", "bfloat16"])
@FEW
@given(m=st.integers(1, 6), seed=st.integers(0, 2**16))
def test_reduce_every_axis_and_scans_match_interpreter(dtype, m, seed):
    rng = np.random.default_rng(seed)
    d = dtypes.dtype(dtype)
    acc = "float32" if dtype in LOW else dtype
    x = (rng.integers(-20, 20, (m, 5, 7)) if d.is_int else rng.standard_normal((m, 5, 7))).astype(d.np_dtype)
    r1 = (rng.integers(-20, 20, (m, 3, 7)) if d.is_int else rng.standard_normal((m, 3, 7))).astype(
        dtypes.dtype(acc).np_dtype)
    args = [x, poison((m, 5, 7), acc), r1, poison((m, 3, 5), dtype), poison((m, 5, 7), dtype), poison((m, 5, 7), dtype)]
    cpu, interp = run_both(reduce_kernel, dict(dtype=dtype), args, (1, 2, 3, 4, 5))
    names = ("max dim0", "min dim1 (accumulate)", "sum dim2", "cumsum dim1", "reverse cumsum dim2")
    for name, got, want in zip(names, cpu, interp):
        assert not np.isnan(got.astype(np.float64)).any(), name
        if d.is_int or "sum" not in name or "cumsum" in name:
            # exact: integers, max/min, and sequential scans (one order everywhere)
            assert same_bits(got, want), (name, got.ravel()[:6], want.ravel()[:6])
        else:
            np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=1e-2 if dtype in LOW
                                       else 1e-5, atol=1e-5, err_msg=name)
    # an independent reference for the maximum
    if d.is_int:
        t = x[:, None] + np.arange(3, dtype=np.int32)[None, :, None, None]
    else:
        t = (x.astype(np.float32)[:, None] + np.arange(3, dtype=np.float32)[None, :, None, None]).astype(d.np_dtype)
    assert same_bits(cpu[0], t.max(axis=1).astype(dtypes.dtype(acc).np_dtype))


# ---------------------------------------------------------------- atomics

def atomic_kernel(BN=16):
    """Global atomics from many blocks at once, a shared-memory histogram (plain
    read-modify-write), and an element-wise tile atomic with masked edges."""
    N = T.symbolic("N")

    @T.prim_func
    def main(X: T.Tensor((N,), "int32"), V: T.Tensor((N,), "float32"), H: T.Tensor((8,), "int32"),
             HL: T.Tensor((T.ceildiv(N, BN), 8), "int32"), F: T.Tensor((1,), "float32"),
             MX: T.Tensor((2,), "int64"), FM: T.Tensor((1,), "float32"), TA: T.Tensor((N,), "float32")):
        with T.Kernel(T.ceildiv(N, BN), threads=32) as bx:
            hist = T.alloc_shared((8,), "int32")
            tile = T.alloc_fragment((BN,), "float32")
            T.clear(hist)
            for i in T.Parallel(BN):
                j = bx * BN + i
                if j < N:
                    T.atomic_add(H[X[j] % 8], 1)
                    T.atomic_add(hist[X[j] % 8], 2)
                    T.atomic_add(F[0], V[j])
                    T.atomic_max(MX[X[j] % 2], T.cast(X[j], "int64"))
                    T.atomic_max(FM[0], V[j])
            T.copy(hist, HL[bx, 0])
            T.copy(V[bx * BN], tile)
            T.atomic_add(TA[bx * BN], tile)
    return main


@FEW
@given(n=st.integers(1, 400), seed=st.integers(0, 2**16))
def test_atomics_global_shared_and_tile(n, seed):
    rng = np.random.default_rng(seed)
    x = rng.integers(-1000, 1000, n).astype(np.int32)
    v = rng.standard_normal(n).astype(np.float32)
    v[rng.random(n) < 0.1] = np.nan if n > 3 else 1.0  # atomic max ignores NaN (numpy.fmax)
    nb = -(-n // 16)
    h, hl = np.zeros(8, np.int32), poison((nb, 8), "int32")
    f, mx, fm = np.zeros(1, np.float32), np.full(2, -(2**40), np.int64), np.full(1, -np.inf, np.float32)
    ta = rng.standard_normal(n).astype(np.float32)
    ta0 = ta.copy()
    compiled(atomic_kernel)(x, v, h, hl, f, mx, fm, ta)
    np.testing.assert_array_equal(h, np.bincount(x % 8, minlength=8))
    for b in range(nb):
        np.testing.assert_array_equal(hl[b], 2 * np.bincount(x[b * 16:(b + 1) * 16] % 8, minlength=8))
    for r in range(2):
        sel = x[x % 2 == r]
        assert mx[r] == (sel.max() if sel.size else -(2**40))
    fin = v[~np.isnan(v)]
    assert fm[0] == (fin.max() if fin.size else -np.inf)
    if not np.isnan(v).any():
        assert abs(f[0] - v.astype(np.float64).sum()) <= 1e-5 * (np.abs(v).sum() + 1) * n
    np.testing.assert_array_equal(ta, (ta0 + v).astype(np.float32))


# ---------------------------------------------------------------- control flow, math, params

def control_kernel(BN=32):
    """serial/unroll/pipelined loops with runtime bounds, if/else, select, bitcasts,
    floor division and modulo of negatives on several widths, shifts, and scalar
    parameters of several dtypes, all inside and outside T.Parallel."""
    N = T.symbolic("N")

    @T.prim_func
    def main(A: T.Tensor((N,), "int32"), B: T.Tensor((N,), "int8"), C: T.Tensor((N,), "int64"),
             O: T.Tensor((9, N), "int64"), F: T.Tensor((N,), "float32"), FO: T.Tensor((3, N), "float32"),
             U: T.Tensor((N,), "uint32"), d: T.int32, scale: T.float32, start: T.int64):
        with T.Kernel(T.ceildiv(N, BN), threads=32) as bx:
            total = T.alloc_var("int64", 0)
            loc = T.alloc_local((2,), "int32")
            loc[0] = 0
            loc[1] = 0
            for k in T.serial(start, start + 3):
                total = total + k
            for u in T.unroll(4):
                loc[0] = loc[0] + u
            for p in T.Pipelined(T.max(d, 1), num_stages=2):
                loc[1] = loc[1] + 1
            for i in T.Parallel(BN):
                j = bx * BN + i
                if j < N:
                    O[0, j] = T.cast(A[j] // d, "int64")
                    O[1, j] = T.cast(A[j] % d, "int64")
                    O[2, j] = T.cast(B[j] // 3, "int64") + T.cast(B[j] % -3, "int64") * 100
                    O[3, j] = C[j] // -7 + (C[j] % 7) * 1000
                    O[4, j] = T.cast((A[j] << 2) ^ (A[j] >> 1), "int64")
                    O[5, j] = total + loc[0] * 10 + loc[1] * 100
                    O[6, j] = T.cast(T.where(A[j] > 0, A[j], -A[j]), "int64")
                    if (A[j] & 1) == 1:
                        O[7, j] = T.cast(T.reinterpret("int32", F[j]), "int64")
                    else:
                        O[7, j] = -1
                    O[8, j] = T.cast(T.max(B[j], T.cast(-5, "int8")), "int64") + T.cast(T.min(A[j], 7), "int64")
                    FO[0, j] = T.reinterpret("float32", U[j])
                    FO[1, j] = T.where(T.isnan(F[j]), scale, F[j] * scale)
                    FO[2, j] = T.pow(T.abs(F[j]), 0.5) + T.max(F[j], 0.0)
    return main


@FEW
@given(n=st.integers(1, 100), d=st.integers(-9, 9).filter(lambda x: x != 0), start=st.integers(-2**40, 2**40),
       seed=st.integers(0, 2**16))
def test_control_flow_integer_semantics_and_params_match_numpy(n, d, start, seed):
    rng = np.random.default_rng(seed)
    a = rng.integers(-2**20, 2**20, n).astype(np.int32)
    b = rng.integers(-128, 128, n).astype(np.int8)
    c = rng.integers(-2**50, 2**50, n).astype(np.int64)
    f = rng.standard_normal(n).astype(np.float32)
    f[rng.random(n) < 0.2] = np.nan
    u = rng.integers(0, 2**32, n, dtype=np.uint64).astype(np.uint32)
    o, fo = poison((9, n), "int64"), poison((3, n), "float32")
    compiled(control_kernel)(a, b, c, o, f, fo, u, d, np.float32(1.5), start)
    a64, b64 = a.astype(np.int64), b.astype(np.int64)
    np.testing.assert_array_equal(o[0], a64 // d)
    np.testing.assert_array_equal(o[1], a64 % d)
    np.testing.assert_array_equal(o[2], b64 // 3 + (b64 % -3) * 100)
    np.testing.assert_array_equal(o[3], c // -7 + (c % 7) * 1000)
    np.testing.assert_array_equal(o[4], ((a << 2) ^ (a >> 1)).astype(np.int64))
    np.testing.assert_array_equal(o[5], np.full(n, 3 * start + 3 + 6 * 10 + max(d, 1) * 100))
    np.testing.assert_array_equal(o[6], np.abs(a64))
    np.testing.assert_array_equal(o[7], np.where(a & 1, f.view(np.int32).astype(np.int64), -1))
    np.testing.assert_array_equal(o[8], np.maximum(b64, -5) + np.minimum(a64, 7))
    args = [a, b, c, poison((9, n), "int64"), f, poison((3, n), "float32"), u, d, np.float32(1.5), start]
    (o_cpu, fo_cpu), (o_ref, fo_ref) = run_both(control_kernel, {}, args, (3, 5))
    assert same_bits(o_cpu, o_ref) and same_bits(fo_cpu[:2], fo_ref[:2])  # the interpreter agrees bit for bit
    assert same_bits(fo[0], u.view(np.float32))
    assert same_bits(fo[1], np.where(np.isnan(f), np.float32(1.5), f * np.float32(1.5)))
    want2 = (np.abs(f.astype(np.float64)) ** 0.5 + np.maximum(f, 0)).astype(np.float32)
    np.testing.assert_allclose(fo[2], want2, rtol=4e-7, equal_nan=True)


def math_kernel(BN=64):
    N = T.symbolic("N")

    @T.prim_func
    def main(X: T.Tensor((N,), "float32"), O: T.Tensor((10, N), "float32"), L: T.Tensor((N,), "bfloat16")):
        with T.Kernel(T.ceildiv(N, BN), threads=64) as bx:
            for i in T.Parallel(BN):
                j = bx * BN + i
                if j < N:
                    x = X[j]
                    O[0, j] = T.exp(x)
                    O[1, j] = T.exp2(x)
                    O[2, j] = T.log(T.abs(x))
                    O[3, j] = T.log2(T.abs(x))
                    O[4, j] = T.sqrt(T.abs(x))
                    O[5, j] = T.rsqrt(T.abs(x))
                    O[6, j] = T.tanh(x)
                    O[7, j] = T.floor(x) * 2.0 + T.ceil(x)
                    O[8, j] = x / 3.0 - x * x
                    O[9, j] = T.cast(T.isnan(x), "float32")
                    L[j] = T.exp(T.cast(x, "bfloat16"))  # bf16 in, float32 math, RNE on store
    return main


@FEW
@given(n=st.integers(1, 300), seed=st.integers(0, 2**16))
def test_math_ops_within_documented_ulps(n, seed):
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(n) * 4).astype(np.float32)
    x[0] = np.nan
    o, low = poison((10, n), "float32"), poison(n, "bfloat16")
    compiled(math_kernel)(x, o, low)
    xd = x.astype(np.float64)
    with np.errstate(all="ignore"):
        refs = [np.exp(xd), np.exp2(xd), np.log(np.abs(xd)), np.log2(np.abs(xd)), np.sqrt(np.abs(xd)),
                1 / np.sqrt(np.abs(xd)), np.tanh(xd)]
        for r, got in zip(refs, o):
            # libm float32: within 4 ulp of the float64 value (docs/backends/cpu.md)
            want = r.astype(np.float32)
            finite = np.isfinite(want)
            ulp = np.spacing(np.abs(want[finite]))
            assert np.all(np.abs(got[finite].astype(np.float64) - r[finite]) <= 4 * ulp), got[finite][:4]
            assert same_bits(got[~finite], want[~finite])
        exact = [np.floor(x) * np.float32(2) + np.ceil(x), x / np.float32(3) - x * x, np.isnan(x).astype(np.float32)]
        for got, want in zip(o[7:], exact):
            assert same_bits(got, want.astype(np.float32))
        want_low = np.exp(x.astype(ml_dtypes.bfloat16).astype(np.float64))
        lowf = low.astype(np.float64)
        ok = np.isfinite(want_low)
        assert np.all(np.abs(lowf[ok] - want_low[ok]) <= np.abs(want_low[ok]) * 2.0 ** -8 * 1.01)


# ---------------------------------------------------------------- strides, big tiles, errors

def strided_kernel(BM=4, BN=8):
    M, N, S = T.symbolic("M"), T.symbolic("N"), T.symbolic("S")

    @T.prim_func
    def main(X: T.StridedTensor((M, N), (S, 1), "float32"), Y: T.Tensor((M, N), "float32")):
        with T.Kernel(T.ceildiv(N, BN), T.ceildiv(M, BM), threads=32) as (bx, by):
            t = T.alloc_fragment((BM, BN), "float32")
            T.copy(X[by * BM, bx * BN], t)
            for i, j in T.Parallel(BM, BN):
                t[i, j] = t[i, j] * 2.0 + 1.0
            T.copy(t, Y[by * BM, bx * BN])
    return main


@FEW
@given(m=st.integers(1, 20), n=st.integers(1, 20), pad=st.integers(0, 9), seed=st.integers(0, 2**16))
def test_symbolic_row_stride_view(m, n, pad, seed):
    base = np.random.default_rng(seed).standard_normal((m, n + pad)).astype(np.float32)
    x = base[:, :n]
    y = poison((m, n), "float32")
    compiled(strided_kernel)(x, y)
    assert same_bits(y, x * np.float32(2) + np.float32(1))


def big_tile_kernel(BM=64, D=576):
    """An MLA-decode-sized block (64 x 576 fp32 = 147 KB of fragment, plus a bf16 shared
    copy): far more than an OpenMP worker's stack, so it must live in the arena."""
    M = T.symbolic("M")

    @T.prim_func
    def main(X: T.Tensor((M, D), "bfloat16"), Y: T.Tensor((M,), "float32")):
        with T.Kernel(T.ceildiv(M, BM), threads=128) as bx:
            s = T.alloc_shared((BM, D), "bfloat16")
            f = T.alloc_fragment((BM, D), "float32")
            r = T.alloc_fragment((BM,), "float32")
            T.copy(X[bx * BM, 0], s)
            T.copy(s, f)
            T.reduce_sum(f, r, dim=1)
            T.copy(r, Y[bx * BM])
    return main


def test_big_tiles_live_in_the_arena_across_threads():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1000, 576)).astype(ml_dtypes.bfloat16)
    y = poison(1000, "float32")
    compiled(big_tile_kernel)(x, y)
    ref = np.cumsum(x.astype(np.float32), axis=1, dtype=np.float32)[:, -1]  # sequential float32 order
    assert same_bits(y, ref)


def scalar_grid_kernel():
    @T.prim_func
    def main(O: T.Tensor((4,), "int32"), n: T.int32):
        with T.Kernel(n, threads=1) as bx:
            O[0] = bx
    return main


def test_launcher_errors_are_typed():
    ir_kernel = scalar_grid_kernel().ir
    launcher = CpuBackend().build(ir_kernel)
    out = np.zeros(4, np.int32)
    with pytest.raises(CpuKernelError, match="grid"):
        launcher([out, -3], [], [-3])
    with pytest.raises(TypeError, match="int32"):
        launcher([np.zeros(4, np.float32), 1], [], [1])
    with pytest.raises(TypeError, match="scalar n"):
        launcher([out, 1.5], [], [1])
    with pytest.raises(ValueError, match="does not fit"):
        launcher([out, 2**40], [], [1])
    launcher([out, 1], [], [1])
    assert out[0] == 0


# ---------------------------------------------------------------- append idiom (compress-store)

APPEND_CAP = 512


def append_kernel(dtype: str, pred: str, in_place: bool):
    """``for j in serial(lo, hi): buf[cnt] = x[j]; idx[cnt] = j; cnt += cast(pred(x[j]))``
    over buffers pre-filled with poison, exported whole (the tail beyond ``cnt`` too,
    which must match the interpreter's scalar semantics bit for bit)."""
    N = T.symbolic("N")

    def keep(v, thr):
        if pred == "gt":
            return v > thr
        if pred == "ne":  # bool & via the DSL's `&`: a compound predicate
            return (v != thr) & (v >= T.cast(0, dtype))
        return v == v  # everything (not NaN): every lane selected

    @T.prim_func
    def append(x: T.Tensor((N,), dtype), poison: T.Tensor((APPEND_CAP,), dtype),
               out: T.Tensor((APPEND_CAP,), dtype), out_idx: T.Tensor((APPEND_CAP,), "int32"),
               count: T.Tensor((1,), "int32"), lo: T.int32, hi: T.int32, c0: T.int32, thr: T.float32):
        with T.Kernel(1, threads=1) as bx:
            buf = T.alloc_shared((APPEND_CAP,), dtype)
            idx = T.alloc_shared((APPEND_CAP,), "int32")
            cnt = T.alloc_var("int32", c0)
            for i in T.Parallel(APPEND_CAP):
                buf[i] = poison[i]
                idx[i] = -7
            if in_place:
                for i in T.Parallel(APPEND_CAP):
                    buf[i] = T.where(i < N, x[T.min(i, N - 1)], poison[i])
                    idx[i] = i
                for j in T.serial(lo, hi):
                    buf[cnt] = buf[j]
                    idx[cnt] = idx[j]
                    cnt = cnt + T.cast(keep(buf[j], T.cast(thr, dtype)), "int32")
            else:
                for j in T.serial(lo, hi):
                    buf[cnt] = x[j]
                    idx[cnt] = j
                    cnt = cnt + T.cast(keep(x[j], T.cast(thr, dtype)), "int32")
            for i in T.Parallel(APPEND_CAP):
                out[i] = buf[i]
                out_idx[i] = idx[i]
            count[0] = cnt

    return append


def test_append_idiom_is_recognised_and_rendered_with_a_scalar_fallback():
    from kernforge.codegen.passes.append import match_append
    from kernforge.codegen import ir
    k = append_kernel("float32", "gt", False).ir
    loops = [n for n in ir.walk(k.body) if isinstance(n, ir.For)]
    assert [match_append(n) is not None for n in loops] == [True]
    src = CpuBackend().source(append_kernel("bfloat16", "gt", True).ir, None)
    assert "defined(__AVX512F__) && defined(__AVX512BW__)" in src
    assert "kf::append_lanes" in src and "#pragma omp simd" in src
    assert "cnt[0] <= j" in src  # in-place compaction: vector path only while the counter trails


def test_append_idiom_not_matched_when_the_counter_is_read_elsewhere():
    from kernforge.codegen.passes.append import match_append
    from kernforge.codegen import ir

    @T.prim_func
    def uses_cnt(x: T.Tensor((64,), "float32"), out: T.Tensor((64,), "int32")):
        with T.Kernel(1, threads=1) as bx:
            buf = T.alloc_shared((64,), "int32")
            cnt = T.alloc_var("int32", 0)
            for j in T.serial(64):
                buf[cnt] = cnt + j
                cnt = cnt + T.cast(x[j] > 0, "int32")
            for i in T.Parallel(64):
                out[i] = buf[i]

    loops = [n for n in ir.walk(uses_cnt.ir.body) if isinstance(n, ir.For)]
    assert all(match_append(n) is None for n in loops)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "int32"])
@pytest.mark.parametrize("pred", ["gt", "ne", "all"])
@pytest.mark.parametrize("in_place", [False, True])
@given(data=st.data())
@settings(max_examples=6, deadline=None)
def test_append_idiom_matches_the_interpreter_bit_for_bit(dtype, pred, in_place, data):
    n = data.draw(st.integers(1, 300))
    lo = data.draw(st.integers(0, n))
    hi = data.draw(st.integers(lo, n))
    # in place, the counter may start behind the loop (vector path) or ahead (scalar fallback)
    c0 = data.draw(st.integers(0, lo + 20 if in_place else 150))
    seed = data.draw(st.integers(0, 2**31 - 1))
    rng = np.random.default_rng(seed)
    np_dt = LOW.get(dtype, np.dtype(dtype))
    if dtype == "int32":
        x = rng.integers(-5, 6, n).astype(np.int32)
        poison = np.full(APPEND_CAP, -123456, np.int32)
    else:
        x = rng.standard_normal(n).astype(np.float32)
        x[rng.random(n) < 0.1] = 0.0
        x[rng.random(n) < 0.05] = np.nan
        x = x.astype(np_dt)
        poison = np.full(APPEND_CAP, np.nan, np.float32).astype(np_dt)
    thr = float(data.draw(st.sampled_from([-1.0, 0.0, 0.5, 3.0])))
    args = [x, poison, np.zeros(APPEND_CAP, np_dt), np.zeros(APPEND_CAP, np.int32),
            np.full(1, -1, np.int32), lo, hi, c0, thr]
    cpu, ref = run_both(append_kernel, dict(dtype=dtype, pred=pred, in_place=in_place), args, (2, 3, 4))
    for got, want in zip(cpu, ref):
        assert got.tobytes() == want.tobytes()
    if in_place and c0 > lo:
        return  # the counter starts ahead of the reads: only the interpreter comparison applies
    v = x[lo:hi].astype(np.float64)
    t = float(np.array(thr, np.float32).astype(np_dt))
    kept = {"gt": v > t, "all": v == v, "ne": (v != t) & (v >= 0)}[pred]
    assert int(cpu[2][0]) == c0 + int(np.count_nonzero(kept))
    sel = np.flatnonzero(kept)
    assert np.array_equal(cpu[1][c0:c0 + sel.size], (lo + sel).astype(np.int32))


def test_append_idiom_scalar_fallback_without_avx512_matches_the_interpreter():
    """The same source built with AVX-512 switched off takes the `#else` path (the plain
    loop) and must give the same bytes as the interpreter."""
    from kernforge import runtime
    from kernforge.backends.cpu.backend import CpuLauncher

    kernel = append_kernel("bfloat16", "gt", True).ir
    # rendered for the AVX2 path: a source for an AVX-512 path refuses to build without it
    program = CpuBackend().render(kernel, CpuBackend().target("avx2"))
    module = runtime.compile("cpu_append_noavx512", program.source, backend="cpu",
                             options=CpuBackend.options + ("-mno-avx512f",), include_dirs=(CpuBackend.include_dir,))
    scalar = CpuLauncher(kernel, module.get_function(program.entry), program)
    rng = np.random.default_rng(5)
    n = 300
    x = rng.standard_normal(n).astype(np.float32).astype(ml_dtypes.bfloat16)
    poison = np.full(APPEND_CAP, np.nan, np.float32).astype(ml_dtypes.bfloat16)
    args = [x, poison, np.zeros(APPEND_CAP, ml_dtypes.bfloat16), np.zeros(APPEND_CAP, np.int32),
            np.full(1, -1, np.int32), 3, 290, 1, 0.25]
    got = [a.copy() if isinstance(a, np.ndarray) else a for a in args]
    scalar(got, [n])
    _, ref = run_both(append_kernel, dict(dtype="bfloat16", pred="gt", in_place=True), args, (2, 3, 4))
    for g, want in zip((got[2], got[3], got[4]), ref):
        assert g.tobytes() == want.tobytes()


def test_launcher_reads_torch_tensor_pointers_and_checks_their_dtype():
    """CPU launchers take torch tensors without a numpy view: the data pointer (storage
    offset included) is what the kernel writes, and a wrong dtype is a TypeError."""
    import torch

    ir_kernel = scalar_grid_kernel().ir
    launcher = CpuBackend().build(ir_kernel)
    base = torch.full((9,), -7, dtype=torch.int32)
    view = base[5:]                                   # non-zero storage offset
    launcher([view, 1], [], [1])                      # one block writes O[0] = 0
    assert base[:5].tolist() == [-7] * 5              # nothing before the view was touched
    assert view.tolist() == [0, -7, -7, -7]
    with pytest.raises(TypeError, match="int32"):
        launcher([torch.zeros(4, dtype=torch.float32), 1], [], [1])
    with pytest.raises(TypeError, match="int32"):
        launcher([torch.zeros(4, dtype=torch.int64), 1], [], [1])
