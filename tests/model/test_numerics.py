"""Batch-invariant numerics: accuracy against float64 torch, and position independence."""

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings, strategies as st

from kernforge.model import deterministic, numerics as nx


def _ulps32(a: torch.Tensor, ref: torch.Tensor) -> float:
    return float(((a.double() - ref).abs() / (ref.abs().clamp(min=1e-30) * 2.0 ** -23)).max())


@pytest.mark.parametrize("fn, ref, lo, hi", [
    (nx.exp, torch.exp, -80.0, 80.0),
    (nx.sigmoid, torch.sigmoid, -40.0, 40.0),
    (nx.silu, F.silu, -40.0, 40.0),
    # F.softplus returns x itself above 20; this form is exact to float64 rounding everywhere.
    (nx.softplus, lambda x: x.clamp(min=0) + torch.log1p(torch.exp(-x.abs())), -30.0, 60.0),
])
def test_deterministic_transcendentals_are_accurate(fn, ref, lo, hi):
    x = torch.linspace(lo, hi, 20011, dtype=torch.float64)
    x = torch.cat([x, torch.randn(5000, dtype=torch.float64, generator=torch.Generator().manual_seed(1)) * 5])
    x32 = x.float()
    with deterministic():
        got = fn(x32)
    truth = ref(x32.double())
    mask = truth.abs() > 1e-30
    assert _ulps32(got[mask], truth[mask]) <= 1.0
    with deterministic():
        got64 = fn(x)
    assert torch.allclose(got64, ref(x), rtol=1e-14, atol=1e-300)


def test_exp_limits():
    x = torch.tensor([-math.inf, -1000.0, 0.0, 1000.0, math.inf])
    with deterministic():
        y = nx.exp(x)
    assert y.tolist() == [0.0, 0.0, 1.0, math.inf, math.inf]


def test_deterministic_elementwise_does_not_depend_on_position():
    # The same values at different offsets (SIMD body vs scalar tail) give the same bits.
    g = torch.Generator().manual_seed(2)
    x = torch.randn(37, generator=g) * 10
    with deterministic():
        for fn in (nx.exp, nx.sigmoid, nx.silu, nx.softplus):
            alone = fn(x)
            padded = fn(torch.cat([torch.randn(1003, generator=g), x, torch.randn(5, generator=g)]))[1003:1040]
            assert torch.equal(alone, padded)


@settings(max_examples=30, deadline=None)
@given(rows=st.integers(1, 9), k=st.integers(1, 70), out=st.integers(1, 20), seed=st.integers(0, 2**16))
def test_deterministic_linear_is_row_invariant_and_accurate(rows, k, out, seed):
    g = torch.Generator().manual_seed(seed)
    x, w = torch.randn(rows, k, generator=g), torch.randn(out, k, generator=g)
    with deterministic():
        full = nx.linear(x, w)
        single = torch.cat([nx.linear(x[i:i + 1], w) for i in range(rows)])
        bigger = nx.linear(torch.cat([torch.randn(3, k, generator=g), x]), w)[3:]
    assert torch.equal(full, single) and torch.equal(full, bigger)
    ref = x.double() @ w.double().T
    assert torch.allclose(full.double(), ref, atol=1e-5 * k, rtol=1e-5)


def test_tree_sum_and_softmax_match_torch():
    x = torch.randn(3, 5, 13, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    with deterministic():
        assert torch.allclose(nx.tree_sum(x, 1), x.sum(1), rtol=1e-14)
        assert torch.allclose(nx.softmax(x, 2), torch.softmax(x, 2), rtol=1e-13)
        assert nx.tree_sum(x, 2, keepdim=True).shape == (3, 5, 1)


def test_topk_breaks_ties_towards_lower_index_and_ignores_padding():
    s = torch.tensor([[1.0, 3.0, 3.0, 0.0, 3.0, -math.inf, -math.inf]])
    assert nx.topk_indices(s, 3).tolist() == [[1, 2, 4]]
    assert nx.topk_indices(s[:, :5], 4).tolist() == nx.topk_indices(s, 4).tolist() == [[1, 2, 4, 0]]


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 40), k_frac=st.floats(0.0, 1.0), levels=st.integers(2, 6), seed=st.integers(0, 2**31 - 1))
def test_topk_matches_a_python_stable_ranking_with_ties_infs_and_nans(n, k_frac, levels, seed):
    """The fast path (torch.topk on untied rows) must give the exact list of a stable descending sort."""
    g = torch.Generator().manual_seed(seed)
    k = 1 + int(k_frac * (n - 1))
    s = torch.randint(0, levels, (6, n), generator=g).double() - 1.0  # few levels: many ties
    s[s == levels - 2] = -math.inf
    s[0] = torch.randn(n, generator=g, dtype=torch.float64)  # an untied row
    s[1, int(torch.randint(0, n, (1,), generator=g))] = math.nan

    def rank(v: float) -> float:  # torch orders NaN above everything when sorting descending
        return math.inf if math.isnan(v) else v

    want = [sorted(range(n), key=lambda i: (-rank(row[i]), i))[:k] for row in s.tolist()]
    assert nx.topk_indices(s, k).tolist() == want


@pytest.mark.parametrize("det", [False, True])
def test_mean_square_matches_float64(det):
    x = torch.randn(3, 7, 1024, generator=torch.Generator().manual_seed(5)) * 3.0
    x[0, 0] = 0.0  # an all-zero row gives exactly zero
    ref = (x.double() ** 2).mean(-1, keepdim=True)
    with deterministic(det):
        got = nx.mean_square(x, -1, keepdim=True)
    assert got.shape == (3, 7, 1) and got.dtype == torch.float32
    assert got[0, 0].item() == 0.0
    assert torch.allclose(got.double(), ref, rtol=1e-5, atol=0)
