"""MLA decode kernel: interp and cpu backends against the float64 torch reference, on
random paged caches whose unused pages and tail positions are NaN."""
import math

import pytest
import torch
from hypothesis import given, settings, strategies as st

import kernforge
from kernforge.kernels import mla_decode as M
from kernforge.kernels.check import run_spec
from tests.conftest import backend_param, host_backends

BACKENDS = host_backends("interp", "cpu")


def run_case(backend, seqlens, heads=4, heads_kv=1, seq_q=1, dim=48, dim_v=32, page=16,
             block_N=16, block_H=4, causal=False, sink=True, seed=0, sink_values=None):
    g = torch.Generator().manual_seed(seed)
    kv, table = M.make_cache(seqlens, page, heads_kv, dim, g)
    q = torch.randn(len(seqlens), seq_q, heads, dim, generator=g).bfloat16()
    attn_sink = torch.randn(heads, generator=g) if sink else torch.full((heads,), -math.inf)
    if sink_values is not None:
        attn_sink = torch.tensor(sink_values, dtype=torch.float32)
    lens = torch.tensor(seqlens, dtype=torch.int32)
    kernel = kernforge.compile(M.mla_decode, backend=backend, out_idx=[-2, -1], heads=heads,
                               heads_kv=heads_kv, seq_q=seq_q, dim=dim, dim_v=dim_v,
                               page_size=page, causal=causal, block_N=block_N, block_H=block_H)
    scale = dim ** -0.5
    out, lse = kernel(q, kv.view(-1, heads_kv * dim), table, lens, attn_sink, scale)
    exp_out, exp_lse = M.reference(q, kv, table, lens, attn_sink, scale, dim_v, causal)
    tol_out, tol_lse = M.tolerances(q, kv, scale, max(seqlens), dim_v)
    M.assert_close(out, lse, exp_out, exp_lse, tol_out, tol_lse)
    return out, lse, exp_out, exp_lse


# (case, also on cpu?): every case runs on interp; the cpu backend compiles each distinct
# kernel with g++ (seconds), so it takes the cases that between them use every feature.
CASES = [
    (dict(seqlens=[1]), False),                                        # one key, batch 1
    (dict(seqlens=[37, 16, 5], block_H=4, heads=6), True),             # tail tiles; heads not a multiple of block_H; sink
    (dict(seqlens=[40, 9], heads=8, heads_kv=2, block_H=8), False),    # GQA: two latent heads
    (dict(seqlens=[33, 1, 0], seq_q=2, causal=True, block_H=8), True), # MTP causal; a row with nothing visible; empty request
    (dict(seqlens=[50], block_N=8, sink=False), False),                # tiles smaller than a page; no sink
]


@pytest.mark.parametrize("backend, case", [backend_param(b, c) for c, on_cpu in CASES for b in ("interp", "cpu")
                                           if b == "interp" or on_cpu])
def test_matches_reference(backend, case):
    run_case(backend, **case)


@pytest.mark.parametrize("backend", BACKENDS)
def test_real_flashmla_dims(backend):
    """d = 576 (512 latent + 64 RoPE), value = first 512 dims, page 64, 16 heads in one block."""
    run_case(backend, [70, 130], heads=16, dim=576, dim_v=512, page=64, block_N=64, block_H=16)


def test_v4_dims_value_is_whole_key():
    """V4: d = dim_v = 512 (no separate RoPE tail: the value is all of the key)."""
    run_case("interp", [65], heads=4, dim=512, dim_v=512, page=64, block_N=32, block_H=4)


def test_sink_extremes():
    """+inf sink zeroes a head's output, -inf is a no-op, lse never includes the sink."""
    out, lse, _, exp_lse = run_case("interp", [20], heads=3, block_H=4,
                                    sink_values=[math.inf, -math.inf, 0.5])
    assert torch.all(out[:, :, 0] == 0)
    nosink, _, _, _ = run_case("interp", [20], heads=3, block_H=4, sink=False)
    assert torch.equal(out[:, :, 1], nosink[:, :, 1])


def test_empty_rows_are_zero_with_infinite_lse():
    out, lse, _, _ = run_case("interp", [0, 3], seq_q=2, causal=True, block_H=8)
    assert torch.all(out[0] == 0) and torch.all(torch.isposinf(lse[0]))
    # request 1 has 3 keys and 2 query tokens: token 0 sees keys 0..1, token 1 all three
    assert torch.all(torch.isfinite(lse[1]))


def test_backends_agree():
    """interp and cpu, same inputs: both within the bound of the reference and of each other."""
    if "cpu" not in BACKENDS:
        pytest.skip("cpu backend not available")
    case = dict(seqlens=[45, 7, 0], seq_q=2, causal=True, block_H=8)   # same kernel as a cpu case
    a = run_case("interp", **case)
    b = run_case("cpu", **case)
    assert (a[0].double() - b[0].double()).abs().max() <= 2 * 2.0 ** -8 * 5
    fin = torch.isfinite(a[1])
    assert torch.equal(fin, torch.isfinite(b[1]))
    assert (a[1][fin] - b[1][fin]).abs().max() < 1e-4


def test_check_detects_a_wrong_element():
    out, lse, exp_out, exp_lse = run_case("interp", [30], heads=4)
    bad = out.clone()
    bad[0, 0, 1, 3] += 0.25
    with pytest.raises(AssertionError, match="output differs"):
        M.assert_close(bad, lse, exp_out, exp_lse, 0.05, 1e-4)


@settings(max_examples=12, deadline=None)
@given(seqlens=st.lists(st.integers(0, 70), min_size=1, max_size=3),
       heads=st.sampled_from([1, 3, 4]), seq_q=st.integers(1, 2), causal=st.booleans(),
       block_N=st.sampled_from([8, 16]), seed=st.integers(0, 2**16))
def test_property_random_shapes(seqlens, heads, seq_q, causal, block_N, seed):
    run_case("interp", seqlens, heads=heads, seq_q=seq_q, causal=causal, block_N=block_N,
             block_H=4, seed=seed)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("spec", [M.SPEC, M.SPEC_SPARSE], ids=lambda s: s.name)
def test_registered_small_problem(backend, spec):
    r = run_spec(spec, backend, "small", repeat=0)
    assert r.verified, r.error


def _listing(pf):
    """The IR listing without its ``attrs`` line (which only echoes the factory's arguments)."""
    return {line.strip() for line in repr(pf.ir).splitlines() if not line.strip().startswith("attrs ")}


def test_each_parameter_shapes_the_kernel_and_its_name():
    """Changing one compile-time parameter changes the kernel where that parameter acts, and
    its name (the CPU entry symbol and the compile cache's artifact are named after it, so two
    specialisations must never share one)."""
    base = dict(heads=8, seq_q=2, causal=True, block_N=32, block_H=16)
    ref = M.mla_decode(**base)
    assert ref.ir.name == "mla_decode_h8_kv1_q2_d576_v512_p64_causal_N32_H16_s2_bfloat16_t256"
    changes = {  # parameter: (new value, text only the new kernel's listing has)
        "heads": (16, "grid(batch, 2, 1)"),                            # 32 query rows: two blocks of 16
        "heads_kv": (2, "global bfloat16[num_tokens, 1152] KV"),       # two latent heads side by side
        "seq_q": (1, "global bfloat16[batch, 1, 8, 576] Q"),
        "dim": (512, "global bfloat16[batch, 2, 8, 512] Q"),
        "dim_v": (256, "alloc shared bfloat16[32, 256] KV_shared"),
        "page_size": (32, "block_table[bx, ((t * 32) // 32)]"),
        "causal": (False, "limit[i_2] = cache_seqlens[bx]"),           # every key visible
        "num_splits": (2, "grid(batch, 1, 2)"),
        "block_N": (16, "alloc shared bfloat16[16, 512] KV_shared"),
        "block_H": (8, "alloc shared bfloat16[8, 512] Q_shared"),
        "num_stages": (1, "num_stages=1):"),
        "threads": (128, "threads=128 as (bx, by, bz)"),
    }
    names = {ref.ir.name}
    for param, (value, text) in changes.items():
        pf = M.mla_decode(**dict(base, **{param: value}))
        assert any(text in line for line in _listing(pf) - _listing(ref)), param
        assert pf.ir.name not in names, f"{param}={value} gives a kernel named like another: {pf.ir.name}"
        names.add(pf.ir.name)


def test_bad_parameters_are_rejected():
    with pytest.raises(ValueError, match="multiple of heads_kv"):
        M.mla_decode(heads=6, heads_kv=4)
    with pytest.raises(ValueError, match="divide page_size"):
        M.mla_decode(heads=4, block_N=48)
    with pytest.raises(ValueError, match="dim_v"):
        M.mla_decode(heads=4, dim=64, dim_v=128)
    with pytest.raises(ValueError, match="V3.2 format"):
        M.mla_decode_sparse(heads=4, topk=8, dim=512, dim_v=512, fp8_kv=True)
    with pytest.raises(ValueError, match="num_splits"):
        M.mla_decode(heads=4, num_splits=0)


def run_sparse(backend, b=2, s_q=1, heads=4, dim=48, dim_v=32, topk=20, num_tokens=60,
               block_N=8, block_H=4, seed=0, topk_length=None, empty_every=4):
    g = torch.Generator().manual_seed(seed)
    kv = torch.randn(num_tokens, dim, generator=g).bfloat16()
    indices = torch.randint(0, num_tokens, (b, s_q, topk), generator=g, dtype=torch.int32)
    indices[..., ::empty_every] = -1
    lengths = torch.tensor(topk_length if topk_length is not None else [topk] * b, dtype=torch.int32)
    for i, n in enumerate(lengths.tolist()):
        indices[i, :, n:] = 2**30                    # past topk_length: never read
    q = torch.randn(b, s_q, heads, dim, generator=g).bfloat16()
    sink = torch.randn(heads, generator=g)
    kernel = kernforge.compile(M.mla_decode_sparse, backend=backend, out_idx=[-2, -1], heads=heads,
                               topk=topk, seq_q=s_q, dim=dim, dim_v=dim_v, block_N=block_N,
                               block_H=block_H)
    out, lse = kernel(q, kv, indices, lengths, sink, dim ** -0.5)
    exp_out, exp_lse = M.reference_sparse(q, kv, indices, lengths, sink, dim ** -0.5, dim_v)
    tol_out, tol_lse = M.tolerances(q, kv, dim ** -0.5, topk, dim_v)
    M.assert_close(out, lse, exp_out, exp_lse, tol_out, tol_lse)
    return out, lse


@pytest.mark.parametrize("backend", BACKENDS)
def test_sparse_matches_reference(backend):
    """topk not a multiple of the tile, empty slots, a request with topk_length 0, MTP tokens,
    heads not a multiple of block_H, garbage past topk_length."""
    out, lse = run_sparse(backend, b=3, s_q=2, heads=6, topk=21, topk_length=[21, 0, 9])
    assert torch.all(out[1] == 0) and torch.all(torch.isposinf(lse[1]))


def test_sparse_real_dims():
    run_sparse("interp", heads=16, dim=576, dim_v=512, topk=70, num_tokens=200, block_N=32,
               block_H=16)


@settings(max_examples=10, deadline=None)
@given(topk=st.integers(1, 40), heads=st.sampled_from([1, 4, 5]), s_q=st.integers(1, 2),
       empty_every=st.integers(1, 5), seed=st.integers(0, 2**16))
def test_sparse_property(topk, heads, s_q, empty_every, seed):
    run_sparse("interp", s_q=s_q, heads=heads, topk=topk, empty_every=empty_every, seed=seed)


@settings(max_examples=8, deadline=None)
@given(seqlens=st.lists(st.integers(0, 90), min_size=1, max_size=3), num_splits=st.integers(2, 5),
       seq_q=st.integers(1, 2), causal=st.booleans(), seed=st.integers(0, 2**16))
def test_split_kv_and_combine(seqlens, num_splits, seq_q, causal, seed):
    """Split-KV partials merged by the combine kernel equal one-pass attention (interp)."""
    g = torch.Generator().manual_seed(seed)
    heads, dim, dim_v, page = 3, 48, 32, 16
    kv, table = M.make_cache(seqlens, page, 1, dim, g)
    q = torch.randn(len(seqlens), seq_q, heads, dim, generator=g).bfloat16()
    sink, lens = torch.randn(heads, generator=g), torch.tensor(seqlens, dtype=torch.int32)
    split = kernforge.compile(M.mla_decode, backend="interp", out_idx=[-2, -1], heads=heads,
                              seq_q=seq_q, dim=dim, dim_v=dim_v, page_size=page, causal=causal,
                              num_splits=num_splits, block_N=8, block_H=4)
    combine = kernforge.compile(M.mla_decode_combine, backend="interp", out_idx=[-2, -1],
                                heads=heads, num_splits=num_splits, seq_q=seq_q, dim_v=dim_v,
                                block_R=4)
    o_part, lse_part = split(q, kv.view(-1, dim), table, lens, sink, dim ** -0.5)
    out, lse = combine(o_part, lse_part, sink)
    exp_out, exp_lse = M.reference(q, kv, table, lens, sink, dim ** -0.5, dim_v, causal)
    tol_out, tol_lse = M.tolerances(q, kv, dim ** -0.5, max(seqlens), dim_v)
    M.assert_close(out, lse, exp_out, exp_lse, tol_out, tol_lse)


def test_run_spec_builds_split_and_combine_for_cut_requests():
    """`kernforge demo` and the tools run a spec with its own ``build`` as the op runs it:
    the scheduled kernel's "demo" problem cuts a request, and only the combine writes it."""
    from kernforge.kernels.registry import get

    res = run_spec(get("mla_decode_scheduled"), "cpu", "demo", repeat=1, seed=3)
    assert res.verified, res.error
