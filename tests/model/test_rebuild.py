"""rebuild_cache: sliding-window cache recovery from the recent tail of the tokens.

Cost is measured as tokens replayed (wall time belongs in benchmarks/); error
is measured on the rebuilt cache tensors and on the logits of the next tokens,
both against a full rebuild.
"""

import pytest
import torch

from kernforge.model import random_model, tiny, v4_flash
from kernforge.model.transformer import exact_rebuild_tail

from ._helpers import tokens

P = 300
NEXT = 8


@pytest.fixture(scope="module")
def setup(_one_torch_thread):
    model = random_model(tiny(), seed=31, dtype=torch.float64)
    ids = tokens(2, P + NEXT, 32)
    model.rebuild_cache(ids[:, :P])  # full rebuild = plain prefill
    full_state = {k: v.clone() for k, v in model.cache_state().items()}
    full_next = _continue(model, ids)
    return model, ids, full_state, full_next


def _continue(model, ids):
    return torch.cat([model(ids[:, t:t + 1], t) for t in range(P, P + NEXT)], dim=1)


def _state_error(model, full_state):
    err = 0.0
    for name, ref in full_state.items():
        got = model.cache_state()[name]
        both_inf = torch.isinf(ref) & torch.isinf(got) & (ref == got)
        diff = (got.double() - ref.double()).abs().masked_fill(both_inf, 0.0)
        err = max(err, float(diff.max()))
    return err


def _rebuild(model, ids, tail):
    model(ids[:, :P])  # a live sequence whose compressed caches are persisted
    model.rebuild_cache(ids[:, :P], tail=tail)


def test_exact_tail_bounds():
    # Spec §5: layer l is exact from p0 + (W-1) l; the ratio-128 layer 2 needs its open
    # block from 256, so p0 = 256 - 2*15 = 226 and the tail is 300 - 226 = 74.
    assert exact_rebuild_tail(tiny(), P) == 74
    # V4-Flash: the last ratio-4 layer (42) needs the window back to P-127, then 127 per layer.
    assert exact_rebuild_tail(v4_flash(max_seq_len=2**20), 100_000) == 127 + 127 * 42


def test_tail_rebuild_error_and_cost_against_full_rebuild(setup, record_property):
    model, ids, full_state, full_next = setup
    exact = model.exact_rebuild_tail(P)
    results = {}
    for tail in (exact, exact - 1, 16, 4):
        _rebuild(model, ids, tail)
        state_err = _state_error(model, full_state)
        logit_err = float((_continue(model, ids) - full_next).abs().max())
        results[tail] = (state_err, logit_err, tail / P)
    record_property("rebuild_tail_results", results)
    # At the bound the rebuilt caches equal the full rebuild, at a quarter of the cost.
    assert results[exact][0] < 1e-12 and results[exact][1] < 1e-9 and results[exact][2] < 0.25
    # One token less and some cache row is only approximate: the bound is tight.
    assert results[exact - 1][0] > 1e-6
    # A window-length tail is cheap and approximate: early replayed tokens see truncated windows.
    assert results[16][2] < 0.06 and results[16][1] > 1e-3
    assert results[4][0] >= results[16][0] > results[exact - 1][0]


def test_full_rebuild_and_overlong_tail_equal_prefill(setup):
    model, ids, full_state, full_next = setup
    for tail in (None, P + 5):
        _rebuild(model, ids, tail)
        assert _state_error(model, full_state) == 0.0
        assert torch.equal(_continue(model, ids), full_next)


def test_tail_rebuild_needs_persisted_entries(setup):
    model, ids, _, _ = setup
    model(ids[:, :100])  # compressed caches hold only 100 tokens' worth
    with pytest.raises(ValueError, match="persisted"):
        model.rebuild_cache(ids[:, :P], tail=50)
    with pytest.raises(ValueError, match="positive"):
        model.rebuild_cache(ids[:, :P], tail=0)
