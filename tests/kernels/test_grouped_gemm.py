"""Grouped GEMM kernels (contiguous layout): interp and cpu against float64 torch, with
garbage in A's padding rows and NaN-poisoned outputs."""
import pytest
import torch
from hypothesis import given, settings, strategies as st

import kernforge
from kernforge.kernels import grouped_gemm as G
from kernforge.kernels.check import run_spec
from tests.conftest import backend_param, host_backends

BACKENDS = host_backends("interp", "cpu")


def inputs(group_rows, alignment, n, k, seed=0):
    g = torch.Generator().manual_seed(seed)
    m_indices = G.contiguous_layout(group_rows, alignment)
    a = torch.randn(m_indices.numel(), k, generator=g)
    a[m_indices < 0] = 1e4            # padding rows hold garbage; D must still be 0 there
    b = torch.randn(len(group_rows), n, k, generator=g)
    return a.bfloat16(), b.bfloat16(), m_indices


def run_bf16(backend, group_rows, alignment, n, k, seed=0, **tiles):
    a, b, m_indices = inputs(group_rows, alignment, n, k, seed)
    kernel = kernforge.compile(G.m_grouped_gemm_nt_contiguous, backend=backend,
                               num_groups=len(group_rows), N=n, K=k, **tiles)
    d = torch.full((a.shape[0], n), float("nan"), dtype=torch.bfloat16)
    kernel(a, b, m_indices, d)
    expected = G.reference(a, b, m_indices)
    G.assert_close(d, expected, G.error_bound(a, b, m_indices, expected))
    return d, expected


# empty expert, unaligned row counts, N and K not multiples of the tiles (also the registered
# "small" problem, so the cpu build is shared)
RAGGED = dict(group_rows=[5, 0, 70, 32], alignment=32, n=40, k=72, block_M=32, block_N=32, block_K=32)
# one expert, tiles smaller than the alignment, a single K step, one pipeline stage
SINGLE = dict(group_rows=[130], alignment=64, n=16, k=16, block_M=32, block_N=16, block_K=16,
              num_stages=1)


@pytest.mark.parametrize("backend, case", [backend_param(b, RAGGED) for b in ("interp", "cpu")] + [("interp", SINGLE)])
def test_bf16_matches_reference(backend, case):
    d, _ = run_bf16(backend, **case)
    m_indices = G.contiguous_layout(case["group_rows"], case["alignment"])
    assert torch.all(d[m_indices < 0] == 0)


@pytest.mark.parametrize("backend", BACKENDS)
def test_fp8_block_scaled_matches_dequantized_reference(backend):
    group_rows, alignment, n, k = [40, 0, 9], 32, 160, 200      # two K blocks, two N blocks, ragged
    g = torch.Generator().manual_seed(1)
    m_indices = G.contiguous_layout(group_rows, alignment)
    a, sfa = G.per_token_cast_to_fp8(torch.randn(m_indices.numel(), k, generator=g))
    b, sfb = G.per_block_cast_to_fp8(torch.randn(len(group_rows), n, k, generator=g) * 3)
    kernel = kernforge.compile(G.m_grouped_fp8_gemm_nt_contiguous, backend=backend,
                               num_groups=len(group_rows), N=n, K=k, block_M=32, block_N=64)
    d = torch.full((m_indices.numel(), n), float("nan"), dtype=torch.bfloat16)
    kernel(a, sfa, b, sfb, m_indices, d)
    a64, b64 = G.dequantize(a, sfa, (1, 128)), G.dequantize(b, sfb, (128, 128))
    expected = G.reference(a64, b64, m_indices)
    G.assert_close(d, expected, G.error_bound(a64, b64, m_indices, expected, rounding_steps=3))


def test_backends_agree():
    if "cpu" not in BACKENDS:
        pytest.skip("cpu backend not available")
    case = dict(RAGGED, group_rows=[33, 64, 0, 3], seed=5)      # same kernel, other rows
    d_i, _ = run_bf16("interp", **case)
    d_c, _ = run_bf16("cpu", **case)
    # same float32 products, possibly summed in another order: at most one bf16 ulp apart
    assert ((d_i.double() - d_c.double()).abs() <= d_i.double().abs() * 2.0 ** -7 + 1e-6).all()


def test_check_detects_a_wrong_element():
    d, expected = run_bf16("interp", [20], 32, 16, 16, block_M=32, block_N=16, block_K=16)
    a, b, m_indices = inputs([20], 32, 16, 16)
    bad = d.clone()
    bad[3, 5] += 0.5
    with pytest.raises(AssertionError, match="error bound"):
        G.assert_close(bad, expected, G.error_bound(a, b, m_indices, expected))


@settings(max_examples=12, deadline=None)
@given(group_rows=st.lists(st.integers(0, 40), min_size=1, max_size=4),
       n=st.integers(1, 40), k=st.integers(1, 40), seed=st.integers(0, 2**16))
def test_property_random_shapes(group_rows, n, k, seed):
    if sum(group_rows) == 0:
        group_rows = group_rows + [1]
    run_bf16("interp", group_rows, 16, n, k, seed, block_M=16, block_N=16, block_K=16)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("spec", [G.SPEC, G.SPEC_FP8, G.SPEC_MASKED], ids=lambda s: s.name)
def test_registered_small_problem(backend, spec):
    r = run_spec(spec, backend, "small", repeat=0)
    assert r.verified, r.error


@pytest.mark.parametrize("use_ue8m0", [False, True])
def test_fp8_casts_round_trip(use_ue8m0):
    """Quantize-dequantize stays within e4m3's relative step (2^-3) of each scale block's amax."""
    x = torch.randn(3, 130, 260) * torch.logspace(-2, 2, 260)
    data, sf = G.per_block_cast_to_fp8(x, use_ue8m0)
    assert sf.shape == (3, 2, 3) and data.dtype == torch.float8_e4m3fn
    if use_ue8m0:
        assert torch.equal(sf, torch.exp2(torch.round(torch.log2(sf))))
    back = G.dequantize(data, sf, (128, 128))
    bound = G.dequantize(torch.ones_like(x), sf, (128, 128)) * 448 * 2.0 ** -3
    assert ((back - x.double()).abs() <= bound).all()
    data, sf = G.per_token_cast_to_fp8(x[0], use_ue8m0)
    assert sf.shape == (130, 3)
    back = G.dequantize(data, sf, (1, 128))
    assert ((back - x[0].double()).abs() <= G.dequantize(torch.ones_like(x[0]), sf, (1, 128)) * 448 * 2.0 ** -3).all()


def _listing(pf):
    """The IR listing without its ``attrs`` line (which only echoes the factory's arguments)."""
    return {line.strip() for line in repr(pf.ir).splitlines() if not line.strip().startswith("attrs ")}


def test_each_parameter_shapes_the_kernel_and_its_name():
    """Changing one compile-time parameter changes the kernel where that parameter acts, and
    its name (the CPU entry symbol and the compile cache's artifact are named after it, so two
    specialisations must never share one)."""
    base = dict(num_groups=4, N=64, K=96, block_M=32, block_N=64, block_K=32, num_stages=3)
    ref = G.m_grouped_gemm_nt_contiguous(**base)
    assert "alloc shared bfloat16[32, 32] A_shared" in _listing(ref)
    changes = {  # parameter: (new value, a line of the new kernel's listing that the old lacks)
        "num_groups": (2, "kernel m_grouped_gemm_nt_contiguous_g2_n64_k96_M32_N64_K32_s3_bfloat16_bfloat16_t128("
                          "global bfloat16[M, 96] A, global bfloat16[2, 64, 96] B, global int32[M] m_indices, "
                          "global bfloat16[M, 64] D)"),
        "N": (128, "grid(2, (((M + 32) - 1) // 32)) threads=128 as (bx, by)"),
        "K": (64, "for k in pipelined(0, +2, num_stages=3):"),
        "block_M": (16, "alloc shared bfloat16[16, 32] A_shared"),
        "block_N": (32, "for i, j in parallel(32, 32):"),
        "block_K": (16, "for k in pipelined(0, +6, num_stages=3):"),
        "num_stages": (1, "for k in pipelined(0, +3, num_stages=1):"),
    }
    names = {ref.ir.name}
    for param, (value, line) in changes.items():
        pf = G.m_grouped_gemm_nt_contiguous(**dict(base, **{param: value}))
        assert line in _listing(pf) and line not in _listing(ref), param
        assert pf.ir.name not in names, f"{param}={value} gives a kernel named like another: {pf.ir.name}"
        names.add(pf.ir.name)


def test_fp8_rejects_tiles_wider_than_a_scale_block():
    with pytest.raises(ValueError, match="divide the 128"):
        G.m_grouped_fp8_gemm_nt_contiguous(num_groups=1, N=256, K=128, block_N=96)


@settings(max_examples=8, deadline=None)
@given(masked=st.lists(st.integers(0, 40), min_size=1, max_size=3), n=st.integers(1, 40),
       k=st.integers(1, 40), seed=st.integers(0, 2**16))
def test_masked_property(masked, n, k, seed):
    """Masked layout on interp: rows below masked_m[g] match, rows past it stay poisoned."""
    g = torch.Generator().manual_seed(seed)
    groups, max_m = len(masked), max(masked) + 3
    a = torch.randn(groups, max_m, k, generator=g).bfloat16()
    b = torch.randn(groups, n, k, generator=g).bfloat16()
    masked_m = torch.tensor(masked, dtype=torch.int32)
    kernel = kernforge.compile(G.m_grouped_gemm_nt_masked, backend="interp", num_groups=groups,
                               N=n, K=k, block_M=16, block_N=16, block_K=16)
    d = torch.full((groups, max_m, n), float("nan"), dtype=torch.bfloat16)
    kernel(a, b, masked_m, d)
    for grp, rows in enumerate(masked):
        e = a[grp, :rows].double() @ b[grp].double().T
        G.assert_close(d[grp, :rows], e, G.error_bound(a[grp, :rows], b[grp:grp + 1],
                                                       torch.zeros(rows, dtype=torch.int32), e))
        assert torch.isnan(d[grp, rows:].float()).all()
