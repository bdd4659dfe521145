"""Independent torch references for MoE permutation: the mapping by a stable sort, the
expansion and the weighted reduction in float64.  None of them shares code or method
with the kernels (which histogram, scan and scatter)."""
from __future__ import annotations

import torch


def mapping(topk_idx: torch.Tensor, num_experts: int, alignment: int, num_expanded_tokens: int):
    """``(pos_to_expert, pos_to_token, pos_to_token_topk, token_topk_to_pos, expert_start,
    expert_end, num_tokens_per_expert)`` with valid rows in flat slot order inside each
    expert's segment (a stable sort of the slots by expert), padding ``-1``."""
    t, k = topk_idx.shape
    flat = topk_idx.reshape(-1).long().cpu()
    valid = flat >= 0
    counts = torch.bincount(flat[valid], minlength=num_experts)
    padded = (counts + alignment - 1) // alignment * alignment
    end = torch.cumsum(padded, 0)
    start = end - padded
    key = torch.where(valid, flat, num_experts)
    order = torch.sort(key, stable=True).indices            # slots grouped by expert, in flat order
    sorted_key = key[order]
    first = torch.searchsorted(sorted_key, sorted_key, right=False)  # first sorted index of each key
    rank = torch.arange(flat.numel()) - first
    n = num_expanded_tokens
    p2e, p2t, p2tk = (torch.full((n,), -1, dtype=torch.int32) for _ in range(3))
    t2p = torch.full((flat.numel(),), -1, dtype=torch.int32)
    keep = sorted_key < num_experts
    slots, experts = order[keep], sorted_key[keep]
    pos = start[experts] + rank[keep]
    p2e[pos] = experts.int()
    p2t[pos] = (slots // k).int()
    p2tk[pos] = slots.int()
    t2p[slots] = pos.int()
    return (p2e, p2t, p2tk, t2p.view(t, k), start.int(), end.int(), padded.int())


def expand(x: torch.Tensor, token_topk_to_pos: torch.Tensor, pos_to_expert: torch.Tensor) -> torch.Tensor:
    """Row ``p`` of the result: the token whose slot maps to ``p``; zero where
    ``pos_to_expert[p] < 0``; rows nobody maps to and that are not padding are NaN
    (undefined; the kernels leave them unwritten)."""
    n = pos_to_expert.numel()
    out = torch.full((n,) + tuple(x.shape[1:]), float("nan"), dtype=torch.float64)
    out[pos_to_expert.cpu() < 0] = 0.0
    t2p = token_topk_to_pos.cpu().long()
    tok = torch.arange(t2p.shape[0])[:, None].expand_as(t2p)
    ok = t2p >= 0
    out[t2p[ok]] = x.cpu().double()[tok[ok]]
    return out


def reduce(x: torch.Tensor, topk_weights, token_topk_to_pos: torch.Tensor, x_sf=None, sf=None) -> torch.Tensor:
    """float64 ``out[t] = sf * sum_j w[t, j] * x_sf[p] * x[p]`` over slots with ``p >= 0``."""
    t2p = token_topk_to_pos.cpu().long()
    t, k = t2p.shape
    xd = x.cpu().double()
    out = torch.zeros((t, x.shape[1]), dtype=torch.float64)
    for j in range(k):
        p = t2p[:, j]
        ok = p >= 0
        s = torch.ones(t, dtype=torch.float64)
        if topk_weights is not None:
            s = topk_weights.cpu().double()[:, j]
        if x_sf is not None:
            s = s * torch.where(ok, x_sf.cpu().double()[p.clamp(min=0)], 0.0)
        out[ok] += s[ok, None] * xd[p[ok]]
    if sf is not None:
        out = out * sf.cpu().double().reshape(())
    return out
