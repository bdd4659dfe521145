"""Routing's compile-time configuration: the thread count per token block.

One block selects one token's experts (:mod:`.kernel`): element-wise scoring over ``E``
experts and ``k`` arg-max passes over an ``E/16 x 16`` key tile, 128 threads (two experts
per thread for E = 256).  The host backends run a block as one thread, so the count does not
matter there; keeping it the same everywhere lets the ops and the catalogue share builds.
"""
from __future__ import annotations

from kernforge.tune.consult import tuned

def threads(backend: str) -> int:
    return 128


@tuned("topk_gate")
def choose_topk(backend: str, num_experts: int, num_topk: int) -> dict:
    return dict(num_experts=num_experts, num_topk=num_topk, threads=threads(backend))


@tuned("top2_sum_gate")
def choose_top2_sum(backend: str, **params) -> dict:
    """``params``: :func:`~kernforge.kernels.routing.top2_sum_gate`'s compile-time parameters."""
    return dict(params, threads=threads(backend))


@tuned("normalize_weight")
def choose_normalize(backend: str, num_topk: int) -> dict:
    return dict(num_topk=num_topk, threads=threads(backend))


@tuned("hash_gate")
def choose_hash(backend: str, num_experts: int, num_topk: int, scoring_func: str, norm_topk_prob: bool) -> dict:
    return dict(num_experts=num_experts, num_topk=num_topk, scoring_func=scoring_func,
                norm_topk_prob=norm_topk_prob, threads=threads(backend))
