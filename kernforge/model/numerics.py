"""Reductions and transcendental functions with an optional batch-invariant mode.

Why this module exists: the reference must give bit-identical logits for the
same tokens whatever else shares the batch (issue 6, item 5). Plain torch ops
do not promise that. A CPU matmul picks its blocking from the row count, and
`torch.exp` runs SIMD code on the body of a tensor but scalar libm code on its
tail, so an element's result depends on where it sits in memory.

In deterministic mode every function here is built only from operations that
IEEE 754 rounds exactly (+, -, *, /, sqrt, comparisons, exponent bit tricks),
applied elementwise, and every sum is a fixed pairwise tree over the reduced
axis. An element's value then depends only on its own inputs. Outside
deterministic mode the functions call the ordinary torch kernels.

The mode is on inside `deterministic()`, or when a `Transformer` whose config
sets `deterministic=True` runs its forward pass.
"""

from __future__ import annotations

import contextlib
import contextvars
import math
from collections.abc import Iterator

import torch
import torch.nn.functional as F

_DETERMINISTIC = contextvars.ContextVar("kernforge_model_deterministic", default=False)

# Cody-Waite split of ln 2: the high part has few enough significant bits that
# k * _LN2_HI is exact for every |k| < 2**11.
_LN2_HI = 6.93147180369123816490e-01
_LN2_LO = 1.90821492927058770002e-10
_LN2 = math.log(2.0)
_EXP_TERMS = 14  # Taylor terms for exp on |r| <= ln2/2: last term < 1e-17.
_LOG_TERMS = 12  # atanh series terms for log on m in [sqrt(1/2), sqrt(2)).
_CHUNK_ELEMENTS = 1 << 23  # cap on the broadcast product in `linear` (32 MiB fp32).


@contextlib.contextmanager
def deterministic(enabled: bool = True) -> Iterator[None]:
    """Run the enclosed model code with batch-invariant numerics."""
    token = _DETERMINISTIC.set(enabled)
    try:
        yield
    finally:
        _DETERMINISTIC.reset(token)


def is_deterministic() -> bool:
    return _DETERMINISTIC.get()


def tree_sum(x: torch.Tensor, dim: int = -1, keepdim: bool = False) -> torch.Tensor:
    """Sum along `dim` by halving the axis (zero-padded to a power of two)."""
    if not is_deterministic():
        return x.sum(dim=dim, keepdim=keepdim)
    x = x.movedim(dim, -1)
    n = x.shape[-1]
    width = 1 << max(n - 1, 0).bit_length()
    if width != n:
        x = F.pad(x, (0, width - n))
    while x.shape[-1] > 1:
        half = x.shape[-1] // 2
        x = x[..., :half] + x[..., half:]
    out = x.movedim(-1, dim)
    return out if keepdim else out.squeeze(dim)


def sum_terms(terms: list[torch.Tensor]) -> torch.Tensor:
    """Pairwise sum of a short list of same-shape tensors, in a fixed order."""
    while len(terms) > 1:
        pairs = [terms[i] + terms[i + 1] for i in range(0, len(terms) - 1, 2)]
        terms = pairs + ([terms[-1]] if len(terms) % 2 else [])
    return terms[0]


def mean(x: torch.Tensor, dim: int = -1, keepdim: bool = False) -> torch.Tensor:
    return tree_sum(x, dim, keepdim) / x.shape[dim]


def mean_square(x: torch.Tensor, dim: int = -1, keepdim: bool = False) -> torch.Tensor:
    """mean(x^2) along dim (the RMS statistics). Outside deterministic mode it is the squared
    `vector_norm`, one fused pass instead of an x*x temporary (10x faster on the
    [b, s, 4*D] hyper-connection streams), equal up to float rounding."""
    if not is_deterministic():
        return torch.linalg.vector_norm(x, dim=dim, keepdim=keepdim).square() / x.shape[dim]
    return mean(x * x, dim, keepdim)


def linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x [..., K] @ weight[O, K].T. Deterministic mode: each output is its own tree sum."""
    if not is_deterministic():
        return F.linear(x, weight)
    lead = x.shape[:-1]
    rows = x.reshape(-1, x.shape[-1])
    step = max(1, _CHUNK_ELEMENTS // max(1, weight.numel()))
    parts = [tree_sum(rows[i:i + step, None, :] * weight, dim=-1) for i in range(0, rows.shape[0], step)]
    out = torch.cat(parts) if parts else rows.new_empty(0, weight.shape[0])
    return out.reshape(*lead, weight.shape[0])


def rsqrt(x: torch.Tensor) -> torch.Tensor:
    # 1/sqrt is two correctly rounded ops; torch.rsqrt may use an approximation.
    return 1.0 / torch.sqrt(x)


def pow2(k: torch.Tensor) -> torch.Tensor:
    """2**k for integer-valued float64 k in [-1022, 1023], built from exponent bits."""
    return ((k.to(torch.int64) + 1023) << 52).view(torch.float64)


def _exp64(x: torch.Tensor) -> torch.Tensor:
    """exp in float64 from +,*,/ only: exp(x) = 2**k * exp(r), |r| <= ln2/2."""
    xc = x.clamp(-708.0, 709.0)
    k = torch.round(xc / _LN2)
    r = (xc - k * _LN2_HI) - k * _LN2_LO
    p = torch.ones_like(r)
    for n in range(_EXP_TERMS, 0, -1):
        p = p * (r / n) + 1.0
    out = p * pow2(k)
    out = torch.where(x < -708.0, torch.zeros_like(out), out)
    return torch.where(x > 709.0, torch.full_like(out, math.inf), out)


def _log64(y: torch.Tensor) -> torch.Tensor:
    """log in float64 for y > 0: log(m * 2**e) = e ln2 + 2 atanh((m-1)/(m+1))."""
    m, e = torch.frexp(y)
    small = m < math.sqrt(0.5)
    m = torch.where(small, m * 2.0, m)
    e = (e - small.to(e.dtype)).to(torch.float64)
    s = (m - 1.0) / (m + 1.0)
    s2 = s * s
    p = torch.zeros_like(s)
    for n in range(_LOG_TERMS, 0, -1):
        p = p * s2 + 1.0 / (2 * n - 1)
    return e * _LN2 + 2.0 * s * p


def _log1p64(z: torch.Tensor) -> torch.Tensor:
    """log(1 + z) without losing small z: log(u) * z / (u - 1) with u = 1 + z (Goldberg's trick)."""
    u = 1.0 + z
    return torch.where(u == 1.0, z, _log64(u) * (z / (u - 1.0)))


def exp(x: torch.Tensor) -> torch.Tensor:
    if not is_deterministic():
        return torch.exp(x)
    return _exp64(x.double()).to(x.dtype)


def sigmoid(x: torch.Tensor) -> torch.Tensor:
    if not is_deterministic():
        return torch.sigmoid(x)
    return (1.0 / (1.0 + _exp64(-x.double()))).to(x.dtype)


def silu(x: torch.Tensor) -> torch.Tensor:
    if not is_deterministic():
        return F.silu(x)
    xd = x.double()
    return (xd / (1.0 + _exp64(-xd))).to(x.dtype)


def softplus(x: torch.Tensor) -> torch.Tensor:
    """log(1 + e^x), written as max(x, 0) + log(1 + e^-|x|) so it never overflows."""
    if not is_deterministic():
        return F.softplus(x)
    xd = x.double()
    return (xd.clamp(min=0.0) + _log1p64(_exp64(-xd.abs()))).to(x.dtype)


def softmax(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    if not is_deterministic():
        return torch.softmax(x, dim=dim)
    e = exp(x - x.amax(dim=dim, keepdim=True))
    return e / tree_sum(e, dim, keepdim=True)


def topk_indices(scores: torch.Tensor, k: int) -> torch.Tensor:
    """Indices of the k largest scores on the last axis, ties to the lower index.

    A stable sort makes the choice a function of the row's values alone, so a
    prefill row (padded with -inf) and a decode row pick the same entries.
    Sorting whole rows is slow (the indexer scores 256 entries per query), so
    rows whose k-th largest value is not tied with an unpicked score take the
    k picks of `torch.topk`, re-sorted among themselves (stable, by index), which
    yields the same list; only rows with a tie at the boundary sort in full.
    """
    if k >= scores.shape[-1] or scores.numel() == 0:
        return _stable_topk(scores, k)
    values, picks = torch.topk(scores, k, dim=-1)
    tied = ((scores >= values[..., -1:]).sum(-1) != k) | scores.isnan().any(-1)  # a tie at the k-th value
    picks = picks.sort(dim=-1).values  # ascending index, so the stable sort below breaks ties by it
    out = picks.gather(-1, _stable_topk(scores.gather(-1, picks), k))
    if tied.any():
        out[tied] = _stable_topk(scores[tied], k)
    return out


def _stable_topk(scores: torch.Tensor, k: int) -> torch.Tensor:
    order = torch.sort(scores, dim=-1, descending=True, stable=True).indices
    return order[..., :k]
