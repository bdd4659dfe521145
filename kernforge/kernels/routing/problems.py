"""The routing catalogue entries: problems, inputs (ties included), references and checks.

Indices must match the torch reference exactly; weights agree to float32 rounding of the
scoring functions (``exp``/``log`` differ by an ulp between numpy, libm and CUDA)."""
from __future__ import annotations

import torch

from kernforge.kernels.registry import KernelSpec, Problem, register
from kernforge.kernels.routing import config, reference
from kernforge.kernels.routing.kernel import hash_gate, normalize_weight, top2_sum_gate, topk_gate

#: relative tolerance of routing weights against the float32 / float64 torch references
WEIGHT_RTOL = 2e-6


def logits_with_ties(t: int, e: int, seed: int) -> torch.Tensor:
    """Random logits where every fourth row repeats a few values (exact score ties)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(t, e, generator=g)
    x[::4] = torch.randint(-2, 3, (x[::4].shape[0], e), generator=g).float() * 0.5
    return x


def assert_weights_close(name: str, got: torch.Tensor, want: torch.Tensor, rtol: float = WEIGHT_RTOL) -> None:
    got, want = got.cpu().double(), want.cpu().double()
    assert not torch.isnan(got).any(), f"{name} has NaN (unwritten or poisoned elements)"
    excess = (got - want).abs() - rtol * want.abs() - 1e-30
    if excess.numel() and excess.max() > 0:
        where = tuple(int(i) for i in torch.unravel_index(excess.argmax(), excess.shape))
        raise AssertionError(f"{name} differ at {where}: got {float(got[where])}, want {float(want[where])}")


def assert_equal(name: str, got: torch.Tensor, want: torch.Tensor) -> None:
    got = got.cpu()
    if got.shape != want.shape or not torch.equal(got, want):
        bad = (got != want).nonzero()[:5].tolist() if got.shape == want.shape else "shape"
        raise AssertionError(f"{name} differ at {bad}: got {got.flatten()[:8].tolist()}, "
                             f"want {want.flatten()[:8].tolist()}")


# ---------------------------------------------------------------- topk_gate

def _topk_inputs(p, seed, device):
    scores = logits_with_ties(p["num_tokens"], p["num_experts"], seed)
    return [scores.to(device), torch.full((p["num_tokens"], p["num_topk"]), -77, dtype=torch.int64, device=device)]


SPEC_TOPK_GATE = register(KernelSpec(
    name="topk_gate",
    family="routing",
    description="top-k expert indices per token (descending, ties to the smaller index)",
    factory=topk_gate,
    runtime_sizes=("num_tokens",),
    problems={label: Problem(label, dict(num_tokens=t, **config.choose_topk.heuristic("cuda", e, k)))
              for label, t, e, k in (("small", 9, 64, 6), ("demo", 512, 256, 6), ("bench", 4096, 256, 8))},
    make_inputs=_topk_inputs,
    outputs=(1,),
    reference=lambda inputs, p: [reference.topk_gate(inputs[0].cpu(), p["num_topk"])],
    check=lambda outputs, expected, inputs, p: assert_equal("topk_idx", outputs[0], expected[0]),
    bytes=lambda p: p["num_tokens"] * (p["num_experts"] * 4 + p["num_topk"] * 8),
    tags=("routing", "moe"),
))


# ---------------------------------------------------------------- top2_sum_gate

def _top2_inputs(p, seed, device):
    """Kernel arguments for problem ``p``; the small problem turns every option on (groups,
    shared slots, physical map with replicas, EP x TP masking, a mask, fixed rows)."""
    g = torch.Generator().manual_seed(seed + 1)
    t, e, k, s = p["num_tokens"], p["num_experts"], p["num_topk"], p["num_shared"]
    logits = logits_with_ties(t, e, seed)
    bias = torch.randn(e, generator=g) * 0.1
    mask = torch.rand(t, generator=g) > 0.2 if p["has_mask"] else torch.ones(1, dtype=torch.bool)
    fix = torch.rand(t, generator=g) > 0.6 if p["has_fix"] else torch.zeros(1, dtype=torch.bool)
    if p["has_unmapped"]:
        unmapped = torch.stack([torch.randperm(e, generator=g)[:k] for _ in range(t)])
        unmapped[0, -1] = -1  # a fixed row with an empty slot
    else:
        unmapped = torch.zeros(1, 1, dtype=torch.int64)
    if p["has_map"]:
        extra = p["extra"]
        phys = torch.randperm(e + s + extra, generator=g).int()
        table = torch.full((e + s, 1 + extra), -1, dtype=torch.int32)
        table[:, 0] = phys[:e + s]
        count = torch.ones(e + s, dtype=torch.int32)
        for r in range(extra):  # replicas of the first experts
            table[r % (e + s), 1 + r // (e + s)] = phys[e + s + r]
            count[r % (e + s)] += 1
    else:
        table, count = torch.zeros(1, 1, dtype=torch.int32), torch.ones(1, dtype=torch.int32)
    idx = torch.full((t, k + s), -77, dtype=torch.int64)
    w = torch.full((t, k + s), float("nan"))
    ep = p["ranks"]
    per_rank = (e + (table.shape[1] - 1 if p["has_map"] else 0)) // ep["num_ep_ranks"]
    tensors = [logits, bias, mask, fix, table, count, unmapped, idx, w]
    return [x.to(device) for x in tensors] + [p["scale"], ep["ep_rank"], ep["tp_rank"], ep["num_tp_ranks"],
                                              per_rank, per_rank * ep["num_tp_ranks"]]


def _top2_reference(inputs, p):
    logits, bias, mask, fix, table, count, unmapped = [x.cpu() for x in inputs[:7]]
    ep = p["ranks"]
    unmapped = unmapped.clone() if p["has_unmapped"] else None
    idx, w = reference.top2_sum_gate(
        logits, bias, p["num_topk"], p["num_topk_groups"], p["num_groups"], p["num_shared"] > 0, p["num_shared"],
        p["scale"], ep["ep_rank"], ep["num_ep_ranks"], ep["tp_rank"], ep["num_tp_ranks"], p["scoring_func"],
        mask=mask if p["has_mask"] else None, fix_routing_mask=fix if p["has_fix"] else None,
        to_physical_map=table if p["has_map"] else None, logical_count=count if p["has_map"] else None,
        unmapped_topk_idx=unmapped)
    return [idx, w] + ([unmapped] if p["has_unmapped"] else [])


def _top2_check(outputs, expected, inputs, p):
    assert_equal("topk_idx", outputs[0], expected[0])
    assert_weights_close("topk_weights", outputs[1], expected[1])
    if p["has_unmapped"]:
        assert_equal("unmapped_topk_idx", outputs[2], expected[2])


_NO_RANKS = dict(ep_rank=0, num_ep_ranks=1, tp_rank=0, num_tp_ranks=1)


def _top2_problem(label, num_tokens, num_experts, num_topk, num_groups, num_topk_groups, scoring_func,
                  num_shared=0, options=False, extra=0, ranks=_NO_RANKS, scale=2.5):
    kernel = config.choose_top2_sum.heuristic("cuda", num_experts=num_experts, num_topk=num_topk, num_groups=num_groups,
                                    num_topk_groups=num_topk_groups, scoring_func=scoring_func,
                                    num_shared=num_shared, has_mask=options, has_fix=options,
                                    has_unmapped=options, has_map=options)
    return Problem(label, dict(kernel, num_tokens=num_tokens, extra=extra, ranks=ranks, scale=scale))


SPEC_TOP2_SUM_GATE = register(KernelSpec(
    name="top2_sum_gate",
    family="routing",
    description="TileKernels' top2_sum_gate: scoring, biased ranking, group limits, shared slots, maps, EP/TP",
    factory=top2_sum_gate,
    runtime_sizes=("num_tokens", "extra", "ranks", "scale"),
    problems={
        "small": _top2_problem("small", 13, 32, 4, 8, 3, "sigmoid", num_shared=2, options=True, extra=6,
                               ranks=dict(ep_rank=1, num_ep_ranks=4, tp_rank=1, num_tp_ranks=2)),
        # DeepSeek-V3's configuration: 256 experts in 8 groups, 4 kept, top-8
        "demo": _top2_problem("demo", 512, 256, 8, 8, 4, "sigmoid"),
        "bench": _top2_problem("bench", 4096, 256, 8, 8, 4, "sigmoid"),
    },
    make_inputs=_top2_inputs,
    outputs=(7, 8, 6),
    reference=_top2_reference,
    check=_top2_check,
    bytes=lambda p: p["num_tokens"] * (p["num_experts"] * 4 + (p["num_topk"] + p["num_shared"]) * 12),
    tags=("routing", "moe"),
))


# ---------------------------------------------------------------- normalize_weight

def _normalize_inputs(p, seed, device):
    g = torch.Generator().manual_seed(seed)
    t, k = p["num_tokens"], p["num_topk"]
    w = torch.rand(t, k, generator=g)
    w[0] = 0.0  # an all-zero row: the 1e-20 keeps it finite
    return [x.to(device) for x in (w, torch.full((t,), float("nan")), torch.full((t, k), float("nan")))]


def _normalize_check(outputs, expected, inputs, p):
    assert_weights_close("denominator", outputs[0], expected[0])
    assert_weights_close("normalized", outputs[1], expected[1])


SPEC_NORMALIZE_WEIGHT = register(KernelSpec(
    name="normalize_weight",
    family="routing",
    description="routing weights divided by their row sum + 1e-20",
    factory=normalize_weight,
    runtime_sizes=("num_tokens",),
    problems={label: Problem(label, dict(num_tokens=t, **config.choose_normalize.heuristic("cuda", k)))
              for label, t, k in (("small", 7, 6), ("demo", 4096, 8), ("bench", 65536, 8))},
    make_inputs=_normalize_inputs,
    outputs=(1, 2),
    reference=lambda inputs, p: list(reference.normalize_weight(inputs[0].cpu())),
    check=_normalize_check,
    bytes=lambda p: p["num_tokens"] * (p["num_topk"] * 8 + 4),
    tags=("routing", "moe"),
))


# ---------------------------------------------------------------- hash_gate

def _hash_inputs(p, seed, device):
    g = torch.Generator().manual_seed(seed)
    t, e, k, v = p["num_tokens"], p["num_experts"], p["num_topk"], p["vocab"]
    logits = logits_with_ties(t, e, seed)
    token_ids = torch.randint(0, v, (t,), generator=g)
    tid2eid = torch.stack([torch.randperm(e, generator=g)[:k] for _ in range(v)])
    tid2eid[0, 1] = tid2eid[0, 0]  # a table row naming one expert twice (random tables may)
    token_ids[0] = 0
    out = [torch.full((t, k), -77, dtype=torch.int64), torch.full((t, k), float("nan"))]
    return [x.to(device) for x in (logits, token_ids, tid2eid, *out)] + [p["scale"]]


def _hash_check(outputs, expected, inputs, p):
    assert_equal("topk_idx", outputs[0], expected[0])
    assert_weights_close("topk_weights", outputs[1], expected[1])


SPEC_HASH_GATE = register(KernelSpec(
    name="hash_gate",
    family="routing",
    description="V4 hash routing: experts from tid2eid[token], the model Gate's weights",
    factory=hash_gate,
    runtime_sizes=("num_tokens", "vocab", "scale"),
    problems={label: Problem(label, dict(num_tokens=t, vocab=v, scale=1.5,
                                         **config.choose_hash.heuristic("cuda", e, k, "sqrtsoftplus", True)))
              for label, t, v, e, k in (("small", 9, 50, 64, 6), ("demo", 512, 4096, 256, 6),
                                        ("bench", 4096, 129280, 256, 6))},
    make_inputs=_hash_inputs,
    outputs=(3, 4),
    reference=lambda inputs, p: list(reference.hash_gate(inputs[0].cpu(), inputs[1].cpu(), inputs[2].cpu(),
                                                         p["scale"], p["scoring_func"], p["norm_topk_prob"])),
    check=_hash_check,
    bytes=lambda p: p["num_tokens"] * (p["num_experts"] * 4 + p["num_topk"] * 24),
    tags=("routing", "moe"),
))
