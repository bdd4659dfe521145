"""Layers against direct float64 transcriptions of the spec's formulas (§2.3-§2.5)."""

import pytest
import torch
import torch.nn.functional as F

from kernforge.model import deterministic, random_model, tiny
from kernforge.model.attention import WindowBand, sparse_attention
from kernforge.model.block import hc_post, hc_pre, sinkhorn
from kernforge.model.primitives import hadamard
from kernforge.model.quant import fake_quant_fp4

from ._helpers import rope_reference, tokens

D = tiny().hidden_size


@pytest.fixture(scope="module")
def model():
    return random_model(tiny(fake_quant=False), seed=1, dtype=torch.float64)


def _rms(x, w, eps=1e-6):
    return x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps) * w


def naive_entries(comp, x):
    """Spec §2.4 compressor: per-channel softmax-gated pooling, RMSNorm, RoPE at k*r."""
    r, d = comp.ratio, comp.head_dim
    t_count = x.shape[1]
    a = x @ comp.wkv.weight.T
    g = x @ comp.wgate.weight.T + comp.ape[torch.arange(t_count) % r]
    entries = []
    for k in range(t_count // r):
        blk = slice(k * r, (k + 1) * r)
        if comp.overlap:
            ca, cg = a[:, blk, d:], g[:, blk, d:]
            if k > 0:
                prev = slice((k - 1) * r, k * r)
                ca, cg = torch.cat([a[:, prev, :d], ca], 1), torch.cat([g[:, prev, :d], cg], 1)
        else:
            ca, cg = a[:, blk], g[:, blk]
        entries.append((torch.softmax(cg, dim=1) * ca).sum(1))
    e = _rms(torch.stack(entries, 1), comp.norm.weight)
    pos = torch.arange(len(entries)) * r
    return rope_reference(e, pos, _freqs(comp.rope))


def _freqs(table):
    # angle(t=1) = f_i; recover from the table's cos/sin at position 1
    return torch.atan2(table.sin[1], table.cos[1])


@pytest.mark.parametrize("layer, length", [(1, 37), (2, 300)])
def test_compressor_matches_formula_for_any_chunking(model, layer, length):
    comp = model.layers[layer].attn.compressor
    x = torch.randn(2, length, D, dtype=torch.float64, generator=torch.Generator().manual_seed(layer))
    expect = naive_entries(comp, x)
    n = expect.shape[1]
    for cuts in ([0, length], [0, 5, 6, 133, 134, length], list(range(0, length, 3)) + [length]):
        comp.reset_cache()
        for lo, hi in zip(cuts[:-1], cuts[1:]):
            comp(x[:, lo:hi], lo)
        assert comp.n_entries == n
        torch.testing.assert_close(comp.kv_cache[:2, :n], expect, rtol=1e-10, atol=1e-10)
        assert torch.all(comp.kv_cache[:, n:] == 0)  # nothing written past the visible entries


def test_indexer_keys_are_rotated_then_fp4(model):
    comp = model.layers[1].attn.indexer.compressor
    x = torch.randn(1, 24, D, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    comp.fake_quant = True
    try:
        comp.reset_cache()
        comp(x, 0)
    finally:
        comp.fake_quant = False
    expect = fake_quant_fp4(hadamard(naive_entries(comp, x)))
    torch.testing.assert_close(comp.kv_cache[:1, :6], expect, rtol=1e-10, atol=1e-10)


def test_indexer_picks_the_top_scores(model):
    attn = model.layers[3].attn
    idx = attn.indexer
    b, t_count = 2, 70
    g = torch.Generator().manual_seed(6)
    x = torch.randn(b, t_count, D, dtype=torch.float64, generator=g)
    qr = torch.randn(b, t_count, 128, dtype=torch.float64, generator=g)
    idx.compressor.reset_cache()
    picks = idx(x, qr, 0)
    keys = idx.compressor.kv_cache[:b, :t_count // 4]
    q = (qr @ idx.wq_b.weight.T).unflatten(-1, (4, 64))
    q = hadamard(rope_reference(q, torch.arange(t_count), _freqs(idx.rope)))
    w = (x @ idx.weights_proj.weight.T) * 64 ** -0.5 * 4 ** -0.5
    for bi in range(b):
        for t in range(t_count):
            n = (t + 1) // 4
            scores = (torch.relu(q[bi, t] @ keys[bi, :n].T) * w[bi, t, :, None]).sum(0)
            # ReLU makes exact-zero ties common; they go to the lower entry index.
            want = set(sorted(range(n), key=lambda k: (-float(scores[k]), k))[:8])
            got = picks[bi, t]
            assert set(got[got >= 0].tolist()) == want and int((got >= 0).sum()) == len(want)


@pytest.mark.parametrize("det", [False, True])
def test_sparse_attention_with_sink_matches_loop(det):
    g = torch.Generator().manual_seed(7)
    q = torch.randn(2, 3, 4, 8, dtype=torch.float64, generator=g)
    per_query = torch.randn(2, 3, 6, 8, dtype=torch.float64, generator=g)  # [b, s, c, d]
    shared = torch.randn(2, 5, 8, dtype=torch.float64, generator=g)  # [b, c, d], same for every query
    valid_q = torch.rand(2, 3, 6, generator=g) > 0.4
    valid_q[..., 0] = True
    valid_s = torch.rand(1, 3, 5, generator=g) > 0.5
    sink = torch.randn(4, dtype=torch.float64, generator=g)
    with deterministic(det):
        got = sparse_attention(q, [(per_query, valid_q), (shared, valid_s)], sink, 0.3)
    for b in range(2):
        for s in range(3):
            v = torch.cat([per_query[b, s, valid_q[b, s]], shared[b, valid_s[0, s]]])
            for h in range(4):
                e = torch.exp(v @ q[b, s, h] * 0.3)
                p = e / (e.sum() + torch.exp(sink[h]))
                torch.testing.assert_close(got[b, s, h], p @ v, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("det", [False, True])
@pytest.mark.parametrize("s, w", [(1, 4), (5, 4), (8, 4), (37, 16), (16, 1)])
def test_window_band_matches_per_query_slices(det, s, w):
    """The blocked band products equal dot products with each query's own W rows (incl. s % W != 0)."""
    g = torch.Generator().manual_seed(s * 31 + w)
    q = torch.randn(2, s, 3, 8, dtype=torch.float64, generator=g)
    seq = torch.randn(2, s + w - 1, 8, dtype=torch.float64, generator=g)
    valid = torch.rand(1, s, w, generator=g) > 0.3
    valid[..., -1] = True
    sink = torch.randn(3, dtype=torch.float64, generator=g)
    with deterministic(det):
        got = sparse_attention(q, [(WindowBand(seq, w), valid)], sink, 0.5)
    for b in range(2):
        for t in range(s):
            v = seq[b, t:t + w][valid[0, t]]
            for h in range(3):
                e = torch.exp(v @ q[b, t, h] * 0.5)
                p = e / (e.sum() + torch.exp(sink[h]))
                torch.testing.assert_close(got[b, t, h], p @ v, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("layer, length", [(2, 290), (3, 45)])
def test_attention_layer_matches_explicit_candidate_sets(model, layer, length):
    """Window t-W+1..t plus visible compressed entries (indexer picks for ratio 4), sink, grouped wo."""
    attn = model.layers[layer].attn
    attn.reset_cache()
    x = torch.randn(1, length, D, dtype=torch.float64, generator=torch.Generator().manual_seed(layer))
    out = attn(x, 0)
    pos = torch.arange(length)
    qr = _rms(x @ attn.wq_a.weight.T, attn.q_norm.weight)
    q = (qr @ attn.wq_b.weight.T).unflatten(-1, (4, 96))
    q = rope_reference(_rms(q, 1.0), pos, _freqs(attn.rope))
    kv = rope_reference(_rms(x @ attn.wkv.weight.T, attn.kv_norm.weight), pos, _freqs(attn.rope))
    comp = attn.compressor.kv_cache[0]
    if attn.indexer is not None:
        attn.indexer.compressor.reset_cache()
        picks = attn.indexer(x, qr, 0)[0]
    expect = torch.empty(length, 4, 96, dtype=torch.float64)
    for t in range(length):
        window = kv[0, max(0, t - 15):t + 1]
        n = (t + 1) // attn.compress_ratio
        chosen = picks[t][picks[t] >= 0] if attn.indexer is not None else torch.arange(n)
        cands = torch.cat([window, comp[chosen]])
        for h in range(4):
            e = torch.exp(cands @ q[0, t, h] / 96 ** 0.5)
            expect[t, h] = (e / (e.sum() + torch.exp(attn.attn_sink[h]))) @ cands
    expect = rope_reference(expect[None], pos, _freqs(attn.rope), inverse=True)[0]
    wo_a = attn.wo_a.weight.unflatten(0, (2, 64))
    low = torch.cat([expect.flatten(1)[:, g * 192:(g + 1) * 192] @ wo_a[g].T for g in range(2)], -1)
    torch.testing.assert_close(out[0], low @ attn.wo_b.weight.T, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("layer", [0, 3])  # hash-routed, score-routed
def test_moe_matches_per_token_formula(model, layer):
    moe = model.layers[layer].ffn
    g = torch.Generator().manual_seed(8)
    x = torch.randn(3, 5, D, dtype=torch.float64, generator=g) * 4  # large enough to hit the clamp
    ids = tokens(3, 5, 9)
    got = moe(x, ids)

    def expert(e, v):
        gate, up = e.w1.weight @ v, e.w3.weight @ v
        return e.w2.weight @ (F.silu(gate.clamp(max=10)) * up.clamp(-10, 10))

    clamped = 0
    for b in range(3):
        for s in range(5):
            v = x[b, s]
            score = torch.sqrt(F.softplus(moe.gate.weight @ v))
            if moe.gate.hash:
                chosen = moe.gate.tid2eid[ids[b, s]]
            else:
                chosen = torch.topk(score + moe.gate.bias, 2).indices
            w = score[chosen] / score[chosen].sum() * 1.5
            want = sum(wi * expert(moe.experts[int(e)], v) for wi, e in zip(w, chosen))
            want = want + expert(moe.shared_experts, v)
            clamped += int((moe.shared_experts.w3.weight @ v).abs().max() > 10)
            torch.testing.assert_close(got[b, s], want, rtol=1e-10, atol=1e-10)
    assert clamped > 0


def test_moe_hash_table_naming_one_expert_twice_adds_it_once(model):
    """DeepSeek's `y[idx] += expert(x[idx], ...)` writes a repeated row back once, so a token whose
    hash row names expert e twice gets w_e * expert_e(x) once (w_e = 1.5 * s_e / (2 s_e)), not twice."""
    moe = model.layers[1].ffn
    assert moe.gate.hash
    g = torch.Generator().manual_seed(12)
    x = torch.randn(2, 6, D, dtype=torch.float64, generator=g)
    ids = torch.arange(12).reshape(2, 6) + 100
    table = moe.gate.tid2eid.clone()
    rows = torch.stack([torch.randperm(8, generator=g)[:2] for _ in range(12)])
    rows[::2, 1] = rows[::2, 0]  # every other token: the same expert in both slots
    try:
        moe.gate.tid2eid[ids.flatten()] = rows
        got = moe(x, ids)
    finally:
        moe.gate.tid2eid.copy_(table)

    def expert(e, v):
        gate, up = e.w1.weight @ v, e.w3.weight @ v
        return e.w2.weight @ (F.silu(gate.clamp(max=10)) * up.clamp(-10, 10))

    for t in range(12):
        v = x.flatten(0, 1)[t]
        score = torch.sqrt(F.softplus(moe.gate.weight @ v))
        chosen = rows[t]
        w = score[chosen] / score[chosen].sum() * 1.5
        distinct = {int(e): wi for wi, e in zip(w, chosen)}  # a repeated expert keeps one (equal) weight
        want = sum(wi * expert(moe.experts[e], v) for e, wi in distinct.items()) + expert(moe.shared_experts, v)
        torch.testing.assert_close(got.flatten(0, 1)[t], want, rtol=1e-10, atol=1e-10)
        if t % 2 == 0:
            e = int(chosen[0])
            assert len(distinct) == 1 and abs(float(distinct[e]) - 0.75) < 1e-12
            twice = want + distinct[e] * expert(moe.experts[e], v)
            assert (got.flatten(0, 1)[t] - twice).abs().max() > 1e-3  # adding it twice would be caught


def test_sinkhorn_matches_spec_iteration_and_is_near_doubly_stochastic():
    logits = torch.randn(50, 4, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(10))
    c = sinkhorn(logits, 20, 1e-6)
    for i in range(50):
        ref = torch.exp(logits[i]) / torch.exp(logits[i]).sum(1, keepdim=True) + 1e-6
        ref = ref / (ref.sum(0) + 1e-6)
        for _ in range(19):
            ref = ref / (ref.sum(1, keepdim=True) + 1e-6)
            ref = ref / (ref.sum(0) + 1e-6)
        torch.testing.assert_close(c[i], ref, rtol=1e-12, atol=1e-12)
    assert torch.all(c > 0)
    torch.testing.assert_close(c.sum(-2), torch.ones(50, 4, dtype=torch.float64), atol=1e-5, rtol=0)
    torch.testing.assert_close(c.sum(-1), torch.ones(50, 4, dtype=torch.float64), atol=0.05, rtol=0)


def test_hyper_connection_pre_and_post_match_formula(model):
    blk = model.layers[0]
    g = torch.Generator().manual_seed(11)
    x = torch.randn(1, 2, 4, D, dtype=torch.float64, generator=g)
    y = torch.randn(1, 2, D, dtype=torch.float64, generator=g)
    u, post, comb = hc_pre(list(x.unbind(2)), blk.hc_attn_fn, blk.hc_attn_scale, blk.hc_attn_base, 20, 1e-6, 1e-6)
    out = torch.stack(hc_post(y, list(x.unbind(2)), post, comb), dim=2)
    a, beta = blk.hc_attn_scale, blk.hc_attn_base
    for s in range(2):
        flat = x[0, s].flatten()
        m = (blk.hc_attn_fn @ flat) / torch.sqrt((flat * flat).mean() + 1e-6)
        pre = torch.sigmoid(a[0] * m[:4] + beta[:4]) + 1e-6
        pst = 2 * torch.sigmoid(a[1] * m[4:8] + beta[4:8])
        c = sinkhorn((a[2] * m[8:] + beta[8:]).view(4, 4), 20, 1e-6)
        torch.testing.assert_close(u[0, s], (pre[:, None] * x[0, s]).sum(0), rtol=1e-12, atol=1e-12)
        want = pst[:, None] * y[0, s] + c.T @ x[0, s]  # X'_k = post_k y + sum_j C[j,k] X_j
        torch.testing.assert_close(out[0, s], want, rtol=1e-12, atol=1e-12)
