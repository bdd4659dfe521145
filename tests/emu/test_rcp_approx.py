"""``T.rcp`` (MLA decode's softmax normalisation): ``rcp.approx.ftz.f32`` on CUDA, emulated by
``kf_emu_rcp_approx_ftz`` (kf/emu/intrinsics.h), against an independent float64 model.

The PTX ISA bounds the hardware result to 1 ulp of ``1/x``; the emulation returns the correctly
rounded quotient (so inside that bound) and applies the instruction's flush-to-zero: a subnormal
input acts as a signed zero (``1/x`` = signed inf), a subnormal result becomes a signed zero.
The interpreter and host backends stay IEEE (``1/x`` exactly), which differs only there."""
import numpy as np
import pytest

import kernforge
import kernforge.dsl as T

N = 256
TINY = np.float32(2.0 ** -127)  # subnormal float32: IEEE 1/x = 2^127 is finite, ftz makes it inf


def rcp_kernel():
    @T.prim_func
    def main(X: T.Tensor((N,), "float32"), Y: T.Tensor((N,), "float32")):
        with T.Kernel(1, threads=128) as bx:
            for i in T.Parallel(N):
                Y[i] = T.rcp(X[i])

    return main


def _inputs():
    special = np.array([TINY, -TINY, 2.0 ** 127, -(2.0 ** 127), 2.0 ** 126, 1.0, -3.0, 0.0, -0.0, np.inf, -np.inf,
                        np.nan, 2.0 ** -126, 1e-30, 7e37], dtype=np.float32)
    rng = np.random.default_rng(11)
    normal = (rng.standard_normal(N - special.size) * 10.0 ** rng.integers(-30, 30, N - special.size)).astype(np.float32)
    return np.concatenate([special, normal])


def _ftz_model(x):
    """rcp.approx.ftz.f32 up to its rounding: float64 1/x of the flushed input, flushed result."""
    x = x.astype(np.float64)
    tiny = np.finfo(np.float32).tiny
    x = np.where((x != 0) & (np.abs(x) < tiny), np.copysign(0.0, x), x)
    with np.errstate(divide="ignore"):
        r = 1.0 / x
    return np.where((r != 0) & (np.abs(r) < tiny), np.copysign(0.0, r), r)


def test_cuda_emu_rcp_is_within_one_ulp_and_flushes_subnormals():
    x = _inputs()
    y = np.full(N, np.nan, dtype=np.float32)
    kernforge.compile(rcp_kernel(), backend="cuda-emu", arch="sm_90a")(x, y)
    want = _ftz_model(x)
    finite = np.isfinite(want) & (want != 0)
    ulp = np.spacing(np.abs(want[finite]).astype(np.float32)).astype(np.float64)
    assert np.all(np.abs(y[finite] - want[finite]) <= ulp), "more than 1 ulp from 1/x"
    special = ~finite
    np.testing.assert_array_equal(np.signbit(y[special]) & ~np.isnan(y[special]),
                                  np.signbit(want[special]) & ~np.isnan(want[special]))
    np.testing.assert_array_equal(y[special], want[special].astype(np.float32))  # inf, zeros, NaN (NaN == NaN here)
    assert y[0] == np.inf and y[1] == -np.inf and y[2] == 0.0 and np.signbit(y[3])  # the ftz cases themselves


@pytest.mark.parametrize("backend", ["interp", "cpu"])
def test_host_backends_keep_ieee_reciprocal(backend):
    """Host backends: the exact quotient, subnormals kept (the documented difference to CUDA)."""
    x = _inputs()
    y = np.full(N, np.nan, dtype=np.float32)
    kernforge.compile(rcp_kernel(), backend=backend)(x, y)
    with np.errstate(divide="ignore"):
        np.testing.assert_array_equal(y, np.float32(1.0) / x)
    assert y[0] == np.float32(2.0 ** 127) and 0 < y[2] < np.finfo(np.float32).tiny
