"""``torch.ops.kernforge.*`` for the MoE ops and the dense FP8 GEMMs (issue 14): each op's eager
result bit for bit against the plain Python op and against an independent torch reference, its
fake implementation against the real outputs' metadata, ``torch.library.opcheck``, and
``torch.compile(fullgraph=True)`` with 0 graph breaks and eager's results.  The checks are
tests/ops/test_torch_library.py's; the cases are the MoE layer's ops."""
from __future__ import annotations

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.symbolic_shapes import ShapeEnv
from torch.utils._pytree import tree_map_only

import kernforge.ops as kops
from kernforge.kernels import gemm as DG
from kernforge.kernels import grouped_gemm as G
from kernforge.kernels.grouped_gemm.problems import FP4_DIFF, FP8_DIFF
from kernforge.kernels.moe_permute import reference as permute_ref
from kernforge.kernels.quant import reference as quant_ref
from kernforge.kernels.routing import reference as routing_ref
from kernforge.kernels.swiglu import reference as swiglu_ref
from kernforge.ops import moe as moe_ops
from kernforge.ops import torch_library
from tests.ops.test_torch_library import _clone, _flat_tensors

ALIGN = 32
E, TOPK = 16, 4


@pytest.fixture(autouse=True)
def small_alignment():
    old = kops.get_mk_alignment_for_contiguous_layout()
    kops.set_mk_alignment_for_contiguous_layout(ALIGN)
    yield
    kops.set_mk_alignment_for_contiguous_layout(old)


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def _nan(*shape):
    return torch.full(shape, float("nan"), dtype=torch.bfloat16)


# ------------------------------------------------------------------ the cases
# each builder: seed -> (op name, args, kwargs, mutated arg indices, plain(args, kwargs), check(args, kwargs, got))


def _grouped_operands(seed, rows=(7, 0, 40), n=48, k=128, fp4=True):
    g = _gen(seed)
    m_idx = G.contiguous_layout(list(rows), ALIGN)           # -1 padding rows between the experts
    a = torch.randn(m_idx.numel(), k, generator=g)
    b = torch.randn(len(rows), n, k, generator=g)
    return m_idx, DG.per_token_cast_to_fp8(a), (DG.per_token_cast_to_fp4(b) if fp4 else DG.per_block_cast_to_fp8(b))


def _dequant_b(bq, fp4):
    return DG.dequantize_fp4(*bq) if fp4 else DG.dequantize(*bq, (128, 128))


def fp8_fp4_contiguous_case(seed, psum=False):
    m_idx, a8, b4 = _grouped_operands(seed)
    # PSUM: each group's cumulative end row; group g starts at align(end[g - 1]), the rows between are gaps
    layout = torch.tensor([7, 32, 72], dtype=torch.int32) if psum else m_idx
    d = _nan(m_idx.numel(), 48)

    def check(args, kwargs, got):
        a64, b64 = DG.dequantize(*a8, (1, 128)), DG.dequantize_fp4(*b4)
        expected = G.reference(a64, b64, m_idx)
        G.assert_close(args[2], expected, G.error_bound(a64, b64, m_idx, expected, rounding_steps=3,
                                                        b_rounding=G.FP4_FOLD_ROUNDING))
        assert DG.calc_diff(args[2], expected) < FP4_DIFF
        assert (args[2][m_idx < 0] == 0).all(), "padding (-1) rows are written as zeros"
    return ("m_grouped_fp8_fp4_gemm_nt_contiguous", (list(a8), list(b4), d, layout),
            dict(use_psum_layout=psum), (2,),
            lambda args, kw: kops.m_grouped_fp8_fp4_gemm_nt_contiguous(tuple(args[0]), tuple(args[1]), *args[2:], **kw),
            check)


def masked_case(seed, fp4, name):
    g = _gen(seed)
    masked = torch.tensor([33, 0, 70], dtype=torch.int32)
    a = torch.randn(3, 70, 128, generator=g)
    b = torch.randn(3, 48, 128, generator=g)
    a8 = DG.per_token_cast_to_fp8(a)
    bq = DG.per_token_cast_to_fp4(b) if fp4 else DG.per_block_cast_to_fp8(b)
    d = _nan(3, 70, 48)

    def check(args, kwargs, got):
        expected = G.reference_masked(DG.dequantize(*a8, (1, 128)), _dequant_b(bq, fp4), masked)
        valid = ~torch.isnan(expected)
        assert torch.isnan(args[2].float()[~valid]).all(), "rows past masked_m stay untouched"
        assert DG.calc_diff(args[2].double()[valid], expected[valid]) < (FP4_DIFF if fp4 else FP8_DIFF)
    return (name, (list(a8), list(bq), d, masked, 40), {}, (2,),
            lambda args, kw: getattr(kops, name)(tuple(args[0]), tuple(args[1]), *args[2:], **kw), check)


def dense_case(seed, name):
    g = _gen(seed)
    fp4, layout = name.startswith("fp8_fp4") and name.endswith("nt"), name[-2:]
    m, n, k = 37, 80, 256
    a, b = torch.randn(m, k, generator=g), torch.randn(n, k, generator=g)
    a8 = DG.per_token_cast_to_fp8(a)
    bq = DG.per_token_cast_to_fp4(b) if fp4 else DG.per_block_cast_to_fp8(b)
    a_arg = list(a8) if layout[0] == "n" else [a8[0].t().contiguous(), a8[1].t().contiguous()]
    b_arg = list(bq) if layout[1] == "t" else [bq[0].t().contiguous(), bq[1].t().contiguous()]
    c = torch.randn(m, n, generator=g)
    d = torch.full((m, n), float("nan"))

    def check(args, kwargs, got):
        expected = DG.reference(DG.dequantize(*a8, (1, 128)), _dequant_b(bq, fp4), c.double())
        assert DG.calc_diff(args[2], expected) < (FP4_DIFF if fp4 else FP8_DIFF)
    return (name, (a_arg, b_arg, d, c), {}, (2,),
            lambda args, kw: getattr(kops, name)(tuple(args[0]), tuple(args[1]), *args[2:], **kw), check)


def cast_case(seed, name, use_ue8m0=False):
    x = (torch.randn(5, 3, 320, generator=_gen(seed)) * 3).bfloat16()
    if name == "per_block_cast_to_fp8":
        x = x[0].repeat(50, 1)[:150]   # two row blocks, the second partial
    kwargs = dict(use_ue8m0=use_ue8m0) if name != "per_token_cast_to_fp4" else {}
    ref = {"per_token_cast_to_fp8": lambda: G.per_token_cast_to_fp8(x.float(), use_ue8m0),
           "per_block_cast_to_fp8": lambda: G.per_block_cast_to_fp8(x.float(), use_ue8m0),
           "per_token_cast_to_fp4": lambda: quant_ref.per_token_cast_to_fp4(x.view(-1, x.shape[-1]))}[name]

    def check(args, kwargs, got):
        for g, w in zip(got, ref()):   # the torch references' bytes
            assert torch.equal(_bits(g), _bits(w.reshape(g.shape)))
    return name, (x,), kwargs, (), lambda args, kw: getattr(kops, name)(*args, **kw), check


def topk_gate_case(seed):
    scores = torch.randn(9, E, generator=_gen(seed))
    scores[0, 3] = scores[0, 5]   # a tie: the smaller index ranks first

    def check(args, kwargs, got):
        assert torch.equal(got, routing_ref.topk_gate(scores, TOPK))
    return "topk_gate", (scores, TOPK), {}, (), lambda args, kw: kops.topk_gate(*args, **kw), check


def top2_sum_gate_case(seed):
    g = _gen(seed)
    logits, bias = torch.randn(11, E, generator=g), torch.randn(E, generator=g) * 0.1
    mask = torch.rand(11, generator=g) > 0.2
    unmapped = torch.full((11, TOPK), -7, dtype=torch.int64)
    args = (logits, bias, TOPK, 2, 4, False, 0, 2.5, 0, 1, 0, 1, "sqrtsoftplus", mask, None, None, None, unmapped)

    def check(args, kwargs, got):
        want_unmapped = torch.full((11, TOPK), -7, dtype=torch.int64)
        want = routing_ref.top2_sum_gate(*args[:17], want_unmapped)
        assert torch.equal(got[0], want[0])
        torch.testing.assert_close(got[1], want[1].float(), rtol=2e-6, atol=1e-7)
        assert torch.equal(args[17], want_unmapped), "unmapped_topk_idx is written in place"
    return "top2_sum_gate", args, {}, (17,), lambda args, kw: kops.top2_sum_gate(*args, **kw), check


def normalize_weight_case(seed):
    w = torch.rand(7, 6, generator=_gen(seed))

    def check(args, kwargs, got):
        den, out = routing_ref.normalize_weight(w)
        torch.testing.assert_close(got[0].double(), den, rtol=1e-6, atol=0)
        torch.testing.assert_close(got[1].double(), out, rtol=1e-6, atol=0)
    return "normalize_weight", (w,), {}, (), lambda args, kw: kops.normalize_weight(*args, **kw), check


def hash_gate_case(seed):
    g = _gen(seed)
    logits = torch.randn(10, E, generator=g)
    tid2eid = torch.stack([torch.randperm(E, generator=g)[:TOPK] for _ in range(50)])
    token_ids = torch.randint(0, 50, (10,), generator=g)

    def check(args, kwargs, got):
        idx, w = routing_ref.hash_gate(logits, token_ids, tid2eid, 1.5)
        assert torch.equal(got[0], idx)
        torch.testing.assert_close(got[1].double(), w, rtol=2e-6, atol=0)
    return ("hash_gate", (logits, token_ids, tid2eid, 1.5), {}, (),
            lambda args, kw: kops.hash_gate(*args, **kw), check)


def _routing(seed, t=21):
    g = _gen(seed)
    idx = torch.randint(0, E, (t, TOPK), generator=g)
    idx[torch.rand((t, TOPK), generator=g) < 0.15] = -1    # skipped slots
    idx[0] = -1                                          # a token with no expert
    return idx


def mapping_case(seed, sync):
    idx = _routing(seed)
    bound = (idx.numel() + (64 - 1) * E) // 64 * 64
    n = 0 if sync else bound

    def check(args, kwargs, got):
        want = permute_ref.mapping(idx, E, 64, got[0].numel() if sync else bound)
        for i, (g_, w) in enumerate(zip(got, want)):
            assert torch.equal(g_, w), f"output {i}"
    return ("get_fused_mapping", (idx, E, n, 64), dict(force_no_sync=not sync), (),
            lambda args, kw: moe_ops.get_fused_mapping(*args, **kw)[:7], check)


def _mapped(seed, t=21):
    idx = _routing(seed, t)
    p2e, _, _, t2p, *_ = moe_ops.get_fused_mapping(idx, E, 0, 64)
    return idx, p2e, t2p


def expand_case(seed):
    _, p2e, t2p = _mapped(seed)
    x = torch.randn(21, 96, generator=_gen(seed)).bfloat16()

    def check(args, kwargs, got):
        want = permute_ref.expand(x, t2p, p2e)
        defined = ~torch.isnan(want)
        assert torch.equal(got.double()[defined], want[defined])
    return "expand_to_fused", (x, t2p, p2e), {}, (), lambda args, kw: kops.expand_to_fused(*args, **kw), check


def expand_sf_case(seed, col_major):
    _, p2e, t2p = _mapped(seed)
    data, sf = G.per_token_cast_to_fp8(torch.randn(21, 256, generator=_gen(seed)))
    data = data.float().bfloat16()   # an 8-bit-valued bf16 payload: the op moves rows, any float dtype

    def check(args, kwargs, got):
        for g_, src in zip(got, (data, sf)):
            want = permute_ref.expand(src, t2p, p2e)
            defined = ~torch.isnan(want)
            assert torch.equal(g_.double()[defined], want[defined])
        if col_major:
            assert got[1].stride(0) == 1 and got[1].stride(1) % 4 == 0
    return ("expand_to_fused_with_sf", ([data, sf], 128, t2p, p2e), dict(use_tma_aligned_col_major_sf=col_major), (),
            lambda args, kw: kops.expand_to_fused_with_sf(tuple(args[0]), *args[1:], **kw), check)


def reduce_case(seed, variant):
    g = _gen(seed)
    _, p2e, t2p = _mapped(seed)
    x = torch.randn(p2e.numel(), 96, generator=g).bfloat16()
    w = torch.rand(21, TOPK, generator=g)
    args, kwargs = (x, w, t2p), {}
    x_sf = sf = None
    if variant == "x_sf":
        x_sf = torch.rand(p2e.numel(), generator=g) + 0.5
        args = (x, w, t2p, "", None, x_sf)
    elif variant == "e4m3":
        sf = torch.tensor([0.25])
        args = (x, w, t2p, "e4m3", sf)

    def check(args, kwargs, got):
        want = permute_ref.reduce(x, w, t2p, x_sf, sf)
        if variant == "e4m3":
            want = want.float().to(torch.float8_e4m3fn)
            # float32 sums of bf16 products: one rounding away from the float64 sum at most
            torch.testing.assert_close(got.float(), want.float(), rtol=0.07, atol=2 ** -9)
        else:
            torch.testing.assert_close(got.double(), want, rtol=2 ** -7, atol=1e-6)

    def plain(a, kw):
        if variant == "x_sf":
            return kops.reduce_fused((a[0], a[5]), *a[1:5], **kw)
        return kops.reduce_fused(*a, **kw)
    return "reduce_fused", args, kwargs, (), plain, check


def swiglu_case(seed, quantize):
    g = _gen(seed)
    x = (torch.randn(9, 256, generator=g) * 4).bfloat16()
    w = torch.rand(9, generator=g)

    def check(args, kwargs, got):
        want = swiglu_ref.model_steps(x, w, 7.0)
        if quantize:
            for g_, e in zip(got, kops.per_token_cast_to_fp8(want)):
                assert torch.equal(_bits(g_), _bits(e))
        else:
            assert got[1] is None and torch.equal(_bits(got[0]), _bits(want))
    plain = (lambda a, kw: kops.swiglu(*a, **kw)) if quantize else (lambda a, kw: (kops.swiglu(*a, **kw), None))
    return "swiglu", (x, w, 7.0, quantize), {}, (), plain, check


CASES = {
    "fp8_fp4_contiguous": fp8_fp4_contiguous_case,
    "fp8_fp4_contiguous_psum": lambda s: fp8_fp4_contiguous_case(s, psum=True),
    "fp8_fp4_masked": lambda s: masked_case(s, True, "m_grouped_fp8_fp4_gemm_nt_masked"),
    "fp8_masked": lambda s: masked_case(s, False, "m_grouped_fp8_gemm_nt_masked"),
    **{name: (lambda s, name=name: dense_case(s, name))
       for name in ("fp8_gemm_nt", "fp8_gemm_nn", "fp8_gemm_tn", "fp8_gemm_tt", "fp8_fp4_gemm_nt")},
    "per_token_cast_to_fp8": lambda s: cast_case(s, "per_token_cast_to_fp8"),
    "per_token_cast_to_fp8_ue8m0": lambda s: cast_case(s, "per_token_cast_to_fp8", True),
    "per_block_cast_to_fp8": lambda s: cast_case(s, "per_block_cast_to_fp8"),
    "per_token_cast_to_fp4": lambda s: cast_case(s, "per_token_cast_to_fp4"),
    "topk_gate": topk_gate_case, "top2_sum_gate": top2_sum_gate_case,
    "normalize_weight": normalize_weight_case, "hash_gate": hash_gate_case,
    "mapping_sync": lambda s: mapping_case(s, True), "mapping_no_sync": lambda s: mapping_case(s, False),
    "expand": expand_case, "expand_sf": lambda s: expand_sf_case(s, False),
    "expand_sf_col_major": lambda s: expand_sf_case(s, True),
    "reduce": lambda s: reduce_case(s, ""), "reduce_x_sf": lambda s: reduce_case(s, "x_sf"),
    "reduce_e4m3": lambda s: reduce_case(s, "e4m3"),
    "swiglu": lambda s: swiglu_case(s, False), "swiglu_quantize": lambda s: swiglu_case(s, True),
}
# cases whose output size depends on the data: traced with an unbacked size (a ShapeEnv), not opcheck'd
DYNAMIC = {"mapping_sync"}
FP8_INPUTS = {"fp8_fp4_contiguous", "fp8_fp4_contiguous_psum", "fp8_fp4_masked", "fp8_masked",
              "fp8_gemm_nt", "fp8_gemm_nn", "fp8_gemm_tn", "fp8_gemm_tt", "fp8_fp4_gemm_nt"}


def _bits(t):
    """The bytes of ``t`` (flattened first: a size-1 dim may carry any stride)."""
    return t.flatten().view(torch.uint8) if t.is_floating_point() else t


def _same(x, y):
    """Bitwise equality (NaN payloads included): the op form runs the very same kernels."""
    if x is None or y is None:
        assert x is None and y is None
        return
    assert (x.dtype, x.shape) == (y.dtype, y.shape)
    assert torch.equal(_bits(x), _bits(y))


def _tuple(x):
    return x if isinstance(x, tuple) else (x,)


def _same_outputs(got, want):
    for g, w in zip(_tuple(got), _tuple(want), strict=True):
        _same(g, w)


# ------------------------------------------------------------------ tests


def test_the_moe_ops_are_registered_and_dense_mutations_declared():
    for name in ("m_grouped_fp8_fp4_gemm_nt_contiguous", "m_grouped_fp8_fp4_gemm_nt_masked",
                 "m_grouped_fp8_gemm_nt_masked", "fp8_gemm_nt", "fp8_fp4_gemm_tt", "per_token_cast_to_fp8",
                 "per_block_cast_to_fp8", "per_token_cast_to_fp4", "topk_gate", "top2_sum_gate",
                 "normalize_weight", "hash_gate", "get_fused_mapping", "expand_to_fused",
                 "expand_to_fused_with_sf", "reduce_fused", "swiglu"):
        assert getattr(torch.ops.kernforge, name).default is torch_library.OPS[name]._opoverload
    schema = torch.ops.kernforge.top2_sum_gate.default._schema
    assert [a.name for a in schema.arguments if a.alias_info and a.alias_info.is_write] == ["unmapped_topk_idx"]
    for name in ("fp8_gemm_nt", "fp8_fp4_gemm_nt", "m_grouped_fp8_fp4_gemm_nt_masked"):
        args = getattr(torch.ops.kernforge, name).default._schema.arguments
        assert [a.name for a in args if a.alias_info and a.alias_info.is_write] == ["d"]
    # DeepGEMM's defaults: tn / tt compile M and N
    assert [a.default_value for a in torch.ops.kernforge.fp8_gemm_tn.default._schema.arguments
            if a.name == "compiled_dims"] == ["mn"]


@pytest.mark.parametrize("case", sorted(CASES))
def test_eager_op_matches_plain_op_and_reference(case):
    name, args, kwargs, mutated, plain, check = CASES[case](1)
    plain_args = _clone(args)
    got = getattr(torch.ops.kernforge, name)(*args, **kwargs)
    expected = plain(plain_args, kwargs)
    if expected is None:
        assert got is None
    else:
        _same_outputs(got, expected)
    untouched = [a for i, a in enumerate(args) if i not in mutated]
    for before, after in zip(_flat_tensors(_clone(untouched)), _flat_tensors(untouched)):
        _same(before, after)
    for i in mutated:
        _same(args[i], plain_args[i])
    check(args, kwargs, got)


@pytest.mark.parametrize("case", sorted(CASES))
def test_fake_impl_matches_real_outputs(case):
    name, args, kwargs, _, _, _ = CASES[case](2)
    op = getattr(torch.ops.kernforge, name).default
    real = _tuple(op(*_clone(args), **kwargs))
    shape_env = ShapeEnv() if case in DYNAMIC else None
    with FakeTensorMode(shape_env=shape_env) as mode:
        fake = _tuple(op(*tree_map_only(torch.Tensor, mode.from_tensor, args),
                         **tree_map_only(torch.Tensor, mode.from_tensor, kwargs)))
    assert len(real) == len(fake)
    for i, (r, f) in enumerate(zip(real, fake)):
        if r is None:
            assert f is None
            continue
        assert (f.dtype, f.device, f.dim()) == (r.dtype, r.device, r.dim()), f"output {i}"
        if case in DYNAMIC and i < 3:   # the trimmed rows: an unbacked size
            assert isinstance(f.shape[0], torch.SymInt) and not isinstance(r.shape[0], torch.SymInt)
            continue
        assert (tuple(f.shape), f.stride()) == (tuple(r.shape), r.stride()), f"output {i}"


@pytest.mark.parametrize("case", sorted(set(CASES) - DYNAMIC))
def test_opcheck(case):
    name, args, kwargs, _, _, _ = CASES[case](3)
    # the schema test compares fp8 inputs with allclose, which CPU torch lacks for fp8 (as in
    # test_torch_library.py); test_eager_op_matches_plain_op_and_reference checks them unchanged
    kw = {"test_utils": ("test_faketensor", "test_aot_dispatch_dynamic", "test_autograd_registration")} \
        if case in FP8_INPUTS else {}
    result = torch.library.opcheck(getattr(torch.ops.kernforge, name).default, args, kwargs, **kw)
    assert set(result.values()) == {"SUCCESS"}


@pytest.mark.parametrize("case", sorted(set(CASES) - DYNAMIC))
def test_compiled_fullgraph_matches_eager_with_no_breaks(case):
    name, args, kwargs, mutated, _, _ = CASES[case](4)
    op = getattr(torch.ops.kernforge, name)

    def f(*a):
        result = op(*a, **kwargs)
        # torch work around the op, so the graph is not the op alone
        return tuple(None if r is None else r.float() * 2 for r in _tuple(result)) if result is not None else None

    eager_args, compiled_args = _clone(args), _clone(args)
    eager = f(*eager_args)
    torch._dynamo.reset()
    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")(*compiled_args)
    if eager is None:
        assert compiled is None
    else:
        _same_outputs(compiled, eager)
    for i in mutated:   # functionalization wrote the mutated argument back
        _same(eager_args[i], compiled_args[i])
    explanation = torch._dynamo.explain(f)(*_clone(args))
    assert explanation.graph_break_count == 0 and explanation.graph_count == 1


@torch._dynamo.config.patch(capture_dynamic_output_shape_ops=True)
def test_moe_dispatch_and_combine_compile_as_one_graph():
    """Routing, the synchronising mapping (an unbacked row count: dynamo traces it with
    ``capture_dynamic_output_shape_ops``, as for ``nonzero``), expand, an expert stand-in and
    reduce under torch.compile: one graph, eager's result, the float64 reference's value."""
    g = _gen(5)
    logits, bias = torch.randn(13, E, generator=g), torch.randn(E, generator=g) * 0.1
    x = torch.randn(13, 64, generator=g).bfloat16()

    def f(logits, bias, x):
        idx, w = torch.ops.kernforge.top2_sum_gate(logits, bias, TOPK, 0, 0, False, 0, 1.5, 0, 1, 0, 1,
                                                   "sqrtsoftplus")
        p2e, _, _, t2p, *_ = torch.ops.kernforge.get_fused_mapping(idx, E, 0, 64)
        expanded = torch.ops.kernforge.expand_to_fused(x, t2p, p2e)
        return torch.ops.kernforge.reduce_fused(expanded * 2, w, t2p)

    eager = f(logits, bias, x)
    torch._dynamo.reset()
    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")(logits, bias, x)
    _same(compiled, eager)
    idx, w = routing_ref.top2_sum_gate(logits, bias, TOPK, 0, 0, False, 0, 1.5, 0, 1, 0, 1, "sqrtsoftplus")
    want = (x.double()[:, None, :] * 2 * w[:, :, None].double()).sum(1)
    torch.testing.assert_close(eager.double(), want, rtol=2 ** -7, atol=1e-5)
    explanation = torch._dynamo.explain(f)(logits, bias, x)
    assert explanation.graph_break_count == 0 and explanation.graph_count == 1


def test_bad_input_keeps_the_typed_errors_naming_the_argument():
    with pytest.raises(TypeError, match="scores must be torch.float32"):
        torch.ops.kernforge.topk_gate(torch.randn(3, E, dtype=torch.float64), 2)
    with pytest.raises(ValueError, match="topk_idx values must be in"):
        torch.ops.kernforge.get_fused_mapping(torch.full((2, 2), E, dtype=torch.int64), E, 0, 64)
    with pytest.raises(ValueError, match="x's last dim must be even"):
        torch.ops.kernforge.per_token_cast_to_fp4(torch.randn(2, 33))
    torch._dynamo.reset()
    with pytest.raises(TypeError, match="scores must be torch.float32"):
        torch.compile(lambda s: torch.ops.kernforge.topk_gate(s, 2), fullgraph=True,
                      backend="aot_eager")(torch.randn(3, E, dtype=torch.float64))
