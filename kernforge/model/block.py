"""Manifold-constrained hyper-connections and the transformer block (spec §2.3).

The residual stream is `hc_mult` (M) parallel copies X_j [b, s, D]. Around
each sublayer f, a mixer computes from X (per token): pre weights that
collapse X to f's input, post weights that spread f's output back, and an
M x M combination matrix, made near doubly stochastic by Sinkhorn
iterations, that mixes the copies: X'_k = post_k f(u) + sum_j C[j, k] X_j.

Inside the blocks the copies are a list of M tensors (`Streams`), not one
[b, s, M, D] tensor (which is what `Transformer.forward_hidden` returns).
Every mixing step is then a plain per-token scaling of whole [b, s, D]
tensors, and each new copy is its own allocation: a stacked [8, 1024, 4, 256]
float32 tensor (capacity at spec §6's hidden size) is exactly 32 MiB, which
glibc always serves with a fresh mmap that is page-faulted in on first write
(~10 ms per block output here), while 8 MiB tensors reuse heap memory.
"""

from __future__ import annotations

import torch
from torch import nn

from kernforge.model import numerics as nx
from kernforge.model.attention import Attention
from kernforge.model.config import ModelConfig
from kernforge.model.moe import MoE
from kernforge.model.primitives import RMSNorm, RopeTable


Streams = list[torch.Tensor]


def hc_mixes(xs: Streams, fn: torch.Tensor, norm_eps: float) -> torch.Tensor:
    """m = (fn . flat(X)) * rms(flat(X))^-1 -> [b, s, rows of fn], flat(X) = the M copies end to end."""
    d = xs[0].shape[-1]
    fn = fn.to(xs[0].dtype)
    dots = nx.sum_terms([nx.linear(x, fn[:, j * d:(j + 1) * d]) for j, x in enumerate(xs)])
    mean_square = nx.sum_terms([nx.mean_square(x, -1, keepdim=True) for x in xs]) / len(xs)
    return dots * nx.rsqrt(mean_square + norm_eps)


def sinkhorn(logits: torch.Tensor, iters: int, eps: float) -> torch.Tensor:
    """Row softmax, then alternate column and row normalisation ([..., M, M], rows = sources).

    The iterations run on a [M, M, ...] copy: each normalising sum then adds
    M contiguous per-token planes, instead of reducing a size-M axis of a
    [tokens, M, M] tensor (about 5x faster for the per-token 4x4 matrices).
    """
    c = nx.softmax(logits, dim=-1).movedim((-2, -1), (0, 1)).contiguous() + eps
    c = c / (nx.tree_sum(c, 0, keepdim=True) + eps)
    for _ in range(iters - 1):
        c = c / (nx.tree_sum(c, 1, keepdim=True) + eps)
        c = c / (nx.tree_sum(c, 0, keepdim=True) + eps)
    return c.movedim((0, 1), (-2, -1))


def hc_pre(xs: Streams, fn: torch.Tensor, scale: torch.Tensor, base: torch.Tensor, iters: int,
           norm_eps: float, hc_eps: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Collapse X to the sublayer input u; also return post [b,s,M] and comb [b,s,M,M]."""
    m_count = len(xs)
    mixes = hc_mixes(xs, fn, norm_eps)
    scale, base = scale.to(mixes.dtype), base.to(mixes.dtype)
    pre = nx.sigmoid(scale[0] * mixes[..., :m_count] + base[:m_count]) + hc_eps
    post = 2 * nx.sigmoid(scale[1] * mixes[..., m_count:2 * m_count] + base[m_count:2 * m_count])
    comb_logits = (scale[2] * mixes[..., 2 * m_count:] + base[2 * m_count:]).unflatten(-1, (m_count, m_count))
    comb = sinkhorn(comb_logits, iters, hc_eps)
    return weighted_streams(pre, xs), post, comb


def weighted_streams(w: torch.Tensor, xs: Streams) -> torch.Tensor:
    """sum_j w[b,s,j] X_j."""
    if nx.is_deterministic():
        return nx.sum_terms([w[..., j, None] * x for j, x in enumerate(xs)])
    out = xs[0] * w[..., 0, None]
    for j in range(1, len(xs)):
        out.addcmul_(xs[j], w[..., j, None])
    return out


def hc_post(y: torch.Tensor, xs: Streams, post: torch.Tensor, comb: torch.Tensor) -> Streams:
    """X'_k = post_k y + sum_j comb[j, k] X_j (comb rows are sources, columns destinations)."""
    return [_add_weighted(post[..., k, None] * y, comb[..., k], xs) for k in range(len(xs))]


def _add_weighted(out: torch.Tensor, w: torch.Tensor, xs: Streams) -> torch.Tensor:
    """out + sum_j w[b,s,j] X_j; outside deterministic mode accumulated into `out` (a fresh
    tensor of the caller's), one addcmul_ per copy, with no temporary per term."""
    if nx.is_deterministic():
        return out + weighted_streams(w, xs)
    for j, x in enumerate(xs):
        out.addcmul_(x, w[..., j, None])
    return out


def hc_head(xs: Streams, fn: torch.Tensor, scale: torch.Tensor, base: torch.Tensor,
            norm_eps: float, hc_eps: float) -> torch.Tensor:
    """Final collapse of the M copies: sigmoid pre weights only, no Sinkhorn, no post."""
    mixes = hc_mixes(xs, fn, norm_eps)
    pre = nx.sigmoid(scale.to(mixes.dtype) * mixes + base.to(mixes.dtype)) + hc_eps
    return weighted_streams(pre, xs)


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

    def _mix(self, xs: Streams, fn, scale, base):
        return hc_pre(xs, fn, scale, base, self.hc_iters, self.norm_eps, self.hc_eps)

    def forward(self, xs: Streams, start_pos: int, token_ids: torch.Tensor) -> Streams:
        u, post, comb = self._mix(xs, self.hc_attn_fn, self.hc_attn_scale, self.hc_attn_base)
        xs = hc_post(self.attn(self.attn_norm(u), start_pos), xs, post, comb)
        u, post, comb = self._mix(xs, self.hc_ffn_fn, self.hc_ffn_scale, self.hc_ffn_base)
        return hc_post(self.ffn(self.ffn_norm(u), token_ids), xs, post, comb)
