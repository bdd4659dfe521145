"""The ops' shared edge-case policy (docs/ops.md): NaN inside the valid range propagates as
torch does (MLA, grouped GEMM) or raises the op's typed NaN error naming the row (topk,
tests/ops/test_topk.py), never comes back as "nothing to attend" (0, lse = +inf); NaN
outside the valid range is never read; flags that cannot apply raise; an empty batch
returns empty results of the right shapes without launching anything."""
import pytest
import torch

from kernforge.kernels import grouped_gemm as G
from kernforge.kernels import mla_decode as M
from kernforge.ops import grouped_gemm as gg
from kernforge.ops import mla
from kernforge.ops.topk import topk as topk_op
from tests.conftest import host_backends

BACKENDS = host_backends("interp", "cpu")
ALL_HOST = host_backends()                       # + cuda-emu: the CUDA source's own NaN path
SCALE = 576 ** -0.5


def assert_nan_aware_close(got, want, tol):
    """NaN exactly where the float64 torch reference has NaN; elsewhere within ``tol``
    (and +-inf where the reference is infinite)."""
    got, want = got.cpu().double(), want.cpu().double()
    assert torch.equal(torch.isnan(got), torch.isnan(want)), (
        f"NaN at {torch.isnan(got).nonzero().tolist()[:6]}, expected at "
        f"{torch.isnan(want).nonzero().tolist()[:6]}")
    ok = ~torch.isnan(want)
    assert torch.equal(torch.isinf(got[ok]), torch.isinf(want[ok]))
    fin = ok & ~torch.isinf(want)
    if fin.any():
        err = (got[fin] - want[fin]).abs().max().item()
        assert err <= tol, f"differs by {err:.3g} > {tol:.3g}"


def dense_case(seqlens, heads=4, s_q=1, seed=0):
    g = torch.Generator().manual_seed(seed)
    kv, table = M.make_cache(seqlens, 64, 1, 576, g)          # NaN past every cache_seqlens
    q = torch.randn(len(seqlens), s_q, heads, 576, generator=g).bfloat16()
    return q, kv, table, torch.tensor(seqlens, dtype=torch.int32)


def token_row(kv, table, request, pos):
    """The cache row ``[576]`` holding token ``pos`` of ``request`` (a view: writes stick)."""
    return kv[int(table[request, pos // 64]), pos % 64, 0]


def check_dense(q, kv, table, lens, causal=False, **kw):
    out, lse = mla.flash_mla_with_kvcache(q, kv, table, lens, 512, causal=causal, **kw)
    exp_out, exp_lse = M.reference(q, kv, table, lens, None, SCALE, 512, causal)
    tol_out, tol_lse = M.tolerances(q.nan_to_num(0), kv, SCALE, int(lens.max()), 512)
    assert_nan_aware_close(out, exp_out, tol_out)
    assert_nan_aware_close(lse, exp_lse, tol_lse)
    return out, lse


@pytest.mark.parametrize("splits", [1, 3])
@pytest.mark.parametrize("backend", ALL_HOST)
def test_mla_nan_in_a_visible_kv_row_propagates(backend, splits):
    """The issue's case: a NaN inside cache_seqlens made the request 0 / lse +inf (one
    split) or silently dropped the split holding it (split-KV).  Now the request's every
    head is NaN, as torch's softmax gives, and the other requests are untouched."""
    q, kv, table, lens = dense_case([130, 3, 40])
    token_row(kv, table, 0, 5)[10] = float("nan")          # value part, a full tile
    token_row(kv, table, 2, 39)[560] = float("nan")        # RoPE part, last token of a partial tile
    out, lse = check_dense(q, kv, table, lens, backend=backend, num_kv_splits=splits)
    for r in (0, 2):
        assert torch.isnan(out[r].float()).all() and torch.isnan(lse[r]).all()
    assert not torch.isnan(out[1].float()).any() and torch.isfinite(lse[1]).all()


@pytest.mark.parametrize("backend", BACKENDS)
def test_mla_nan_in_q_poisons_only_its_row(backend):
    q, kv, table, lens = dense_case([70, 20], heads=4, s_q=2)
    q[1, 0, 2, 7] = float("nan")
    out, lse = check_dense(q, kv, table, lens, backend=backend)
    nan_rows = torch.isnan(lse).nonzero().tolist()
    assert nan_rows == [[1, 2, 0]]                          # request 1, head 2, query token 0
    assert torch.isnan(out[1, 0, 2].float()).all()


def test_mla_nan_in_a_causally_hidden_key_acts_like_torch():
    """Query token 0 cannot see the last key, whose value holds a NaN: its probability is
    0, and torch's ``softmax @ V`` gives 0 * NaN = NaN in that value column only (lse
    stays finite); query token 1 sees it and is NaN throughout."""
    q, kv, table, lens = dense_case([50], heads=2, s_q=2)
    token_row(kv, table, 0, 49)[3] = float("nan")
    out, lse = check_dense(q, kv, table, lens, causal=True, backend="interp")
    assert torch.isfinite(lse[0, :, 0]).all() and torch.isnan(lse[0, :, 1]).all()
    assert torch.isnan(out[0, 0, :, 3].float()).all()
    assert not torch.isnan(out[0, 0, :, :3].float()).any()


def test_mla_nan_past_cache_seqlens_is_never_read():
    """make_cache fills every position past cache_seqlens (and the unowned page) with NaN:
    none of it may show up."""
    q, kv, table, lens = dense_case([65, 1, 128])
    assert torch.isnan(kv.float()).any()
    out, lse = mla.flash_mla_with_kvcache(q, kv, table, lens, 512, backend="interp")
    assert not torch.isnan(out.float()).any() and not torch.isnan(lse).any()


@pytest.mark.parametrize("backend", BACKENDS)
def test_mla_sparse_nan_propagates_only_from_selected_rows(backend):
    g = torch.Generator().manual_seed(1)
    kv = torch.randn(3, 64, 1, 576, generator=g).bfloat16()
    q = torch.randn(2, 2, 8, 576, generator=g).bfloat16()
    indices = torch.randint(0, 150, (2, 2, 40), generator=g, dtype=torch.int32)
    topk_length = torch.tensor([40, 33], dtype=torch.int32)
    indices[1, 1, 33:] = 170                                # past topk_length: never read
    flat = kv.view(-1, 576)
    flat[170, 9] = float("nan")
    flat[int(indices[0, 1, 4]), 100] = float("nan")        # selected by request 0, token 1
    out, lse = mla.flash_mla_with_kvcache(q, kv, None, None, 512, indices=indices,
                                          topk_length=topk_length, backend=backend)
    exp_out, exp_lse = M.reference_sparse(q, flat, indices, topk_length, None, SCALE, 512)
    tol_out, tol_lse = M.tolerances(q, kv.nan_to_num(0), SCALE, 40, 512)
    assert_nan_aware_close(out, exp_out, tol_out)
    assert_nan_aware_close(lse, exp_lse, tol_lse)
    assert torch.isnan(lse[0, :, 1]).all() and not torch.isnan(lse[1]).any()


def test_fp8_flag_with_a_bf16_cache_raises_on_the_dense_path():
    """FlashMLA's dense decode has no FP8 cache; kernforge used to ignore the flag."""
    q, kv, table, lens = dense_case([20])
    with pytest.raises(TypeError, match=r"is_fp8_kvcache=True, but k_cache is torch.bfloat16"):
        mla.flash_mla_with_kvcache(q, kv, table, lens, 512, is_fp8_kvcache=True, backend="interp")
    with pytest.raises(NotImplementedError, match="sparse"):
        mla.flash_mla_with_kvcache(q, kv.view(torch.uint8), table, lens, 512, is_fp8_kvcache=True,
                                   backend="interp")


# ---------------------------------------------------------------- grouped GEMM


@pytest.mark.parametrize("backend", BACKENDS)
def test_grouped_gemm_nan_propagates_like_torch_matmul(backend):
    """NaN in a row of ``a`` poisons that row of ``d``, NaN in ``b[g]`` a column of the
    rows of expert g; a padding row (-1) is 0 whatever ``a`` holds (the documented
    padding rule)."""
    old = gg.get_mk_alignment_for_contiguous_layout()
    gg.set_mk_alignment_for_contiguous_layout(32)
    try:
        g = torch.Generator().manual_seed(2)
        ids = G.contiguous_layout([7, 40], 32)                 # rows 7..31 and 72..95 are padding
        a = torch.randn(ids.numel(), 80, generator=g).bfloat16()
        b = torch.randn(2, 48, 80, generator=g).bfloat16()
        a[3, 11] = float("nan")
        a[10, 0] = float("nan")                                 # a padding row
        b[1, 5, 70] = float("nan")
        d = torch.full((ids.numel(), 48), 7.0, dtype=torch.bfloat16)
        gg.m_grouped_bf16_gemm_nt_contiguous(a, b, d, ids, backend=backend)
        expected = G.reference(a, b, ids)
        clean = G.reference(a.nan_to_num(0), b.nan_to_num(0), ids)
        bound = G.error_bound(a.nan_to_num(0), b.nan_to_num(0), ids, clean)
        nan = torch.isnan(expected)
        assert torch.equal(torch.isnan(d.double()), nan)
        assert nan[3].all() and nan[32:72, 5].all() and nan.sum() == 48 + 40
        assert ((d.double() - expected).abs()[~nan] <= bound[~nan]).all()
        assert (d[7:32] == 0).all()
    finally:
        gg.set_mk_alignment_for_contiguous_layout(old)


def test_grouped_gemm_fp8_nan_scale_propagates():
    old = gg.get_mk_alignment_for_contiguous_layout()
    gg.set_mk_alignment_for_contiguous_layout(32)
    try:
        g = torch.Generator().manual_seed(3)
        ids = G.contiguous_layout([3, 50], 32)
        a = torch.randn(ids.numel(), 136, generator=g).bfloat16()
        b = torch.randn(2, 130, 136, generator=g).bfloat16()
        (a8, sfa), b8 = G.per_token_cast_to_fp8(a), G.per_block_cast_to_fp8(b)
        sfa[40, 1] = float("nan")
        d = torch.zeros(ids.numel(), 130, dtype=torch.bfloat16)
        gg.m_grouped_fp8_gemm_nt_contiguous((a8, sfa), b8, d, ids, backend="interp")
        nan_rows = torch.isnan(d.float()).any(dim=1).nonzero()[:, 0].tolist()
        assert nan_rows == [40] and torch.isnan(d[40].float()).all()
    finally:
        gg.set_mk_alignment_for_contiguous_layout(old)


@pytest.mark.parametrize("backend", BACKENDS)
def test_grouped_gemm_masked_nan_only_within_masked_m(backend):
    g = torch.Generator().manual_seed(4)
    a = torch.randn(2, 40, 32, generator=g).bfloat16()
    b = torch.randn(2, 24, 32, generator=g).bfloat16()
    masked_m = torch.tensor([10, 40], dtype=torch.int32)
    a[0, 4, 1] = float("nan")                                   # within masked_m[0]
    a[0, 20, 1] = float("nan")                                  # past masked_m[0]: never read
    d = torch.full((2, 40, 24), 7.0, dtype=torch.bfloat16)
    gg.m_grouped_bf16_gemm_nt_masked(a, b, d, masked_m, expected_m=16, backend=backend)
    assert torch.isnan(d[0, 4].float()).all()
    assert torch.isnan(d.float()).sum() == 24
    assert (d[0, 10:] == 7.0).all()


# ---------------------------------------------------------------- empty batches


@pytest.fixture
def no_launch(monkeypatch):
    """Compiling anything fails the test: an empty batch must not reach a kernel."""
    import importlib

    def refuse(*a, **k):
        raise AssertionError("an empty batch compiled a kernel")

    for mod in ("kernforge.ops.topk", "kernforge.ops.mla", "kernforge.ops.grouped_gemm"):
        monkeypatch.setattr(importlib.import_module(mod), "_compiled", refuse)


def test_empty_batches_return_empty_results_in_every_op(no_launch):
    # topk: (0, k) values and indices
    v, i = topk_op(torch.randn(0, 50), 16, backend="cpu")
    assert v.shape == (0, 16) and i.shape == (0, 16) and i.dtype == torch.int64
    # MLA dense: b = 0, and s_q = 0 / h_q = 0 with a real batch
    kv = torch.randn(2, 64, 1, 576).bfloat16()
    table = torch.zeros(0, 1, dtype=torch.int32)
    meta, _ = mla.get_mla_metadata()
    out, lse = mla.flash_mla_with_kvcache(torch.randn(0, 2, 16, 576).bfloat16(), kv, table,
                                          torch.zeros(0, dtype=torch.int32), 512, meta,
                                          backend="cpu")
    assert out.shape == (0, 2, 16, 512) and out.dtype == torch.bfloat16
    assert lse.shape == (0, 16, 2) and lse.dtype == torch.float32
    assert not meta.have_initialized
    one = torch.zeros(1, 1, dtype=torch.int32), torch.tensor([5], dtype=torch.int32)
    for shape, lse_shape in (((1, 0, 16, 576), (1, 16, 0)), ((1, 1, 0, 576), (1, 0, 1))):
        out, lse = mla.flash_mla_with_kvcache(torch.randn(shape).bfloat16(), kv, *one, 512,
                                              backend="cpu")
        assert out.shape == shape[:3] + (512,) and lse.shape == lse_shape
    # MLA sparse: b = 0
    out, lse = mla.flash_mla_with_kvcache(torch.randn(0, 1, 8, 576).bfloat16(), kv, None, None,
                                          512, indices=torch.zeros(0, 1, 4, dtype=torch.int32),
                                          backend="cpu")
    assert out.shape == (0, 1, 8, 512) and lse.shape == (0, 8, 1)
    # grouped GEMM: M = 0 (contiguous), G = 0 and M_max = 0 (masked): d is empty too
    d = torch.empty(0, 8, dtype=torch.bfloat16)
    gg.m_grouped_bf16_gemm_nt_contiguous(torch.empty(0, 16).bfloat16(), torch.randn(2, 8, 16).bfloat16(),
                                         d, torch.empty(0, dtype=torch.int32), backend="cpu")
    for groups, max_m in ((0, 5), (2, 0)):
        gg.m_grouped_bf16_gemm_nt_masked(torch.empty(groups, max_m, 16).bfloat16(),
                                         torch.randn(groups, 8, 16).bfloat16(),
                                         torch.empty(groups, max_m, 8, dtype=torch.bfloat16),
                                         torch.zeros(groups, dtype=torch.int32), expected_m=4,
                                         backend="cpu")


def test_empty_batches_are_still_checked():
    """An empty batch skips the launch, not the argument checks."""
    kv = torch.randn(2, 64, 1, 576).bfloat16()
    with pytest.raises(TypeError, match="q must be bfloat16"):
        mla.flash_mla_with_kvcache(torch.randn(0, 1, 16, 576), kv, torch.zeros(0, 1, dtype=torch.int32),
                                   torch.zeros(0, dtype=torch.int32), 512, backend="interp")
    with pytest.raises(ValueError, match="head_dim_v"):
        mla.flash_mla_with_kvcache(torch.randn(0, 1, 16, 576).bfloat16(), kv,
                                   torch.zeros(0, 1, dtype=torch.int32),
                                   torch.zeros(0, dtype=torch.int32), 0, backend="interp")
    with pytest.raises(TypeError, match="masked_m"):
        gg.m_grouped_bf16_gemm_nt_masked(torch.empty(0, 5, 16).bfloat16(), torch.randn(0, 8, 16).bfloat16(),
                                         torch.empty(0, 5, 8, dtype=torch.bfloat16),
                                         torch.zeros(0, dtype=torch.int64), expected_m=4, backend="interp")
