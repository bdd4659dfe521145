"""Mixture of experts (spec §2.5): sqrt-softplus gate, hash-routed first layers,
one shared expert, SwiGLU clamped at `swiglu_limit`.

Routing weights are the unbiased scores of the chosen experts, renormalised to
sum to one and multiplied by `routed_scaling_factor`; the gate bias only
changes which experts are chosen. Each expert multiplies its hidden
activation by the routing weight before its down projection, as upstream does.
"""

from __future__ import annotations

import torch
from torch import nn

from kernforge.model import numerics as nx
from kernforge.model.config import ModelConfig
from kernforge.model.primitives import Linear


class Gate(nn.Module):
    def __init__(self, layer_id: int, config: ModelConfig):
        super().__init__()
        self.topk, self.scoring_func = config.num_experts_per_tok, config.scoring_func
        self.route_scale, self.norm_topk_prob = config.routed_scaling_factor, config.norm_topk_prob
        self.hash = config.is_hash_layer(layer_id)
        self.weight = nn.Parameter(torch.empty(config.n_routed_experts, config.hidden_size))
        if self.hash:
            self.register_buffer("tid2eid", torch.zeros(config.vocab_size, self.topk, dtype=torch.int64))
            self.bias = None
        else:
            self.bias = nn.Parameter(torch.empty(config.n_routed_experts))

    def forward(self, x: torch.Tensor, token_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x [n, D], token_ids [n] -> (weights [n, k], expert indices [n, k])."""
        logits = nx.linear(x, self.weight.to(x.dtype))
        if self.scoring_func == "sqrtsoftplus":
            scores = torch.sqrt(nx.softplus(logits))
        elif self.scoring_func == "sigmoid":
            scores = nx.sigmoid(logits)
        else:
            scores = nx.softmax(logits, dim=-1)
        if self.hash:
            indices = self.tid2eid[token_ids]
        else:
            indices = nx.topk_indices(scores + self.bias.to(x.dtype), self.topk)
        weights = scores.gather(1, indices)
        if self.scoring_func != "softmax" and self.norm_topk_prob:
            weights = weights / nx.tree_sum(weights, -1, keepdim=True)
        return weights * self.route_scale, indices


class Expert(nn.Module):
    def __init__(self, hidden_size: int, moe_intermediate_size: int, swiglu_limit: float):
        super().__init__()
        self.w1 = Linear(hidden_size, moe_intermediate_size)
        self.w2 = Linear(moe_intermediate_size, hidden_size)
        self.w3 = Linear(hidden_size, moe_intermediate_size)
        self.swiglu_limit = swiglu_limit

    def forward(self, x: torch.Tensor, weights: torch.Tensor | None = None) -> torch.Tensor:
        gate, up = self.w1(x), self.w3(x)  # fresh tensors, so the elementwise steps run in place
        if self.swiglu_limit > 0:
            up.clamp_(-self.swiglu_limit, self.swiglu_limit)
            gate.clamp_(max=self.swiglu_limit)
        h = nx.silu(gate).mul_(up)
        if weights is not None:
            h.mul_(weights)
        return self.w2(h)


class MoE(nn.Module):
    def __init__(self, layer_id: int, config: ModelConfig):
        super().__init__()
        self.n_routed_experts = config.n_routed_experts
        self.gate = Gate(layer_id, config)
        self.experts = nn.ModuleList(
            Expert(config.hidden_size, config.moe_intermediate_size, config.swiglu_limit)
            for _ in range(config.n_routed_experts))
        # The current checkpoint revision clamps the shared expert too (spec §7).
        self.shared_experts = Expert(config.hidden_size, config.moe_intermediate_size, config.swiglu_limit)

    def forward(self, x: torch.Tensor, token_ids: torch.Tensor) -> torch.Tensor:
        """Shared expert plus, for each distinct expert a token is routed to, that expert's weighted output.

        A hash table may name one expert twice for a token (possible with random
        tables; the official one lists distinct experts). DeepSeek's reference
        then adds that expert ONCE: it runs `y[idx] += expert(x[idx], ...)`, and
        an indexed `+=` with a repeated row writes the row back once instead of
        accumulating. Both slots carry the same weight (same score, same
        normaliser), so the token gets w_e * expert_e(x) one time, and the
        duplicate still counts twice in the normalising sum. Here that is done
        explicitly: each (token, expert) pair is one row, with the weight of the
        first slot naming the expert.
        """
        shape = x.shape
        x = x.reshape(-1, shape[-1])
        weights, indices = self.gate(x, token_ids.reshape(-1))
        y = self.shared_experts(x)
        for e in torch.unique(indices).tolist():  # ascending: a token adds its experts in index order
            hit = indices == e
            rows = hit.any(dim=1).nonzero().squeeze(1)  # each token once
            slot = hit[rows].to(torch.int8).argmax(dim=1)  # first slot naming e (argmax returns the first)
            # index_select/index_add_ on these distinct rows: the same rows as x[rows] / y[rows] += ...,
            # several times faster on the CPU.
            y.index_add_(0, rows, self.experts[e](x.index_select(0, rows), weights[rows, slot, None]))
        return y.reshape(shape)
