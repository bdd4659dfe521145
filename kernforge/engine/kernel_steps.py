"""The engine's steps that run as kernforge kernels (besides attention and the indexer top-k,
which live in `engine.py`).

Why a module of thin wrappers: each wrapper registers one step name as a
"kernel" step, so the dispatch-mode test can check that it issues no torch
math, and `steps.record()` times it. The ops are `kernforge.ops.layers`
(docs/kernels/layers.md); every one computes in float32 and rounds once, so at
the model's float32 they agree with the reference's functions to float32
rounding (the exact-mode tests' 1e-4 holds unchanged).

The hyper-connection streams travel as one contiguous tensor `[1, N, M, D]`
(copy j at `[..., j, :]`, the layout `hc_pre`/`hc_post`/`hc_head` read).
"""

from __future__ import annotations

import torch

from kernforge import ops
from kernforge.engine.steps import step


@step("embedding", "kernel", "token rows of the embedding table (ops.embedding)")
def embedding(weight: torch.Tensor, ids: torch.Tensor, backend: str) -> torch.Tensor:
    return ops.embedding(ids, weight, backend=backend)


@step("rms_norm", "kernel", "RMSNorm, weighted or not (ops.rms_norm)")
def rms_norm(module, x: torch.Tensor, eps: float | None, backend: str) -> torch.Tensor:
    """module(x) for an RMSNorm module, or with module None the unweighted normalisation."""
    if module is None:
        return ops.rms_norm(x, None, eps, backend=backend)
    return ops.rms_norm(x, module.weight, module.eps, backend=backend)


@step("rope", "kernel", "RoPE/YaRN rotation (ops.rotary_embedding)")
def rope(cos_sin: tuple[torch.Tensor, torch.Tensor], x: torch.Tensor, positions: torch.Tensor, backend: str,
         inverse: bool = False) -> torch.Tensor:
    """x [1, N, (h,) d] rotated at positions [N] (one position per flattened token)."""
    cos, sin = cos_sin
    return ops.rotary_embedding(x, positions.expand(x.shape[:2]).contiguous(), cos, sin, inverse=inverse,
                                backend=backend)


@step("hadamard", "kernel", "Hadamard transform of the indexer q (ops.hadamard_transform)")
def hadamard(x: torch.Tensor, backend: str) -> torch.Tensor:
    return ops.hadamard_transform(x, backend=backend)


@step("hc_pre", "kernel", "hyper-connection pre mixing + Sinkhorn (ops.hc_pre)")
def hc_pre(block, streams: torch.Tensor, which: str, backend: str):
    """streams [1, N, M, D] -> (u [1, N, D], post [1, N, M], comb [1, N, M, M])."""
    fn, scale, base = (getattr(block, f"hc_{which}_{p}") for p in ("fn", "scale", "base"))
    return ops.hc_pre(streams, fn, scale, base, block.hc_iters, block.norm_eps, block.hc_eps, backend=backend)


@step("hc_post", "kernel", "hyper-connection post mixing (ops.hc_post)")
def hc_post(y: torch.Tensor, streams: torch.Tensor, post: torch.Tensor, comb: torch.Tensor,
            backend: str) -> torch.Tensor:
    return ops.hc_post(y, streams, post, comb, backend=backend)


@step("hc_head", "kernel", "final hyper-connection collapse (ops.hc_head)")
def hc_head(streams: torch.Tensor, fn, scale, base, norm_eps: float, hc_eps: float, backend: str) -> torch.Tensor:
    return ops.hc_head(streams, fn, scale, base, norm_eps, hc_eps, backend=backend)


@step("routing", "kernel", "expert choice and weights (ops.hash_gate / ops.top2_sum_gate)")
def routing(gate, logits: torch.Tensor, token_ids: torch.Tensor, backend: str):
    """`Gate.forward` from its logits [T, E] (float32): (topk_idx int64 [T, k], weights float32 [T, k]).

    Hash layers: `hash_gate` (experts `tid2eid[token]`). Scored layers: `top2_sum_gate`
    without groups, shared slots or EP/TP masking, which docs/kernels/routing.md states
    equals `Gate.forward` (weights renormalised, so the engine requires norm_topk_prob
    and sigmoid or sqrtsoftplus scoring for them)."""
    if gate.hash:
        return ops.hash_gate(logits, token_ids, gate.tid2eid, gate.route_scale, gate.scoring_func,
                             gate.norm_topk_prob, backend=backend)
    return ops.top2_sum_gate(logits, gate.bias.float().contiguous(), gate.topk, 0, 0, False, 0,
                             gate.route_scale, 0, 1, 0, 1, gate.scoring_func, backend=backend)


@step("moe_mapping", "kernel", "expert-major row mapping of the routed slots (ops.get_fused_mapping)")
def moe_mapping(topk_idx: torch.Tensor, num_experts: int, backend: str):
    return ops.get_fused_mapping(topk_idx, num_experts, 0, MOE_ALIGNMENT, backend=backend)


MOE_ALIGNMENT = 64  # the smaller of get_fused_mapping's two alignments: less padding per expert


@step("moe_expand", "kernel", "token rows copied to their experts' rows (ops.expand_to_fused)")
def moe_expand(x: torch.Tensor, token_topk_to_pos: torch.Tensor, pos_to_expert: torch.Tensor,
               backend: str) -> torch.Tensor:
    return ops.expand_to_fused(x, token_topk_to_pos, pos_to_expert, backend=backend)


@step("swiglu", "kernel", "expert activation with the routing weight (ops.swiglu)")
def swiglu(gate_up: torch.Tensor, weights: torch.Tensor | None, limit: float, backend: str) -> torch.Tensor:
    return ops.swiglu(gate_up, weights, limit, backend=backend)
