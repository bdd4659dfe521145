"""The unscaled dense GEMM (``dense_gemm``: DeepGEMM's bf16_gemm_*, and float32 operands for
the engine's float32 linears): interp and cpu against float64 matmuls with elementwise
bounds, every major, ragged shapes, accumulation, and the batch invariance the engine's
deterministic mode needs."""
import pytest
import torch

import kernforge
from kernforge.kernels import gemm as G
from kernforge import ops
from kernforge.kernels.check import run_spec
from kernforge.kernels.gemm import config, problems as P
from tests.conftest import host_backends

BACKENDS = host_backends("interp", "cpu")
MAJORS = [("k", "k"), ("k", "mn"), ("mn", "k"), ("mn", "mn")]


def run(backend, m, n, k, a_major="k", b_major="k", dtype="float32", out_dtype="float32", accumulate=False,
        seed=0, **tiles):
    g = torch.Generator().manual_seed(seed)
    t, ot = getattr(torch, dtype), getattr(torch, out_dtype)
    a, b = torch.randn(m, k, generator=g).to(t), (torch.randn(n, k, generator=g) * 3).to(t)
    c = torch.randn(m, n, generator=g).to(ot) if accumulate else None
    tiles = tiles or dict(block_M=32, block_N=64, block_K=64, num_stages=1)
    kernel = kernforge.compile(G.dense_gemm, backend=backend, N=n, K=k, a_major=a_major, b_major=b_major,
                               accumulate=accumulate, dtype=dtype, out_dtype=out_dtype, **tiles)
    d = c.clone() if accumulate else torch.full((m, n), float("nan"), dtype=ot)
    kernel(a if a_major == "k" else a.T.contiguous(), b if b_major == "k" else b.T.contiguous(), d)
    a64, b64 = a.double(), b.double()
    expected = G.reference(a64, b64, c)
    bound = P.dense_error_bound(a64, b64, expected, out_dtype)
    if accumulate:  # the sum is rounded to float32 before c is added: one more rounding of it
        bound = bound + 2.0 ** -24 * (a64 @ b64.T).abs()
    P.assert_close(d, expected, bound)
    return d


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("majors", MAJORS, ids="".join)
def test_float32_every_major_ragged(backend, majors):
    """M, N, K not multiples of the 32x64x64 tiles."""
    run(backend, 37, 160, 264, *majors)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("out_dtype", ["bfloat16", "float32"])
def test_bf16_operands_accumulate(backend, out_dtype):
    run(backend, 20, 96, 200, dtype="bfloat16", out_dtype=out_dtype, accumulate=True)


@pytest.mark.parametrize("backend", BACKENDS)
def test_decode_row_with_the_host_tiles(backend):
    run(backend, 1, 512, 128, **{k: v for k, v in config.choose_dense("cpu", 512, 128, 1).items()
                                  if k not in ("N", "K")})


def test_a_row_is_the_same_bits_in_any_batch():
    """The engine's deterministic mode: through the op (so with the chooser's tiles for each
    M, 16-row tiles alone and 64-row ones in the batch) a row's result does not depend on how
    many rows share the call or where the row sits."""
    g = torch.Generator().manual_seed(3)
    a, b = torch.randn(100, 200, generator=g), torch.randn(96, 200, generator=g)
    full = torch.empty(100, 96)
    ops.fp32_gemm_nt(a, b, full, backend="cpu")
    assert config.choose_dense("cpu", 96, 200, 1)["block_M"] != config.choose_dense("cpu", 96, 200, 100)["block_M"]
    for row in (0, 41, 99):
        for lo, hi in ((row, row + 1), (max(0, row - 5), row + 1)):
            part = torch.empty(hi - lo, 96)
            ops.fp32_gemm_nt(a[lo:hi].contiguous(), b, part, backend="cpu")
            assert torch.equal(part[-1], full[row]), (row, lo)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("spec", [P.SPEC_BF16, P.SPEC_FP32], ids=lambda s: s.name)
def test_registered_small_problem(backend, spec):
    r = run_spec(spec, backend, "small", repeat=0)
    assert r.verified, r.error


def test_check_detects_a_wrong_element():
    d = run("interp", 16, 32, 128)
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(16, 128, generator=g).double(), (torch.randn(32, 128, generator=g) * 3).double()
    expected = a @ b.T
    bad = d.clone()
    bad[3, 5] += 1e-3 * (1 + bad[3, 5].abs())
    with pytest.raises(AssertionError, match="error bound"):
        P.assert_close(bad, expected, P.dense_error_bound(a, b, expected, "float32"))


def test_factory_rejects_other_operand_dtypes():
    with pytest.raises(ValueError, match="dtype must be"):
        G.dense_gemm(N=64, K=64, dtype="float16")
