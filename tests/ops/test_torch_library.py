"""``torch.ops.kernforge.*``: every kernforge op as a torch custom op.  Each op's eager result
against the plain Python op and an independent reference, its fake implementation against
the real outputs' metadata, ``torch.library.opcheck``, ``torch.compile(fullgraph=True)`` with
0 graph breaks and eager's results, and the refusal of inputs that require grad."""
from __future__ import annotations

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._pytree import tree_map_only

import kernforge.ops as kops
from kernforge.jit.kernel import AutogradError
from kernforge.kernels import grouped_gemm as G
from kernforge.kernels import mla_decode as M
from kernforge.ops import torch_library
from kernforge.ops.topk import TopKValueError

ALIGN = 32  # the grouped GEMM layouts below use a small alignment (as tests/ops/test_grouped_gemm_ops.py)


@pytest.fixture(autouse=True)
def small_alignment():
    old = kops.get_mk_alignment_for_contiguous_layout()
    kops.set_mk_alignment_for_contiguous_layout(ALIGN)
    yield
    kops.set_mk_alignment_for_contiguous_layout(old)


def _gen(seed):
    return torch.Generator().manual_seed(seed)


# ------------------------------------------------------------------ one case per op (and mode)
# each: (op name, args, kwargs, indices of mutated args, reference(args, kwargs) -> checker)


def topk_case(seed, return_value=True, sorted=False):
    x = torch.randn(5, 333, generator=_gen(seed))
    return "topk", (x, 9), dict(return_value=return_value, sorted=sorted), ()


def topk_into_case(seed):
    x = torch.randn(4, 200, generator=_gen(seed))
    out = torch.full((4, 7), -5, dtype=torch.int32)
    return "topk_into", (x, 7, out), {}, (2,)


def gemm_case(seed):
    g = _gen(seed)
    m_idx = G.contiguous_layout([7, 0, 40], ALIGN)
    a = torch.randn(m_idx.numel(), 80, generator=g).bfloat16()
    b = torch.randn(3, 48, 80, generator=g).bfloat16()
    d = torch.full((m_idx.numel(), 48), float("nan")).bfloat16()
    return "m_grouped_bf16_gemm_nt_contiguous", (a, b, d, m_idx), {}, (2,)


def fp8_case(seed):
    _, (a, b, d, m_idx), _, _ = gemm_case(seed)
    return ("m_grouped_fp8_gemm_nt_contiguous",
            (list(G.per_token_cast_to_fp8(a)), list(G.per_block_cast_to_fp8(b)), d, m_idx), {}, (2,))


def masked_case(seed):
    g = _gen(seed)
    a, b = torch.randn(3, 70, 40, generator=g).bfloat16(), torch.randn(3, 36, 40, generator=g).bfloat16()
    d = torch.full((3, 70, 36), float("nan")).bfloat16()
    return "m_grouped_bf16_gemm_nt_masked", (a, b, d, torch.tensor([70, 0, 33], dtype=torch.int32), 40), {}, (2,)


def mla_case(seed, sink=False):
    g = _gen(seed)
    lens = [100, 1, 64]
    kv, table = M.make_cache(lens, 64, 1, 576, g)
    q = torch.randn(3, 1, 16, 576, generator=g).bfloat16()
    kwargs = dict(attn_sink=torch.randn(16, generator=g)) if sink else {}
    return "flash_mla_with_kvcache", (q, kv, table, torch.tensor(lens, dtype=torch.int32), 512), kwargs, ()


CASES = {
    "topk": lambda s: topk_case(s), "topk_no_values": lambda s: topk_case(s, return_value=False),
    "topk_sorted": lambda s: topk_case(s, sorted=True), "topk_into": topk_into_case,
    "bf16_contiguous": gemm_case, "fp8_contiguous": fp8_case, "bf16_masked": masked_case,
    "mla": mla_case, "mla_sink": lambda s: mla_case(s, sink=True),
}


def _clone(args):
    return tree_map_only(torch.Tensor, torch.clone, args)


def _plain(name, args, kwargs):
    """The same call through the plain Python op (the behaviour the torch op must keep)."""
    if name == "topk_into":
        x, k, out = args
        kops.topk(x, k, output_idx=out, indices_type=out.dtype, **kwargs)
        return kops.topk(x, k, **kwargs)[0]
    if name == "m_grouped_fp8_gemm_nt_contiguous":
        a, b, *rest = args
        return getattr(kops, name)(tuple(a), tuple(b), *rest, **kwargs)
    return getattr(kops, name)(*args, **kwargs)


def _check_reference(name, args, kwargs, result):
    """An independent reference for each op's result (torch / float64 math)."""
    if name in ("topk", "topk_into"):
        x, k = args[:2]
        idx = args[2] if name == "topk_into" else result[1]
        values = result if name == "topk_into" else result[0]
        expected = torch.topk(x.double(), k, dim=1).values
        got = x.double().gather(1, idx.long())
        torch.testing.assert_close(got.sort(1).values, expected.sort(1).values, rtol=0, atol=0)
        if values is not None and kwargs.get("return_value", True):
            torch.testing.assert_close(values.double(), got, rtol=0, atol=0)
    elif name == "m_grouped_bf16_gemm_nt_contiguous":
        a, b, d, m_idx = args
        expected = G.reference(a, b, m_idx)
        G.assert_close(d, expected, G.error_bound(a, b, m_idx, expected))
    elif name == "m_grouped_fp8_gemm_nt_contiguous":
        a, b, d, m_idx = args
        a64, b64 = G.dequantize(*a, (1, 128)), G.dequantize(*b, (128, 128))
        expected = G.reference(a64, b64, m_idx)
        G.assert_close(d, expected, G.error_bound(a64, b64, m_idx, expected, rounding_steps=3))
    elif name == "m_grouped_bf16_gemm_nt_masked":
        a, b, d, masked_m, _ = args
        expected = G.reference_masked(a, b, masked_m)
        valid = ~torch.isnan(expected)
        assert torch.isnan(d.float()[~valid]).all(), "rows past masked_m must stay untouched"
        torch.testing.assert_close(d.double()[valid], expected[valid], atol=0.05, rtol=0.02)
    elif name == "flash_mla_with_kvcache":
        q, kv, table, lens, dim_v = args
        sink = kwargs.get("attn_sink")
        out, lse = result
        exp_out, exp_lse = M.reference(q, kv, table, lens, sink, 576 ** -0.5, dim_v, False)
        tol_out, tol_lse = M.tolerances(q, kv, 576 ** -0.5, int(lens.max()), dim_v)
        M.assert_close(out, lse, exp_out, exp_lse, tol_out, tol_lse)
    else:
        raise AssertionError(name)


def _same(x, y):
    """Bitwise equality (NaN payloads included): the op form runs the very same kernels."""
    if x is None or y is None:
        assert x is None and y is None
        return
    assert (x.dtype, x.shape) == (y.dtype, y.shape)
    assert torch.equal(_bits(x), _bits(y))


def _bits(t):
    return t.contiguous().view(torch.uint8) if t.is_floating_point() else t


def _flat_tensors(args):
    return [t for a in args for t in (a if isinstance(a, list) else [a]) if isinstance(t, torch.Tensor)]


# ------------------------------------------------------------------ tests


def test_every_kernforge_op_is_registered():
    helpers = {"FlashMLASchedMeta", "get_stride_requirement", "get_k_alignment_for_contiguous_layout",
               "get_m_alignment_for_contiguous_layout", "get_mk_alignment_for_contiguous_layout",
               "set_mk_alignment_for_contiguous_layout",
               "m_grouped_gemm_fp8_fp8_bf16_nt_contiguous"}  # the legacy alias of the fp8 op
    assert set(kops.__all__) - helpers == set(torch_library.OPS) - {"topk_into"}
    for name, op in torch_library.OPS.items():
        assert getattr(torch.ops.kernforge, name).default is op._opoverload
    assert torch_library.OPS["m_grouped_bf16_gemm_nt_masked"]._opoverload._schema.arguments[2].alias_info.is_write


@pytest.mark.parametrize("case", sorted(CASES))
def test_eager_op_matches_plain_op_and_reference(case):
    name, args, kwargs, mutated = CASES[case](1)
    plain_args = _clone(args)
    got = getattr(torch.ops.kernforge, name)(*args, **kwargs)
    expected = _plain(name, plain_args, kwargs)
    if name == "topk_into":
        _same(got, expected)
        _same(args[2], plain_args[2])
    elif isinstance(got, tuple):
        for g, e in zip(got, expected):
            _same(g, e)
    else:
        assert got is None and expected is None
    untouched = [a for i, a in enumerate(args) if i not in mutated]
    for before, after in zip(_flat_tensors(_clone(untouched)), _flat_tensors(untouched)):
        _same(before, after)
    for i in mutated:
        _same(args[i], plain_args[i])
    _check_reference(name, args, kwargs, got)


@pytest.mark.parametrize("case", sorted(CASES))
def test_fake_impl_matches_real_outputs(case):
    name, args, kwargs, mutated = CASES[case](2)
    op = getattr(torch.ops.kernforge, name).default
    real = op(*_clone(args), **kwargs)
    with FakeTensorMode() as mode:
        fake_args = tree_map_only(torch.Tensor, mode.from_tensor, args)
        fake_kwargs = tree_map_only(torch.Tensor, mode.from_tensor, kwargs)
        fake = op(*fake_args, **fake_kwargs)
    real = real if isinstance(real, tuple) else (real,)
    fake = fake if isinstance(fake, tuple) else (fake,)
    assert len(real) == len(fake)
    for r, f in zip(real, fake):
        if r is None:
            assert f is None
            continue
        assert (f.shape, f.dtype, f.stride(), f.device) == (r.shape, r.dtype, r.stride(), r.device)


@pytest.mark.parametrize("case", sorted(CASES))
def test_opcheck(case):
    name, args, kwargs, _ = CASES[case](3)
    # the schema test compares fp8 inputs before/after with allclose, which CPU torch lacks for fp8;
    # test_eager_op_matches_plain_op_and_reference checks that op's inputs stay unchanged
    utils = ("test_faketensor", "test_aot_dispatch_dynamic", "test_autograd_registration") \
        if case == "fp8_contiguous" else None
    kw = {} if utils is None else {"test_utils": utils}
    result = torch.library.opcheck(getattr(torch.ops.kernforge, name).default, args, kwargs, **kw)
    assert set(result.values()) == {"SUCCESS"}


@pytest.mark.parametrize("case", sorted(CASES))
def test_compiled_fullgraph_matches_eager_with_no_breaks(case):
    name, args, kwargs, mutated = CASES[case](4)
    op = getattr(torch.ops.kernforge, name)

    def f(*a):
        result = op(*a, **kwargs)
        # torch work around the op, so the graph is not the op alone
        if isinstance(result, tuple):
            return tuple(None if r is None else r.float() * 2 for r in result)
        return None if result is None else result.float() * 2

    eager_args, compiled_args = _clone(args), _clone(args)
    eager = f(*eager_args)
    torch._dynamo.reset()
    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")(*compiled_args)
    eager = eager if isinstance(eager, tuple) else (eager,)
    compiled = compiled if isinstance(compiled, tuple) else (compiled,)
    for e, c in zip(eager, compiled):
        _same(e, c)
    for i in mutated:  # functionalization wrote the mutated argument back
        _same(eager_args[i], compiled_args[i])
    explanation = torch._dynamo.explain(f)(*_clone(args))
    assert explanation.graph_break_count == 0 and explanation.graph_count == 1


def test_inductor_fullgraph_topk_and_gemm():
    """The default torch.compile backend (inductor) around two ops and torch work."""
    _, (x, k), _, _ = topk_case(5)
    _, (a, b, d, m_idx), _, _ = gemm_case(5)

    def f(x, a, b, d, m_idx):
        values, idx = torch.ops.kernforge.topk(x * 2, k)
        torch.ops.kernforge.m_grouped_bf16_gemm_nt_contiguous(a, b, d, m_idx)
        return values.sum(1), idx, d.float().relu()

    d_eager, d_compiled = d.clone(), d.clone()
    eager = f(x, a, b, d_eager, m_idx)
    torch._dynamo.reset()
    compiled = torch.compile(f, fullgraph=True)(x, a, b, d_compiled, m_idx)
    torch.testing.assert_close(compiled[0], eager[0])  # inductor's own reduction order: not bitwise
    _same(compiled[1], eager[1])
    _same(compiled[2], eager[2])
    _same(d_eager, d_compiled)


def test_flash_mla_with_op_metadata_placeholder():
    """FlashMLA's two-call form in op form: get_mla_metadata's placeholder tensor stands in
    the tile_scheduler_metadata slot."""
    name, (q, kv, table, lens, dim_v), _, _ = mla_case(6)

    def f(q, kv, table, lens):
        meta, splits = torch.ops.kernforge.get_mla_metadata(lens)
        assert splits is None
        return torch.ops.kernforge.flash_mla_with_kvcache(q, kv, table, lens, dim_v, meta, splits)

    eager = f(q, kv, table, lens)
    torch._dynamo.reset()
    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")(q, kv, table, lens)
    for e, c in zip(eager, compiled):
        _same(e, c)
    _check_reference(name, (q, kv, table, lens, dim_v), {}, eager)
    meta, _ = torch.ops.kernforge.get_mla_metadata(lens)
    assert meta.shape == (0,) and meta.dtype == torch.int32


def test_topk_refuses_output_idx_and_topk_into_takes_it():
    x = torch.randn(3, 50, generator=_gen(7))
    out = torch.empty(3, 4, dtype=torch.int64)
    with pytest.raises(TopKValueError, match="topk_into"):
        torch.ops.kernforge.topk(x, 4, output_idx=out)
    values = torch.ops.kernforge.topk_into(x, 4, out, return_value=False)
    assert values.shape == (3, 0)
    assert torch.equal(x.gather(1, out).sort(1).values, torch.topk(x, 4).values.sort(1).values)


def test_value_fill_default_is_minus_infinity():
    x = torch.randn(2, 10, generator=_gen(8))
    end = torch.tensor([3, 10], dtype=torch.int32)
    values, idx = torch.ops.kernforge.topk(x, 5, end=end)
    assert torch.isneginf(values[0, 3:]).all() and (idx[0, 3:] == 2**31 - 1).all()
    values, _ = torch.ops.kernforge.topk(x, 5, end=end, value_oob_fill_value=7.0)
    assert (values[0, 3:] == 7.0).all()


def test_inputs_that_require_grad_are_refused_before_the_kernel_runs():
    name, (a, b, d, m_idx), _, _ = gemm_case(9)
    b.requires_grad_()
    with pytest.raises(AutogradError, match="argument 'b' requires grad.*inference-only"):
        torch.ops.kernforge.m_grouped_bf16_gemm_nt_contiguous(a, b, d, m_idx)
    assert d.isnan().all(), "the kernel must not have run"
    with torch.no_grad():  # inference with parameters that require grad works
        torch.ops.kernforge.m_grouped_bf16_gemm_nt_contiguous(a, b, d, m_idx)
    _check_reference(name, (a, b.detach(), d, m_idx), {}, None)
    x = torch.randn(2, 30, requires_grad=True)
    with pytest.raises(AutogradError, match="'input'"):
        torch.ops.kernforge.topk(x, 3)
    a8, b8 = G.per_token_cast_to_fp8(a), G.per_block_cast_to_fp8(b.detach())
    sfb = b8[1].clone().requires_grad_()
    with pytest.raises(AutogradError, match="argument 'b'"):  # inside a Tensor[] pair
        torch.ops.kernforge.m_grouped_fp8_gemm_nt_contiguous(list(a8), [b8[0], sfb], d, m_idx)


def test_bad_input_keeps_the_ops_typed_errors_in_eager_and_compiled_calls():
    x = torch.randn(3, 20, dtype=torch.float64)
    with pytest.raises(TypeError, match="bfloat16 or float32"):
        torch.ops.kernforge.topk(x, 2)
    torch._dynamo.reset()
    with pytest.raises(TypeError, match="bfloat16 or float32"):
        torch.compile(lambda x: torch.ops.kernforge.topk(x, 2), fullgraph=True, backend="aot_eager")(x)
