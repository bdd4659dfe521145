"""The dense-layer kernels (norm, rope, hadamard, hyper_connection, embedding) themselves:
each registry spec verified against its float64 reference on interp, cpu and cuda-emu
(outputs poisoned with NaN by the specs), edge shapes drawn by hypothesis on the
interpreter (1 token, odd counts, ragged tiles), and the CUDA sources compiled for
sm_90a with nvcc at the full V4-Flash sizes (no GPU needed)."""
from __future__ import annotations

import shutil
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

import kernforge
from kernforge.kernels import embedding as E
from kernforge.kernels import hadamard as H
from kernforge.kernels import hyper_connection as HC
from kernforge.kernels import norm as N
from kernforge.kernels import rope as R
from kernforge.kernels.check import run_spec
from kernforge.kernels.hyper_connection.problems import mixer
from kernforge.kernels.registry import get
from tests.conftest import host_backends

SPECS = ("rms_norm", "rotary_embedding", "hadamard", "hc_pre", "hc_post", "hc_head", "embedding")
F64 = dict(rtol=1e-5, atol=2e-5)


def _close(got, want, **tol):
    assert not torch.isnan(got).any(), "an output element was never written (NaN poison left)"
    torch.testing.assert_close(got.double(), want.double(), **(tol or F64))


# cpu runs every kernel through the ops (tests/ops/test_layer_ops.py), with the op's configurations
@pytest.mark.parametrize("backend", host_backends("interp", "cuda-emu"))
@pytest.mark.parametrize("name", SPECS)
def test_spec_small_problem_matches_float64_reference(name, backend):
    result = run_spec(get(name), backend, "small", repeat=1)
    assert result.verified, result.error


@pytest.mark.parametrize("name", SPECS)
def test_torch_peers_compute_what_the_kernel_computes(name):
    """``problems.peers``: the model's function on the spec's inputs (gpu_check's timing column)
    must agree with the spec's float64 reference, or the timing compares different work."""
    import importlib

    spec = get(name)
    params = spec.problems["small"].params
    inputs = spec.make_inputs(params, 0, "cpu")
    (fn,) = importlib.import_module(f"kernforge.kernels.{spec.family}.problems").peers(spec, inputs, params).values()
    got = fn()
    got = got[0] if isinstance(got, tuple) else torch.stack(got, 1).flatten(1) if isinstance(got, list) else got
    torch.testing.assert_close(got.reshape(spec.reference(inputs, params)[0].shape).double(),
                               spec.reference(inputs, params)[0].double(), **F64)


def _interp(factory, out_idx, **params):
    return kernforge.compile(factory, backend="interp", out_idx=out_idx, **params)


@settings(max_examples=8)
@given(rows=st.integers(1, 9), dim=st.sampled_from([1, 7, 32, 96]), block_rows=st.sampled_from([1, 2, 4]),
       weighted=st.booleans(), dtype=st.sampled_from(["float32", "bfloat16"]))
@example(rows=1, dim=7, block_rows=4, weighted=True, dtype="float32")
@example(rows=5, dim=96, block_rows=2, weighted=False, dtype="float32")
def test_rms_norm_edge_shapes(rows, dim, block_rows, weighted, dtype):
    g = torch.Generator().manual_seed(rows * 100 + dim)
    tdt = getattr(torch, dtype)
    x = (torch.randn(rows, dim, generator=g) * 4).to(tdt)
    w = torch.rand(dim, generator=g) + 0.5
    k = _interp(N.rms_norm, [2], dim=dim, dtype=dtype, weight_dtype="float32" if weighted else None,
                block_rows=block_rows)
    got = k(x, w if weighted else torch.empty(1), 1e-6)
    want = N.reference(x, w if weighted else None, 1e-6)
    _close(got, want, **({} if dtype == "float32" else dict(rtol=2.0 ** -7, atol=1e-2)))


@settings(max_examples=8)
@given(tokens=st.integers(1, 6), heads=st.integers(1, 5), dims=st.sampled_from([(2, 2), (8, 4), (96, 32), (40, 40)]),
       block_heads=st.sampled_from([1, 2, 4]), inverse=st.booleans(), pos_dtype=st.sampled_from(["int32", "int64"]))
def test_rope_edge_shapes(tokens, heads, dims, block_heads, inverse, pos_dtype):
    head_dim, rope_dim = dims
    g = torch.Generator().manual_seed(tokens * 10 + heads)
    cos, sin = R.angle_tables(rope_dim, 50, 10000.0 ** (-torch.arange(0, rope_dim, 2, dtype=torch.float64) / rope_dim))
    x = torch.randn(tokens, heads, head_dim, generator=g)
    pos = torch.randint(0, 50, (tokens,), generator=g).to(getattr(torch, pos_dtype))
    k = _interp(R.rotary_embedding, [4], head_dim=head_dim, rope_dim=rope_dim, position_dtype=pos_dtype,
                inverse=inverse, block_heads=block_heads)
    _close(k(x, pos, cos, sin), R.reference(x, pos, cos, sin, inverse))


def test_rope_inverse_undoes_the_rotation():
    cos, sin = R.angle_tables(32, 64, 10000.0 ** (-torch.arange(0, 32, 2, dtype=torch.float64) / 32))
    x, pos = torch.randn(5, 3, 96), torch.tensor([0, 63, 7, 7, 1])
    fwd = _interp(R.rotary_embedding, [4], head_dim=96, rope_dim=32)
    inv = _interp(R.rotary_embedding, [4], head_dim=96, rope_dim=32, inverse=True)
    back = inv(fwd(x, pos, cos, sin), pos, cos, sin)
    torch.testing.assert_close(back, x, rtol=1e-5, atol=1e-5)
    assert torch.equal(fwd(x, pos, cos, sin)[:, :, :64], x[:, :, :64]), "the nope dims are copied exactly"
    assert torch.equal(fwd(x, torch.zeros(5, dtype=torch.int64), cos, sin), x), "position 0 is the identity"


@settings(max_examples=8)
@given(rows=st.integers(1, 7), log_n=st.integers(0, 8), block_rows=st.sampled_from([1, 2, 4]),
       dtype=st.sampled_from(["float32", "bfloat16"]))
def test_hadamard_edge_shapes(rows, log_n, block_rows, dtype):
    n = 1 << log_n
    x = torch.randn(rows, n, generator=torch.Generator().manual_seed(rows + n)).to(getattr(torch, dtype))
    got = _interp(H.hadamard, [1], n=n, dtype=dtype, block_rows=block_rows)(x)
    _close(got, H.reference(x), **({} if dtype == "float32" else dict(rtol=2.0 ** -7, atol=2e-2)))


@pytest.mark.parametrize("backend", host_backends("interp", "cpu"))
def test_hadamard_is_the_models_butterflies_bit_for_bit(backend):
    """The Stockham stages add the operands of the model's stages in the same order, so the
    float32 result is the model's `primitives.hadamard` exactly (not merely within
    tolerance), at every size up to 256, odd row counts (a ragged last block) included."""
    from kernforge.model.primitives import hadamard as model_hadamard

    for log_n in range(9):
        n = 1 << log_n
        x = torch.randn(37, n, generator=torch.Generator().manual_seed(n)) * 100
        k = kernforge.compile(H.hadamard, backend=backend, **H.choose(backend, n))
        out = torch.full_like(x, float("nan"))
        k(x, out)
        assert torch.equal(out, model_hadamard(x)), f"n={n}"


def test_hadamard_is_an_involution_and_rejects_other_sizes():
    x = torch.randn(3, 128)
    k = _interp(H.hadamard, [1], n=128)
    torch.testing.assert_close(k(k(x)), x, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="power of two"):
        H.hadamard(n=96)


def _hc_inputs(tokens, m, d, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, m * d, generator=g)
    fn, scale, base = mixer(g, (2 + m) * m, m * d, 3)
    return g, x, fn, scale, base


@settings(max_examples=8)
@given(tokens=st.integers(1, 5), m=st.sampled_from([1, 2, 4]), d=st.sampled_from([8, 24]),
       block_tokens=st.sampled_from([1, 2, 4, 32]), iters=st.sampled_from([1, 3, 20]))
def test_hc_pre_edge_shapes(tokens, m, d, block_tokens, iters):
    _, x, fn, scale, base = _hc_inputs(tokens, m, d, tokens * 7 + m)
    k = _interp(HC.hc_pre, [4, 5, 6], hc_mult=m, dim=d, sinkhorn_iters=iters, block_tokens=block_tokens,
                block_k=8)
    u, post, comb = k(x, fn, scale, base, 1e-6, 1e-6)
    want = HC.reference.hc_pre(x.view(tokens, m, d), fn, scale, base, iters, 1e-6, 1e-6)
    for got, w in zip((u, post, comb), want):
        _close(got, w)


def test_sinkhorn_makes_the_combination_near_doubly_stochastic():
    _, x, fn, scale, base = _hc_inputs(6, 4, 16, 3)
    _, _, comb = _interp(HC.hc_pre, [4, 5, 6], hc_mult=4, dim=16, sinkhorn_iters=200, block_k=16)(
        x, fn, scale, base, 1e-6, 1e-6)
    ones = torch.ones(6, 4)
    assert (comb > 0).all()
    torch.testing.assert_close(comb.sum(-2), ones, atol=1e-5, rtol=0)  # columns: the last normalisation
    torch.testing.assert_close(comb.sum(-1), ones, atol=1e-4, rtol=0)  # rows: converged after 200 rounds


@settings(max_examples=6)
@given(tokens=st.integers(1, 5), m=st.sampled_from([1, 2, 4]), d=st.sampled_from([8, 40]),
       block_tokens=st.sampled_from([1, 2, 4]), block_d=st.sampled_from([8, 16, 64]))
def test_hc_post_and_head_edge_shapes(tokens, m, d, block_tokens, block_d):
    g, x, _, _, _ = _hc_inputs(tokens, m, d, tokens + 11 * m)
    y = torch.randn(tokens, d, generator=g)
    post = 2 * torch.rand(tokens, m, generator=g)
    comb = torch.rand(tokens, m, m, generator=g)
    got = _interp(HC.hc_post, [4], hc_mult=m, dim=d, block_tokens=block_tokens, block_d=block_d)(y, x, post, comb)
    _close(got, HC.reference.hc_post(y, x.view(tokens, m, d), post, comb).flatten(1))
    fn, scale, base = mixer(g, m, m * d, 1)
    u = _interp(HC.hc_head, [4], hc_mult=m, dim=d, block_tokens=block_tokens, block_k=8)(x, fn, scale, base,
                                                                                       1e-6, 1e-6)
    _close(u, HC.reference.hc_head(x.view(tokens, m, d), fn, scale, base, 1e-6, 1e-6))


@settings(max_examples=8)
@given(tokens=st.integers(1, 9), vocab=st.integers(1, 40), dim=st.sampled_from([1, 5, 64, 100]),
       block_cols=st.sampled_from([16, 64, 256]), index_dtype=st.sampled_from(["int32", "int64"]))
def test_embedding_edge_shapes(tokens, vocab, dim, block_cols, index_dtype):
    g = torch.Generator().manual_seed(tokens * vocab + dim)
    w = torch.randn(vocab, dim, generator=g)
    ids = torch.randint(0, vocab, (tokens,), generator=g).to(getattr(torch, index_dtype))
    got = _interp(E.embedding, [2], dim=dim, index_dtype=index_dtype, block_cols=block_cols)(ids, w)
    assert torch.equal(got, w[ids.long()])


def test_embedding_kernel_writes_zero_rows_for_ids_outside_the_table():
    """The kernel's own guard (the op refuses such ids before launch; a graph replay cannot)."""
    w = torch.randn(10, 128)
    ids = torch.tensor([3, -1, 10, 9, 2**31 - 1, 0], dtype=torch.int64)
    for backend in ("interp", "cpu"):  # cpu: the op's configuration, so the build is shared with the op tests
        got = kernforge.compile(E.embedding, backend=backend, out_idx=[2], **E.choose(backend, 128))(ids, w)
        assert torch.equal(got, E.reference(ids, w))
        assert torch.equal(got[1:3], torch.zeros(2, 128)) and torch.equal(got[[0, 3]], w[[3, 9]])


@pytest.mark.parametrize("factory,params,message", [
    (N.rms_norm, dict(dim=8, dtype="float16"), "dtype must be one of"),
    (R.rotary_embedding, dict(head_dim=8, rope_dim=10), "rope_dim must be even"),
    (R.rotary_embedding, dict(head_dim=8, rope_dim=3), "rope_dim must be even"),
    (HC.hc_pre, dict(hc_mult=4, dim=8, sinkhorn_iters=0, block_k=8), "sinkhorn_iters"),
    (HC.hc_pre, dict(hc_mult=4, dim=8, sinkhorn_iters=2, block_k=64), "must divide"),
    (E.embedding, dict(dim=8, index_dtype="uint8"), "index_dtype"),
])
def test_factories_reject_bad_parameters(factory, params, message):
    with pytest.raises(ValueError, match=message):
        factory(**params)


@pytest.mark.nvcc
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not on PATH")
def test_cuda_sources_compile_for_sm90a_at_full_size():
    """The op's CUDA configurations at V4-Flash's sizes (hidden 4096, head_dim 512, rope 64, index
    head 128, M = 4): every kernel builds with nvcc, no spills, shared memory within a block's."""
    from kernforge.backends.cuda.backend import build_report

    # the specs' "demo" problems are these configurations (so tests/backends/test_cuda_compile.py
    # reuses the builds from the JIT cache), plus the weightless per-head norm
    kernels = [get(name).factory(**get(name).problems["demo"].params) for name in SPECS]
    kernels.append(N.rms_norm(**N.choose("cuda", 512, "bfloat16", None)))
    with ThreadPoolExecutor(max_workers=2) as pool:
        reports = list(pool.map(lambda pf: (pf.name, build_report(pf.ir, "sm_90a")), kernels))
    for name, report in reports:
        assert report["arch"] == "sm_90a", name
        assert report["spill_stores"] == 0, (name, report)
        assert report["shared_bytes"] <= 227 * 1024, (name, report)
