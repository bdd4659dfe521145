"""``kernforge.ops`` routing: TileKernels' gates against the torch reference, the model's
``Gate`` (scored and hash layers) against the ops, every option of ``top2_sum_gate``, edge
sizes, and typed errors before launch."""
import pytest
import torch

from kernforge import ops
from kernforge.kernels.routing import reference
from kernforge.kernels.routing.problems import logits_with_ties
from kernforge.model import config as model_config
from kernforge.model import numerics as nx
from kernforge.model.moe import Gate

RTOL = 2e-6


def gate_args(t=11, e=32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return logits_with_ties(t, e, seed), torch.randn(e, generator=g) * 0.1


def call(logits, bias, k=4, tg=0, g=0, shared=False, s=0, scale=2.5, ep=(0, 1), tp=(0, 1), scoring="sigmoid",
         backend="interp", **opt):
    args = (logits, bias, k, tg, g, shared, s, scale, ep[0], ep[1], tp[0], tp[1], scoring)
    got = ops.top2_sum_gate(*args, **{n: v.clone() if n == "unmapped_topk_idx" else v for n, v in opt.items()},
                            backend=backend)
    want = reference.top2_sum_gate(*args, **opt)
    return got, want


def assert_same(got, want):
    assert torch.equal(got[0], want[0]), (got[0], want[0])
    torch.testing.assert_close(got[1], want[1], rtol=RTOL, atol=0)


def test_topk_gate_on_the_default_backend():
    s = logits_with_ties(9, 64, seed=1)  # the catalogue's small build (E 64, k 6)
    assert torch.equal(ops.topk_gate(s, 6), reference.topk_gate(s, 6))
    assert torch.equal(ops.topk_gate(s[:1], 6), reference.topk_gate(s[:1], 6))  # T = 1
    assert ops.topk_gate(s[:0], 6).shape == (0, 6)


def test_top2_sum_gate_on_the_default_backend_with_every_option():
    """The catalogue's small configuration through the op: groups, shared slots, a physical
    map with replicas, EP 4 x TP 2, mask and fixed rows; ``unmapped_topk_idx`` pre-filled with
    a sentinel where the op must write."""
    t, e, k, s, extra = 13, 32, 4, 2, 6
    logits, bias = gate_args(t, e, seed=2)
    g = torch.Generator().manual_seed(3)
    table = torch.randperm(e + s + extra, generator=g).int()
    phys = torch.full((e + s, 1 + extra), -1, dtype=torch.int32)
    phys[:, 0] = table[:e + s]
    count = torch.ones(e + s, dtype=torch.int32)
    phys[:extra, 1] = table[e + s:]
    count[:extra] = 2
    mask = torch.rand(t, generator=g) > 0.2
    fix = torch.rand(t, generator=g) > 0.6
    unmapped = torch.stack([torch.randperm(e, generator=g)[:k] for _ in range(t)])
    unmapped[~fix] = -77  # the op overwrites these rows
    got, want = call(logits, bias, k, 3, 8, True, s, ep=(1, 4), tp=(1, 2), backend=None, mask=mask,
                     fix_routing_mask=fix, to_physical_map=phys, logical_count=count, unmapped_topk_idx=unmapped)
    assert_same(got, want)
    out = unmapped.clone()
    ops.top2_sum_gate(logits, bias, k, 3, 8, True, s, 2.5, 1, 4, 1, 2, "sigmoid", mask=mask, fix_routing_mask=fix,
                      to_physical_map=phys, logical_count=count, unmapped_topk_idx=out)
    reference.top2_sum_gate(logits, bias, k, 3, 8, True, s, 2.5, 1, 4, 1, 2, "sigmoid", mask=mask,
                            fix_routing_mask=fix, to_physical_map=phys, logical_count=count,
                            unmapped_topk_idx=unmapped)
    assert torch.equal(out, unmapped) and (out[~mask] == -1).all()


@pytest.mark.parametrize("scoring", ["sigmoid", "sqrtsoftplus", "softmax"])
def test_each_option_alone(scoring):
    logits, bias = gate_args(seed=4)
    t, e = logits.shape
    assert_same(*call(logits, bias, scoring=scoring))
    assert_same(*call(logits, bias, 6, 2, 4, scoring=scoring))                 # groups
    mask = torch.arange(t) % 3 != 0
    got, want = call(logits, bias, scoring=scoring, mask=mask)
    assert_same(got, want)
    assert (got[0][~mask] == -1).all() and (got[1][~mask] == 0).all()
    assert_same(*call(logits, bias, ep=(0, 4), tp=(1, 2), scoring=scoring))      # EP/TP masking alone
    ident = torch.arange(e + 1, dtype=torch.int32)[:, None].repeat(1, 2)
    got, want = call(logits, bias, shared=True, s=1, scoring=scoring, to_physical_map=ident,
                     logical_count=torch.ones(e + 1, dtype=torch.int32))
    assert_same(got, want)
    assert (got[0][:, -1] == e).all() and (got[1][:, -1] == 1.0).all()


def test_extreme_logits_keep_their_relative_precision():
    """sqrt-softplus of -60 is ~1e-13: a log(1 + exp(x)) written without log1p gives 0."""
    logits = torch.tensor([[-60.0, -50.0, -40.0, -70.0] * 2, [30.0, 25.0, -80.0, 0.0] * 2])
    assert_same(*call(logits, torch.zeros(8), k=4, scoring="sqrtsoftplus"))


@torch.no_grad()
def test_matches_the_model_gate_for_scored_and_hash_layers():
    cfg = model_config.tiny(n_routed_experts=64, num_experts_per_tok=6)
    g = torch.Generator().manual_seed(5)
    x = torch.randn(17, cfg.hidden_size, generator=g)
    token_ids = torch.randint(0, cfg.vocab_size, (17,), generator=g)
    scored = Gate(cfg.num_hash_layers, cfg)
    assert not scored.hash
    scored.weight.copy_(torch.randn(scored.weight.shape, generator=g) * 0.2)
    scored.bias.copy_(torch.randn(64, generator=g) * 0.05)
    weights, indices = scored(x, token_ids)
    logits = nx.linear(x, scored.weight)
    idx, w = ops.top2_sum_gate(logits, scored.bias, 6, 0, 0, False, 0, cfg.routed_scaling_factor,
                               0, 1, 0, 1, "sqrtsoftplus", backend="interp")
    assert torch.equal(idx, indices)
    torch.testing.assert_close(w, weights, rtol=RTOL, atol=0)

    hashed = Gate(0, cfg)
    assert hashed.hash
    hashed.weight.copy_(scored.weight)
    hashed.tid2eid.copy_(torch.stack([torch.randperm(64, generator=g)[:6] for _ in range(cfg.vocab_size)]))
    hashed.tid2eid[token_ids[0], 1] = hashed.tid2eid[token_ids[0], 0]  # one expert twice
    weights, indices = hashed(x, token_ids)
    idx, w = ops.hash_gate(logits, token_ids, hashed.tid2eid, cfg.routed_scaling_factor)
    assert torch.equal(idx, indices)
    torch.testing.assert_close(w, weights, rtol=RTOL, atol=0)
    idx32, w32 = ops.hash_gate(logits, token_ids.int(), hashed.tid2eid, cfg.routed_scaling_factor)
    assert torch.equal(idx32, idx) and torch.equal(w32, w)
    empty = ops.hash_gate(logits[:0], token_ids[:0], hashed.tid2eid, 1.5)
    assert empty[0].shape == (0, 6) and empty[1].shape == (0, 6)


def test_normalize_weight():
    w = torch.rand(7, 6, generator=torch.Generator().manual_seed(6))
    w[0] = 0.0
    den, out = ops.normalize_weight(w)
    want_den, want = reference.normalize_weight(w)
    torch.testing.assert_close(den.double(), want_den, rtol=RTOL, atol=0)
    torch.testing.assert_close(out.double(), want, rtol=RTOL, atol=0)
    assert (out[0] == 0).all() and float(den[0]) == float(torch.tensor(1e-20))
    assert ops.normalize_weight(w[:0])[1].shape == (0, 6)


def test_empty_batch():
    logits, bias = gate_args()
    idx, w = ops.top2_sum_gate(logits[:0], bias, 4, 0, 0, False, 0, 1.0, 0, 1, 0, 1, "sigmoid")
    assert idx.shape == (0, 4) and w.shape == (0, 4)


def _bad(fn, exc, match):
    with pytest.raises(exc, match=match):
        fn()


def test_bad_inputs_raise_typed_errors_naming_the_argument():
    logits, bias = gate_args()
    base = dict(logits=logits, bias=bias, num_topk=4, num_topk_groups=0, num_groups=0, use_shared_as_routed=False,
                num_shared_experts=0, routed_scaling_factor=1.0, ep_rank=0, num_ep_ranks=1, tp_rank=0,
                num_tp_ranks=1, scoring_func="sigmoid")

    def gate(**kw):
        return lambda: ops.top2_sum_gate(**dict(base, **kw))

    _bad(gate(logits=logits.double()), ops.RoutingTypeError, "logits must be torch.float32")
    _bad(gate(logits=logits.t()), ops.RoutingValueError, "logits must have shape|logits must be contiguous")
    _bad(gate(logits=logits[:, :30].contiguous(), bias=bias[:30]), ops.RoutingValueError, "multiple of 4")
    _bad(gate(bias=bias[:8]), ops.RoutingValueError, "bias must have shape")
    _bad(gate(num_topk=33), ops.RoutingValueError, "num_topk")
    _bad(gate(num_topk=0), ops.RoutingValueError, "num_topk")
    _bad(gate(num_topk=2.0), ops.RoutingTypeError, "num_topk must be an int")
    _bad(gate(scoring_func="identity"), ops.RoutingValueError, "scoring_func")
    _bad(gate(num_groups=6, num_topk_groups=2), ops.RoutingValueError, "num_groups=6 must divide")
    _bad(gate(num_groups=4, num_topk_groups=5), ops.RoutingValueError, "num_topk_groups")
    _bad(gate(num_groups=16, num_topk_groups=1), ops.RoutingValueError, "exceeds the experts of the kept groups")
    _bad(gate(num_groups=32, num_topk_groups=2), ops.RoutingValueError, "experts per group")
    _bad(gate(use_shared_as_routed=True, num_shared_experts=1), ops.RoutingValueError, "to_physical_map")
    _bad(gate(use_shared_as_routed=True, num_shared_experts=3), ops.RoutingValueError, "1 or 2")
    phys = torch.zeros(32, 2, dtype=torch.int32)
    _bad(gate(to_physical_map=phys), ops.RoutingValueError, "given together")
    _bad(gate(to_physical_map=phys, logical_count=torch.full((32,), 3, dtype=torch.int32)), ops.RoutingValueError,
         "logical_count values")
    _bad(gate(num_ep_ranks=33), ops.RoutingValueError, "num_ep_ranks=33 exceeds")
    _bad(gate(ep_rank=1), ops.RoutingValueError, "ep_rank")
    _bad(gate(tp_rank=-1), ops.RoutingValueError, "tp_rank")
    _bad(gate(mask=torch.ones(11, dtype=torch.int32)), ops.RoutingTypeError, "mask must be torch.bool")
    _bad(gate(mask=torch.ones(5, dtype=torch.bool)), ops.RoutingValueError, "mask must have shape")
    _bad(gate(unmapped_topk_idx=torch.zeros(11, 4, 2, dtype=torch.int64)[..., 0]), ops.RoutingValueError,
         "unit stride")
    _bad(gate(fix_routing_mask=torch.ones(11, dtype=torch.bool), unmapped_topk_idx=torch.full((11, 4), 32)),
         ops.RoutingValueError, "unmapped_topk_idx of fix_routing_mask rows")
    for bad in (float("nan"), float("inf")):
        poisoned = logits.clone()
        poisoned[3, 5] = bad
        _bad(gate(logits=poisoned), ops.RoutingNonFiniteError, r"logits holds NaN or Inf at \(3, 5\)")
    _bad(gate(bias=torch.full((32,), float("nan"))), ops.RoutingNonFiniteError, "bias")

    scores = logits.clone()
    _bad(lambda: ops.topk_gate(scores, 33), ops.RoutingValueError, "num_topk")
    _bad(lambda: ops.topk_gate(scores[0], 2), ops.RoutingValueError, "scores must be 2-D")
    scores[0, 0] = float("nan")
    _bad(lambda: ops.topk_gate(scores, 2), ops.RoutingNonFiniteError, "scores holds NaN")
    _bad(lambda: ops.normalize_weight(torch.ones(3, 2, dtype=torch.float16)), ops.RoutingTypeError, "w must be")
    tab = torch.zeros(10, 6, dtype=torch.int64)
    ids = torch.zeros(11, dtype=torch.int64)
    _bad(lambda: ops.hash_gate(logits, ids + 10, tab, 1.0), ops.RoutingValueError, "token_ids must be in")
    _bad(lambda: ops.hash_gate(logits, ids, tab + 32, 1.0), ops.RoutingValueError, "tid2eid entries")
    _bad(lambda: ops.hash_gate(logits, ids.float(), tab, 1.0), ops.RoutingTypeError, "token_ids")
    _bad(lambda: ops.hash_gate(logits, ids, tab.int(), 1.0), ops.RoutingTypeError, "tid2eid must be torch.int64")
    _bad(lambda: ops.hash_gate(logits, ids, torch.zeros(10, 33, dtype=torch.int64), 1.0), ops.RoutingValueError,
         "num_topk")


def test_finite_checks_are_not_fooled_by_an_overflowing_sum():
    """The NaN/Inf check screens with one sum: large finite logits whose sum overflows
    (3e38 + 3e38 = inf) must still pass, and each non-finite value must still be found
    wherever it sits, including +inf and -inf together (their sum is NaN) for topk_gate,
    which takes infinities and rejects only NaN."""
    logits, bias = gate_args()
    huge = logits.clone()
    huge[0, :4] = 3e38
    huge[5, :4] = -3e38
    assert_same(*call(huge, bias))
    for where in ((0, 0), (10, 31), (4, 17)):
        for bad in (float("nan"), float("inf"), float("-inf")):
            poisoned = huge.clone()
            poisoned[where] = bad
            _bad(lambda: call(poisoned, bias), ops.RoutingNonFiniteError,
                 rf"logits holds NaN or Inf at \({where[0]}, {where[1]}\)")
    scores = huge.clone()
    scores[1, 2], scores[1, 3] = float("inf"), float("-inf")
    assert torch.equal(ops.topk_gate(scores, 4, backend="interp"), reference.topk_gate(scores, 4))
    scores[7, 9] = float("nan")
    _bad(lambda: ops.topk_gate(scores, 4), ops.RoutingNonFiniteError, r"scores holds NaN at \(7, 9\)")


def test_memoised_settings_still_check_types_on_every_call():
    """top2_sum_gate memoises its scalar checks; the memo keys on types, so a bool where an
    int goes (True == 1 in a plain dict) is rejected even after the int was accepted, and an
    unhashable argument gets the typed error, not the cache's."""
    logits, bias = gate_args()
    args = [logits, bias, 4, 0, 0, False, 0, 1.0, 0, 1, 0, 1, "sigmoid"]
    ops.top2_sum_gate(*args, backend="interp")
    for i, bad, name in ((2, True, "num_topk"), (9, True, "num_ep_ranks"), (2, [4], "num_topk"),
                         (5, 0, "use_shared_as_routed"), (7, "1.0", "routed_scaling_factor")):
        wrong = list(args)
        wrong[i] = bad
        _bad(lambda: ops.top2_sum_gate(*wrong, backend="interp"), ops.RoutingTypeError, name)


def test_memoised_launch_follows_every_scalar_and_optional_tensor():
    """top2_sum_gate memoises its launch (key, kernel choice, scalars) per signature: calls in
    turn that differ in one scalar only (an int where a float was too), in the token count,
    or in whether a mask / unmapped_topk_idx is given, each match the reference, twice round."""
    logits, bias = gate_args(t=5, e=32, seed=3)
    mask = torch.tensor([True, False, True, True, False])
    variants = [{}, {"scale": 1.0}, {"scale": 1}, {"ep": (1, 2)}, {"tp": (1, 2)}, {"scoring": "softmax"},
                {"k": 3}, {"mask": mask}, {"unmapped_topk_idx": torch.full((5, 4), -7)},
                {"mask": mask, "unmapped_topk_idx": torch.full((5, 4), -7)}, {"rows": 2}]
    for _ in range(2):
        for v in variants:
            v = dict(v)
            rows = v.pop("rows", 5)
            assert_same(*call(logits[:rows], bias, backend="cpu", **v))
