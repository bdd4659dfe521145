"""Float64 hyper-connection references, written from the definitions (spec §2.3) with explicit
loops over the copies: independent of the kernel's tiling and of the model's torch code."""
from __future__ import annotations

import torch


def mixes(x: torch.Tensor, fn: torch.Tensor, norm_eps: float) -> torch.Tensor:
    """``(fn . flat(X)) / sqrt(mean(flat(X)^2) + eps)`` per token; ``x [tokens, M, D]``."""
    flat = x.double().flatten(1)
    return (flat @ fn.double().T) / torch.sqrt(flat.pow(2).mean(-1, keepdim=True) + norm_eps)


def sinkhorn(logits: torch.Tensor, iters: int, eps: float) -> torch.Tensor:
    """Row softmax, + eps, column normalisation, then ``iters - 1`` (row, column) rounds; ``[.., j, k]``."""
    c = torch.softmax(logits.double(), dim=-1) + eps
    c = c / (c.sum(-2, keepdim=True) + eps)
    for _ in range(iters - 1):
        c = c / (c.sum(-1, keepdim=True) + eps)
        c = c / (c.sum(-2, keepdim=True) + eps)
    return c


def hc_pre(x, fn, scale, base, iters: int, norm_eps: float, hc_eps: float):
    """``(u [tokens, D], post [tokens, M], comb [tokens, M, M])`` in float64."""
    m = x.shape[1]
    mx = mixes(x, fn, norm_eps)
    s, b = scale.double(), base.double()
    pre = torch.sigmoid(s[0] * mx[:, :m] + b[:m]) + hc_eps
    post = 2 * torch.sigmoid(s[1] * mx[:, m:2 * m] + b[m:2 * m])
    comb = sinkhorn((s[2] * mx[:, 2 * m:] + b[2 * m:]).view(-1, m, m), iters, hc_eps)
    u = sum(pre[:, j, None] * x[:, j].double() for j in range(m))
    return u, post, comb


def hc_head(x, fn, scale, base, norm_eps: float, hc_eps: float) -> torch.Tensor:
    m = x.shape[1]
    pre = torch.sigmoid(scale.double() * mixes(x, fn, norm_eps) + base.double()) + hc_eps
    return sum(pre[:, j, None] * x[:, j].double() for j in range(m))


def hc_post(y, x, post, comb) -> torch.Tensor:
    """``out[:, k] = post_k y + sum_j comb[:, j, k] x[:, j]``, float64, ``[tokens, M, D]``."""
    m = x.shape[1]
    xd, cd = x.double(), comb.double()
    outs = [post[:, k, None].double() * y.double() + sum(cd[:, j, k, None] * xd[:, j] for j in range(m))
            for k in range(m)]
    return torch.stack(outs, dim=1)
