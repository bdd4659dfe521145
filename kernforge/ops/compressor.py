"""The V4 compressor's pooling as an op (``kernforge.model.compressor.Compressor._pool``).

``compressor_pool(kv, score, n_entries, ratio, overlap, ape=None)``: the sequence's projections
``kv = wkv(x)``, ``score = wgate(x)`` (+ ``ape``: given, the op adds it) as rows ``[R, W]`` from the start of the block
before the first new entry -> the entries ``[n_entries, d]`` in kv's dtype, each the
per-channel softmax-gated sum over its candidates (ratio 4 ``overlap``: the first halves of
the previous block's rows and the second halves of its own, ``W = 2d``; else its own
block's rows, ``W = d``).  The entry's RMSNorm, RoPE and rounding are other ops
(``rms_norm``, ``rotary_embedding``, ``hadamard_transform``, ``fake_quant_fp8/fp4``),
chained by the engine's ``compressor_pool`` step.  Argument errors are
:class:`CompressorTypeError` / :class:`CompressorValueError`, naming the argument.
"""
from __future__ import annotations

import functools
from typing import Optional

import torch

import kernforge
from kernforge import backends
from kernforge.kernels import compressor as kernels

_DTYPES = {torch.float32: "float32", torch.bfloat16: "bfloat16"}


class CompressorTypeError(TypeError):
    """An argument of the wrong type or dtype."""


class CompressorValueError(ValueError):
    """An argument with a bad shape, layout, device or value."""


@functools.lru_cache(maxsize=None)
def _kernel(backend: str, **params):
    return kernforge.compile(kernels.compressor_pool, backend=backend, **params)


def _int(name: str, v, low: int) -> None:
    if isinstance(v, bool) or not isinstance(v, int):
        raise CompressorTypeError(f"{name} must be an int, got {type(v).__name__}")
    if v < low:
        raise CompressorValueError(f"{name} must be >= {low}, got {v}")


def compressor_pool(kv: torch.Tensor, score: torch.Tensor, n_entries: int, ratio: int, overlap: bool,
                    ape: Optional[torch.Tensor] = None, *, backend: Optional[str] = None) -> torch.Tensor:
    """Entries ``[n_entries, d]`` pooled from ``kv, score [R, W]`` (``R >= (n_entries + 1) *
    ratio``; ``d = W / 2`` with ``overlap``, else ``W``): the model's ``_pool`` for sequence
    blocks 1..n_entries, block 0 being the one before the first new entry.  ``ape [ratio, W]``
    (kv's dtype), when given, is the gate's position bias: row i's gates are
    ``score[i] + ape[i % ratio]``, rounded to the dtype, as the model's ``wgate(x) + ape``
    (so ``score`` may hold the plain ``wgate(x)``)."""
    for name, t in (("kv", kv), ("score", score)) + ((("ape", ape),) if ape is not None else ()):
        if not isinstance(t, torch.Tensor):
            raise CompressorTypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dtype not in _DTYPES:
            raise CompressorTypeError(f"{name} must be float32 or bfloat16, got {t.dtype}")
        if t.dim() != 2:
            raise CompressorValueError(f"{name} must be 2-D [rows, width], got shape {tuple(t.shape)}")
        if not t.is_contiguous():
            raise CompressorValueError(f"{name} must be contiguous")
    if score.dtype != kv.dtype or score.shape != kv.shape:
        raise CompressorValueError(f"score must match kv ({tuple(kv.shape)}, {kv.dtype}), "
                                   f"got {tuple(score.shape)}, {score.dtype}")
    if score.device != kv.device:
        raise CompressorValueError(f"score is on {score.device}, kv on {kv.device}")
    if not isinstance(overlap, bool):
        raise CompressorTypeError(f"overlap must be a bool, got {type(overlap).__name__}")
    _int("n_entries", n_entries, 0)
    _int("ratio", ratio, 1)
    width = kv.shape[1]
    if overlap and width % 2:
        raise CompressorValueError(f"kv's width must be even with overlap (two halves), got {width}")
    d = width // 2 if overlap else width
    if d == 0:
        raise CompressorValueError("kv's width must be positive")
    if ape is not None and (ape.dtype != kv.dtype or ape.shape != (ratio, width) or ape.device != kv.device):
        raise CompressorValueError(f"ape must be [ratio, width] = [{ratio}, {width}] in kv's dtype {kv.dtype} on "
                                   f"{kv.device}, got {tuple(ape.shape)}, {ape.dtype} on {ape.device}")
    if kv.shape[0] < (n_entries + 1) * ratio:
        raise CompressorValueError(f"kv has {kv.shape[0]} rows; {n_entries} entries at ratio {ratio} read "
                                   f"{(n_entries + 1) * ratio}")
    out = torch.empty(n_entries, d, dtype=kv.dtype, device=kv.device)
    if n_entries == 0:
        return out
    name = backends.for_tensor(kv, backend)
    if ape is None:
        ape = torch.zeros(ratio, width, dtype=kv.dtype, device=kv.device)  # x + 0 == x
    _kernel(name, **kernels.choose(name, d, ratio, overlap, _DTYPES[kv.dtype]))(kv, score, ape, out)
    return out
