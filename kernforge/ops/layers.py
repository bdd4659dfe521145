"""The V4-Flash dense-layer steps as ops over the library kernels (docs/kernels/layers.md).

Each op replaces one function of the torch reference (``kernforge/model``) with the same
meaning, so the engine can swap them one for one:

========================== ===================================================================
op                         replaces
========================== ===================================================================
:func:`rms_norm`           ``primitives.RMSNorm.forward`` (``weight``) and ``rms_normalize`` (``None``)
:func:`rotary_embedding`   ``primitives.RopeTable.rotate`` (``inverse=`` too), positions per token
:func:`hadamard_transform` ``primitives.hadamard``
:func:`hc_pre`             ``block.hc_pre`` (``hc_mixes`` + ``sinkhorn`` + ``weighted_streams``)
:func:`hc_post`            ``block.hc_post``
:func:`hc_head`            ``block.hc_head``
:func:`embedding`          ``primitives.Embedding.forward``
========================== ===================================================================

Every op checks its arguments before launch and raises :class:`LayerTypeError` (a
``TypeError``) or :class:`LayerValueError` (a ``ValueError``; :class:`LayerIndexError`
for an id or position outside its table) naming the argument.  Index values are checked
on the host, except while a CUDA graph is captured (``kernforge.ops._capture``).  Torch is
used for allocation and views only: no op computes anything outside its kernel.  Math is
float32 inside every kernel; outputs take the dtype the model's function returns (the
activation dtype; ``post``/``comb`` of the mixer are float32).
"""
from __future__ import annotations

import functools
import math
from typing import Optional, Sequence

import torch

import kernforge
from kernforge import backends
from kernforge.kernels import embedding as emb_k
from kernforge.kernels import hadamard as had_k
from kernforge.kernels import hyper_connection as hc_k
from kernforge.kernels import norm as norm_k
from kernforge.kernels import rope as rope_k
from kernforge.ops._capture import capturing
from kernforge.ops._launch import launch

_FLOATS = (torch.float32, torch.bfloat16)
_INDEX = (torch.int32, torch.int64)
_NAME = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.int32: "int32", torch.int64: "int64"}


class LayerOpError(Exception):
    """Base of the layer ops' argument errors."""


class LayerTypeError(LayerOpError, TypeError):
    """An argument of the wrong type or dtype."""


class LayerValueError(LayerOpError, ValueError):
    """An argument with a bad shape, layout, device or value."""


class LayerIndexError(LayerValueError, IndexError):
    """A token id or position outside its table (checked before launch)."""


# ---------------------------------------------------------------- ops


def rms_norm(x: torch.Tensor, weight: Optional[torch.Tensor], eps: float, *,
             out_dtype: Optional[torch.dtype] = None, backend: Optional[str] = None) -> torch.Tensor:
    """``x * (mean(x^2, -1) + eps)^-1/2 * weight`` over the last dim of ``x [..., D]``.

    ``weight [D]`` (float32 or bfloat16) or ``None`` for the weightless
    ``rms_normalize`` (the per-head query normalisation).  The output dtype is
    torch's promotion of ``x`` and ``weight`` (what ``RMSNorm.forward`` returns) unless
    ``out_dtype`` is given.  V4 has no fused residual add: its residual is the
    hyper-connection streams (:func:`hc_post`)."""
    _tensor("x", x, _FLOATS, min_dim=1)
    _contiguous("x", x)
    dim = x.shape[-1]
    if weight is not None:
        _tensor("weight", weight, _FLOATS)
        _shape("weight", weight, (dim,))
        _contiguous("weight", weight)
        _same_device("weight", weight, x)
    _eps("eps", eps)
    if out_dtype is None:
        out_dtype = x.dtype if weight is None else torch.promote_types(x.dtype, weight.dtype)
    if out_dtype not in _FLOATS:
        raise LayerTypeError(f"out_dtype must be torch.float32 or torch.bfloat16, got {out_dtype}")
    out = torch.empty(x.shape, dtype=out_dtype, device=x.device)
    if x.numel() == 0:
        return out
    name = backends.for_tensor(x, backend)
    w_name = None if weight is None else _NAME[weight.dtype]
    w = weight if weight is not None else torch.empty(1, dtype=torch.float32, device=x.device)
    rows = x.numel() // dim
    launch(("rms_norm", x.device, name, rows, dim, x.dtype, w_name, out_dtype, float(eps)),
           lambda: _compiled(name, norm_k.rms_norm, norm_k.choose(name, dim, _NAME[x.dtype], w_name, _NAME[out_dtype])),
           (x.view(rows, dim), w, out.view(rows, dim), float(eps)))
    return out


def rope_cos_sin(table) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``(cos, sin)`` float32 tables :func:`rotary_embedding` reads, from a model
    ``RopeTable`` (its float64 ``cos``/``sin`` ``[max_seq_len, rope_dim // 2]``).  Call it once
    when the engine is built (``model.rope_plain`` / ``model.rope_yarn``), not per step."""
    return table.cos.float().contiguous(), table.sin.float().contiguous()


def rotary_embedding(x: torch.Tensor, positions: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, *,
                     inverse: bool = False, backend: Optional[str] = None) -> torch.Tensor:
    """``RopeTable.rotate``: a copy of ``x`` whose last ``rope_dim = 2 * cos.shape[1]`` dims are
    rotated in interleaved pairs at each vector's position; the other dims are copied.

    ``positions`` (int32/int64) has the leading shape of ``x``: ``x [N, H, D]`` or ``[N, D]``
    with ``positions [N]`` (a ragged batch flattened to tokens), or ``x [b, s, h, d]`` with
    ``positions [b, s]``; the dims between are heads sharing the position.  ``cos``/``sin``
    are float32 ``[table_len, rope_dim // 2]`` (:func:`rope_cos_sin`); ``inverse`` rotates
    by minus the angle (the attention output)."""
    _tensor("x", x, _FLOATS, min_dim=1)
    _contiguous("x", x)
    _tensor("positions", positions, _INDEX)
    _contiguous("positions", positions)
    if positions.dim() == 0 or positions.dim() >= x.dim() or tuple(positions.shape) != tuple(x.shape[:positions.dim()]):
        raise LayerValueError(f"positions must have the leading shape of x (x {tuple(x.shape)}: e.g. "
                              f"{tuple(x.shape[:1])}), got {tuple(positions.shape)}")
    for name, t in (("cos", cos), ("sin", sin)):
        _tensor(name, t, (torch.float32,), min_dim=2)
        _contiguous(name, t)
        _same_device(name, t, x)
        if t.dim() != 2:
            raise LayerValueError(f"{name} must be 2-D [table_len, rope_dim // 2], got {tuple(t.shape)}")
    if cos.shape != sin.shape:
        raise LayerValueError(f"cos {tuple(cos.shape)} and sin {tuple(sin.shape)} must have one shape")
    _same_device("positions", positions, x)
    head_dim, rope_dim, length = x.shape[-1], 2 * cos.shape[1], cos.shape[0]
    if rope_dim > head_dim or length == 0:
        raise LayerValueError(f"cos/sin [{length}, {rope_dim // 2}] rotate {rope_dim} dims; x's last dim is "
                              f"{head_dim} (need 0 < table_len and rope_dim <= {head_dim})")
    if not isinstance(inverse, bool):
        raise LayerTypeError(f"inverse must be a bool, got {type(inverse).__name__}")
    _in_range("positions", positions, length, "table_len")
    out = torch.empty_like(x)
    if x.numel() == 0:
        return out
    name = backends.for_tensor(x, backend)
    n = positions.numel()
    heads = x.numel() // (n * head_dim)
    launch(("rotary_embedding", x.device, name, n, heads, head_dim, length, rope_dim, x.dtype, positions.dtype,
            inverse),
           lambda: _compiled(name, rope_k.rotary_embedding, rope_k.choose(
               name, head_dim, rope_dim, _NAME[x.dtype], _NAME[positions.dtype], inverse)),
           (x.view(n, heads, head_dim), positions.view(n), cos, sin, out.view(n, heads, head_dim)))
    return out


def hadamard_transform(x: torch.Tensor, *, backend: Optional[str] = None) -> torch.Tensor:
    """``primitives.hadamard``: the Sylvester-ordered Walsh-Hadamard transform of the last dim
    of ``x [..., n]`` (``n`` a power of two), scaled by ``n^-1/2``."""
    _tensor("x", x, _FLOATS, min_dim=1)
    _contiguous("x", x)
    n = x.shape[-1]
    if n < 1 or n & (n - 1):
        raise LayerValueError(f"x's last dim must be a power of two (Hadamard size), got {n}")
    out = torch.empty_like(x)
    if x.numel() == 0:
        return out
    name = backends.for_tensor(x, backend)
    rows = x.numel() // n
    launch(("hadamard", x.device, name, rows, n, x.dtype),
           lambda: _compiled(name, had_k.hadamard, had_k.choose(name, n, _NAME[x.dtype])),
           (x.view(rows, n), out.view(rows, n)))
    return out


def hc_pre(x: torch.Tensor, fn: torch.Tensor, scale: torch.Tensor, base: torch.Tensor, sinkhorn_iters: int,
           norm_eps: float, hc_eps: float, *,
           backend: Optional[str] = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``block.hc_pre`` on streams ``x [..., M, D]`` (copy ``j`` at ``x[..., j, :]``, the model's
    ``torch.stack(xs, -2)``): returns ``(u [..., D], post [..., M], comb [..., M, M])``.

    ``fn [(2+M)*M, M*D]`` (float32 or bfloat16), ``scale [3]`` and ``base [(2+M)*M]`` float32
    (``Block.hc_attn_fn/scale/base``, ``hc_ffn_*``).  ``u`` has ``x``'s dtype; ``post`` and
    ``comb`` are float32, ``comb[..., j, k]`` mixing source ``j`` into destination ``k``."""
    lead, m, d = _streams("x", x)
    mix = (2 + m) * m
    _mixer(fn, scale, base, (mix, m * d), 3, x)
    if isinstance(sinkhorn_iters, bool) or not isinstance(sinkhorn_iters, int) or sinkhorn_iters < 1:
        raise LayerValueError(f"sinkhorn_iters must be a positive int, got {sinkhorn_iters!r}")
    _eps("norm_eps", norm_eps)
    _eps("hc_eps", hc_eps)
    u = torch.empty(*lead, d, dtype=x.dtype, device=x.device)
    post = torch.empty(*lead, m, dtype=torch.float32, device=x.device)
    comb = torch.empty(*lead, m, m, dtype=torch.float32, device=x.device)
    if u.numel() == 0:
        return u, post, comb
    name = backends.for_tensor(x, backend)
    n = u.numel() // d
    launch(("hc_pre", x.device, name, n, m, d, sinkhorn_iters, x.dtype, fn.dtype, float(norm_eps), float(hc_eps)),
           lambda: _compiled(name, hc_k.hc_pre, hc_k.choose_pre(name, m, d, sinkhorn_iters, _NAME[x.dtype],
                                                                 _NAME[fn.dtype])),
           (x.view(n, m * d), fn, scale, base, u.view(n, d), post.view(n, m), comb.view(n, m, m),
            float(norm_eps), float(hc_eps)))
    return u, post, comb


def hc_post(y: torch.Tensor, x: torch.Tensor, post: torch.Tensor, comb: torch.Tensor, *,
            backend: Optional[str] = None) -> torch.Tensor:
    """``block.hc_post``: new streams ``[..., M, D]`` with copy ``k`` =
    ``post[..., k] * y + sum_j comb[..., j, k] * x[..., j, :]``; ``y [..., D]`` is the
    sublayer output (``x``'s dtype), ``post``/``comb`` float32 as :func:`hc_pre` returns them."""
    lead, m, d = _streams("x", x)
    _tensor("y", y, (x.dtype,))
    _shape("y", y, (*lead, d))
    _contiguous("y", y)
    for name, t, shape in (("post", post, (*lead, m)), ("comb", comb, (*lead, m, m))):
        _tensor(name, t, (torch.float32,))
        _shape(name, t, shape)
        _contiguous(name, t)
        _same_device(name, t, x)
    _same_device("y", y, x)
    out = torch.empty_like(x)
    if out.numel() == 0:
        return out
    name = backends.for_tensor(x, backend)
    n = out.numel() // (m * d)
    launch(("hc_post", x.device, name, n, m, d, x.dtype),
           lambda: _compiled(name, hc_k.hc_post, hc_k.choose_post(name, m, d, _NAME[x.dtype])),
           (y.view(n, d), x.view(n, m * d), post.view(n, m), comb.view(n, m, m), out.view(n, m * d)))
    return out


def hc_head(x: torch.Tensor, fn: torch.Tensor, scale: torch.Tensor, base: torch.Tensor, norm_eps: float,
            hc_eps: float, *, backend: Optional[str] = None) -> torch.Tensor:
    """``block.hc_head``: the final collapse ``u [..., D]`` of streams ``x [..., M, D]`` with
    ``fn [M, M*D]``, ``scale [1]``, ``base [M]`` (``Transformer.hc_head_*``, ``MTPBlock.hc_head_*``)."""
    lead, m, d = _streams("x", x)
    _mixer(fn, scale, base, (m, m * d), 1, x)
    _eps("norm_eps", norm_eps)
    _eps("hc_eps", hc_eps)
    u = torch.empty(*lead, d, dtype=x.dtype, device=x.device)
    if u.numel() == 0:
        return u
    name = backends.for_tensor(x, backend)
    n = u.numel() // d
    launch(("hc_head", x.device, name, n, m, d, x.dtype, fn.dtype, float(norm_eps), float(hc_eps)),
           lambda: _compiled(name, hc_k.hc_head, hc_k.choose_head(name, m, d, _NAME[x.dtype], _NAME[fn.dtype])),
           (x.view(n, m * d), fn, scale, base, u.view(n, d), float(norm_eps), float(hc_eps)))
    return u


def embedding(ids: torch.Tensor, weight: torch.Tensor, *, backend: Optional[str] = None) -> torch.Tensor:
    """``Embedding.forward``: ``weight[ids]`` for ids (int32/int64, any shape) into
    ``weight [vocab, dim]``; every id must lie in ``[0, vocab)`` (:class:`LayerIndexError`)."""
    _tensor("ids", ids, _INDEX)
    _contiguous("ids", ids)
    _tensor("weight", weight, _FLOATS, min_dim=2)
    _contiguous("weight", weight)
    if weight.dim() != 2:
        raise LayerValueError(f"weight must be 2-D [vocab, dim], got {tuple(weight.shape)}")
    _same_device("ids", ids, weight)
    vocab, dim = weight.shape
    _in_range("ids", ids, vocab, "vocab")
    out = torch.empty(*ids.shape, dim, dtype=weight.dtype, device=weight.device)
    if out.numel() == 0:
        return out
    name = backends.for_tensor(weight, backend)
    launch(("embedding", weight.device, name, ids.numel(), vocab, dim, weight.dtype, ids.dtype),
           lambda: _compiled(name, emb_k.embedding, emb_k.choose(name, dim, _NAME[weight.dtype], _NAME[ids.dtype])),
           (ids.view(-1), weight, out.view(-1, dim)))
    return out


# ---------------------------------------------------------------- compilation
#
# Each op launches through `kernforge.ops._launch.launch`, keyed on everything the kernel
# choice and its launch plan depend on (op, device, backend, every shape and dtype of the
# contiguous views it passes, the scalar values): a repeated call skips the tuning chooser
# and the compiled kernel's signature checks, which at decode sizes cost more than the kernel
# (~250 small launches per forward in the engine).


@functools.lru_cache(maxsize=None)
def _compiled_cached(backend: str, factory, params: tuple):
    return kernforge.compile(factory, backend=backend, **dict(params))


def _compiled(backend: str, factory, params: dict):
    """One compiled kernel per (backend, factory, configuration), built on first use."""
    return _compiled_cached(backend, factory, tuple(sorted(params.items())))


# ---------------------------------------------------------------- validation


def _tensor(name: str, t, dtypes: Sequence[torch.dtype], min_dim: int = 0) -> None:
    if not isinstance(t, torch.Tensor):
        raise LayerTypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in dtypes:
        raise LayerTypeError(f"{name} must have dtype {' or '.join(map(str, dtypes))}, got {t.dtype}")
    if t.dim() < min_dim:
        raise LayerValueError(f"{name} must have at least {min_dim} dims, got shape {tuple(t.shape)}")


def _shape(name: str, t: torch.Tensor, shape: tuple) -> None:
    if tuple(t.shape) != tuple(shape):
        raise LayerValueError(f"{name} must have shape {tuple(shape)}, got {tuple(t.shape)}")


def _contiguous(name: str, t: torch.Tensor) -> None:
    if not t.is_contiguous():
        raise LayerValueError(f"{name} must be contiguous, got strides {tuple(t.stride())} for shape "
                              f"{tuple(t.shape)}")


def _same_device(name: str, t: torch.Tensor, ref: torch.Tensor) -> None:
    if t.device != ref.device:
        raise LayerValueError(f"{name} is on {t.device}, the input on {ref.device}")


def _eps(name: str, v) -> None:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
        raise LayerValueError(f"{name} must be a finite non-negative float, got {v!r}")


def _in_range(name: str, t: torch.Tensor, size: int, what: str) -> None:
    """Every value of ``t`` in ``[0, size)``, read on the host (skipped while a CUDA graph captures)."""
    if t.numel() == 0 or capturing(t):
        return
    lo, hi = int(t.min()), int(t.max())
    if lo < 0 or hi >= size:
        bad = lo if lo < 0 else hi
        where = (t == bad).nonzero()[0].tolist()
        raise LayerIndexError(f"{name}{where} = {bad} is outside [0, {what}={size})")


def _streams(name: str, x) -> tuple[tuple, int, int]:
    """``x [..., M, D]``, contiguous: the leading shape, M and D."""
    _tensor(name, x, _FLOATS, min_dim=2)
    _contiguous(name, x)
    return tuple(x.shape[:-2]), x.shape[-2], x.shape[-1]


def _mixer(fn, scale, base, fn_shape: tuple, n_scales: int, x: torch.Tensor) -> None:
    _tensor("fn", fn, _FLOATS)
    _shape("fn", fn, fn_shape)
    _contiguous("fn", fn)
    _tensor("scale", scale, (torch.float32,))
    _shape("scale", scale, (n_scales,))
    _tensor("base", base, (torch.float32,))
    _shape("base", base, (fn_shape[0],))
    for name, t in (("fn", fn), ("scale", scale), ("base", base)):
        _contiguous(name, t)
        _same_device(name, t, x)
