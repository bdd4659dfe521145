"""TileKernels' MoE gating (``tile_kernels.moe``) and V4's hash routing, as kernels.

* ``topk_gate(scores, num_topk)`` -> ``topk_idx int64 [T, k]``;
* ``top2_sum_gate(logits, bias, num_topk, num_topk_groups, num_groups, use_shared_as_routed,
  num_shared_experts, routed_scaling_factor, ep_rank, num_ep_ranks, tp_rank, num_tp_ranks,
  scoring_func, mask=None, fix_routing_mask=None, to_physical_map=None, logical_count=None,
  unmapped_topk_idx=None)`` -> ``(topk_idx int64, topk_weights float32)``, each ``[T, k + s]``;
* ``normalize_weight(w)`` -> ``(denominator [T], w / denominator)``, ``denominator = sum + 1e-20``;
* ``hash_gate(logits, token_ids, tid2eid, routed_scaling_factor, scoring_func, norm_topk_prob)``
  -> ``(topk_idx, topk_weights)``: what ``kernforge.model.moe.Gate`` computes for a hash layer
  from the gate's logits (note the order: indices first, as the TileKernels ops return them;
  ``Gate.forward`` returns weights first).

Ranking is descending with ties to the smaller index (groups too), identical on every
backend (the kernels select by integer keys that encode the index).  Semantics are TileKernels'
torch reference's (``kernforge/kernels/routing/kernel.py`` lists them); the weights'
denominator is ``max(sum, 1e-20)``, as there.

Validation raises before launch, naming the argument: :class:`RoutingTypeError` (dtype),
:class:`RoutingValueError` (shape, contiguity, ``k > E``, ``E % 4``, group and shared-expert
constraints, ids out of range) and :class:`RoutingNonFiniteError` where upstream traps on the
device (NaN/Inf logits or bias in ``top2_sum_gate``; NaN scores in ``topk_gate``, which have
no rank).  ``T = 0`` returns empty results.
"""
from __future__ import annotations

import functools
import math
from typing import Optional

import torch

import kernforge
from kernforge import backends
from kernforge.kernels import routing as kernels
from kernforge.kernels.routing import config
from kernforge.ops._capture import capturing
from kernforge.ops._launch import Bound, launch
from kernforge.tune import consult

#: the most experts per token: one block holds a token's keys on chip (8 KB of int64 keys at 1024)
MAX_EXPERTS = 1024


class RoutingTypeError(TypeError, RuntimeError):
    """An argument of the wrong type or dtype."""


class RoutingValueError(ValueError, RuntimeError):
    """An argument with a bad value, shape or layout, or a constraint of the gate violated."""


class RoutingNonFiniteError(RoutingValueError):
    """A NaN (or, for ``top2_sum_gate``, an infinity) where upstream's kernel traps."""


@functools.lru_cache(maxsize=None)
def _kernel(factory, backend: str, **params):
    return kernforge.compile(factory, backend=backend, **params)


def _check_tensor(name: str, t, dtype, dim: Optional[int] = None, shape: Optional[tuple] = None,
                  contiguous: bool = True) -> None:
    if not isinstance(t, torch.Tensor):
        raise RoutingTypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype != dtype:
        raise RoutingTypeError(f"{name} must be {dtype}, got {t.dtype}")
    if dim is not None and t.dim() != dim:
        raise RoutingValueError(f"{name} must be {dim}-D, got shape {tuple(t.shape)}")
    if shape is not None and tuple(t.shape) != tuple(shape):
        raise RoutingValueError(f"{name} must have shape {tuple(shape)}, got {tuple(t.shape)}")
    if contiguous and not t.is_contiguous():
        raise RoutingValueError(f"{name} must be contiguous")


def _check_int(name: str, v, lo: int, hi: Optional[int] = None) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise RoutingTypeError(f"{name} must be an int, got {type(v).__name__} {v!r}")
    if v < lo or (hi is not None and v > hi):
        raise RoutingValueError(f"{name} must be in [{lo}, {hi if hi is not None else 'inf'}], got {v}")
    return v


def _check_experts(name: str, t: torch.Tensor) -> int:
    e = t.shape[-1]
    if not 1 <= e <= MAX_EXPERTS:
        raise RoutingValueError(f"{name} must have 1 to {MAX_EXPERTS} experts (last dim), got {e}")
    return e


def _check_finite(name: str, t: torch.Tensor, allow_inf: bool = False) -> None:
    if t.numel() == 0 or capturing(t):
        return
    # a screen first: one reduction and one host read.  Any NaN makes the sum NaN and any
    # infinity makes it non-finite, so a finite sum (a non-NaN one with allow_inf) clears the
    # tensor; a sum that overflowed or met inf - inf falls through to the exact mask, which
    # also names the first culprit (2 us against 12 for aminmax + isfinite at decode)
    total = float(t.sum())
    if not math.isnan(total) and (allow_inf or not math.isinf(total)):
        return
    flags = torch.isnan(t) if allow_inf else ~torch.isfinite(t)
    if not bool(flags.any()):
        return
    where = tuple(int(i) for i in flags.nonzero()[0])
    what = "NaN" if allow_inf else "NaN or Inf"
    raise RoutingNonFiniteError(f"{name} holds {what} at {where}")


def _check_scoring(scoring_func) -> str:
    if scoring_func not in kernels.SCORING_FUNCS:
        raise RoutingValueError(f"scoring_func must be one of {kernels.SCORING_FUNCS}, got {scoring_func!r}")
    return scoring_func


def topk_gate(scores: torch.Tensor, num_topk: int, *, backend: Optional[str] = None) -> torch.Tensor:
    """The ``num_topk`` largest scores of each row of ``scores [T, E]`` (float32): int64
    indices, descending, ties to the smaller index; ``-inf`` ranks last, NaN is an error."""
    _check_tensor("scores", scores, torch.float32, dim=2)
    e = _check_experts("scores", scores)
    k = _check_int("num_topk", num_topk, 1, e)
    _check_finite("scores", scores, allow_inf=True)
    out = torch.empty(scores.shape[0], k, dtype=torch.int64, device=scores.device)
    if scores.shape[0] == 0:
        return out
    name = backends.for_tensor(scores, backend)
    launch(("topk_gate", scores.device, scores.shape[0], name, e, k),
           lambda: _kernel(kernels.topk_gate, name, **config.choose_topk(name, e, k)), (scores, out))
    return out


def top2_sum_gate(logits: torch.Tensor, bias: torch.Tensor, num_topk: int, num_topk_groups: int,
                  num_groups: int, use_shared_as_routed: bool, num_shared_experts: int,
                  routed_scaling_factor: float, ep_rank: int, num_ep_ranks: int, tp_rank: int,
                  num_tp_ranks: int, scoring_func: str, mask: Optional[torch.Tensor] = None,
                  fix_routing_mask: Optional[torch.Tensor] = None, to_physical_map: Optional[torch.Tensor] = None,
                  logical_count: Optional[torch.Tensor] = None, unmapped_topk_idx: Optional[torch.Tensor] = None,
                  *, backend: Optional[str] = None) -> tuple[torch.Tensor, torch.Tensor]:
    """TileKernels' ``top2_sum_gate``: ``(topk_idx int64 [T, k + s], topk_weights float32 [T, k + s])``
    (``s = num_shared_experts`` with ``use_shared_as_routed``, else 0).  ``unmapped_topk_idx``
    (int64 ``[T, k]``), when given, receives the routed logical ids before mapping and masking
    (``-1`` for masked rows) and supplies them for the rows of ``fix_routing_mask``."""
    _check_tensor("logits", logits, torch.float32, dim=2)
    t, e = logits.shape
    _check_experts("logits", logits)
    if e % 4:
        raise RoutingValueError(f"logits: the number of experts must be a multiple of 4, got {e}")
    _check_tensor("bias", bias, torch.float32, shape=(e,))
    if to_physical_map is not None:
        _check_tensor("to_physical_map", to_physical_map, torch.int32, dim=2)
    map_shape = None if to_physical_map is None else tuple(to_physical_map.shape)
    settings = (e, num_topk, num_topk_groups, num_groups, use_shared_as_routed, num_shared_experts,
                routed_scaling_factor, ep_rank, num_ep_ranks, tp_rank, num_tp_ranks, scoring_func, map_shape)
    try:
        k, scoring, groups, topk_groups, s, per_rank = _gate_settings(*settings)
    except TypeError as unhashable:   # an unhashable argument: checked uncached (and rejected there)
        if isinstance(unhashable, RoutingTypeError):
            raise
        k, scoring, groups, topk_groups, s, per_rank = _gate_settings.__wrapped__(*settings)
    _check_map(to_physical_map, logical_count, e + s)
    for name, m in (("mask", mask), ("fix_routing_mask", fix_routing_mask)):
        if m is not None:
            _check_tensor(name, m, torch.bool, shape=(t,))
    if unmapped_topk_idx is not None:
        _check_tensor("unmapped_topk_idx", unmapped_topk_idx, torch.int64, shape=(t, k), contiguous=False)
        if unmapped_topk_idx.stride(1) != 1:
            raise RoutingValueError("unmapped_topk_idx must have unit stride along its last dim")
    _check_same_device(logits, bias=bias, mask=mask, fix_routing_mask=fix_routing_mask,
                       to_physical_map=to_physical_map, logical_count=logical_count,
                       unmapped_topk_idx=unmapped_topk_idx)
    _check_finite("logits", logits)
    _check_finite("bias", bias)
    has_fix = fix_routing_mask is not None and unmapped_topk_idx is not None
    if has_fix and not capturing(logits):
        fixed = unmapped_topk_idx[fix_routing_mask]
        if bool(((fixed < -1) | (fixed >= e)).any()):
            raise RoutingValueError(f"unmapped_topk_idx of fix_routing_mask rows must be -1 or in [0, {e})")

    dev = logits.device
    idx = torch.empty(t, k + s, dtype=torch.int64, device=dev)
    weights = torch.empty(t, k + s, dtype=torch.float32, device=dev)
    if t == 0:
        return idx, weights
    # the launch's key and kernel parameters follow from what was checked above: memoised
    # with it (the layout of the optional tensors, beyond their presence, is in the key)
    if backend is not None and not isinstance(backend, str):
        backends.for_tensor(logits, backend)    # the registry's error for a non-name
    layout = (t, dev, backend, mask is not None, has_fix,
              None if unmapped_topk_idx is None else unmapped_topk_idx.stride(),
              None if to_physical_map is None else to_physical_map.stride())
    run, scalars = _gate_launch(settings, layout, consult.stamp())
    flag, no_map, one_count, no_unmapped = _placeholders(dev)  # slots of optional tensors not given
    run((logits, bias, mask if mask is not None else flag,
         fix_routing_mask if fix_routing_mask is not None else flag,
         to_physical_map if to_physical_map is not None else no_map,
         logical_count if logical_count is not None else one_count,
         unmapped_topk_idx if unmapped_topk_idx is not None else no_unmapped,
         idx, weights) + scalars)
    return idx, weights


@functools.lru_cache(maxsize=1024)
def _gate_launch(settings: tuple, layout: tuple, stamp: tuple) -> tuple:
    """:func:`top2_sum_gate`'s launch for checked ``settings`` (:func:`_gate_settings`'s
    arguments) and ``layout`` ``(T, device, backend argument, has_mask, has_fix, unmapped
    strides, map strides)``: ``(launch (a :class:`~kernforge.ops._launch.Bound`), scalar arguments)``.  Memoised because
    the kernel choice, the key and the scalars cost more than the kernel at T = 1;
    ``stamp`` (the tuning database's state) is in the key as in :func:`launch`."""
    k, scoring, groups, topk_groups, s, per_rank = _gate_settings(*settings)
    e, map_shape = settings[0], settings[-1]
    routed_scaling_factor, ep_rank, tp_rank, num_tp_ranks = settings[6], settings[7], settings[9], settings[10]
    t, dev, backend, has_mask, has_fix, unmapped_stride, map_stride = layout
    name = backends.for_device(dev.type) if backend is None else backends.for_tensor(None, backend)
    choice = dict(num_experts=e, num_topk=k, num_groups=groups, num_topk_groups=topk_groups, scoring_func=scoring,
                  num_shared=s, has_mask=has_mask, has_fix=has_fix,
                  has_unmapped=unmapped_stride is not None, has_map=map_shape is not None)
    scalars = (float(routed_scaling_factor), ep_rank, tp_rank, num_tp_ranks, per_rank, per_rank * num_tp_ranks)
    # the shapes and strides the launch depends on beyond t and the choice: the optional tensors'
    shapes = (None if map_shape is None else (map_shape, map_stride),
              None if unmapped_stride is None else ((t, k), unmapped_stride))
    key = ("top2_sum_gate", dev, t, name, shapes) + tuple(choice.values()) + scalars
    make = lambda: _kernel(kernels.top2_sum_gate, name, **config.choose_top2_sum(name, **choice))  # noqa: E731
    return Bound(key, make), scalars


@functools.lru_cache(maxsize=1024, typed=True)
def _gate_settings(e: int, num_topk, num_topk_groups, num_groups, use_shared_as_routed, num_shared_experts,
                   routed_scaling_factor, ep_rank, num_ep_ranks, tp_rank, num_tp_ranks, scoring_func,
                   map_shape) -> tuple:
    """:func:`top2_sum_gate`'s scalar arguments checked (the physical map, already checked 2-D,
    by its shape only): ``(k, scoring, groups, topk_groups, s, experts_per_rank)``.  Memoised, with the types in
    the key (``True`` is not ``1`` here), because a decode step calls the gate with the same
    settings every layer and these checks cost more than its kernel at T = 1."""
    k = _check_int("num_topk", num_topk, 1, min(e, kernels.MAX_TOPK))
    scoring = _check_scoring(scoring_func)
    groups, topk_groups = _check_groups(e, k, num_groups, num_topk_groups)
    s = _check_shared(e, k, use_shared_as_routed, num_shared_experts, map_shape)
    extra = map_shape[1] - 1 if map_shape is not None else 0
    _check_int("num_ep_ranks", num_ep_ranks, 1)
    _check_int("ep_rank", ep_rank, 0, num_ep_ranks - 1)
    _check_int("num_tp_ranks", num_tp_ranks, 1)
    _check_int("tp_rank", tp_rank, 0, num_tp_ranks - 1)
    if num_ep_ranks > e + extra:  # experts per rank, (E + extra) // num_ep_ranks as upstream, must be >= 1
        raise RoutingValueError(f"num_ep_ranks={num_ep_ranks} exceeds the routed experts plus the extra "
                                f"replicas ({e} + {extra})")
    if isinstance(routed_scaling_factor, bool) or not isinstance(routed_scaling_factor, (int, float)):
        raise RoutingTypeError(f"routed_scaling_factor must be a float, got {type(routed_scaling_factor).__name__}")
    return k, scoring, groups, topk_groups, s, (e + extra) // num_ep_ranks


@functools.lru_cache(maxsize=None)
def _placeholders(device: torch.device) -> tuple:
    """One-element stand-ins for :func:`top2_sum_gate`'s optional tensors, made once per
    device: the kernel neither reads nor writes a slot whose ``has_*`` flag is off."""
    return (torch.ones(1, dtype=torch.bool, device=device), torch.zeros(1, 1, dtype=torch.int32, device=device),
            torch.ones(1, dtype=torch.int32, device=device), torch.zeros(1, 1, dtype=torch.int64, device=device))


def _check_groups(e: int, k: int, num_groups, num_topk_groups) -> tuple[int, int]:
    g = _check_int("num_groups", num_groups, 0, kernels.MAX_GROUPS)
    tg = _check_int("num_topk_groups", num_topk_groups, 0, kernels.MAX_GROUPS)
    if g == tg:  # both 0, or every group kept: no grouping
        return 0, 0
    if not 0 < tg < g:
        raise RoutingValueError(f"num_topk_groups must be in [1, num_groups={g}), got {tg}")
    if e % g:
        raise RoutingValueError(f"num_groups={g} must divide the number of experts {e}")
    per = e // g
    if not 2 <= per <= kernels.MAX_EXPERTS_PER_GROUP:
        raise RoutingValueError(f"experts per group (E / num_groups = {per}) must be in "
                                f"[2, {kernels.MAX_EXPERTS_PER_GROUP}]")
    if k > tg * per:
        raise RoutingValueError(f"num_topk={k} exceeds the experts of the kept groups "
                                f"(num_topk_groups * E / num_groups = {tg * per})")
    return g, tg


def _check_shared(e: int, k: int, use_shared_as_routed, num_shared, map_shape: Optional[tuple]) -> int:
    if not isinstance(use_shared_as_routed, bool):
        raise RoutingTypeError(f"use_shared_as_routed must be a bool, got {type(use_shared_as_routed).__name__}")
    s = _check_int("num_shared_experts", num_shared, 0)
    if not use_shared_as_routed:
        return 0
    if s not in (1, 2):
        raise RoutingValueError(f"num_shared_experts must be 1 or 2 with use_shared_as_routed, got {s}")
    if k % s or e % (k // s):
        raise RoutingValueError(f"use_shared_as_routed needs num_topk % num_shared_experts == 0 and "
                                f"E % (num_topk / num_shared_experts) == 0, got k={k}, s={s}, E={e}")
    if map_shape is None or map_shape[1] - 1 < s:
        raise RoutingValueError("use_shared_as_routed needs to_physical_map with at least "
                                f"num_shared_experts + 1 = {s + 1} columns")
    return s


def _check_map(to_physical_map, logical_count, logical: int) -> None:
    """The physical map's dtype and rows and ``logical_count``'s values (its extra replica
    columns, ``shape[1] - 1``, are counted from the shape by :func:`_gate_settings`)."""
    if (to_physical_map is None) != (logical_count is None):
        raise RoutingValueError("to_physical_map and logical_count must be given together")
    if to_physical_map is None:
        return
    _check_tensor("to_physical_map", to_physical_map, torch.int32, dim=2)
    if to_physical_map.shape[0] != logical:
        raise RoutingValueError(f"to_physical_map must have {logical} rows (routed + shared experts), "
                                f"got {to_physical_map.shape[0]}")
    _check_tensor("logical_count", logical_count, torch.int32, shape=(logical,))
    d = to_physical_map.shape[1]
    if not capturing(logical_count) and bool(((logical_count < 1) | (logical_count > d)).any()):
        raise RoutingValueError(f"logical_count values must be in [1, {d}] (the map's columns)")


def _check_same_device(ref: torch.Tensor, **tensors) -> None:
    for name, t in tensors.items():
        if t is not None and t.device != ref.device:
            raise RoutingValueError(f"{name} is on {t.device}, logits on {ref.device}")


def normalize_weight(w: torch.Tensor, *, backend: Optional[str] = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(denominator [T] = w.sum(-1) + 1e-20, w / denominator)`` for float32 ``w [T, k]``; NaN propagates."""
    _check_tensor("w", w, torch.float32, dim=2)
    t, k = w.shape
    _check_int("w.shape[1] (num_topk)", k, 1)
    den = torch.empty(t, dtype=torch.float32, device=w.device)
    out = torch.empty_like(w)
    if t == 0:
        return den, out
    name = backends.for_tensor(w, backend)
    launch(("normalize_weight", w.device, t, name, k),
           lambda: _kernel(kernels.normalize_weight, name, **config.choose_normalize(name, k)), (w, den, out))
    return den, out


def hash_gate(logits: torch.Tensor, token_ids: torch.Tensor, tid2eid: torch.Tensor,
              routed_scaling_factor: float, scoring_func: str = "sqrtsoftplus", norm_topk_prob: bool = True,
              *, backend: Optional[str] = None) -> tuple[torch.Tensor, torch.Tensor]:
    """V4's hash routing: ``topk_idx = tid2eid[token_ids]`` (int64 ``[T, k]``) and the weights of
    ``kernforge.model.moe.Gate``: the chosen experts' scores of ``logits [T, E]``, divided by
    their sum (unless softmax scoring or ``norm_topk_prob=False``), times the scaling factor."""
    _check_tensor("logits", logits, torch.float32, dim=2)
    t, e = logits.shape
    _check_experts("logits", logits)
    if not isinstance(token_ids, torch.Tensor) or token_ids.dtype not in (torch.int32, torch.int64):
        raise RoutingTypeError(f"token_ids must be an int32 or int64 tensor, got "
                               f"{getattr(token_ids, 'dtype', type(token_ids).__name__)}")
    _check_tensor("token_ids", token_ids, token_ids.dtype, shape=(t,))
    _check_tensor("tid2eid", tid2eid, torch.int64, dim=2)
    vocab, k = tid2eid.shape
    _check_int("tid2eid.shape[1] (num_topk)", k, 1, e)
    scoring = _check_scoring(scoring_func)
    if not isinstance(norm_topk_prob, bool):
        raise RoutingTypeError(f"norm_topk_prob must be a bool, got {type(norm_topk_prob).__name__}")
    if isinstance(routed_scaling_factor, bool) or not isinstance(routed_scaling_factor, (int, float)):
        raise RoutingTypeError(f"routed_scaling_factor must be a float, got {type(routed_scaling_factor).__name__}")
    _check_same_device(logits, token_ids=token_ids, tid2eid=tid2eid)
    idx = torch.empty(t, k, dtype=torch.int64, device=logits.device)
    weights = torch.empty(t, k, dtype=torch.float32, device=logits.device)
    if t == 0:
        return idx, weights
    if not capturing(logits):
        if bool(((token_ids < 0) | (token_ids >= vocab)).any()):
            raise RoutingValueError(f"token_ids must be in [0, {vocab}) (tid2eid's rows)")
        rows = tid2eid[token_ids.long()]
        if bool(((rows < 0) | (rows >= e)).any()):
            raise RoutingValueError(f"tid2eid entries of these tokens must be expert ids in [0, {e})")
    name = backends.for_tensor(logits, backend)
    kernel = _kernel(kernels.hash_gate, name, **config.choose_hash(name, e, k, scoring, norm_topk_prob))
    kernel(logits, token_ids.long(), tid2eid, idx, weights, float(routed_scaling_factor))
    return idx, weights
