"""DeepGEMM-style dense FP8/FP4 GEMM ops and the FP8 masked / FP8 x FP4 grouped ops: layouts
(nt/nn/tn/tt, MN-major TMA-aligned scales without a copy), recipes and packed UE8M0 scales,
``c`` accumulation, trivial sizes, and typed errors raised before anything runs."""
import pytest
import torch

from kernforge import ops as kops
from kernforge.kernels import gemm as G
from kernforge.kernels import grouped_gemm as GG
from kernforge.kernels.gemm import problems as P
from kernforge.ops import gemm as ops
from kernforge.ops import grouped_gemm as gops
from tests.conftest import backend_param

M, N, K = 37, 160, 264


def operands(m=M, n=N, k=K, seed=0, fp4=False, use_ue8m0=False, per_row_b=False):
    g = torch.Generator().manual_seed(seed)
    a, b = torch.randn(m, k, generator=g), torch.randn(n, k, generator=g)
    a8 = G.per_token_cast_to_fp8(a, use_ue8m0)
    if fp4:
        bq = G.per_token_cast_to_fp4(b, use_ue8m0)
    elif per_row_b:
        bq = G.per_token_cast_to_fp8(b, use_ue8m0)
    else:
        bq = G.per_block_cast_to_fp8(b, use_ue8m0)
    return a8, bq


def expected(a8, bq, fp4=False, per_row_b=False, c=None):
    a64 = G.dequantize(*a8, (1, 128))
    if fp4:
        b64 = G.dequantize_fp4(*bq)
    else:
        b64 = G.dequantize(*bq, (1, 128) if per_row_b else (128, 128))
    return a64, b64, G.reference(a64, b64, c)


def poisoned(m=M, n=N, dtype=torch.bfloat16):
    return torch.full((m, n), float("nan"), dtype=dtype)


def check(d, a8, bq, **kw):
    a64, b64, e = expected(a8, bq, **kw)
    P.assert_close(d, e, P.error_bound(a64, b64, e), P.FP4_DIFF if kw.get("fp4") else P.FP8_DIFF)


def test_four_majors_agree_with_deepgemm_conventions():
    """``nn``/``tn``/``tt`` take the transposed tensors (data and scales), contiguous, as
    DeepGEMM's tests pass them; all four give the same bits."""
    a8, b8 = operands()
    t = lambda x: (x[0].T.contiguous(), x[1].T.contiguous())  # noqa: E731
    results = {}
    for name, args in {"nt": (a8, b8), "nn": (a8, t(b8)), "tn": (t(a8), t(b8)), "tt": (t(a8), b8)}.items():
        d = poisoned()
        getattr(kops, f"fp8_gemm_{name}")(*args, d, backend="interp")
        results[name] = d
    check(results["nt"], a8, b8)
    for name, d in results.items():
        assert torch.equal(d, results["nt"]), name


@pytest.mark.parametrize("backend", [backend_param("cpu")])
def test_tn_on_cpu_with_the_ops_tiles(backend):
    """The op's own (host) tile choice on cpu, with both operands MN-major."""
    a8, b8 = operands()
    d = poisoned()
    ops.fp8_gemm_tn((a8[0].T.contiguous(), a8[1].T.contiguous()), (b8[0].T.contiguous(), b8[1].T.contiguous()),
                    d, backend=backend)
    check(d, a8, b8)


@pytest.mark.parametrize("in_place", [True, False])
def test_c_accumulates(in_place):
    """``c is d``: in place; another ``c``: copied into ``d`` first (left unchanged)."""
    a8, b8 = operands()
    c = torch.randn(M, N, generator=torch.Generator().manual_seed(4))
    d = c.clone() if in_place else poisoned(dtype=torch.float32)
    c_arg = d if in_place else c.clone()
    ops.fp8_gemm_nt(a8, b8, d, c=c_arg, backend="interp")
    a64, b64, e = expected(a8, b8, c=c)
    bound = (K + 4) * 2.0 ** -24 * (a64.abs() @ b64.abs().T + c.double().abs()) + 2.0 ** -23 * e.abs()
    P.assert_close(d, e, bound)
    if not in_place:
        assert torch.equal(c_arg, c)


def test_trivial_sizes():
    a8, b8 = operands(m=0)
    ops.fp8_gemm_nt(a8, b8, poisoned(0), backend="interp")                      # m == 0: nothing
    a8, b8 = operands(n=0)
    d = poisoned(n=0)
    ops.fp8_gemm_nt(a8, b8, d, backend="interp")
    a8, b8 = operands(k=0)
    d = poisoned()
    ops.fp8_gemm_nt(a8, b8, d, backend="interp")                                # k == 0: d = 0
    assert torch.equal(d, torch.zeros_like(d))
    c = torch.randn(M, N).bfloat16()
    ops.fp8_gemm_nt(a8, b8, d, c=c, backend="interp")                           # k == 0: d = c
    assert torch.equal(d, c)


def test_one_row():
    a8, b8 = operands(m=1, n=384, k=384)
    d = poisoned(1, 384)
    ops.fp8_gemm_nt(a8, b8, d, backend="interp")
    check(d, a8, b8)


def test_tma_aligned_mn_major_sfa_goes_in_without_a_copy(monkeypatch):
    """DeepGEMM's required SFA layout reaches the kernel as is; a row-major SFA is converted
    (by get_mn_major_tma_aligned_tensor) to the same result."""
    a8, b8 = operands()
    d_row = poisoned()
    ops.fp8_gemm_nt(a8, b8, d_row, backend="interp")
    aligned = G.get_mn_major_tma_aligned_tensor(a8[1])
    assert aligned.stride() == (1, 40)

    def no_copy(sf):
        raise AssertionError("the aligned scales were copied")
    monkeypatch.setattr(ops, "get_mn_major_tma_aligned_tensor", no_copy)
    d = poisoned()
    ops.fp8_gemm_nt((a8[0], aligned), b8, d, backend="interp")
    assert torch.equal(d, d_row)


def test_per_row_recipe_and_packed_ue8m0_scales():
    """recipe (1, 1, 128) takes per-row b scales; UE8M0 powers of two packed four per int32
    (DeepGEMM's SM100 form, per-row by default) give the same bits as their float32 form."""
    a8, b8 = operands(use_ue8m0=True, per_row_b=True)
    d = poisoned()
    ops.fp8_gemm_nt(a8, b8, d, recipe=(1, 1, 128), backend="interp")
    check(d, a8, b8, per_row_b=True)
    d_packed = poisoned()
    ops.fp8_gemm_nt((a8[0], G.pack_ue8m0_to_int(a8[1])), (b8[0], G.pack_ue8m0_to_int(b8[1])), d_packed,
                    disable_ue8m0_cast=True, backend="interp")
    assert torch.equal(d_packed, d)


def test_fp8_fp4():
    a8, b4 = operands(k=256, fp4=True)
    d = poisoned()
    ops.fp8_fp4_gemm_nt(a8, b4, d, recipe_a=(1, 128), recipe_b=(1, 32), backend="interp")
    check(d, a8, b4, fp4=True)
    a8u, b4u = operands(k=256, fp4=True, use_ue8m0=True)
    d = poisoned()
    ops.fp8_fp4_gemm_nt(a8u, b4u, d, backend="interp")
    d_packed = poisoned()
    ops.fp8_fp4_gemm_nt(a8u, (b4u[0], G.pack_ue8m0_to_int(b4u[1])), d_packed, backend="interp")
    assert torch.equal(d_packed, d)


def test_aliases():
    assert kops.fp8_gemm_nt is kops.fp8_fp4_gemm_nt and kops.fp8_gemm_tt is kops.fp8_fp4_gemm_tt
    assert kops.m_grouped_fp8_gemm_nt_masked is kops.m_grouped_fp8_fp4_gemm_nt_masked
    assert kops.fp8_m_grouped_gemm_nt_masked is kops.m_grouped_gemm_fp8_fp8_bf16_nt_masked \
        is kops.m_grouped_fp8_fp4_gemm_nt_masked
    assert kops.m_grouped_fp8_fp4_gemm_nt_contiguous is kops.m_grouped_fp8_gemm_nt_contiguous
    a8, b8 = operands(m=4, n=16, k=128)
    d, d_legacy = poisoned(4, 16), poisoned(4, 16)
    ops.fp8_gemm_nt(a8, b8, d, backend="interp")
    ops.gemm_fp8_fp8_bf16_nt(a8, b8, d_legacy, backend="interp")
    assert torch.equal(d, d_legacy)


def _dense_args():
    a8, b8 = operands()
    return dict(a=a8, b=b8, d=poisoned())


def _set(key, value):
    return lambda x: x.update({key: value(x) if callable(value) else value})


@pytest.mark.parametrize("mutate, error, match", [
    (_set("a", lambda x: x["a"][0]), TypeError, "a must be a .data, scale_factor. pair"),
    (_set("a", lambda x: (x["a"][0].float(), x["a"][1])), TypeError, "a must be torch.float8_e4m3fn"),
    (_set("a", lambda x: (x["a"][0].view(torch.int8), x["a"][1])), NotImplementedError, "FP4 activations"),
    (_set("b", lambda x: (x["b"][0].bfloat16(), x["b"][1])), TypeError, "b must be"),
    (_set("a", lambda x: (torch.empty(M, 2 * K, dtype=torch.float8_e4m3fn)[:, ::2], x["a"][1])), ValueError,
     "a must be K-major"),
    (_set("b", lambda x: (x["b"][0][:, :128].contiguous(), x["b"][1])), ValueError, "K mismatch"),
    (_set("d", torch.full((M, N), float("nan"), dtype=torch.float16)), TypeError, "d must be torch.bfloat16"),
    (_set("d", lambda x: poisoned(M, N + 1)), ValueError, r"d must have shape \(37, 160\)"),
    (_set("d", lambda x: poisoned(N, M).T), ValueError, "d must be contiguous"),
    (_set("c", torch.zeros(M, N)), TypeError, "c must have d's dtype"),
    (_set("c", torch.zeros(M, 2, dtype=torch.bfloat16)), ValueError, "c must have shape"),
    (_set("a", lambda x: (x["a"][0], x["a"][1].half())), TypeError, "sfa must be a float32 or packed"),
    (_set("a", lambda x: (x["a"][0], x["a"][1][:, :2])), ValueError, r"sfa must have shape \(37, 3\)"),
    (_set("b", lambda x: (x["b"][0], x["b"][1][:1])), ValueError, r"sfb must have shape \(2, 3\)"),
    (_set("a", lambda x: (x["a"][0], torch.zeros(M, 2, dtype=torch.int32))), ValueError,
     r"sfa \(packed UE8M0, 4 per int32\) must have shape \(37, 1\)"),
    (_set("recipe", (1, 128, 128)), None, None),
    (lambda x: x.update(recipe=(1, 128, 128), recipe_a=(1, 128)), ValueError, "recipe or recipe_a"),
    (_set("recipe_a", (1, 128)), ValueError, "go together"),
    (_set("recipe", (1, 64, 128)), NotImplementedError, "not supported"),
    (_set("recipe", (128, 128)), ValueError, "gran_m, gran_n, gran_k"),
    (_set("compiled_dims", "xy"), ValueError, "compiled_dims"),
    (_set("disable_ue8m0_cast", 1), TypeError, "disable_ue8m0_cast"),
])
def test_bad_dense_arguments_raise_before_anything_runs(mutate, error, match):
    args = _dense_args()
    mutate(args)
    if error is None:                                     # the control: this mutation is valid
        ops.fp8_gemm_nt(**args, backend="interp")
        assert not torch.isnan(args["d"].float()).any()
        return
    with pytest.raises(error, match=match):
        ops.fp8_gemm_nt(**args, backend="interp")
    assert torch.isnan(args["d"].float()).all(), "nothing may run before the checks pass"


def test_bad_fp4_arguments():
    a8, b4 = operands(k=256, fp4=True)
    with pytest.raises(NotImplementedError, match="MN-major FP4"):
        ops.fp8_fp4_gemm_nn(a8, (b4[0].T.contiguous(), b4[1].T.contiguous()), poisoned(), backend="interp")
    with pytest.raises(NotImplementedError, match="not supported for FP4"):
        ops.fp8_fp4_gemm_nt(a8, b4, poisoned(), recipe=(1, 128, 128), backend="interp")
    with pytest.raises(ValueError, match=r"sfb must have shape \(160, 8\)"):
        ops.fp8_fp4_gemm_nt(a8, (b4[0], b4[1][:, :4]), poisoned(), backend="interp")
    with pytest.raises(ValueError, match="K mismatch"):
        ops.fp8_fp4_gemm_nt(a8, (b4[0][:, :64].contiguous(), b4[1][:, :4]), poisoned(), backend="interp")


# ---------------------------------------------------------------- grouped: FP4 contiguous, masked


@pytest.fixture
def alignment_32():
    old = gops.get_mk_alignment_for_contiguous_layout()
    gops.set_mk_alignment_for_contiguous_layout(32)
    yield 32
    gops.set_mk_alignment_for_contiguous_layout(old)


def grouped_operands(group_rows, n=96, k=256, seed=0):
    g = torch.Generator().manual_seed(seed)
    m_indices = GG.contiguous_layout(group_rows, 32)
    a = torch.randn(m_indices.numel(), k, generator=g).masked_fill((m_indices < 0)[:, None], 0.0)
    b = torch.randn(len(group_rows), n, k, generator=g)
    return G.per_token_cast_to_fp8(a), G.per_token_cast_to_fp4(b, use_ue8m0=True), m_indices


def check_grouped(d, a8, b4, m_indices):
    a64, b64 = G.dequantize(*a8, (1, 128)), G.dequantize_fp4(*b4)
    e = GG.reference(a64, b64, m_indices)
    GG.assert_close(d, e, GG.error_bound(a64, b64, m_indices, e, rounding_steps=3))


@pytest.mark.parametrize("backend", ["interp"])
def test_fp4_contiguous_index_layout(alignment_32, backend):
    a8, b4, m_indices = grouped_operands([7, 0, 40])
    d = poisoned(m_indices.numel(), 96)
    kops.m_grouped_fp8_fp4_gemm_nt_contiguous(a8, b4, d, m_indices, backend=backend)
    check_grouped(d, a8, b4, m_indices)
    assert torch.all(d[m_indices < 0] == 0)


def test_fp4_contiguous_psum_layout_and_packed_scales(alignment_32):
    """PSUM ends [7, 32, 72]: starts 0, 32, 32; the gap rows hold garbage in a and come out 0."""
    a8, b4, m_indices = grouped_operands([7, 0, 40])
    a_data = a8[0].clone()
    a_data[7:32] = torch.tensor(400.0).to(torch.float8_e4m3fn)
    ends = torch.tensor([7, 32, 72], dtype=torch.int32)
    d = poisoned(m_indices.numel(), 96)
    packed = (b4[0], G.pack_ue8m0_to_int(b4[1]))
    kops.m_grouped_fp8_fp4_gemm_nt_contiguous((a_data, a8[1]), packed, d, ends, use_psum_layout=True,
                                              backend="interp")
    check_grouped(d, a8, b4, m_indices)
    assert torch.all(d[7:32] == 0)


@pytest.mark.parametrize("mutate, error, match", [
    (lambda x: x.update(b=(x["b"][0][:, :, :64].contiguous(), x["b"][1])), ValueError, "K mismatch"),
    (lambda x: x.update(b=(x["b"][0], x["b"][1][:, :, :4])), ValueError, "sfb must have shape"),
    (lambda x: x.update(recipe_a=(1, 128), recipe_b=(128, 128)), NotImplementedError, "not supported"),
    (lambda x: x.update(grouped_layout=x["grouped_layout"][:-1]), ValueError, "grouped_layout must have shape"),
    (lambda x: x.update(d=x["d"].float()), TypeError, "d must be torch.bfloat16"),
    (lambda x: x.update(expected_m_for_psum_layout=8), ValueError, "only valid with use_psum_layout"),
])
def test_fp4_contiguous_bad_arguments(alignment_32, mutate, error, match):
    a8, b4, m_indices = grouped_operands([7, 0, 40])
    args = dict(a=a8, b=b4, d=poisoned(m_indices.numel(), 96), grouped_layout=m_indices)
    mutate(args)
    with pytest.raises(error, match=match):
        kops.m_grouped_fp8_fp4_gemm_nt_contiguous(**args, backend="interp")
    assert torch.isnan(args["d"].float()).all()


def masked_operands(fp4, groups=3, max_m=40, n=96, k=256, seed=0):
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(groups, max_m, k, generator=g)
    b = torch.randn(groups, n, k, generator=g)
    bq = G.per_token_cast_to_fp4(b) if fp4 else G.per_block_cast_to_fp8(b)
    return G.per_token_cast_to_fp8(a), bq


@pytest.mark.parametrize("fp4", [False, True], ids=["fp8", "fp4"])
def test_masked_op_leaves_rows_past_masked_m_untouched(fp4):
    a8, bq = masked_operands(fp4)
    masked_m = torch.tensor([40, 0, 17], dtype=torch.int32)
    d = torch.full((3, 40, 96), float("nan"), dtype=torch.bfloat16)
    kops.m_grouped_fp8_fp4_gemm_nt_masked(a8, bq, d, masked_m, 24, backend="interp")
    a64 = G.dequantize(*a8, (1, 128))
    b64 = G.dequantize_fp4(*bq) if fp4 else G.dequantize(*bq, (128, 128))
    e = GG.reference_masked(a64, b64, masked_m)
    valid = ~torch.isnan(e)
    assert torch.isnan(d.float()[~valid]).all(), "rows past masked_m must stay untouched"
    for grp, rows in enumerate(masked_m.tolist()):
        GG.assert_close(d[grp, :rows], e[grp, :rows],
                        GG.error_bound(a64[grp, :rows], b64[grp:grp + 1], torch.zeros(rows, dtype=torch.int32),
                                       e[grp, :rows], rounding_steps=3,
                                       b_rounding=GG.FP4_FOLD_ROUNDING if fp4 else 0.0))
    assert G.calc_diff(d.double()[valid], e[valid]) < (P.FP4_DIFF if fp4 else P.FP8_DIFF)


def test_masked_op_takes_per_group_tma_aligned_scales_as_is(monkeypatch):
    a8, b8 = masked_operands(False)
    masked_m = torch.tensor([40, 3, 17], dtype=torch.int32)
    d_row = torch.full((3, 40, 96), float("nan"), dtype=torch.bfloat16)
    kops.m_grouped_fp8_gemm_nt_masked(a8, b8, d_row, masked_m, 24, backend="interp")
    aligned = G.get_mn_major_tma_aligned_tensor(a8[1])
    monkeypatch.setattr(ops, "get_mn_major_tma_aligned_tensor", lambda sf: pytest.fail("copied"))
    d = torch.full_like(d_row, float("nan"))
    kops.m_grouped_fp8_gemm_nt_masked((a8[0], aligned), b8, d, masked_m, 24, backend="interp")
    assert torch.equal(d.isnan(), d_row.isnan()) and torch.equal(d.nan_to_num(), d_row.nan_to_num())


@pytest.mark.parametrize("mutate, error, match", [
    (lambda x: x.update(masked_m=torch.tensor([41, 0, 3], dtype=torch.int32)), ValueError, r"\[0, 40\]"),
    (lambda x: x.update(masked_m=torch.tensor([-1, 0, 3], dtype=torch.int32)), ValueError, r"\[0, 40\]"),
    (lambda x: x.update(masked_m=x["masked_m"].long()), TypeError, "masked_m"),
    (lambda x: x.update(masked_m=x["masked_m"][:2]), TypeError, "masked_m"),
    (lambda x: x.update(expected_m=0), ValueError, "expected_m"),
    (lambda x: x.update(b=(x["b"][0][:2].contiguous(), x["b"][1][:2])), ValueError, r"a must be \[G, M_max, K\]"),
    (lambda x: x.update(d=x["d"][:, :, :8].contiguous()), ValueError, "d must have shape"),
    (lambda x: x.update(a=(x["a"][0], x["a"][1][:, :, :1])), ValueError, "sfa must have shape"),
    (lambda x: x.update(b=(x["b"][0], x["b"][1][:, :, :1])), ValueError, "sfb must have shape"),
    (lambda x: x.update(recipe=(1, 1, 128)), ValueError, r"sfb must have shape \(3, 96, 2\)"),  # per-row b scales
    (lambda x: x.update(recipe=(1, 64, 128)), NotImplementedError, "recipe"),
    (lambda x: x.update(a=(x["a"][0].bfloat16(), x["a"][1])), TypeError, "a must be torch.float8_e4m3fn"),
])
def test_masked_bad_arguments(mutate, error, match):
    a8, b8 = masked_operands(False)
    args = dict(a=a8, b=b8, d=torch.full((3, 40, 96), float("nan"), dtype=torch.bfloat16),
                masked_m=torch.tensor([40, 0, 17], dtype=torch.int32), expected_m=24)
    mutate(args)
    with pytest.raises(error, match=match):
        kops.m_grouped_fp8_fp4_gemm_nt_masked(**args, backend="interp")
    assert torch.isnan(args["d"].float()).all()


def test_ops_compile_the_choosers_configuration(monkeypatch):
    """The dense op's kernel parameters are config.choose's for its call (majors, recipe
    granularity and output dtype passed through), and the masked op's choose_fp8_masked's."""
    seen = []
    monkeypatch.setattr(ops, "_kernel", lambda factory, backend, **p: seen.append(p) or (lambda *args: None))
    a8, b8 = operands(m=80)
    ops.fp8_gemm_tt((a8[0].T.contiguous(), a8[1].T.contiguous()), b8, poisoned(80, N, torch.float32),
                    backend="cuda-emu")
    assert seen[-1] == G.config.choose("cuda", N, K, 80, accumulate=False, out_dtype="float32", a_major="mn",
                                       b_major="k", gran_n=128)
    assert seen[-1]["block_M"] == 128 and seen[-1]["threads"] == 256
    monkeypatch.setattr(gops, "_kernel", lambda factory, backend, **p: seen.append(p) or (lambda *args: None))
    a8, bq = masked_operands(True)
    kops.m_grouped_fp8_fp4_gemm_nt_masked(a8, bq, torch.zeros(3, 40, 96, dtype=torch.bfloat16),
                                          torch.tensor([1, 2, 3], dtype=torch.int32), 200, backend="interp")
    assert seen[-1] == GG.config.choose_fp8_masked("interp", 3, 96, 256, 200)
