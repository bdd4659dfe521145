"""FP8 masked and FP8 x FP4 grouped GEMM kernels (contiguous and masked layouts): interp and cpu
against float64 dequantise-then-matmul references, DeepGEMM's calc_diff thresholds, experts
with no rows, padding rows zeroed, rows past masked_m left poisoned.  Their registered "small"
problems run on cuda-emu (sm_90a and sm_80) in tests/emu/test_library_kernels.py."""
import pytest
import torch
from hypothesis import given, settings, strategies as st

import kernforge
import kernforge.ops as kops
from kernforge.kernels import gemm as DG
from kernforge.kernels import grouped_gemm as G
from kernforge.kernels.check import run_spec
from kernforge.kernels.grouped_gemm import kernel as K
from kernforge.kernels.grouped_gemm import problems as P
from tests.conftest import backend_param


def contiguous_case(backend, group_rows, alignment, n, k, seed=0, ue8m0=False, **tiles):
    """``ue8m0``: power-of-two B scales, which the kernel folds into its bf16 B tile exactly,
    so the bound has no term for that rounding."""
    g = torch.Generator().manual_seed(seed)
    m_indices = G.contiguous_layout(group_rows, alignment)
    a = torch.randn(m_indices.numel(), k, generator=g).masked_fill((m_indices < 0)[:, None], 0.0)
    b = torch.randn(len(group_rows), n, k, generator=g)
    (a8, sfa), (b4, sfb) = DG.per_token_cast_to_fp8(a), DG.per_token_cast_to_fp4(b, use_ue8m0=ue8m0)
    kernel = kernforge.compile(K.m_grouped_fp8_fp4_gemm_nt_contiguous, backend=backend,
                               num_groups=len(group_rows), N=n, K=k, **tiles)
    d = torch.full((m_indices.numel(), n), float("nan"), dtype=torch.bfloat16)
    kernel(a8, DG.get_mn_major_tma_aligned_tensor(sfa), b4, sfb, m_indices, d)
    a64, b64 = DG.dequantize(a8, sfa, (1, 128)), DG.dequantize_fp4(b4, sfb)
    expected = G.reference(a64, b64, m_indices)
    G.assert_close(d, expected, G.error_bound(a64, b64, m_indices, expected, rounding_steps=3,
                                              b_rounding=0.0 if ue8m0 else P.FP4_FOLD_ROUNDING))
    assert DG.calc_diff(d, expected) < P.FP4_DIFF
    assert DG.calc_diff(d, G.reference(a, b, m_indices)) < P.FP4_DIFF   # DeepGEMM's use: unquantized
    assert torch.all(d[m_indices < 0] == 0), "padding rows must be stored as zeros"
    return d


# the registered "small" problems' shapes, so the cpu builds are shared with
# test_registered_small_problem (which runs them on interp too)
@pytest.mark.parametrize("backend", [backend_param("cpu")])
def test_fp4_contiguous_with_an_empty_expert(backend):
    contiguous_case(backend, [40, 0, 9], 32, 160, 256, block_M=32, block_N=64)


def test_fp4_contiguous_odd_multiples_of_128():
    contiguous_case("interp", [1, 0, 20], 32, 384, 384, block_M=32, block_N=128)


@pytest.mark.parametrize("backend", [backend_param("cpu")])
def test_fp4_contiguous_power_of_two_scales_fold_exactly(backend):
    """UE8M0 scales times e2m1 values are exact in bf16: only accumulation and store rounding."""
    contiguous_case(backend, [40, 0, 9], 32, 160, 256, ue8m0=True, block_M=32, block_N=64)


def test_fp4_row_major_decode_walk():
    """``decode_k_outer=False`` (the GPU's walk of the B tile) gives the same results, with a K
    that ends inside a 128-wide step (its last scale columns are never read)."""
    contiguous_case("interp", [1, 0, 20], 32, 96, 160, block_M=32, block_N=64, decode_k_outer=False)
    masked_case("interp", [5, 0, 17], 20, 96, 160, True, block_M=16, block_N=32, decode_k_outer=False)


def masked_case(backend, masked, max_m, n, k, fp4, seed=0, **tiles):
    g = torch.Generator().manual_seed(seed)
    groups = len(masked)
    a = torch.randn(groups, max_m, k, generator=g)
    b = torch.randn(groups, n, k, generator=g)
    a8, sfa = DG.per_token_cast_to_fp8(a)
    bq, sfb = DG.per_token_cast_to_fp4(b) if fp4 else DG.per_block_cast_to_fp8(b)
    factory = K.m_grouped_fp8_fp4_gemm_nt_masked if fp4 else K.m_grouped_fp8_gemm_nt_masked
    kernel = kernforge.compile(factory, backend=backend, num_groups=groups, N=n, K=k, **tiles)
    masked_m = torch.tensor(masked, dtype=torch.int32)
    d = torch.full((groups, max_m, n), float("nan"), dtype=torch.bfloat16)
    kernel(a8, DG.get_mn_major_tma_aligned_tensor(sfa), bq, sfb, masked_m, d)
    a64 = DG.dequantize(a8, sfa, (1, 128))
    b64 = DG.dequantize_fp4(bq, sfb) if fp4 else DG.dequantize(bq, sfb, (128, 128))
    threshold = P.FP4_DIFF if fp4 else P.FP8_DIFF
    for grp, rows in enumerate(masked):
        e = a64[grp, :rows] @ b64[grp].T
        G.assert_close(d[grp, :rows], e, G.error_bound(a64[grp, :rows], b64[grp:grp + 1],
                                                       torch.zeros(rows, dtype=torch.int32), e, rounding_steps=3,
                                                       b_rounding=P.FP4_FOLD_ROUNDING if fp4 else 0.0))
        assert torch.isnan(d[grp, rows:].float()).all(), f"group {grp}: rows past masked_m were written"
        if rows * n >= 256:
            assert DG.calc_diff(d[grp, :rows], a[grp, :rows].double() @ b[grp].double().T) < threshold
    return d


@pytest.mark.parametrize("backend, fp4", [("interp", False), backend_param("cpu", True)])
def test_masked(backend, fp4):
    """A group with no rows, one whose rows end inside a tile, one filling M_max."""
    masked_case(backend, [40, 0, 17], 40, 160, 256, fp4, block_M=32, block_N=64)


@settings(max_examples=5, deadline=None)
@given(masked=st.lists(st.integers(0, 40), min_size=1, max_size=3), n=st.integers(1, 100),
       k=st.integers(1, 260), fp4=st.booleans(), seed=st.integers(0, 2 ** 16))
def test_masked_property(masked, n, k, fp4, seed):
    k = max(32, k // 32 * 32) if fp4 else k
    masked_case("interp", masked, max(masked) + 3, n, k, fp4, seed, block_M=16, block_N=32)


# the masked fp8 kernel on cpu is the bf16 masked kernel's structure with the promotion the
# fp8 contiguous kernel has on cpu (tests/kernels/test_grouped_gemm.py): interp only here
@pytest.mark.parametrize("backend, spec", [
    backend_param(b, s, id=f"{s.name}-{b}") for b in ("interp", "cpu") for s in (P.SPEC_FP4, P.SPEC_FP4_MASKED)
] + [backend_param("interp", P.SPEC_FP8_MASKED, id="m_grouped_fp8_gemm_nt_masked-interp")])
def test_registered_small_problem(backend, spec):
    r = run_spec(spec, backend, "small", repeat=0)
    assert r.verified, r.error


def test_masked_check_detects_a_written_row_past_masked_m():
    spec = P.SPEC_FP8_MASKED
    params = spec.problems["small"].params
    inputs = spec.make_inputs(params, 0)
    kernforge.compile(spec.factory, backend="interp", **params)(*inputs)
    expected = spec.reference(inputs, params)
    d = inputs[5].clone()
    d[2, 17, 0] = 0.0                                       # group 2 has 17 valid rows
    with pytest.raises(AssertionError, match="past masked_m"):
        spec.check([d], expected, inputs, params)


def test_fp4_factories_reject_odd_k_and_masked_fp8_wide_tiles():
    with pytest.raises(ValueError, match="even"):
        K.m_grouped_fp8_fp4_gemm_nt_contiguous(num_groups=2, N=64, K=63)
    with pytest.raises(ValueError, match="even"):
        K.m_grouped_fp8_fp4_gemm_nt_masked(num_groups=2, N=64, K=63)
    with pytest.raises(ValueError, match="divide the 128"):
        K.m_grouped_fp8_gemm_nt_masked(num_groups=2, N=256, K=128, block_N=96)


def op_contiguous_case(backend, group_rows, alignment, n, k, seed):
    """``kernforge.ops.m_grouped_fp8_fp4_gemm_nt_contiguous`` (the public op: its checks, its
    tile choice at ``alignment``) on a NaN-poisoned ``d`` and garbage in ``a``'s padding rows,
    against the float64 product of the dequantised operands."""
    g = torch.Generator().manual_seed(seed)
    m_indices = G.contiguous_layout(group_rows, alignment)
    a = torch.randn(m_indices.numel(), k, generator=g)
    a[m_indices < 0] *= 1e3                                 # padding rows: garbage the op must not read
    b = torch.randn(len(group_rows), n, k, generator=g)
    (a8, sfa), (b4, sfb) = DG.per_token_cast_to_fp8(a), DG.per_token_cast_to_fp4(b)
    d = torch.full((m_indices.numel(), n), float("nan"), dtype=torch.bfloat16)
    previous = kops.get_mk_alignment_for_contiguous_layout()
    kops.set_mk_alignment_for_contiguous_layout(alignment)
    try:
        kops.m_grouped_fp8_fp4_gemm_nt_contiguous((a8, sfa), (b4, sfb), d, m_indices, backend=backend)
    finally:
        kops.set_mk_alignment_for_contiguous_layout(previous)
    a64, b64 = DG.dequantize(a8, sfa, (1, 128)), DG.dequantize_fp4(b4, sfb)
    expected = G.reference(a64, b64, m_indices)
    G.assert_close(d, expected, G.error_bound(a64, b64, m_indices, expected, rounding_steps=3,
                                              b_rounding=P.FP4_FOLD_ROUNDING))
    valid = m_indices >= 0
    assert DG.calc_diff(d[valid], expected[valid]) < P.FP4_DIFF
    assert torch.all(d[~valid] == 0), "padding (-1) rows must be stored as zeros"


#: rows per expert: none, one, ragged, and exactly an alignment's worth
_ROWS = st.sampled_from([0, 1, 3, 17, 32, 33, 64])


@settings(max_examples=6, deadline=None)
@given(group_rows=st.lists(_ROWS, min_size=1, max_size=4), alignment=st.sampled_from([32, 64]),
       n=st.integers(1, 3).map(lambda i: 32 * i), k=st.sampled_from([32, 64, 160, 256]),
       seed=st.integers(0, 2 ** 16))
def test_fp4_contiguous_op_property_interp(group_rows, alignment, n, k, seed):
    """Shapes on the interpreter: G 1-4, N multiples of 32, K multiples of FP4's 32-wide
    scale blocks (inside and across A's 128-wide ones)."""
    op_contiguous_case("interp", group_rows, alignment, n, k, seed)


@pytest.mark.parametrize("backend", [backend_param("cpu")])
@settings(max_examples=6, deadline=None)
@given(group_rows=st.lists(_ROWS, min_size=3, max_size=3), seed=st.integers(0, 2 ** 16))
def test_fp4_contiguous_op_property_cpu(backend, group_rows, seed):
    """Rows per expert on the compiled kernel: G, N, K fixed so one build serves every example
    (M is a runtime size); alignment 128, DeepGEMM's (``get_mk_alignment_for_contiguous_layout``)."""
    op_contiguous_case(backend, group_rows, 128, 160, 256, seed)
