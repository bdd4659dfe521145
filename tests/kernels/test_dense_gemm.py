"""Dense block-scaled GEMM kernels (FP8 x FP8 in four majors, FP8 x FP4): interp, cpu and
cuda-emu against float64 dequantise-then-matmul references (elementwise bounds and DeepGEMM's
calc_diff thresholds), poisoned outputs, ragged and odd-multiple shapes, nvcc builds."""
import shutil

import pytest
import torch
from hypothesis import given, settings, strategies as st

import kernforge
from kernforge.kernels import gemm as G
from kernforge.kernels.check import run_spec
from kernforge.kernels.gemm import problems as P
from kernforge.model.quant import unpack_fp4
from tests.conftest import backend_param, host_backends

BACKENDS = host_backends("interp", "cpu")


def operands(m, n, k, seed=0, fp4=False, gran_n=128, use_ue8m0=False):
    """Random ``a [m, k]``, ``b [n, k]``, their DeepGEMM casts and float64 dequantizations."""
    g = torch.Generator().manual_seed(seed)
    a, b = torch.randn(m, k, generator=g), torch.randn(n, k, generator=g) * 3
    a8 = G.per_token_cast_to_fp8(a, use_ue8m0)
    if fp4:
        bq = G.per_token_cast_to_fp4(b, use_ue8m0)
        b64 = G.dequantize_fp4(*bq)
    elif gran_n == 1:
        bq = G.per_token_cast_to_fp8(b, use_ue8m0)
        b64 = G.dequantize(*bq, (1, 128))
    else:
        bq = G.per_block_cast_to_fp8(b, use_ue8m0)
        b64 = G.dequantize(*bq, (128, 128))
    return a, b, a8, bq, G.dequantize(*a8, (1, 128)), b64


def run(backend, m, n, k, a_major="k", b_major="k", gran_n=128, accumulate=False, out_dtype="bfloat16",
        fp4=False, seed=0, block_M=32, block_N=64, **compile_kw):
    """One kernel call on poisoned (or ``c``-initialised) ``d``, checked against float64."""
    a, b, (a8, sfa), (bq, sfb), a64, b64 = operands(m, n, k, seed, fp4, gran_n)
    variant = dict(accumulate=accumulate, out_dtype=out_dtype, block_M=block_M, block_N=block_N)
    if fp4:
        kernel = kernforge.compile(G.fp8_fp4_gemm, backend=backend, N=n, K=k, **variant, **compile_kw)
    else:
        kernel = kernforge.compile(G.fp8_gemm, backend=backend, N=n, K=k, a_major=a_major, b_major=b_major,
                                   gran_n=gran_n, **variant, **compile_kw)
    torch_out = getattr(torch, out_dtype)
    c = torch.randn(m, n, generator=torch.Generator().manual_seed(seed + 1)).to(torch_out) if accumulate else None
    d = c.clone() if accumulate else torch.full((m, n), float("nan"), dtype=torch_out)
    kernel(a8 if a_major == "k" else a8.T.contiguous(), G.get_mn_major_tma_aligned_tensor(sfa),
           bq if b_major == "k" else bq.T.contiguous(), sfb, d)
    expected = G.reference(a64, b64, c)
    bound = P.error_bound(a64, b64, expected)
    if out_dtype == "float32":
        bound = bound - 2.0 ** -8 * expected.abs() + 2.0 ** -23 * expected.abs()
    P.assert_close(d, expected, bound, P.FP4_DIFF if fp4 else P.FP8_DIFF)
    # DeepGEMM's own use of the thresholds, against the unquantized product: a statistic of
    # the quantization error, meaningful over many outputs only
    if m * n >= 256:
        assert G.calc_diff(d, G.reference(a, b, c)) < (P.FP4_DIFF if fp4 else P.FP8_DIFF)
    return d, expected


MAJORS = [("k", "k"), ("k", "mn"), ("mn", "k"), ("mn", "mn")]  # nt, nn, tt, tn


# cpu runs the registered nt problems below and the op's tn (tests/ops/test_gemm_ops.py)
@pytest.mark.parametrize("backend, majors", [("interp", mj) for mj in MAJORS])
def test_fp8_every_major_ragged(backend, majors):
    """M, N, K not multiples of the tiles (K not of the 128-wide scale block either)."""
    run(backend, 37, 160, 264, *majors)


def test_fp8_per_row_b_scales_accumulate_into_fp32():
    """DeepGEMM's 1D1D recipe (1, 1, 128) with ``c`` and a float32 ``d`` (its wgrad form)."""
    run("interp", 20, 96, 256, gran_n=1, accumulate=True, out_dtype="float32")


def test_fp8_fp4_k_not_a_multiple_of_128():
    """K = 320: the last A scale block is partial while B's 1x32 blocks are whole."""
    run("interp", 37, 160, 320, fp4=True)


def test_fp8_fp4_accumulate_one_row_odd_multiples():
    run("interp", 1, 384, 384, fp4=True, accumulate=True)


@pytest.mark.parametrize("m", [1, 2])
def test_fp8_decode_rows_odd_multiples_of_128(m):
    """M = 1 and 2 (decode), N = 3 x 128 and K = 5 x 128."""
    run("interp", m, 384, 640)


@pytest.mark.parametrize("backend", [backend_param("cuda-emu")])
def test_transposed_accumulating_on_cuda_emulation(backend):
    """The CUDA source (sm_90a: wgmma, TMA) on host emulation for the variant the registry
    lacks: MN-major operands, accumulating; the registered kernels (nt, FP4) run in tests/emu."""
    run(backend, 37, 160, 256, a_major="mn", b_major="mn", accumulate=True)


def test_fp4_decoder_covers_every_byte():
    """All 256 byte values through the kernel (A = identity, unit scales, float32 out):
    D[i, n] = fp4(B)[n, i] exactly, low nibble first, as kernforge.model.quant decodes."""
    k = 64
    codes = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(torch.int8).view(8, 32)
    eye = torch.eye(k).to(torch.float8_e4m3fn)
    sfa, sfb = torch.ones(k, 1), torch.ones(8, 2)
    d = torch.full((k, 8), float("nan"))
    kernel = kernforge.compile(G.fp8_fp4_gemm, backend="interp", N=8, K=k, out_dtype="float32", block_M=32,
                               block_N=8)
    kernel(eye, sfa, codes, sfb, d)
    assert torch.equal(d.T, unpack_fp4(codes))


@settings(max_examples=6, deadline=None)
@given(m=st.integers(1, 70), n=st.integers(1, 200), k=st.integers(1, 300), majors=st.sampled_from(MAJORS),
       seed=st.integers(0, 2 ** 16))
def test_fp8_property_random_shapes(m, n, k, majors, seed):
    run("interp", m, n, k, *majors, seed=seed)


@settings(max_examples=4, deadline=None)
@given(m=st.integers(1, 40), n=st.integers(1, 130), k32=st.integers(1, 6), seed=st.integers(0, 2 ** 16))
def test_fp4_property_random_shapes(m, n, k32, seed):
    run("interp", m, n, 32 * k32, fp4=True, seed=seed)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("spec", [P.SPEC, P.SPEC_FP4], ids=lambda s: s.name)
def test_registered_small_problem(backend, spec):
    r = run_spec(spec, backend, "small", repeat=0)
    assert r.verified, r.error


def test_check_detects_a_wrong_element():
    d, expected = run("interp", 16, 32, 128)
    a, b, _, _, a64, b64 = operands(16, 32, 128)
    bad = d.clone()
    bad[3, 5] += 0.25 * (1 + bad[3, 5].abs())
    with pytest.raises(AssertionError, match="error bound"):
        P.assert_close(bad, expected, P.error_bound(a64, b64, expected))


def test_factories_reject_what_they_cannot_tile():
    with pytest.raises(ValueError, match="divide the 128"):
        G.fp8_gemm(N=256, K=128, block_N=96)
    with pytest.raises(ValueError, match="gran_n"):
        G.fp8_gemm(N=256, K=128, gran_n=32)
    with pytest.raises(ValueError, match="major"):
        G.fp8_gemm(N=256, K=128, a_major="row")
    with pytest.raises(ValueError, match="even"):
        G.fp8_fp4_gemm(N=64, K=33)


def test_ue8m0_helpers():
    """Packing keeps exponents only and rejects what DeepGEMM's cast would assert on; the
    MN-major TMA-aligned layout pads MN to a multiple of 4 floats."""
    sf = G.ceil_to_ue8m0(torch.rand(5, 7) * 100 + 1e-3)
    assert torch.equal(sf, torch.exp2(torch.round(torch.log2(sf))))
    packed = G.pack_ue8m0_to_int(sf)
    assert packed.dtype == torch.int32 and packed.shape == (5, 2)
    assert torch.equal(G.unpack_ue8m0_from_int(packed, 7), sf)
    with pytest.raises(ValueError, match="powers of two"):
        G.pack_ue8m0_to_int(sf * 1.5)
    for bad in (0.0, float("inf"), 2.0 ** -127):  # no UE8M0 code means these (0 is 2^-127 to the hardware)
        with pytest.raises(ValueError, match="powers of two"):
            G.pack_ue8m0_to_int(torch.tensor([1.0, bad]))


def test_ue8m0_codes_unpack_as_the_tensor_cores_read_them():
    """Every byte e is 2^(e - 127) -- 0 included, a float32 subnormal -- and 255 is NaN, the reading
    of the CUDA kernels' UE8M0 path (block-scaled tcgen05.mma, `fp8_gemm(sf_format="ue8m0")`), so host
    and CUDA backends agree on every code."""
    codes = torch.arange(256, dtype=torch.int64)
    packed = (codes[0::4] | codes[1::4] << 8 | codes[2::4] << 16 | codes[3::4] << 24)
    packed = torch.where(packed >= 2 ** 31, packed - 2 ** 32, packed).to(torch.int32)
    got = G.unpack_ue8m0_from_int(packed, 256).double()
    want = torch.exp2(codes[:255].double() - 127)
    assert torch.equal(got[:255], want) and torch.isnan(got[255])
    t = G.get_mn_major_tma_aligned_tensor(torch.randn(3, 5, 2))
    assert t.shape == (3, 5, 2) and t.stride() == (16, 1, 8)


def test_fp4_cast_round_trip():
    """e2m1 with one scale per 32: each element within half a grid step (1 at the top, 6 x
    scale) of the original; codes round-trip through pack/unpack."""
    x = torch.randn(6, 128) * torch.logspace(-2, 2, 128)
    codes, sf = G.per_token_cast_to_fp4(x)
    assert codes.shape == (6, 64) and sf.shape == (6, 4)
    back = G.dequantize_fp4(codes, sf)
    assert ((back - x.double()).abs() <= sf.double().repeat_interleave(32, -1) + 1e-12).all()
    assert torch.equal(G.pack_fp4(unpack_fp4(codes)), codes)


@pytest.mark.nvcc
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")
@pytest.mark.parametrize("arch", ["sm_100a"])
def test_transposed_accumulating_variant_builds_without_spills(arch):
    """The variants the registry's compile set (tests/backends/test_cuda_compile.py: small
    problems for sm_90a, sm_80 and sm_100a) lacks: MN-major operands, per-row B scales,
    accumulation into float32, at the op's GPU tiles, on sm_100a, where mma.sync at 128x128
    spilled (hence config's 64-row tiles when accumulating)."""
    from kernforge.backends.cuda import backend as cuda_backend

    params = G.config.choose("cuda", 384, 640, 4096, a_major="mn", b_major="mn", gran_n=1, accumulate=True,
                             out_dtype="float32")
    report = cuda_backend.build_report(G.fp8_gemm(**params).ir, arch)
    assert report["arch"] == arch
    assert not (report["spill_stores"] or report["spill_loads"] or report["local_bytes"]), report


def test_bench_problems_are_the_choosers_output():
    # the FP8 x FP8 bench names its K-major A (the chooser's cluster request depends on it)
    for spec, variant in ((P.SPEC, dict(a_major="k")), (P.SPEC_FP4, {})):
        params = dict(spec.problems["bench"].params)
        m = params.pop("M")
        assert params == G.config.choose("cuda", 7168, 2048, m, **variant), spec.name
