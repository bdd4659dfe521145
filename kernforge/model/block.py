"""Manifold-constrained hyper-connections and the transformer block (spec §2.3).

The residual stream is `hc_mult` (M) parallel copies X [b, s, M, D]. Around
each sublayer f, a mixer computes from X (per token): pre weights that
collapse X to f's input, post weights that spread f's output back, and an
M x M combination matrix, made near doubly stochastic by Sinkhorn
iterations, that mixes the copies: X'_k = post_k f(u) + sum_j C[j, k] X_j.
"""

from __future__ import annotations

import torch
from torch import nn

from kernforge.model import numerics as nx
from kernforge.model.attention import Attention
from kernforge.model.config import ModelConfig
from kernforge.model.moe import MoE
from kernforge.model.primitives import RMSNorm, RopeTable


def hc_mixes(x: torch.Tensor, fn: torch.Tensor, norm_eps: float) -> torch.Tensor:
    """m = (fn . flat(X)) * rms(flat(X))^-1 -> [b, s, rows of fn]."""
    flat = x.flatten(2)
    return nx.linear(flat, fn.to(x.dtype)) * nx.rsqrt(nx.mean_square(flat, -1, keepdim=True) + norm_eps)


def sinkhorn(logits: torch.Tensor, iters: int, eps: float) -> torch.Tensor:
    """Row softmax, then alternate column and row normalisation ([..., M, M], rows = sources)."""
    c = nx.softmax(logits, dim=-1) + eps
    c = c / (nx.tree_sum(c, -2, keepdim=True) + eps)
    for _ in range(iters - 1):
        c = c / (nx.tree_sum(c, -1, keepdim=True) + eps)
        c = c / (nx.tree_sum(c, -2, keepdim=True) + eps)
    return c


def hc_pre(x: torch.Tensor, fn: torch.Tensor, scale: torch.Tensor, base: torch.Tensor, iters: int,
           norm_eps: float, hc_eps: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Collapse X to the sublayer input u; also return post [b,s,M] and comb [b,s,M,M]."""
    m_count = x.shape[2]
    mixes = hc_mixes(x, fn, norm_eps)
    scale, base = scale.to(x.dtype), base.to(x.dtype)
    pre = nx.sigmoid(scale[0] * mixes[..., :m_count] + base[:m_count]) + hc_eps
    post = 2 * nx.sigmoid(scale[1] * mixes[..., m_count:2 * m_count] + base[m_count:2 * m_count])
    comb_logits = (scale[2] * mixes[..., 2 * m_count:] + base[2 * m_count:]).unflatten(-1, (m_count, m_count))
    comb = sinkhorn(comb_logits, iters, hc_eps)
    return weighted_streams(pre, x), post, comb


def weighted_streams(w: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """sum_j w[b,s,j] X[b,s,j,:]."""
    if nx.is_deterministic():
        return nx.sum_terms([w[:, :, j, None] * x[:, :, j] for j in range(x.shape[2])])
    return torch.matmul(w[:, :, None, :], x).squeeze(2)


def hc_post(y: torch.Tensor, x: torch.Tensor, post: torch.Tensor, comb: torch.Tensor) -> torch.Tensor:
    """X'_k = post_k y + sum_j comb[j, k] X_j (comb rows are sources, columns destinations)."""
    if nx.is_deterministic():
        mixed = nx.sum_terms([comb[:, :, j, :, None] * x[:, :, j, None, :] for j in range(x.shape[2])])
        return post[..., None] * y[:, :, None, :] + mixed
    # In place, one source copy at a time: no [b, s, M, M, D] product and no batched 4x4 GEMM
    # (torch runs those as one tiny matmul per token).
    out = post[..., None] * y[:, :, None, :]
    for j in range(x.shape[2]):
        out.addcmul_(comb[:, :, j, :, None], x[:, :, j, None, :])
    return out


def hc_head(x: torch.Tensor, fn: torch.Tensor, scale: torch.Tensor, base: torch.Tensor,
            norm_eps: float, hc_eps: float) -> torch.Tensor:
    """Final collapse of the M copies: sigmoid pre weights only, no Sinkhorn, no post."""
    pre = nx.sigmoid(scale.to(x.dtype) * hc_mixes(x, fn, norm_eps) + base.to(x.dtype)) + hc_eps
    return weighted_streams(pre, x)


class Block(nn.Module):
    def __init__(self, layer_id: int, config: ModelConfig, rope: RopeTable):
        super().__init__()
        m, d = config.hc_mult, config.hidden_size
        mix = (2 + m) * m
        self.norm_eps, self.hc_eps, self.hc_iters = config.rms_norm_eps, config.hc_eps, config.hc_sinkhorn_iters
        self.attn = Attention(layer_id, config, rope)
        self.ffn = MoE(layer_id, config)
        self.attn_norm = RMSNorm(d, config.rms_norm_eps)
        self.ffn_norm = RMSNorm(d, config.rms_norm_eps)
        self.hc_attn_fn = nn.Parameter(torch.empty(mix, m * d))
        self.hc_ffn_fn = nn.Parameter(torch.empty(mix, m * d))
        self.hc_attn_base = nn.Parameter(torch.empty(mix))
        self.hc_ffn_base = nn.Parameter(torch.empty(mix))
        self.hc_attn_scale = nn.Parameter(torch.empty(3))
        self.hc_ffn_scale = nn.Parameter(torch.empty(3))

    def _mix(self, x: torch.Tensor, fn, scale, base):
        return hc_pre(x, fn, scale, base, self.hc_iters, self.norm_eps, self.hc_eps)

    def forward(self, x: torch.Tensor, start_pos: int, token_ids: torch.Tensor) -> torch.Tensor:
        u, post, comb = self._mix(x, self.hc_attn_fn, self.hc_attn_scale, self.hc_attn_base)
        x = hc_post(self.attn(self.attn_norm(u), start_pos), x, post, comb)
        u, post, comb = self._mix(x, self.hc_ffn_fn, self.hc_ffn_scale, self.hc_ffn_base)
        return hc_post(self.ffn(self.ffn_norm(u), token_ids), x, post, comb)
