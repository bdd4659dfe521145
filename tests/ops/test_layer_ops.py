"""kernforge.ops.layers against the model's own torch functions (kernforge/model) and float64
references: the tiny model's real parameters and rope tables, ragged positions, leading shapes,
bf16, empty inputs, hypothesis over token counts, and a typed error naming the argument for each
kind of bad input (raised before any launch)."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kernforge import ops
from kernforge.kernels import hadamard as H
from kernforge.kernels import hyper_connection as HC
from kernforge.kernels import norm as N
from kernforge.kernels import rope as R
from kernforge.model import block, random_model, tiny
from kernforge.model.primitives import RMSNorm, hadamard, rms_normalize
from kernforge.ops.layers import LayerIndexError, LayerTypeError, LayerValueError

F32 = dict(rtol=1e-5, atol=2e-5)
BF16 = dict(rtol=2.0 ** -7, atol=2e-2)


@pytest.fixture(scope="module")
def model():
    return random_model(tiny(), seed=3)


def _streams(tokens, m, d, seed, dtype=torch.float32):
    return torch.randn(tokens, m, d, generator=torch.Generator().manual_seed(seed)).to(dtype)


# ---------------------------------------------------------------- RMSNorm


def test_rms_norm_matches_the_model_norms(model):
    x = torch.randn(2, 7, model.config.hidden_size) * 3
    norm = model.layers[0].attn_norm
    torch.testing.assert_close(ops.rms_norm(x, norm.weight, norm.eps), norm(x), **F32)
    torch.testing.assert_close(ops.rms_norm(x, norm.weight, norm.eps), N.reference(x, norm.weight, norm.eps).float(),
                               **F32)
    q = torch.randn(3, 5, model.config.num_attention_heads, model.config.head_dim)  # the per-head q norm
    torch.testing.assert_close(ops.rms_norm(q, None, 1e-6), rms_normalize(q, 1e-6), **F32)


def test_rms_norm_bf16_dtypes_follow_torch_promotion():
    x = (torch.randn(9, 128) * 2).bfloat16()
    w = torch.rand(128) + 0.5
    norm = RMSNorm(128, 1e-6)
    norm.weight.data = w.bfloat16()
    got = ops.rms_norm(x, norm.weight, 1e-6)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), norm(x).float(), **BF16)
    # dtypes only (empty inputs launch nothing): bf16 x with a float32 weight promotes, as in torch
    none = torch.empty(0, 128, dtype=torch.bfloat16)
    assert ops.rms_norm(none, w, 1e-6).dtype == torch.float32
    assert ops.rms_norm(none, w, 1e-6, out_dtype=torch.bfloat16).dtype == torch.bfloat16
    with pytest.raises(LayerTypeError, match="out_dtype"):
        ops.rms_norm(none, w, 1e-6, out_dtype=torch.float16)


@settings(max_examples=6)
@given(tokens=st.integers(1, 13))
def test_rms_norm_any_token_count(tokens):
    x = torch.randn(tokens, 128)
    w = torch.rand(128) + 0.5
    torch.testing.assert_close(ops.rms_norm(x, w, 1e-6).double(), N.reference(x, w, 1e-6), **F32)


# ---------------------------------------------------------------- RoPE


@pytest.mark.parametrize("table", ["rope_plain", "rope_yarn"])
def test_rope_matches_the_model_rotation(model, table):
    rope = getattr(model, table)
    cos, sin = ops.rope_cos_sin(rope)
    c = model.config
    q = torch.randn(2, 11, c.num_attention_heads, c.head_dim)
    positions = torch.arange(290, 301)
    per_token = positions.repeat(2, 1)  # [b, s]
    for inverse in (False, True):
        want = rope.rotate(q, positions, inverse=inverse)
        torch.testing.assert_close(ops.rotary_embedding(q, per_token, cos, sin, inverse=inverse), want, **F32)
    kv = torch.randn(2, 11, c.head_dim)  # one shared kv head: [b, s, d]
    torch.testing.assert_close(ops.rotary_embedding(kv, per_token, cos, sin), rope.rotate(kv, positions), **F32)
    # float64 angles from the model's frequencies, independent of its cos/sin arithmetic
    want64 = R.reference(q.flatten(0, 1), per_token.flatten(), cos, sin)
    torch.testing.assert_close(ops.rotary_embedding(q.flatten(0, 1), per_token.flatten(), cos, sin).double(),
                               want64, **F32)


def test_rope_ragged_batch_flattened_to_tokens(model):
    """Sequences at different offsets in one call: each matches the model rotating it alone."""
    rope, c = model.rope_yarn, model.config
    cos, sin = ops.rope_cos_sin(rope)
    starts, lengths = (0, 517, 3), (5, 1, 9)
    seqs = [torch.randn(n, c.num_attention_heads, c.head_dim) for n in lengths]
    positions = torch.cat([torch.arange(s, s + n) for s, n in zip(starts, lengths)])
    got = ops.rotary_embedding(torch.cat(seqs), positions, cos, sin).split(lengths)
    for g, x, s, n in zip(got, seqs, starts, lengths):
        torch.testing.assert_close(g, rope.rotate(x[None], torch.arange(s, s + n))[0], **F32)


def test_rope_bf16_and_compressor_entry_positions(model):
    rope = model.rope_yarn
    cos, sin = ops.rope_cos_sin(rope)
    x = torch.randn(6, 96).bfloat16()
    positions = torch.arange(6) * 128  # compressed entries rotate at their block start k * ratio
    got = ops.rotary_embedding(x, positions, cos, sin)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), rope.rotate(x[None].float(), positions)[0], **BF16)


# ---------------------------------------------------------------- Hadamard


def test_hadamard_matches_the_model():
    x = torch.randn(3, 5, 64)  # the tiny indexer's head dim; other sizes: tests/kernels
    got = ops.hadamard_transform(x)
    torch.testing.assert_close(got, hadamard(x), **F32)
    torch.testing.assert_close(got.double(), H.reference(x), **F32)
    xb = x.bfloat16()
    torch.testing.assert_close(ops.hadamard_transform(xb).double(), H.reference(xb), **BF16)


# ---------------------------------------------------------------- hyper-connections


def test_hc_pre_post_head_match_the_model_blocks(model):
    c = model.config
    m, d = c.hc_mult, c.hidden_size
    x = _streams(7, m, d, 1)  # a streams tensor as forward_hidden returns it, per token
    xs = list(x.unbind(1))
    blk = model.layers[1]
    u, post, comb = ops.hc_pre(x, blk.hc_attn_fn, blk.hc_attn_scale, blk.hc_attn_base, c.hc_sinkhorn_iters,
                               c.rms_norm_eps, c.hc_eps)
    u_w, post_w, comb_w = block.hc_pre(xs, blk.hc_attn_fn, blk.hc_attn_scale, blk.hc_attn_base,
                                       c.hc_sinkhorn_iters, c.rms_norm_eps, c.hc_eps)
    for got, want in ((u, u_w), (post, post_w), (comb, comb_w)):
        torch.testing.assert_close(got, want, **F32)
    u64, post64, comb64 = HC.reference.hc_pre(x, blk.hc_attn_fn, blk.hc_attn_scale, blk.hc_attn_base,
                                              c.hc_sinkhorn_iters, c.rms_norm_eps, c.hc_eps)
    torch.testing.assert_close(comb.double(), comb64, **F32)
    y = torch.randn(7, d)
    got = ops.hc_post(y, x, post, comb)
    torch.testing.assert_close(got, torch.stack(block.hc_post(y, xs, post_w, comb_w), 1), **F32)
    u = ops.hc_head(x, model.hc_head_fn, model.hc_head_scale, model.hc_head_base, c.rms_norm_eps, c.hc_eps)
    want = block.hc_head(xs, model.hc_head_fn, model.hc_head_scale, model.hc_head_base, c.rms_norm_eps, c.hc_eps)
    torch.testing.assert_close(u, want, **F32)


def test_hc_leading_shapes_and_bf16(model):
    c = model.config
    blk = model.layers[0]
    x = _streams(6, c.hc_mult, c.hidden_size, 2).view(2, 3, c.hc_mult, c.hidden_size)
    u, post, comb = ops.hc_pre(x, blk.hc_ffn_fn, blk.hc_ffn_scale, blk.hc_ffn_base, 20, 1e-6, 1e-6)
    assert (u.shape, post.shape, comb.shape) == ((2, 3, c.hidden_size), (2, 3, 4), (2, 3, 4, 4))
    assert post.dtype == comb.dtype == torch.float32
    xb = x.bfloat16()
    ub, postb, combb = ops.hc_pre(xb, blk.hc_ffn_fn, blk.hc_ffn_scale, blk.hc_ffn_base, 20, 1e-6, 1e-6)
    assert ub.dtype == torch.bfloat16
    want = HC.reference.hc_pre(xb.flatten(0, 1), blk.hc_ffn_fn, blk.hc_ffn_scale, blk.hc_ffn_base, 20, 1e-6, 1e-6)
    for got, w in zip((ub, postb, combb), want):
        torch.testing.assert_close(got.flatten(0, 1).double(), w, **BF16)
    y = torch.randn(2, 3, c.hidden_size).bfloat16()
    out = ops.hc_post(y, xb, postb, combb)
    assert out.shape == xb.shape and out.dtype == torch.bfloat16
    want = HC.reference.hc_post(y.flatten(0, 1), xb.flatten(0, 1), postb.flatten(0, 1), combb.flatten(0, 1))
    torch.testing.assert_close(out.flatten(0, 1).double(), want, **BF16)


@settings(max_examples=5)
@given(tokens=st.integers(1, 9))
def test_hc_any_token_count(model, tokens):
    c = model.config
    blk = model.layers[2]
    x = _streams(tokens, c.hc_mult, c.hidden_size, tokens)
    got = ops.hc_pre(x, blk.hc_attn_fn, blk.hc_attn_scale, blk.hc_attn_base, 20, 1e-6, 1e-6)
    want = HC.reference.hc_pre(x, blk.hc_attn_fn, blk.hc_attn_scale, blk.hc_attn_base, 20, 1e-6, 1e-6)
    for g, w in zip(got, want):
        torch.testing.assert_close(g.double(), w, **F32)


# ---------------------------------------------------------------- embedding


def test_embedding_matches_the_model(model):
    ids = torch.randint(0, model.config.vocab_size, (3, 17))
    ids[0, 0], ids[0, 1] = 0, model.config.vocab_size - 1
    assert torch.equal(ops.embedding(ids, model.embed.weight), model.embed(ids))
    assert torch.equal(ops.embedding(ids.int(), model.embed.weight.bfloat16()), model.embed(ids).bfloat16())


def test_repeated_launches_follow_every_argument(model):
    """The ops bind a launch per signature (`ops._launch.launch`) and later calls only pass
    pointers: calls that repeat the shapes but change the data, eps, a weight's stride, the
    rope table or hc scalars must still give the model's results, and each call writes its own
    output buffer."""
    g = torch.Generator().manual_seed(5)
    x = torch.randn(6, 128, generator=g)
    w2 = torch.randn(128, generator=g)
    for w, eps in ((torch.randn(128, generator=g), 1e-6), (w2, 1e-6), (w2, 0.5)):
        for xi in (x, x * 3 + 1):
            want = RMSNorm(128, eps)
            want.weight.data = w.contiguous()
            got = ops.rms_norm(xi, w, eps)
            torch.testing.assert_close(got, want(xi), **F32)
    first = ops.hadamard_transform(x[:, :64].contiguous())
    second = ops.hadamard_transform(x[:, 64:].contiguous())
    assert first.data_ptr() != second.data_ptr()
    torch.testing.assert_close(second, hadamard(x[:, 64:]), **F32)
    torch.testing.assert_close(first, hadamard(x[:, :64]), **F32)
    c, blk = model.config, model.layers[0]
    streams = _streams(5, c.hc_mult, c.hidden_size, seed=8)
    mixer = (blk.hc_attn_fn, blk.hc_attn_scale, blk.hc_attn_base, c.hc_sinkhorn_iters)
    for eps in (0.25, c.rms_norm_eps):  # same shapes, another norm eps: another launch
        u = ops.hc_pre(streams, *mixer, eps, c.hc_eps)[0]
        want = block.hc_pre(list(streams.unbind(1)), *mixer, eps, c.hc_eps)[0]
        torch.testing.assert_close(u, want, **F32)
    with pytest.raises(LayerValueError, match="weight must be contiguous"):  # the kernel reads it densely
        ops.rms_norm(x, torch.randn(256)[::2], 1e-6)
    with pytest.raises(LayerValueError, match="base must be contiguous"):
        ops.hc_pre(streams, *mixer[:2], blk.hc_attn_base.repeat_interleave(2)[::2], mixer[3], c.rms_norm_eps,
                   c.hc_eps)


# ---------------------------------------------------------------- edges and errors


def test_empty_inputs_give_empty_results():
    assert ops.rms_norm(torch.empty(0, 128), torch.ones(128), 1e-6).shape == (0, 128)
    assert ops.hadamard_transform(torch.empty(0, 64)).shape == (0, 64)
    cos = sin = torch.zeros(4, 16)
    assert ops.rotary_embedding(torch.empty(0, 4, 96), torch.empty(0, dtype=torch.int64), cos, sin).shape == (0, 4, 96)
    assert ops.embedding(torch.empty(0, dtype=torch.int64), torch.randn(5, 128)).shape == (0, 128)
    u, post, comb = ops.hc_pre(torch.empty(0, 4, 128), torch.randn(24, 512), torch.ones(3), torch.zeros(24), 20,
                               1e-6, 1e-6)
    assert (u.shape, post.shape, comb.shape) == ((0, 128), (0, 4), (0, 4, 4))


_X = torch.randn(4, 128)
_COS = torch.zeros(8, 16)


@pytest.mark.parametrize("call,error,message", [
    (lambda: ops.rms_norm(_X.half(), None, 1e-6), LayerTypeError, "x must have dtype"),
    (lambda: ops.rms_norm(_X, torch.ones(127), 1e-6), LayerValueError, r"weight must have shape \(128,\)"),
    (lambda: ops.rms_norm(_X.t(), None, 1e-6), LayerValueError, "x must be contiguous"),
    (lambda: ops.rms_norm(_X, None, -1.0), LayerValueError, "eps must be"),
    (lambda: ops.rms_norm([1.0], None, 1e-6), LayerTypeError, "x must be a torch.Tensor"),
    (lambda: ops.rotary_embedding(_X.view(4, 1, 128), torch.tensor([0, 1, 2, 8]), _COS, _COS), LayerIndexError,
     r"positions\[3\] = 8 is outside \[0, table_len=8\)"),
    (lambda: ops.rotary_embedding(_X, torch.tensor([0, 1, -1, 2]), _COS, _COS), LayerIndexError, "positions"),
    (lambda: ops.rotary_embedding(_X, torch.tensor([0.0] * 4), _COS, _COS), LayerTypeError, "positions must have"),
    (lambda: ops.rotary_embedding(_X, torch.zeros(3, dtype=torch.int64), _COS, _COS), LayerValueError,
     "positions must have the leading shape"),
    (lambda: ops.rotary_embedding(_X, torch.zeros(4, dtype=torch.int64), _COS.double(), _COS), LayerTypeError,
     "cos must have dtype"),
    (lambda: ops.rotary_embedding(_X, torch.zeros(4, dtype=torch.int64), _COS, torch.zeros(8, 8)),
     LayerValueError, "must have one shape"),
    (lambda: ops.rotary_embedding(_X, torch.zeros(4, dtype=torch.int64), torch.zeros(8, 65), torch.zeros(8, 65)),
     LayerValueError, "rope_dim <= 128"),
    (lambda: ops.hadamard_transform(torch.randn(3, 96)), LayerValueError, "power of two"),
    (lambda: ops.embedding(torch.tensor([0, 5]), torch.randn(5, 8)), LayerIndexError,
     r"ids\[1\] = 5 is outside \[0, vocab=5\)"),
    (lambda: ops.embedding(torch.tensor([0.0]), torch.randn(5, 8)), LayerTypeError, "ids must have dtype"),
    (lambda: ops.embedding(torch.tensor([0]), torch.randn(5, 8, 1)), LayerValueError, "weight must be 2-D"),
    (lambda: ops.hc_pre(torch.randn(2, 4, 8), torch.randn(24, 31), torch.ones(3), torch.zeros(24), 20, 1e-6, 1e-6),
     LayerValueError, r"fn must have shape \(24, 32\)"),
    (lambda: ops.hc_pre(torch.randn(2, 4, 8), torch.randn(24, 32), torch.ones(2), torch.zeros(24), 20, 1e-6, 1e-6),
     LayerValueError, r"scale must have shape \(3,\)"),
    (lambda: ops.hc_pre(torch.randn(2, 4, 8), torch.randn(24, 32), torch.ones(3), torch.zeros(24), 0, 1e-6, 1e-6),
     LayerValueError, "sinkhorn_iters"),
    (lambda: ops.hc_pre(torch.randn(2, 4, 8), torch.randn(24, 32), torch.ones(3).double(), torch.zeros(24), 20,
                        1e-6, 1e-6), LayerTypeError, "scale must have dtype"),
    (lambda: ops.hc_post(torch.randn(2, 8), torch.randn(2, 4, 8), torch.rand(2, 4), torch.rand(2, 4, 3)),
     LayerValueError, r"comb must have shape \(2, 4, 4\)"),
    (lambda: ops.hc_post(torch.randn(2, 8).bfloat16(), torch.randn(2, 4, 8), torch.rand(2, 4), torch.rand(2, 4, 4)),
     LayerTypeError, "y must have dtype"),
    (lambda: ops.hc_head(torch.randn(2, 4, 8), torch.randn(4, 32), torch.ones(1), torch.zeros(3), 1e-6, 1e-6),
     LayerValueError, r"base must have shape \(4,\)"),
])
def test_bad_arguments_raise_typed_errors_naming_them(call, error, message):
    with pytest.raises(error, match=message):
        call()


def test_a_bad_argument_never_launches(monkeypatch):
    from kernforge.ops import layers

    def no_compile(*a, **k):
        raise AssertionError("compiled or launched despite a bad argument")

    monkeypatch.setattr(layers, "_compiled", no_compile)
    with pytest.raises(LayerIndexError):
        ops.embedding(torch.tensor([7]), torch.randn(5, 8))
    with pytest.raises(LayerValueError):
        ops.rms_norm(torch.randn(2, 8), torch.ones(9), 1e-6)
