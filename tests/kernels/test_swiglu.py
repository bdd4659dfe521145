"""The SwiGLU DSL kernel: the catalogue entry on interp and cpu, the model's step-by-step
torch ops and a float64 oracle over random shapes, the FP8 output bit for bit against
DeepGEMM's per_token_cast_to_fp8 of the unquantised output, NaN and clamp edges, one
cuda-emu case and the sm_90a build."""
import shutil

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import kernforge
from kernforge.kernels import swiglu as K
from kernforge.kernels import vexp
from kernforge.kernels.check import run_spec
from kernforge.kernels.grouped_gemm.reference import per_token_cast_to_fp8
from kernforge.kernels.registry import get
from tests.conftest import host_backends

LIMIT = 10.0


@pytest.mark.parametrize("backend", host_backends("interp", "cpu"))
def test_catalogue_entry_verifies(backend):
    result = run_spec(get("swiglu"), backend, "small", repeat=1)
    assert result.verified, result.error


def run(x, w, limit, quantize, backend, rows=4):
    m, i = x.shape[0], x.shape[1] // 2
    kernel = kernforge.compile(K.swiglu, backend=backend, inter=i, dtype=str(x.dtype).removeprefix("torch."),
                               with_weights=w is not None, quantize=quantize, rows=rows)
    out = torch.full((m, i), float("nan")).to(torch.float8_e4m3fn if quantize else x.dtype)
    sf = torch.full((m, i // 128) if quantize else (1, 1), float("nan"))
    kernel(x, w if w is not None else torch.zeros(1), limit, out, sf)
    return (out, sf) if quantize else out


def inputs(m, i, dtype, seed, scale=6.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn((m, 2 * i), generator=g) * scale).to(dtype), torch.rand(m, generator=g)


@settings(max_examples=10)
@given(m=st.integers(1, 40), dtype=st.sampled_from([torch.float32, torch.bfloat16]),
       limit=st.sampled_from([0.0, 3.5, LIMIT]), seed=st.integers(0, 2 ** 16))
def test_matches_model_steps_and_float64(m, dtype, limit, seed):
    """One compiled kernel per dtype, the limit a runtime scalar: bf16 results equal the
    model's in-place torch ops except where torch's and the C library's float32 exp round
    silu differently (a bf16 ulp, rarely); float32 within 8 ulps of the float64 chain
    (exp's error and three roundings)."""
    x, w = inputs(m, 128, dtype, seed)
    got = run(x, w, limit, False, "cpu").double()
    model = K.reference.model_steps(x, w, limit).double()
    exact = K.reference.float64(x, w, limit)
    ulp = 2.0 ** -7 if dtype == torch.bfloat16 else 2.0 ** -20
    assert ((got - exact).abs() <= ulp * exact.abs() + 1e-30).all()
    assert ((got - model).abs() <= ulp * model.abs() + 1e-30).all()
    if dtype == torch.bfloat16:
        assert (got != model).float().mean() < 0.01


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_fp8_output_is_per_token_cast_of_the_unquantised_output(dtype):
    x, w = inputs(37, 256, dtype, 1)
    x[3] = 0.0                      # an all-zero row: amax clamps to 1e-4
    x[5, :128] = 1e-30              # tiny gate values: a block far below the clamp
    h = run(x, w, LIMIT, False, "cpu")
    q, sf = run(x, w, LIMIT, True, "cpu")
    want_q, want_sf = per_token_cast_to_fp8(h)
    assert torch.equal(q.view(torch.uint8), want_q.view(torch.uint8))
    assert torch.equal(sf.view(torch.int32), want_sf.view(torch.int32))


def test_nan_propagates_and_the_clamp_holds_on_the_interpreter():
    x, w = inputs(5, 128, torch.float32, 2, scale=40.0)
    x[1, 7] = float("nan")          # gate NaN
    x[2, 128 + 9] = float("nan")    # up NaN
    got = run(x, w, LIMIT, False, "interp")
    assert torch.isnan(got[1, 7]) and torch.isnan(got[2, 9])
    assert torch.isnan(got).sum() == 2
    # |silu(min(g, L))| <= L and |clamp(u)| <= L: |h| <= L^2 * w
    assert (got.nan_to_num().abs() <= LIMIT * LIMIT * w[:, None] * (1 + 1e-6)).all()


def test_ragged_rows_and_columns_without_quantisation_on_the_interpreter():
    """inter 200 (not a multiple of the 128-column step), 6 rows in blocks of 4: the masked
    edges neither read past x nor leave an element unwritten."""
    x, w = inputs(6, 200, torch.bfloat16, 4)
    got = run(x, w, LIMIT, False, "interp")
    assert not torch.isnan(got.float()).any()
    assert ((got.double() - K.reference.float64(x, w, LIMIT)).abs()
            <= 2.0 ** -7 * K.reference.float64(x, w, LIMIT).abs()).all()


def test_cuda_emu_quantised_output_equals_cpu():
    x, w = inputs(9, 256, torch.bfloat16, 6)
    q_emu, sf_emu = run(x, w, LIMIT, True, "cuda-emu")
    q_cpu, sf_cpu = run(x, w, LIMIT, True, "cpu")
    assert torch.equal(sf_emu, sf_cpu)
    # float32 exp may differ between CUDA's expf and the host's by an ulp: codes within one step
    diff = (q_emu.view(torch.uint8).int() - q_cpu.view(torch.uint8).int()).abs()
    assert (diff <= 1).all() and (diff > 0).float().mean() < 0.01


@pytest.mark.nvcc
def test_cuda_sm90a_build_of_the_op_configuration():
    if shutil.which("nvcc") is None:
        pytest.skip("nvcc not on PATH")
    from kernforge.backends.cuda.backend import build_report

    pf = K.swiglu(**K.choose("cuda", 2048, "bfloat16", True, True))
    report = build_report(pf.ir, "sm_90a")
    assert report["arch"] == "sm_90a" and report["spill_stores"] == 0


def _exp_kernel(backend):
    """A kernel that applies `vexp.exp` to each element of a float32 vector (blocks of 64)."""
    import kernforge.dsl as T

    n = T.symbolic("n")

    @T.prim_func
    def vexp_kernel(x: T.Tensor((n,), "float32"), out: T.Tensor((n,), "float32")):
        with T.Kernel(T.ceildiv(n, 64), threads=64) as bx:
            for i in T.Parallel(64):
                if bx * 64 + i < n:
                    out[bx * 64 + i] = vexp.exp(x[bx * 64 + i])

    return kernforge.compile(vexp_kernel, backend=backend)


@pytest.mark.parametrize("backend", host_backends("interp", "cpu"))
def test_vectorisable_exp_is_within_two_ulps_of_float64(backend):
    """`vexp.exp` (the SwiGLU's, the compressor's and the hyper-connections' exp) against
    float64 exp rounded to float32: at most 2 ulps (of the float32 result; subnormal results
    within 2 of the smallest subnormal), over random values from -110 to 90, the split's edge
    cases (exact integers, values with 12 or fewer significant bits, tiny magnitudes), the
    overflow and underflow borders, the split's own border (|x| = 128) and huge finite inputs
    (past 2.3e38 the split's product overflows: those gave NaN) and the non-finite inputs."""
    g = torch.Generator().manual_seed(3)
    x = torch.cat([torch.rand(20000, generator=g) * 200 - 110, torch.randn(5000, generator=g) * 1e-3,
                   torch.arange(-104, 89).float(), torch.tensor([0.0, -0.0, 1e-30, -1e-38, 88.72, 88.73, -87.33,
                                                                 -103.2, -103.98, -150.0, -1e5, 1e5, 0.5, -0.5,
                                                                 1.0 / 3, 44.361419555836, 127.99, -127.99, 128.0,
                                                                 -128.0, 1e30, -1e30, 2.4e38, -2.4e38, 3.4e38,
                                                                 -3.4e38, float("inf"), float("-inf"),
                                                                 float("nan")])])
    out = torch.full_like(x, 7.0)
    _exp_kernel(backend)(x, out)
    want64 = x.double().exp()
    want = want64.float()
    finite = torch.isfinite(want) & torch.isfinite(x)
    # ulp of the float32 result (the smallest subnormal for subnormal and zero results)
    ulp = torch.where(want[finite].abs() >= 2.0 ** -126,
                      want[finite].abs() * 2.0 ** -23, torch.tensor(2.0 ** -149)).double()
    err = (out[finite].double() - want64[finite]).abs()
    assert (err <= 2 * ulp).all(), x[finite][(err > 2 * ulp)][:8]
    assert torch.equal(out[~finite & ~torch.isnan(x)], want[~finite & ~torch.isnan(x)])  # inf, 0 at the borders
    assert torch.isnan(out[torch.isnan(x)]).all()
    assert out[x == float("-inf")].item() == 0.0 and out[x == 0].eq(1.0).all()
