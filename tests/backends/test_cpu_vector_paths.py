"""The CPU backend's vector replacements for scalar code, against independent references.

* ``kf_exp2f`` (kf/vmath.h), which the renderer emits for float32 ``exp2`` so that the loops
  around it vectorise: against float64 ``exp2`` over random, edge and special inputs (within
  1 ulp; glibc's exp2f is the other side of that bound), exact on integers (scales built as
  ``exp2(ceil(log2 x))`` rely on it), and actually vectorised (the generated loop is `omp simd`
  and g++ reports it vectorised).
* the row reduction of a float tile (``kf::reduce`` with INNER == 1 on AVX-512: 16 rows at a
  time through register transposes): max and min bit for bit with the interpreter, the sum bit
  for bit with the sum in index order (the backend's rule), with NaN, signed zeros and ties,
  clear and accumulate, row counts and widths that leave scalar remainders.
"""
from __future__ import annotations

import functools
import shutil

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import kernforge
import kernforge.dsl as T
from kernforge.backends.cpu import isa

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")


@functools.lru_cache(maxsize=None)
def exp2_kernel(n: int):
    @T.prim_func
    def main(X: T.Tensor((n,), "float32"), Y: T.Tensor((n,), "float32")):
        with T.Kernel(1, threads=32) as bx:
            for i in T.Parallel(n):
                Y[i] = T.exp2(X[i])
    return kernforge.compile(main, backend="cpu")


def ulp_distance(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Distance in float32 steps (monotonic integer order of the bits)."""
    def key(x):
        i = x.astype(np.float32).view(np.int32).astype(np.int64)
        return np.where(i < 0, -(i & 0x7FFFFFFF), i)
    return np.abs(key(a) - key(b))


def test_exp2_is_within_one_ulp_and_exact_on_integers():
    rng = np.random.default_rng(7)
    special = np.array([0.0, -0.0, 1.0, -1.0, 0.5, -149.0, -149.5, -150.0, -150.5, -126.0, -125.99, 127.0,
                        127.99, 128.0, 1e-30, -1e-30, 300.0, -300.0, np.inf, -np.inf, np.nan], np.float32)
    ints = np.arange(-160, 140, dtype=np.float32)
    x = np.concatenate([special, ints, rng.uniform(-150, 128, 40000).astype(np.float32),
                        rng.standard_normal(10000).astype(np.float32) * 1e-3]).astype(np.float32)
    y = np.full_like(x, 7.0)
    exp2_kernel(x.size)(x, y)
    with np.errstate(over="ignore"):
        want = np.exp2(x.astype(np.float64)).astype(np.float32)  # float64, rounded once: within 0.5 ulp
    finite = np.isfinite(x)
    assert np.isnan(y[np.isnan(x)]).all()
    assert y[x == np.inf][0] == np.inf and y[x == -np.inf][0] == 0.0
    assert (ulp_distance(y[finite], want[finite]) <= 1).all()
    k = np.isin(x, ints)
    assert np.array_equal(y[k], want[k]), "exp2 of an integer must be the exact power of two"
    # the correctly rounded value almost always: a poor polynomial would be 1 ulp off often
    assert (y[finite] == want[finite]).mean() > 0.999


def test_exp2_loops_vectorise(tmp_path):
    """The point of kf_exp2f: the generated loop calls it, not glibc, and g++ vectorises it."""
    import subprocess

    from kernforge.backends.cpu.backend import CpuBackend

    src = exp2_kernel(64).get_kernel_source()
    assert "kf_exp2f(" in src and "exp2f(" not in src.replace("kf_exp2f(", "")
    (tmp_path / "v.cpp").write_text('#include "kf/vmath.h"\nvoid f(const float* __restrict__ x, '
                                    'float* __restrict__ y, int n) {\n#pragma omp simd\n'
                                    '  for (int i = 0; i < n; ++i) y[i] = kf_exp2f(x[i]);\n}\n')
    run = subprocess.run([shutil.which("g++"), "-std=c++17", "-O3", "-fopenmp", "-march=native", "-ffp-contract=off",
                          "-c", str(tmp_path / "v.cpp"), "-o", str(tmp_path / "v.o"), "-I", CpuBackend.include_dir,
                          "-fopt-info-vec-optimized"], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "loop vectorized" in run.stderr, run.stderr[-2000:]


@functools.lru_cache(maxsize=None)
def row_reduce_kernel(rows: int, cols: int):
    """Row max, min (accumulating onto a loaded vector) and sum of a float tile."""
    @T.prim_func
    def main(X: T.Tensor((rows, cols), "float32"), Mx: T.Tensor((rows,), "float32"),
             Mn: T.Tensor((rows,), "float32"), Sm: T.Tensor((rows,), "float32")):
        with T.Kernel(1, threads=32) as bx:
            t = T.alloc_fragment((rows, cols), "float32")
            mx = T.alloc_fragment((rows,), "float32")
            mn = T.alloc_fragment((rows,), "float32")
            sm = T.alloc_fragment((rows,), "float32")
            T.copy(X[0, 0], t)
            T.reduce_max(t, mx, dim=1)
            T.copy(Mn[0], mn)
            T.reduce_min(t, mn, dim=1, clear=False)
            T.reduce_sum(t, sm, dim=1)
            T.copy(mx, Mx[0])
            T.copy(mn, Mn[0])
            T.copy(sm, Sm[0])
    return main


@pytest.mark.skipif("avx512" not in isa.compiler_paths(), reason="the transposed row reduction is AVX-512 code")
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(shape=st.sampled_from([(16, 16), (17, 33), (32, 64), (48, 23), (64, 64), (5, 40), (33, 100)]),
       specials=st.booleans(), seed=st.integers(0, 2**16))
def test_row_reductions_match_the_interpreter_bit_for_bit(shape, specials, seed):
    rows, cols = shape
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(shape) * np.exp2(rng.integers(-20, 20, shape))).astype(np.float32)
    if specials:  # NaN rows, signed zeros and ties: the kf_max / kf_min rules, lane by lane
        x[rng.integers(0, rows), rng.integers(0, cols)] = np.nan
        z = rng.integers(0, rows)
        x[z] = 0.0
        x[z, rng.integers(0, 2)::2] = -0.0  # max(-0, +0) is the second operand: the row's last zero
        x[rng.integers(0, rows)] = 3.0
    mn0 = rng.standard_normal(rows).astype(np.float32)
    outs = {}
    for backend in ("cpu", "interp"):
        mx, mn, sm = np.full(rows, 5.0, np.float32), mn0.copy(), np.full(rows, 5.0, np.float32)
        kernforge.compile(row_reduce_kernel(rows, cols), backend=backend)(x.copy(), mx, mn, sm)
        outs[backend] = (mx, mn, sm)
    # the sum's reference is the sum in index order (numpy's cumsum is sequential; the
    # interpreter's numpy sum is pairwise, so it is only close)
    seq = np.cumsum(x, axis=1, dtype=np.float32)[:, -1]
    for name, got, want in zip(("max", "min", "sum"), outs["cpu"], outs["interp"][:2] + (seq,)):
        assert np.array_equal(np.isnan(got), np.isnan(want)), name
        ok = ~np.isnan(want)
        assert np.array_equal(got[ok].view(np.int32), want[ok].view(np.int32)), (name, got[:8], want[:8])
    np.testing.assert_allclose(outs["cpu"][2], outs["interp"][2], rtol=1e-5, atol=1e-6 * cols * np.nanmax(np.abs(x)))
