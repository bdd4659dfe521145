"""The lightning indexer's entry scores as an op (the engine's ``indexer_scores`` step).

``indexer_scores(q, keys, head_weights, scale)``: ``q [S, H, D]``, ``keys [N, D]``,
``head_weights [S, H]`` (one dtype, float32 or bfloat16, contiguous, one device) ->
float32 ``scores [S, N] = sum_h relu(q[s, h] . keys[n]) * (head_weights[s, h] * scale)``,
with ``-0.0`` written as ``+0.0``: the scores `kernforge.model.compressor.Indexer` ranks.

The kernel is GEMM-shaped (one ``T.gemm`` over ``D`` per head, the heads added in order),
so each score is summed in a fixed order whatever ``S``, ``N`` or the tile: on a CPU its
bits depend on its own inputs only (the engine's deterministic rows rely on it).  The
scores agree with the reference, in either mode, to float32 rounding.  The query count
picks the tile (:func:`kernforge.kernels.indexer.config.row_block`: at most three
compiled kernels per shape).  Validation raises before launch:
:class:`IndexerTypeError` (types, dtypes) and :class:`IndexerValueError` (shapes, layout,
devices, a non-finite scale), both naming the argument.
"""
from __future__ import annotations

import functools
import math
from typing import Optional

import torch

import kernforge
from kernforge import backends
from kernforge.kernels import indexer as kernels

_DTYPES = {torch.float32: "float32", torch.bfloat16: "bfloat16"}


class IndexerTypeError(TypeError):
    """An argument of the wrong type or dtype."""


class IndexerValueError(ValueError):
    """An argument with a bad shape, layout, device or value."""


@functools.lru_cache(maxsize=None)
def _kernel(backend: str, params: tuple):
    return kernforge.compile(kernels.indexer_scores, backend=backend, **dict(params))


def _tensor(name: str, t, dim: int) -> None:
    if not isinstance(t, torch.Tensor):
        raise IndexerTypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in _DTYPES:
        raise IndexerTypeError(f"{name} must be float32 or bfloat16, got {t.dtype}")
    if t.dim() != dim:
        raise IndexerValueError(f"{name} must be {dim}-D, got shape {tuple(t.shape)}")
    if not t.is_contiguous():
        raise IndexerValueError(f"{name} must be contiguous, got strides {tuple(t.stride())}")


def indexer_scores(q: torch.Tensor, keys: torch.Tensor, head_weights: torch.Tensor, scale: float, *,
                   backend: Optional[str] = None) -> torch.Tensor:
    """Scores ``[S, N]`` (float32) of ``N`` keys for ``S`` indexer queries of ``H`` heads."""
    _tensor("q", q, 3)
    _tensor("keys", keys, 2)
    _tensor("head_weights", head_weights, 2)
    s, h, d = q.shape
    for name, t in (("keys", keys), ("head_weights", head_weights)):
        if t.dtype != q.dtype:
            raise IndexerTypeError(f"{name} must have q's dtype {q.dtype}, got {t.dtype}")
        if t.device != q.device:
            raise IndexerValueError(f"{name} is on {t.device}, q on {q.device}")
    if keys.shape[1] != d:
        raise IndexerValueError(f"keys must be [N, {d}] (q's head dim), got {tuple(keys.shape)}")
    if tuple(head_weights.shape) != (s, h):
        raise IndexerValueError(f"head_weights must be [{s}, {h}] (q's rows and heads), got "
                                f"{tuple(head_weights.shape)}")
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale):
        raise IndexerValueError(f"scale must be a finite float, got {scale!r}")
    n = keys.shape[0]
    scores = torch.empty(s, n, dtype=torch.float32, device=q.device)
    if s == 0 or n == 0 or h == 0 or d == 0:
        return scores.zero_() if s and n else scores  # no heads or dims: every sum is +0.0
    name = backends.for_tensor(q, backend)
    params = kernels.choose(name, h, d, _DTYPES[q.dtype], kernels.config.row_block(s))
    _kernel(name, tuple(sorted(params.items())))(q, keys, head_weights, scores, float(scale))
    return scores
