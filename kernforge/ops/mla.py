"""FlashMLA's decode API on kernforge kernels: ``get_mla_metadata`` + ``flash_mla_with_kvcache``.

The signatures follow FlashMLA (the upstream spec ``flashmla-decode.md``; not shipped),
including its legacy call forms, so code written for FlashMLA runs unchanged; ``backend=``
picks the kernforge backend (default: the one ``kernforge.backends.for_tensor`` gives the
tensors' device).
Every argument is checked on the host before a kernel starts, with an error that
names the argument: a wrong block table or sequence length is an exception here,
never a read of someone else's page.

Differences from FlashMLA, all of them widenings: any head dims with
``head_dim_v <= d`` and any page size (FlashMLA: d in {512, 576}, head_dim_v 512,
page 64), any architecture, ``attn_sink`` on the dense path too, and a bf16 cache on
the sparse (``indices``) path besides the V3.2 FP8 one (``is_fp8_kvcache=True``, 656
bytes per token).  Not yet supported (``NotImplementedError``): the MODEL1 (V4) FP8
layout and the extra KV cache.

Dense split-KV, as FlashMLA: on a CUDA device (or anywhere with ``num_sm_parts=``) the
first call computes FlashMLA's balanced schedule from ``cache_seqlens``
(:mod:`kernforge.kernels.mla_decode.schedule`: ``tile_scheduler_metadata int32
[num_sm_parts, 8]`` and ``num_splits int32 [b + 1]``), stores it in the
``FlashMLASchedMeta`` from ``get_mla_metadata``, and runs the kernel that walks it plus
the combine (``mla_decode_scheduled``); later calls with that object reuse it (valid
while the lengths are unchanged, as in FlashMLA).  The schedule is computed on the
host, so a CUDA-graph capture needs it recorded by an earlier call.  Host backends split
only when the batch's blocks would leave threads of their team idle (batch 1 at 64 heads
on 2 threads: 1.7x faster, measured on the quiet 2-core machine).
``num_kv_splits=`` (or a recorded ``kv_splits``) keeps the older uniform split (every
request cut into the same power of two, ``config.choose_splits``; what the
``mla_decode_splitkv`` tuning entry sweeps).  Legacy metadata tensors (v1/v2 API) are
accepted and ignored: FlashMLA's own encodings differ between versions.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Optional

import torch

from kernforge.ops._capture import capturing

import kernforge
from kernforge import backends
from kernforge.kernels import mla_decode as kernels
from kernforge.kernels.mla_decode import config, schedule
from kernforge.kernels.mla_decode.scheduled import Scheduled
from kernforge.kernels.mla_decode.split_kv import SplitKV
from kernforge.ops.arch import target_arch
from kernforge.model import numerics as nx

_DTYPES = (torch.bfloat16,)


@dataclass
class FlashMLASchedMeta:
    """FlashMLA's lazily filled schedule object.  The first call records the shape
    configuration in ``config``; later calls must match it (as in FlashMLA).  The dense
    path's first call fills ``tile_scheduler_metadata`` and ``num_splits`` with the balanced
    schedule of its ``cache_seqlens`` (when it runs the scheduled kernel), or records the
    uniform split count in ``kv_splits`` (a kernforge field; the caller may set it), and every
    later call with this object uses what was recorded: FlashMLA computes one schedule per
    decode step and shares it across the layers, so a tuning database that changes
    mid-step does not split one layer differently from the next."""

    have_initialized: bool = False
    config: Optional[dict] = None
    tile_scheduler_metadata: Optional[torch.Tensor] = None
    num_splits: Optional[torch.Tensor] = None
    kv_splits: Optional[int] = None


def get_mla_metadata(*args, **kwargs) -> tuple[FlashMLASchedMeta, None]:
    """Current FlashMLA form: arguments are accepted for compatibility and ignored; the
    schedule is computed by the first :func:`flash_mla_with_kvcache` call that uses the
    returned object (FlashMLA's lazy ``FlashMLASchedMeta``)."""
    return FlashMLASchedMeta(), None


def flash_mla_with_kvcache(q: torch.Tensor, k_cache: torch.Tensor, block_table: torch.Tensor,
                           cache_seqlens: torch.Tensor, head_dim_v: int,
                           tile_scheduler_metadata=None, num_splits=None,
                           softmax_scale: Optional[float] = None, causal: bool = False,
                           is_fp8_kvcache: bool = False, indices: Optional[torch.Tensor] = None,
                           attn_sink: Optional[torch.Tensor] = None, extra_k_cache=None,
                           extra_indices_in_kvcache=None, topk_length=None,
                           extra_topk_length=None, *, backend: Optional[str] = None,
                           num_kv_splits: Optional[int] = None, num_sm_parts: Optional[int] = None
                           ) -> tuple[torch.Tensor, torch.Tensor]:
    """Paged MLA decode attention.

    ``q [b, s_q, h_q, d]``, ``k_cache [num_blocks, page_block_size, h_kv, d]`` (value =
    first ``head_dim_v`` dims of the key), ``block_table int32 [b, max_blocks]``,
    ``cache_seqlens int32 [b]``.  Returns ``out [b, s_q, h_q, head_dim_v]`` in q's
    dtype and ``lse float32 [b, h_q, s_q]`` (natural log; ``+inf`` and out 0 for rows
    with nothing to attend; NaN, as torch gives, for rows whose query or visible keys
    hold a NaN; empty tensors for an empty batch: docs/ops.md).  ``attn_sink float32 [h_q]`` scales each head's output by
    ``1 / (1 + exp(sink - lse))``.

    With ``indices int32 [b, s_q, topk]`` (flat token ids ``block * page_block_size +
    offset``, ``-1`` = empty) each query token attends to its listed rows only
    (``block_table``/``cache_seqlens`` are then ignored and may be ``None``), limited to
    the first ``topk_length[i]`` slots when that is given.

    kernforge additions (keyword-only): ``backend``; ``num_sm_parts`` to run the dense path
    over FlashMLA's balanced schedule with that many partitions on any backend (default:
    on a CUDA device, FlashMLA's count for its SMs; on a host, a split only when the batch
    would leave threads idle, never in deterministic mode); ``num_kv_splits``
    to force a uniform split-KV factor instead (default: the ``kv_splits`` a
    ``FlashMLASchedMeta`` recorded, else
    :func:`kernforge.kernels.mla_decode.config.choose_splits`)."""
    if extra_k_cache is not None or extra_indices_in_kvcache is not None or extra_topk_length is not None:
        raise NotImplementedError("extra_k_cache / extra_indices_in_kvcache are not supported yet")
    _check_schedule_args(tile_scheduler_metadata, num_splits)
    if indices is not None:
        return _sparse(q, k_cache, indices, topk_length, head_dim_v, tile_scheduler_metadata,
                       softmax_scale, causal, bool(is_fp8_kvcache), attn_sink, backend)
    if is_fp8_kvcache:
        _check_fp8_flag_on_dense(k_cache)
    if topk_length is not None:
        raise ValueError("topk_length is only meaningful with indices (the sparse path)")
    b, s_q, h_q, d = _check_dense(q, k_cache, block_table, cache_seqlens, head_dim_v, attn_sink)
    if b * s_q * h_q == 0:
        return _empty_result(q, head_dim_v)
    page, h_kv = k_cache.shape[1], k_cache.shape[2]
    causal = bool(causal) and s_q > 1            # FlashMLA ignores causal for one query token
    if isinstance(tile_scheduler_metadata, FlashMLASchedMeta):
        _record_config(tile_scheduler_metadata, dict(
            b=b, s_q=s_q, h_q=h_q, page_block_size=page, h_kv=h_kv, causal=causal,
            is_fp8_kvcache=False, topk=None))
    scale = d ** -0.5 if softmax_scale is None else float(softmax_scale)
    backend = backends.for_tensor(q, backend)
    cfg = config.choose(backend, h_q, h_kv, s_q, d, head_dim_v, page, causal, arch=target_arch(backend, None))
    meta = tile_scheduler_metadata if isinstance(tile_scheduler_metadata, FlashMLASchedMeta) else None
    sink = attn_sink if attn_sink is not None else torch.full((h_q,), -float("inf"), device=q.device)
    parts = _schedule_parts(backend, cfg, q, meta, num_kv_splits, num_sm_parts)
    if parts is not None:
        return _scheduled(backend, cfg, q, k_cache.view(-1, h_kv * d), block_table, cache_seqlens, sink, scale,
                          head_dim_v, meta, parts)
    if num_kv_splits is not None:
        splits = _check_splits("num_kv_splits", num_kv_splits)
    elif meta is not None and meta.kv_splits is not None:
        splits = _check_splits("tile_scheduler_metadata.kv_splits", meta.kv_splits)
    else:
        splits = config.choose_splits(backend, cfg, b, block_table.shape[1], q.device)["num_splits"]
    if meta is not None and meta.kv_splits is None:
        meta.kv_splits = splits
    out = torch.empty(b, s_q, h_q, head_dim_v, dtype=q.dtype, device=q.device)
    lse = torch.empty(b, h_q, s_q, dtype=torch.float32, device=q.device)
    kv_flat = k_cache.view(-1, h_kv * d)
    if splits == 1:
        _kernel(backend, kernels.mla_decode, **cfg)(q, kv_flat, block_table, cache_seqlens, sink,
                                                      scale, out, lse)
        return out, lse
    combine = config.choose_combine(backend, h_q, splits, s_q, head_dim_v)
    SplitKV(_kernel(backend, kernels.mla_decode, **cfg, num_splits=splits),
            _kernel(backend, kernels.mla_decode_combine, **combine),
            splits)(q, kv_flat, block_table, cache_seqlens, sink, scale, out, lse)
    return out, lse


def _schedule_parts(backend, cfg, q, meta, num_kv_splits, num_sm_parts) -> Optional[int]:
    """The partition count of the balanced split-KV schedule this call runs, or ``None``
    for the uniform path (``num_kv_splits`` or a recorded ``kv_splits`` given, a host
    backend whose threads the batch's blocks already fill (:func:`config.host_parts`), or
    CUDA-graph capture with no schedule recorded: the schedule is computed on the host from
    ``cache_seqlens``, which capture cannot read)."""
    if num_sm_parts is not None:
        if num_kv_splits is not None:
            raise ValueError("pass num_kv_splits (uniform splits) or num_sm_parts (balanced schedule), not both")
        parts = _check_splits("num_sm_parts", num_sm_parts)
        if meta is not None and meta.tile_scheduler_metadata is not None \
                and meta.tile_scheduler_metadata.shape[0] != parts:
            raise ValueError(f"num_sm_parts={parts}, but tile_scheduler_metadata holds a schedule of "
                             f"{meta.tile_scheduler_metadata.shape[0]} partitions")
        return parts
    if num_kv_splits is not None or (meta is not None and meta.kv_splits is not None):
        return None
    if meta is not None and meta.tile_scheduler_metadata is not None:
        return meta.tile_scheduler_metadata.shape[0]
    if capturing(q):
        return None
    if backends.device(backend) == "cuda":
        return config.sm_parts(cfg, q.device)
    if nx.is_deterministic():  # a host split follows the batch size: a row's bits would follow its batch
        return None
    return config.host_parts(cfg, q.shape[0], backends.get(backend).workers())


def _scheduled(backend, cfg, q, kv_flat, block_table, cache_seqlens, sink, scale, head_dim_v, meta, parts):
    """Dense decode over FlashMLA's balanced schedule (:mod:`kernforge.kernels.mla_decode.schedule`):
    computed from ``cache_seqlens`` on the first call and kept in ``meta`` (FlashMLA's
    ``tile_scheduler_metadata`` and ``num_splits``), which later calls reuse, as FlashMLA
    does for every layer of a decode step (valid while the lengths are unchanged)."""
    if meta is not None and meta.tile_scheduler_metadata is not None:
        sched, num_splits = meta.tile_scheduler_metadata, meta.num_splits
    else:
        sched, num_splits = schedule.schedule(cache_seqlens.cpu(), parts)
        sched, num_splits = sched.to(q.device), num_splits.to(q.device)
        if meta is not None:
            meta.tile_scheduler_metadata, meta.num_splits = sched, num_splits
    b, s_q, h_q, _ = q.shape
    out = torch.empty(b, s_q, h_q, head_dim_v, dtype=q.dtype, device=q.device)
    lse = torch.empty(b, h_q, s_q, dtype=torch.float32, device=q.device)
    o_acc = torch.empty(b + parts, s_q, h_q, head_dim_v, dtype=torch.float32, device=q.device)
    lse_acc = torch.empty(b + parts, h_q, s_q, dtype=torch.float32, device=q.device)
    Scheduled(_kernel(backend, kernels.mla_decode_scheduled, **cfg),
              _kernel(backend, kernels.mla_decode_combine_scheduled,
                      **config.scheduled_combine_params(backend, h_q, s_q, head_dim_v)))(
        q, kv_flat, block_table, cache_seqlens, sched, num_splits, sink, scale, out, lse, o_acc, lse_acc)
    return out, lse


def _check_splits(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return value


def _sparse(q, k_cache, indices, topk_length, head_dim_v, meta, softmax_scale, causal, fp8,
            attn_sink, backend) -> tuple[torch.Tensor, torch.Tensor]:
    """Index-selected decode: each query token attends to its listed rows of a bf16 or
    V3.2-FP8 cache."""
    if causal:
        raise ValueError("causal must be False with indices (the sparse path)")
    b, s_q, h_q, d = _check_q_and_cache(q, k_cache, head_dim_v, fp8)
    num_blocks, page, h_kv, _ = k_cache.shape
    if h_kv != 1:
        raise ValueError(f"the sparse path supports only MQA (h_kv == 1), got h_kv={h_kv}")
    if not isinstance(indices, torch.Tensor) or indices.dtype != torch.int32 or indices.dim() != 3 \
            or tuple(indices.shape[:2]) != (b, s_q) or indices.shape[2] == 0 or not indices.is_contiguous():
        raise ValueError(f"indices must be a contiguous int32 [{b}, {s_q}, topk > 0] tensor, got "
                         f"{getattr(indices, 'dtype', type(indices).__name__)} "
                         f"{tuple(getattr(indices, 'shape', ()))}")
    topk = indices.shape[2]
    if topk_length is None:
        topk_length = torch.full((b,), topk, dtype=torch.int32, device=q.device)
    elif not isinstance(topk_length, torch.Tensor) or topk_length.dtype != torch.int32 \
            or tuple(topk_length.shape) != (b,) or (not capturing(q) and (topk_length < 0).any()):
        raise ValueError(f"topk_length must be a non-negative int32 [{b}] tensor")
    _check_sink(attn_sink, h_q)
    _check_one_device(q, k_cache, indices, topk_length, attn_sink)
    if not capturing(q):
        used = torch.arange(topk, device=indices.device) < topk_length.long()[:, None, None]
        ids = indices[used.expand(b, s_q, topk)]
        if ((ids != -1) & ((ids < 0) | (ids >= num_blocks * page))).any():
            raise ValueError(f"indices within topk_length must be -1 or token ids in "
                             f"[0, {num_blocks * page}) (physical_block * page_block_size + offset)")
    if b * s_q * h_q == 0:
        return _empty_result(q, head_dim_v)
    if isinstance(meta, FlashMLASchedMeta):
        _record_config(meta, dict(b=b, s_q=s_q, h_q=h_q, page_block_size=page, h_kv=1,
                                  causal=False, is_fp8_kvcache=fp8, topk=topk))
    scale = d ** -0.5 if softmax_scale is None else float(softmax_scale)
    backend = backends.for_tensor(q, backend)
    kernel = _kernel(backend, kernels.mla_decode_sparse,
                     **config.choose_sparse(backend, h_q, topk, s_q, d, head_dim_v, fp8))
    sink = attn_sink if attn_sink is not None else torch.full((h_q,), -float("inf"), device=q.device)
    out = torch.empty(b, s_q, h_q, head_dim_v, dtype=q.dtype, device=q.device)
    lse = torch.empty(b, h_q, s_q, dtype=torch.float32, device=q.device)
    kv_flat = k_cache.view(torch.uint8).view(-1, kernels.V32_BYTES) if fp8 else k_cache.view(-1, d)
    kernel(q, kv_flat, indices, topk_length, sink, scale, out, lse)
    return out, lse


#: the configuration choosers this op compiles with (kept here under their old names):
#: ``choose_config(backend, h_q, h_kv, s_q, d, dim_v, page, causal)`` and
#: ``choose_splits(backend, config, batch, pages, device)`` (a dict: ``config`` plus ``num_splits``)
choose_config = config.choose
choose_splits = config.choose_splits


@functools.lru_cache(maxsize=None)
def _compiled(backend: str, factory, params: tuple):
    return kernforge.compile(factory, backend=backend, **dict(params))


def _kernel(backend: str, factory, **params):
    return _compiled(backend, factory, tuple(sorted(params.items())))


def _check_schedule_args(meta, num_splits) -> None:
    if meta is None or isinstance(meta, FlashMLASchedMeta):
        if num_splits is not None:
            raise ValueError("num_splits must be None with the current FlashMLA API (pass the "
                             "FlashMLASchedMeta from get_mla_metadata as tile_scheduler_metadata)")
    elif not isinstance(meta, torch.Tensor):
        raise TypeError(f"tile_scheduler_metadata must be a FlashMLASchedMeta (or a legacy "
                        f"metadata tensor), got {type(meta).__name__}")
    # legacy tensors (v1/v2 API) carry FlashMLA's own per-SM schedule, whose encoding changed
    # between versions (token vs block ranges): ignored, the op computes its own


def _record_config(meta: FlashMLASchedMeta, config: dict) -> None:
    if not meta.have_initialized:
        meta.config, meta.have_initialized = config, True
    elif meta.config != config:
        raise ValueError(f"Your input arguments are inconsistent with sched_meta: it was first "
                         f"used with {meta.config}, now {config}")


def _check_dense(q, k_cache, block_table, cache_seqlens, head_dim_v, attn_sink) -> tuple:
    b, s_q, h_q, d = _check_q_and_cache(q, k_cache, head_dim_v)
    for name, t in (("block_table", block_table), ("cache_seqlens", cache_seqlens)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if block_table.dtype != torch.int32 or block_table.dim() != 2 or block_table.shape[0] != b:
        raise ValueError(f"block_table must be int32 [{b}, max_blocks], got {block_table.dtype} "
                         f"{tuple(block_table.shape)}")
    if cache_seqlens.dtype != torch.int32 or tuple(cache_seqlens.shape) != (b,):
        raise ValueError(f"cache_seqlens must be int32 [{b}], got {cache_seqlens.dtype} "
                         f"{tuple(cache_seqlens.shape)}")
    if not block_table.is_contiguous() or not cache_seqlens.is_contiguous():
        raise ValueError("block_table and cache_seqlens must be contiguous")
    _check_sink(attn_sink, h_q)
    _check_one_device(q, k_cache, block_table, cache_seqlens, attn_sink)
    if not capturing(q):
        _check_pages(block_table, cache_seqlens, k_cache.shape[1], k_cache.shape[0])
    return b, s_q, h_q, d


_FP8_CACHE_DTYPES = (torch.float8_e4m3fn, torch.int8, torch.uint8)


def _check_q_and_cache(q, k_cache, head_dim_v, fp8: bool = False) -> tuple:
    for name, t in (("q", q), ("k_cache", k_cache)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if q.dim() != 4:
        raise ValueError(f"q must be [batch, s_q, h_q, d], got shape {tuple(q.shape)}")
    b, s_q, h_q, d = q.shape
    if q.dtype not in _DTYPES:
        raise TypeError(f"q must be bfloat16, got {q.dtype}")
    if fp8:
        if k_cache.dtype not in _FP8_CACHE_DTYPES:
            raise TypeError(f"an FP8 k_cache holds bytes (float8_e4m3fn, int8 or uint8), got "
                            f"{k_cache.dtype}")
        if (d, head_dim_v) != (576, 512):
            raise ValueError(f"the V3.2 FP8 cache format needs d 576 and head_dim_v 512, got "
                             f"{d}, {head_dim_v}")
        width = kernels.V32_BYTES
    else:
        if k_cache.dtype != q.dtype:
            raise TypeError(f"k_cache dtype {k_cache.dtype} must equal q's {q.dtype}")
        width = d
    if not fp8 and k_cache.dim() == 4 and k_cache.shape[3] != d:
        raise ValueError(f"q's head dim d = {d} (q.shape[3], q {tuple(q.shape)}) must equal "
                         f"k_cache's {k_cache.shape[3]} (k_cache.shape[3], k_cache "
                         f"{tuple(k_cache.shape)}): keys and queries share one head dim")
    if k_cache.dim() != 4 or k_cache.shape[3] != width:
        raise ValueError(f"k_cache must be [num_blocks, page_block_size, h_kv, {width}], got "
                         f"{tuple(k_cache.shape)}")
    h_kv = k_cache.shape[2]
    if not 0 < head_dim_v <= d:
        raise ValueError(f"head_dim_v ({head_dim_v}) must be in (0, d={d}]: the value is the first "
                         "head_dim_v dims of the key")
    if h_kv == 0 or h_q % h_kv:
        raise ValueError(f"h_q ({h_q}) must be a multiple of h_kv ({h_kv})")
    if not q.is_contiguous() or not k_cache.is_contiguous():
        raise ValueError("q and k_cache must be contiguous")
    return b, s_q, h_q, d


def _check_fp8_flag_on_dense(k_cache) -> None:
    """``is_fp8_kvcache=True`` without ``indices``: never silently ignored.  A bf16 cache
    contradicts the flag; an FP8 one needs a dense FP8 kernel kernforge does not have."""
    if isinstance(k_cache, torch.Tensor) and k_cache.dtype not in _FP8_CACHE_DTYPES:
        raise TypeError(f"is_fp8_kvcache=True, but k_cache is {k_cache.dtype}: an FP8 cache holds "
                        "bytes (float8_e4m3fn, int8 or uint8); pass is_fp8_kvcache=False for a "
                        f"{k_cache.dtype} cache")
    raise NotImplementedError("an FP8 KV cache (is_fp8_kvcache=True) is supported on the sparse "
                              "(indices) path only; FlashMLA's dense decode is bf16/fp16 too")


def _empty_result(q, head_dim_v: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(out, lse)`` for a call with no query rows (``b``, ``s_q`` or ``h_q`` is 0): empty
    tensors of the right shapes, as torch's attention returns; nothing is launched and a
    ``FlashMLASchedMeta`` is left unrecorded (there is no schedule to record)."""
    b, s_q, h_q, _ = q.shape
    return (torch.empty(b, s_q, h_q, head_dim_v, dtype=q.dtype, device=q.device),
            torch.empty(b, h_q, s_q, dtype=torch.float32, device=q.device))


def _check_sink(attn_sink, h_q: int) -> None:
    if attn_sink is not None and (not isinstance(attn_sink, torch.Tensor)
                                  or attn_sink.dtype != torch.float32
                                  or tuple(attn_sink.shape) != (h_q,) or not attn_sink.is_contiguous()):
        raise ValueError(f"attn_sink must be a contiguous float32 [{h_q}] tensor")


def _check_one_device(*tensors) -> None:
    devices = {t.device for t in tensors if t is not None}
    if len(devices) != 1:
        raise ValueError(f"all tensors must be on one device, got {sorted(map(str, devices))}")


def _check_pages(block_table, cache_seqlens, page: int, num_blocks: int) -> None:
    """Every page a request uses must exist: a bad id would read another allocation."""
    lens = cache_seqlens.long()
    max_len = block_table.shape[1] * page
    if (lens < 0).any() or (lens > max_len).any():
        raise ValueError(f"cache_seqlens must be in [0, {max_len}] (block_table width x page size), "
                         f"got {cache_seqlens.tolist()}")
    used = torch.arange(block_table.shape[1], device=lens.device)[None, :] * page < lens[:, None]
    ids = block_table[used]
    if ids.numel() and ((ids < 0).any() or (ids >= num_blocks).any()):
        raise ValueError(f"block_table holds page ids outside [0, {num_blocks}) within "
                         "cache_seqlens")
