"""The torch reference of the compressor pooling: ``Compressor._pool``'s candidates and
softmax-gated sum, in float64 (an independent formulation: the kernel computes in float32
with its own summation order, so the check is a float32 tolerance, not bits)."""
from __future__ import annotations

import torch


def compressor_pool(kv: torch.Tensor, score: torch.Tensor, n_entries: int, ratio: int, overlap: bool,
                    ape: torch.Tensor | None = None) -> torch.Tensor:
    """``kv, score [R, W]`` (rows from the block before entry 0; gates ``score + ape[row % ratio]``
    rounded to score's dtype, as the model's ``wgate(x) + ape``) -> ``[n_entries, d]`` float64."""
    r, n = ratio, n_entries
    if ape is not None:
        score = score + ape.to(score.dtype).repeat(-(-score.shape[0] // r), 1)[:score.shape[0]]
    d = kv.shape[-1] // 2 if overlap else kv.shape[-1]
    blocks_kv = kv[:(n + 1) * r].double().unflatten(0, (n + 1, r))
    blocks_score = score[:(n + 1) * r].double().unflatten(0, (n + 1, r))
    if overlap:
        cand_kv = torch.cat([blocks_kv[:n, :, :d], blocks_kv[1:, :, d:]], dim=1)
        cand_score = torch.cat([blocks_score[:n, :, :d], blocks_score[1:, :, d:]], dim=1)
    else:
        cand_kv, cand_score = blocks_kv[1:], blocks_score[1:]
    return (torch.softmax(cand_score, dim=1) * cand_kv).sum(1)
