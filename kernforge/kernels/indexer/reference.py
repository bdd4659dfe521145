"""The torch oracle of the indexer score kernel: the engine's former `indexer_scores` torch
step (the reference model's own arithmetic, `kernforge.model.compressor.Indexer`), moved
here, with the indexer module's `n_heads` and `scale` as arguments."""
from __future__ import annotations

import torch

from kernforge.model import numerics as nx


def indexer_scores(head_weights: torch.Tensor, q: torch.Tensor, keys: torch.Tensor, scale: float) -> torch.Tensor:
    """head_weights [s, h], q [s, h, d], keys [n, d] -> scores [s, n] = sum_h relu(q_h . k) * w_h * scale.

    Deterministic mode (`nx.deterministic()`): each dot is `nx.tree_sum`, the heads
    `nx.sum_terms`; otherwise the dots are a matmul."""
    weights = head_weights * scale
    terms = []
    for i in range(q.shape[1]):
        dots = nx.tree_sum(q[:, None, i, :] * keys[None], -1) if nx.is_deterministic() else q[:, i] @ keys.T
        terms.append(dots.relu_().mul_(weights[:, i, None]))
    # + 0.0 turns -0.0 (relu 0 times a negative weight) into +0.0: kernforge's topk ranks
    # -0.0 below +0.0 by bit order, the reference's sort treats them as a tie (lower index wins).
    return nx.sum_terms(terms) + 0.0
