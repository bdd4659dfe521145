"""DeepGEMM-style grouped GEMM ops: index and PSUM layouts, fp8 pairs, alignment rules
and typed errors."""
import pytest
import torch

from kernforge.kernels import grouped_gemm as G
from kernforge.ops import grouped_gemm as ops
from tests.conftest import host_backends

BACKENDS = host_backends("interp", "cpu")


@pytest.fixture(autouse=True)
def small_alignment():
    old = ops.get_mk_alignment_for_contiguous_layout()
    ops.set_mk_alignment_for_contiguous_layout(32)
    yield
    ops.set_mk_alignment_for_contiguous_layout(old)


def operands(group_rows, n=48, k=80, seed=0):
    g = torch.Generator().manual_seed(seed)
    m_indices = G.contiguous_layout(group_rows, ops.get_mk_alignment_for_contiguous_layout())
    a = torch.randn(m_indices.numel(), k, generator=g).bfloat16()
    b = torch.randn(len(group_rows), n, k, generator=g).bfloat16()
    d = torch.full((m_indices.numel(), n), float("nan"), dtype=torch.bfloat16)
    return a, b, d, m_indices


def check(d, a, b, m_indices):
    expected = G.reference(a, b, m_indices)
    G.assert_close(d, expected, G.error_bound(a, b, m_indices, expected))


@pytest.mark.parametrize("backend", BACKENDS)
def test_index_layout(backend):
    a, b, d, m_indices = operands([7, 0, 40])
    ops.m_grouped_bf16_gemm_nt_contiguous(a, b, d, m_indices, backend=backend)
    check(d, a, b, m_indices)


def test_psum_layout_zeroes_gap_rows():
    a, b, d, _ = operands([7, 0, 40])
    ends = torch.tensor([7, 32, 72], dtype=torch.int32)      # starts 0, 32, 32 (aligned ends)
    a[7:32] = 1e4                                            # gap rows: garbage in A
    ops.m_grouped_bf16_gemm_nt_contiguous(a, b, d, ends, use_psum_layout=True, backend="interp")
    ids = torch.full((a.shape[0],), -1, dtype=torch.int32)
    ids[:7], ids[32:72] = 0, 2
    check(d, a, b, ids)
    assert torch.all(d[7:32] == 0)


def test_fp8_pairs(backend="interp"):
    a, b, d, m_indices = operands([3, 50], n=130, k=136)
    a8, b8 = G.per_token_cast_to_fp8(a), G.per_block_cast_to_fp8(b)
    ops.m_grouped_fp8_gemm_nt_contiguous(a8, b8, d, m_indices, backend=backend)
    a64, b64 = G.dequantize(*a8, (1, 128)), G.dequantize(*b8, (128, 128))
    expected = G.reference(a64, b64, m_indices)
    G.assert_close(d, expected, G.error_bound(a64, b64, m_indices, expected, rounding_steps=3))


def test_empty_m_is_a_no_op():
    a, b = torch.empty(0, 16).bfloat16(), torch.randn(2, 8, 16).bfloat16()
    d = torch.empty(0, 8, dtype=torch.bfloat16)
    ops.m_grouped_bf16_gemm_nt_contiguous(a, b, d, torch.empty(0, dtype=torch.int32), backend="interp")


def test_alignment_api():
    assert ops.get_m_alignment_for_contiguous_layout() == 32
    with pytest.raises(ValueError):
        ops.set_mk_alignment_for_contiguous_layout(0)


def test_block_m_divides_alignment():
    ops.set_mk_alignment_for_contiguous_layout(48)
    assert ops.choose_config("cpu", 2, 64, 64)["block_M"] == 16
    ops.set_mk_alignment_for_contiguous_layout(128)
    assert ops.choose_config("cuda", 2, 64, 64)["block_M"] == 128
    assert "block_K" not in ops.choose_config("cpu", 2, 64, 64, fp8=True)


def _bad_layouts():
    ids = G.contiguous_layout([7, 0, 40], 32)
    two_experts = ids.clone()
    two_experts[5] = 2                                        # a second expert inside one aligned block
    unaligned = ids.clone()
    unaligned[0] = -1                                         # block starts with padding, then expert 0
    out_of_range = ids.clone()
    out_of_range[40] = 3
    return [(two_experts, "aligned block"), (unaligned, "aligned block"),
            (out_of_range, r"in \[0, 3\)"), (ids[:-1], "shape"), (ids.long(), "int32")]


@pytest.mark.parametrize("layout, match", _bad_layouts())
def test_bad_layouts_raise(layout, match):
    a, b, d, _ = operands([7, 0, 40])
    with pytest.raises((ValueError, TypeError), match=match):
        ops.m_grouped_bf16_gemm_nt_contiguous(a, b, d, layout, backend="interp")
    assert torch.isnan(d.float()).all(), "nothing may run before the checks pass"


@pytest.mark.parametrize("mutate, error, match", [
    (lambda x: x.update(a=x["a"].float()), TypeError, "a must be torch.bfloat16"),
    (lambda x: x.update(b=x["b"][:, :, :16].contiguous()), ValueError, "K mismatch"),
    (lambda x: x.update(d=x["d"][:, :8]), ValueError, "d must have shape"),
    (lambda x: x.update(a=x["a"].t().contiguous().t()), ValueError, "contiguous"),
    (lambda x: x.update(expected_m_for_psum_layout=64), ValueError, "only valid with use_psum_layout"),
    (lambda x: x.update(grouped_layout=torch.tensor([50, 40, 72], dtype=torch.int32),
                        use_psum_layout=True), ValueError, "non-decreasing"),
])
def test_bad_arguments_raise(mutate, error, match):
    a, b, d, m_indices = operands([7, 0, 40])
    args = dict(a=a, b=b, d=d, grouped_layout=m_indices)
    mutate(args)
    with pytest.raises(error, match=match):
        ops.m_grouped_bf16_gemm_nt_contiguous(**args, backend="interp")


def test_fp8_argument_checks():
    a, b, d, m_indices = operands([7, 40], n=48, k=80)
    a8, b8 = G.per_token_cast_to_fp8(a), G.per_block_cast_to_fp8(b)
    with pytest.raises(TypeError, match="pair"):
        ops.m_grouped_fp8_gemm_nt_contiguous(a8[0], b8, d, m_indices, backend="interp")
    with pytest.raises(ValueError, match="sfa must have shape"):
        ops.m_grouped_fp8_gemm_nt_contiguous((a8[0], a8[1][:, :0]), b8, d, m_indices, backend="interp")
    with pytest.raises(NotImplementedError, match="recipe"):
        ops.m_grouped_fp8_gemm_nt_contiguous(a8, b8, d, m_indices, recipe=(1, 64, 128), backend="interp")
    with pytest.raises(ValueError, match=r"sfb must have shape \(2, 48, 1\)"):  # per-row b scales: one per row
        ops.m_grouped_fp8_gemm_nt_contiguous(a8, b8, d, m_indices, recipe=(1, 1, 128), backend="interp")
    assert torch.isnan(d.float()).all()


@pytest.mark.parametrize("backend", BACKENDS)
def test_masked_layout(backend):
    g = torch.Generator().manual_seed(3)
    a = torch.randn(3, 70, 40, generator=g).bfloat16()
    b = torch.randn(3, 36, 40, generator=g).bfloat16()
    masked_m = torch.tensor([70, 0, 33], dtype=torch.int32)
    d = torch.full((3, 70, 36), float("nan"), dtype=torch.bfloat16)
    ops.m_grouped_bf16_gemm_nt_masked(a, b, d, masked_m, expected_m=40, backend=backend)
    expected = G.reference_masked(a, b, masked_m)
    valid = ~torch.isnan(expected)
    assert torch.isnan(d.float()[~valid]).all(), "rows past masked_m must stay untouched"
    for grp in range(3):
        rows = int(masked_m[grp])
        e, x = expected[grp, :rows], d[grp, :rows]
        G.assert_close(x, e, G.error_bound(a[grp, :rows], b[grp:grp + 1],
                                           torch.zeros(rows, dtype=torch.int32), e))


@pytest.mark.parametrize("mutate, error, match", [
    (lambda x: x.update(masked_m=torch.tensor([71, 0, 3], dtype=torch.int32)), ValueError, r"\[0, 70\]"),
    (lambda x: x.update(masked_m=x["masked_m"].long()), TypeError, "masked_m"),
    (lambda x: x.update(expected_m=0), ValueError, "expected_m"),
    (lambda x: x.update(d=x["d"][:, :, :8].contiguous()), ValueError, "d must have shape"),
    (lambda x: x.update(b=x["b"][:2].contiguous()), ValueError, r"a must be \[G, M_max, K\]"),
])
def test_masked_bad_arguments(mutate, error, match):
    args = dict(a=torch.randn(3, 70, 40).bfloat16(), b=torch.randn(3, 36, 40).bfloat16(),
                d=torch.full((3, 70, 36), float("nan"), dtype=torch.bfloat16),
                masked_m=torch.tensor([70, 0, 33], dtype=torch.int32), expected_m=40)
    mutate(args)
    with pytest.raises(error, match=match):
        ops.m_grouped_bf16_gemm_nt_masked(**args, backend="interp")


def test_fp8_accepts_mn_major_scales():
    """DeepGEMM's preferred SFA layout is MN-major (stride(-2) == 1): same result."""
    a, b, d, m_indices = operands([3, 50], n=130, k=136)
    (a8, sfa), b8 = G.per_token_cast_to_fp8(a), G.per_block_cast_to_fp8(b)
    ops.m_grouped_fp8_gemm_nt_contiguous((a8, sfa), b8, d, m_indices, backend="interp")
    d2 = torch.full_like(d, float("nan"))
    mn_major = sfa.t().contiguous().t()
    assert mn_major.stride(-2) == 1
    ops.m_grouped_fp8_gemm_nt_contiguous((a8, mn_major), b8, d2, m_indices, backend="interp")
    assert torch.equal(d, d2)


@pytest.mark.parametrize("backend", [b for b in BACKENDS if b.values[0] == "cpu"])
def test_cpu_team_splits_the_n_tiles_only_for_a_skewed_layout(backend, monkeypatch):
    """At 2 threads the masked op asks for one run of N tiles per thread (``n_splits``) when the first
    half of the groups (the first guided chunk) holds over 3% more than half of ``masked_m``; an even
    enough layout keeps one run (the split costs locality), and so does the contiguous op whatever
    its layout.  The results stay correct either way."""
    from kernforge.backends.cpu import threads

    seen = []
    real = ops._kernel
    monkeypatch.setattr(ops, "_kernel", lambda factory, be, **p: seen.append(p) or real(factory, be, **p))
    before = threads.num_threads()
    threads.set_num_threads(2)
    try:
        for rows, split in (([64, 64, 9, 0], 1), ([40, 40, 40, 40], 1)):
            a, b, d, m_indices = operands(rows, n=256, k=64)  # 2 N tiles of 128
            ops.m_grouped_bf16_gemm_nt_contiguous(a, b, d, m_indices, backend=backend)
            check(d, a, b, m_indices)
            assert seen[-1]["n_splits"] == split, rows
        for masked, split in (([60, 5, 0, 3], 2), ([20, 20, 20, 20], 1)):
            a = torch.randn(4, 64, 64).bfloat16()
            b = torch.randn(4, 256, 64).bfloat16()
            d = torch.full((4, 64, 256), float("nan"), dtype=torch.bfloat16)
            ops.m_grouped_bf16_gemm_nt_masked(a, b, d, torch.tensor(masked, dtype=torch.int32), 16, backend=backend)
            for g, r in enumerate(masked):
                want = a[g, :r].double() @ b[g].double().T
                assert (d[g, :r].double() - want).abs().max() <= 2e-2 * max(1.0, float(want.abs().max())) if r else True
                assert torch.isnan(d[g, r:].float()).all()
            assert seen[-1]["n_splits"] == split, masked
    finally:
        threads.set_num_threads(before)


@pytest.mark.parametrize("form", ["float32", "packed"])
def test_fp8_per_row_b_scales_on_a_host(form):
    """DeepGEMM's SM100 1D1D recipe (``b`` scaled per row): as float32 with ``recipe=(1, 1, 128)``, or
    packed UE8M0 (int32, four K blocks a word, the default recipe then), which a host unpacks.  Each
    K block of each row has its own power of two, so a scale read from the wrong row, K block or byte
    is off by a factor of 2 or more."""
    from kernforge.kernels.gemm import pack_ue8m0_to_int

    g = torch.Generator().manual_seed(11)
    m_indices = G.contiguous_layout([3, 50], 32)
    n, k = 40, 600  # five K blocks: two packed words, the second partly padding
    a = (torch.randn(m_indices.numel(), k, generator=g) * 4).to(torch.float8_e4m3fn)
    b = (torch.randn(2, n, k, generator=g) * 4).to(torch.float8_e4m3fn)
    sa = torch.pow(2.0, torch.randint(-9, 10, (a.shape[0], 5), generator=g).float())
    sb = torch.pow(2.0, torch.randint(-9, 10, (2, n, 5), generator=g).float())
    d = torch.full((a.shape[0], n), float("nan"), dtype=torch.bfloat16)
    if form == "packed":
        ops.m_grouped_fp8_gemm_nt_contiguous((a, pack_ue8m0_to_int(sa)), (b, pack_ue8m0_to_int(sb)), d, m_indices,
                                             backend="interp")
    else:
        ops.m_grouped_fp8_gemm_nt_contiguous((a, sa), (b, sb), d, m_indices, recipe=(1, 1, 128), backend="interp")
    a64 = a.double() * sa.double().repeat_interleave(128, -1)[:, :k]
    b64 = b.double() * sb.double().repeat_interleave(128, -1)[..., :k]
    expected = G.reference(a64, b64, m_indices)
    G.assert_close(d, expected, G.error_bound(a64, b64, m_indices, expected, rounding_steps=3))
