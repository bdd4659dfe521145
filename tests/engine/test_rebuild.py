"""Engine.rebuild_cache: sliding-window cache recovery from the last tokens (spec §5).

As tests/model/test_rebuild.py for the reference: after a rebuild, the logits of the next
tokens are compared with those after a full rebuild (a plain prefill). At tails of at
least `exact_rebuild_tail` they must agree; below it the error is measured and bounded,
and the engine must reproduce the reference's own `rebuild_cache` at the same tail (its
truncated windows and kept compressed entries), exact mode (float64 attention, float32
pages; conftest) so that 1e-4 separates arithmetic order from a different cache.
"""

import pytest
import torch

from kernforge.engine import Engine
from kernforge.model.transformer import exact_rebuild_tail
from tests.engine.conftest import tokens

ATOL = 1e-4  # exact mode, as tests/engine/test_engine.py
P, NEXT = 300, 6


def _continue(runner, ids):
    return torch.cat([runner(ids[:, t:t + 1], t) for t in range(P, P + NEXT)], dim=1)


def _after_tail_rebuild(runner, ids, tail):
    runner(ids[:, :P], 0)  # a live batch whose compressed entries are persisted
    runner.rebuild_cache(ids[:, :P], tail=tail)
    return _continue(runner, ids)


@pytest.fixture(scope="module")
def ids():
    return tokens(P + NEXT, seed=3, batch=2)


def test_exact_tail_is_the_reference_bound(model_noqat):
    eng = Engine(model_noqat)
    assert eng.exact_rebuild_tail(P) == exact_rebuild_tail(model_noqat.config, P) == 74


@pytest.mark.parametrize("tail", [None, P, P + 5])
def test_full_rebuild_is_a_prefill(exact, model_noqat, ids, tail):
    eng = Engine(model_noqat)
    eng.forward(ids[:, :100], 0)  # whatever was cached before is dropped
    eng.rebuild_cache(ids[:, :P], tail=tail)
    got = _continue(eng, ids)
    torch.testing.assert_close(got, model_noqat(ids, 0)[:, P:], atol=ATOL, rtol=0)


def test_tail_rebuild_error_against_full_rebuild_and_reference(exact, model_noqat, ids, record_property):
    eng = Engine(model_noqat)
    eng.rebuild_cache(ids[:, :P])
    full = _continue(eng, ids)
    exact_tail = eng.exact_rebuild_tail(P)
    errors = {}
    for tail in (exact_tail + 10, exact_tail, exact_tail - 1, 16, 4):
        got = _after_tail_rebuild(eng, ids, tail)
        ref = _after_tail_rebuild(model_noqat, ids, tail)
        # the reference's own tail rebuild: the same truncated windows and kept entries
        torch.testing.assert_close(got, ref, atol=ATOL, rtol=0)
        errors[tail] = float((got - full).abs().max())
    record_property("engine_rebuild_tail_logit_error", errors)
    # at and above the bound the rebuild equals the full one
    assert errors[exact_tail + 10] <= ATOL and errors[exact_tail] <= ATOL
    # a window-length tail is approximate: early replayed tokens saw truncated windows
    # (measured 1.8 and 2.9 on logits of magnitude ~5; the bound says "approximate, not garbage")
    assert 1e-3 < errors[16] <= errors[4] < 10.0


def test_tail_rebuild_in_kernel_mode_equals_full_rebuild(model_noqat, ids):
    """bf16 attention kernel: the replayed rows see the same keys as the prefill's."""
    eng = Engine(model_noqat)
    eng.rebuild_cache(ids[:, :P])
    full = _continue(eng, ids)
    got = _after_tail_rebuild(eng, ids, eng.exact_rebuild_tail(P))
    torch.testing.assert_close(got, full, atol=1e-5, rtol=0)


def test_tail_rebuild_keeps_the_cache_consistent(exact, model_noqat, ids):
    """Window blocks go back to the pool and are taken again; nothing leaks across rebuilds."""
    eng = Engine(model_noqat)
    eng.forward(ids[:, :P], 0)
    free = {p: a.num_free for p, a in eng.cache.allocators.items()}
    for _ in range(3):
        eng.rebuild_cache(ids[:, :P], tail=40)
    assert {p: a.num_free for p, a in eng.cache.allocators.items()} == free
    assert [eng.length(s) for s in eng.sequences] == [P, P]


def test_tail_rebuild_argument_errors(model_noqat, ids):
    eng = Engine(model_noqat)
    eng.forward(ids[:, :100], 0)  # compressed entries for 100 tokens only
    with pytest.raises(ValueError, match="persisted"):
        eng.rebuild_cache(ids[:, :P], tail=50)
    eng.forward(ids[:, :P], 0)
    for bad in (0, -3, True, 2.5):
        with pytest.raises(ValueError, match="tail"):
            eng.rebuild_cache(ids[:, :P], tail=bad)
    with pytest.raises(ValueError, match="batch"):
        eng.rebuild_cache(ids[:1, :P], tail=50)
    with pytest.raises(ValueError, match="tokens"):
        eng.rebuild_cache(ids[0, :P], tail=50)
