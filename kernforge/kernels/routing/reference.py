"""torch references for the routing kernels: TileKernels' semantics written with whole-tensor
torch ops (stable sorts, gathers, masked fills), none of the kernel's integer-key machinery."""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

from kernforge.kernels.routing.kernel import REPLICA_HASH


def stable_topk(keys: torch.Tensor, k: int) -> torch.Tensor:
    """Indices of the ``k`` largest keys per row, descending, ties to the smaller index."""
    return torch.sort(keys, dim=-1, descending=True, stable=True).indices[..., :k]


def topk_gate(scores: torch.Tensor, num_topk: int) -> torch.Tensor:
    return stable_topk(scores, num_topk)


def scores_of(logits: torch.Tensor, scoring_func: str) -> torch.Tensor:
    if scoring_func == "sigmoid":
        return torch.sigmoid(logits)
    if scoring_func == "sqrtsoftplus":
        return F.softplus(logits).sqrt()
    return torch.softmax(logits, dim=-1)


def top2_sum_gate(logits: torch.Tensor, bias: torch.Tensor, num_topk: int, num_topk_groups: int, num_groups: int,
                  use_shared_as_routed: bool, num_shared_experts: int, routed_scaling_factor: float,
                  ep_rank: int, num_ep_ranks: int, tp_rank: int, num_tp_ranks: int, scoring_func: str,
                  mask: Optional[torch.Tensor] = None, fix_routing_mask: Optional[torch.Tensor] = None,
                  to_physical_map: Optional[torch.Tensor] = None, logical_count: Optional[torch.Tensor] = None,
                  unmapped_topk_idx: Optional[torch.Tensor] = None):
    """TileKernels' ``top2_sum_gate`` on the host: ``(topk_idx, topk_weights)``; ``unmapped_topk_idx``
    (when given) is updated in place as upstream does."""
    t, e = logits.shape
    s = num_shared_experts if use_shared_as_routed else 0
    scores = scores_of(logits, scoring_func)
    keys = (logits if scoring_func == "softmax" else scores) + bias
    if num_groups != num_topk_groups:
        grouped = keys.view(t, num_groups, e // num_groups)
        top_groups = stable_topk(grouped.topk(2, dim=-1).values.sum(-1), num_topk_groups)
        dropped = torch.ones(t, num_groups, dtype=torch.bool).scatter_(1, top_groups, False)
        keys = keys.masked_fill(dropped.repeat_interleave(e // num_groups, dim=1), float("-inf"))
    idx = stable_topk(keys, num_topk)
    active = torch.ones(t, dtype=torch.bool) if mask is None else mask.bool()
    if fix_routing_mask is not None and unmapped_topk_idx is not None:
        fixed = fix_routing_mask.bool() & active
        idx = torch.where(fixed[:, None], unmapped_topk_idx, idx)
    weights = scores.gather(1, idx.clamp(min=0))
    weights = weights / weights.sum(-1, keepdim=True).clamp(min=1e-20) * routed_scaling_factor
    if unmapped_topk_idx is not None:
        unmapped_topk_idx.copy_(torch.where(active[:, None], idx, -1))
    idx = torch.cat([idx, torch.arange(e, e + s).expand(t, s)], dim=1)
    weights = torch.cat([weights, torch.ones(t, s)], dim=1)
    if to_physical_map is not None:
        replica = (ep_rank + torch.arange(t, dtype=torch.int64)[:, None] * REPLICA_HASH) % \
            logical_count.long()[idx.clamp(min=0)]
        idx = torch.where(idx >= 0, to_physical_map.long()[idx.clamp(min=0), replica], idx)
    extra = to_physical_map.shape[1] - 1 if to_physical_map is not None else 0
    per_rank = (e + extra) // num_ep_ranks
    per_dp = per_rank * num_tp_ranks
    valid = (idx >= 0) & (torch.div(idx, per_rank, rounding_mode="floor") % num_tp_ranks == tp_rank)
    local = idx - tp_rank * per_rank
    local = local - torch.div(local, per_dp, rounding_mode="floor") * (per_dp - per_rank)
    idx = torch.where(valid & (local >= 0), local, -1)
    idx = torch.where(active[:, None], idx, -1)
    weights = torch.where(active[:, None], weights, 0.0)
    return idx, weights


def normalize_weight(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """float64 ``(sum + 1e-20, w / (sum + 1e-20))``."""
    den = w.double().sum(-1) + 1e-20
    return den, w.double() / den[:, None]


def hash_gate(logits: torch.Tensor, token_ids: torch.Tensor, tid2eid: torch.Tensor, routed_scaling_factor: float,
              scoring_func: str = "sqrtsoftplus", norm_topk_prob: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """float64 ``(tid2eid[token_ids], weights)``: the weights of ``kernforge.model.moe.Gate``'s
    hash layers, computed in double precision."""
    idx = tid2eid[token_ids.long()]
    w = scores_of(logits.double(), scoring_func).gather(1, idx)
    if scoring_func != "softmax" and norm_topk_prob:
        w = w / w.sum(-1, keepdim=True)
    return idx, w * routed_scaling_factor
