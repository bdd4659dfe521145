"""Dense MLA decode over FlashMLA's balanced split-KV schedule (:mod:`.schedule`).

:func:`mla_decode_scheduled` launches one CTA per (row block, partition): the CTA walks
its partition's requests in order, and for each one streams the KV blocks the
schedule gives it (the whole request, or one piece of a request cut across
partitions) with the same tile step as :func:`~.kernel.mla_decode`.  A request the
schedule did not cut is finished in place (normalised, sink folded in, written to
``Out``/``LSE``); a piece of a cut request leaves float32 partials in row
``num_splits[req] + split`` of ``O_accum``/``LSE_accum``, which
:func:`mla_decode_combine_scheduled` merges (it skips the requests with one split).

The grid's fastest dimension is the row block, so the CTAs that read one partition's
KV (a request's 64-head row blocks at h=128) are adjacent in launch order and share it
in L2 instead of each fetching it from HBM.
"""
# no `from __future__ import annotations`: T.Tensor annotations must see the factory's
# parameters as values when the prim_func is traced
import math

import kernforge.dsl as T
from kernforge.kernels.mla_decode.kernel import (LOG2E, _alloc_attention, _attend_pages, _check_shape_params,
                                                _init_softmax, _load_rows, _write_rows, rows_are_tiles)
from kernforge.kernels.mla_decode.schedule import BLOCK, FIELDS


def _check_block_N(block_N: int) -> None:
    if BLOCK % block_N:
        raise ValueError(f"block_N ({block_N}) must divide the schedule's block of {BLOCK} tokens")


@T.tunable(block_N=[16, 32, 64], block_H=[16, 32, 64], num_stages=[1, 2])
def mla_decode_scheduled(heads: int, heads_kv: int = 1, seq_q: int = 1, dim: int = 576, dim_v: int = 512,
                         page_size: int = 64, causal: bool = False, block_N: int = 32, block_H: int = 64,
                         num_stages: int = 2, dtype: str = "bfloat16", threads: int = 256):
    """Parameters of the returned kernel, in order: ``Q [batch, seq_q, heads, dim]``,
    ``KV [num_tokens, heads_kv * dim]``, ``block_table int32 [batch, max_pages]``,
    ``cache_seqlens int32 [batch]``, ``tile_scheduler_metadata int32 [num_sm_parts, 8]``
    and ``num_splits int32 [batch + 1]`` (:func:`.schedule.schedule` of these lengths),
    ``attn_sink float32 [heads]``, ``sm_scale``, outputs ``Out [batch, seq_q, heads,
    dim_v]``, ``LSE float32 [batch, heads, seq_q]`` (rows of requests with one split),
    ``O_accum float32 [n_accum, seq_q, heads, dim_v]`` and ``LSE_accum float32 [n_accum,
    heads, seq_q]`` (partials of cut requests; ``n_accum >= num_splits[batch]``, FlashMLA
    allocates ``batch + num_sm_parts``)."""
    _check_shape_params(heads, heads_kv, dim, dim_v, page_size, block_N, block_H)
    _check_block_N(block_N)
    accum = "float32"
    dpe = dim - dim_v
    group = heads // heads_kv
    rows = seq_q * group
    row_blocks = -(-rows // block_H)
    tile_rows = rows_are_tiles(group, seq_q, heads_kv, block_H)
    tiles_per_block = BLOCK // block_N
    batch = T.symbolic("batch")
    batch1 = T.symbolic("batch_plus_1")
    parts = T.symbolic("num_sm_parts")
    n_accum = T.symbolic("n_accum")
    num_tokens = T.symbolic("num_tokens")
    max_pages = T.symbolic("max_pages")
    name = (f"mla_decode_sched_h{heads}_kv{heads_kv}_q{seq_q}_d{dim}_v{dim_v}_p{page_size}"
            f"{'_causal' if causal else ''}_N{block_N}_H{block_H}_s{num_stages}_{dtype}_t{threads}")

    @T.prim_func(name=name)
    def main(Q: T.Tensor((batch, seq_q, heads, dim), dtype),
             KV: T.Tensor((num_tokens, heads_kv * dim), dtype),
             block_table: T.Tensor((batch, max_pages), "int32"),
             cache_seqlens: T.Tensor((batch,), "int32"),
             tile_scheduler_metadata: T.Tensor((parts, FIELDS), "int32"),
             num_splits: T.Tensor((batch1,), "int32"),
             attn_sink: T.Tensor((heads,), accum),
             sm_scale: T.float32,
             Out: T.Tensor((batch, seq_q, heads, dim_v), dtype),
             LSE: T.Tensor((batch, heads, seq_q), accum),
             O_accum: T.Tensor((n_accum, seq_q, heads, dim_v), accum),
             LSE_accum: T.Tensor((n_accum, heads, seq_q), accum)):
        # row block fastest: a partition's row blocks are neighbours in launch order
        with T.Kernel(heads_kv * row_blocks, parts, threads=threads) as (by, part):
            st = _alloc_attention(block_H, block_N, dim_v, dpe, dtype, accum)
            limit = T.alloc_fragment((block_H,), "int32")
            kvh = by // row_blocks
            row0 = (by % row_blocks) * block_H
            scale_log2 = sm_scale * LOG2E
            first_req = tile_scheduler_metadata[part, 0]
            last_req = tile_scheduler_metadata[part, 1]
            for req in T.serial(first_req, last_req + 1):
                seqlen = cache_seqlens[req]
                n_tiles = T.ceildiv(seqlen, block_N)
                t0 = T.if_then_else(req == first_req, tile_scheduler_metadata[part, 2] * tiles_per_block, 0)
                t1 = T.if_then_else(req == last_req,
                                    T.min(tile_scheduler_metadata[part, 3] * tiles_per_block, n_tiles), n_tiles)
                _load_rows(st, Q, req, row0, rows, group, kvh, limit, seqlen, seq_q, causal)
                _init_softmax(st)
                _attend_pages(st, KV, block_table, req, kvh, dim, page_size, seqlen, limit, scale_log2,
                              t0, T.max(t1, t0), num_stages)

                def row_of(i):
                    r = T.min(row0 + i, rows - 1)
                    return r, kvh * group + r % group

                def lse_of(i):
                    return st.m[i] * sm_scale + T.log(st.l[i])

                acc_row = num_splits[req] + T.if_then_else(req == first_req, tile_scheduler_metadata[part, 4], 0)
                # the block's rows as one tile (token s0, heads h0..) of Out or O_accum, where they are one:
                # TMA stores on sm_90a (the float32 partials one warp column at a time, tma_store.TmaStore.rounds)
                s0, h0 = row0 // group, kvh * group + row0 % group
                if num_splits[req + 1] - num_splits[req] == 1:
                    _write_rows(block_H, dim_v, st.acc_o, st.l, lse_of, row_of, lambda i: row0 + i < rows,
                                Out, lambda rh, i, d: (req, rh[0] // group, rh[1], d),
                                LSE, lambda rh, i: (req, rh[1], rh[0] // group),
                                sink_of=lambda rh: attn_sink[rh[1]], empty_lse=math.inf,
                                out_tile=Out[req, s0, h0, 0] if tile_rows else None)
                else:
                    _write_rows(block_H, dim_v, st.acc_o, st.l, lse_of, row_of, lambda i: row0 + i < rows,
                                O_accum, lambda rh, i, d: (acc_row, rh[0] // group, rh[1], d),
                                LSE_accum, lambda rh, i: (acc_row, rh[1], rh[0] // group),
                                sink_of=None, empty_lse=-math.inf,
                                out_tile=O_accum[acc_row, s0, h0, 0] if tile_rows else None)

    return main


@T.tunable(block_R=[4, 8, 16, 32])
def mla_decode_combine_scheduled(heads: int, seq_q: int = 1, dim_v: int = 512, block_R: int = 16,
                                 dtype: str = "bfloat16", threads: int = 128):
    """Merge the partials of the requests :func:`mla_decode_scheduled` cut: for request
    ``b`` with ``n = num_splits[b+1] - num_splits[b] > 1`` splits, ``lse = log sum_s
    exp(lse_s)`` and ``out = sum_s exp(lse_s - lse) out_s`` over accumulator rows
    ``num_splits[b] ..``, then the sink.  Requests with one split are left alone (the
    split kernel wrote them).  Parameters: ``O_accum``, ``LSE_accum``, ``num_splits
    int32 [batch + 1]``, ``attn_sink``, outputs ``Out [batch, seq_q, heads, dim_v]``,
    ``LSE [batch, heads, seq_q]``."""
    accum = "float32"
    rows = seq_q * heads
    batch = T.symbolic("batch")
    batch1 = T.symbolic("batch_plus_1")
    n_accum = T.symbolic("n_accum")
    name = f"mla_decode_combine_sched_h{heads}_q{seq_q}_v{dim_v}_R{block_R}_{dtype}_t{threads}"

    @T.prim_func(name=name)
    def main(O_accum: T.Tensor((n_accum, seq_q, heads, dim_v), accum),
             LSE_accum: T.Tensor((n_accum, heads, seq_q), accum),
             num_splits: T.Tensor((batch1,), "int32"),
             attn_sink: T.Tensor((heads,), accum),
             Out: T.Tensor((batch, seq_q, heads, dim_v), dtype),
             LSE: T.Tensor((batch, heads, seq_q), accum)):
        with T.Kernel(T.ceildiv(rows, block_R), batch, threads=threads) as (by, bx):
            top = T.alloc_fragment((block_R,), accum)
            w = T.alloc_fragment((block_R,), accum)
            total = T.alloc_fragment((block_R,), accum)
            acc = T.alloc_fragment((block_R, dim_v), accum)
            row0 = by * block_R
            base = num_splits[bx]
            n = num_splits[bx + 1] - base
            if n > 1:
                T.fill(top, -T.infinity(accum))
                for sp in T.serial(n):
                    for i in T.Parallel(block_R):
                        r = T.min(row0 + i, rows - 1)
                        top[i] = T.max(top[i], LSE_accum[base + sp, r % heads, r // heads])
                T.fill(total, 0)
                T.fill(acc, 0)
                for sp in T.serial(n):
                    for i in T.Parallel(block_R):
                        r = T.min(row0 + i, rows - 1)
                        shift = T.if_then_else(top[i] == -T.infinity(accum), 0.0, top[i])
                        w[i] = T.exp(LSE_accum[base + sp, r % heads, r // heads] - shift)
                        total[i] = total[i] + w[i]
                    for i, d in T.Parallel(block_R, dim_v):
                        r = T.min(row0 + i, rows - 1)
                        acc[i, d] = acc[i, d] + w[i] * O_accum[base + sp, r // heads, r % heads, d]
                _write_rows(block_R, dim_v, acc, total, lambda i: top[i] + T.log(total[i]),
                            lambda i: T.min(row0 + i, rows - 1), lambda i: row0 + i < rows,
                            Out, lambda r, i, d: (bx, r // heads, r % heads, d),
                            LSE, lambda r, i: (bx, r % heads, r // heads),
                            sink_of=lambda r: attn_sink[r % heads], empty_lse=math.inf)

    return main


class Scheduled:
    """The split kernel and then the combine, called as the split kernel is: ``(q, kv,
    block_table, cache_seqlens, tile_scheduler_metadata, num_splits, attn_sink, sm_scale,
    out, lse, o_accum, lse_accum)``.  The combine always runs, as FlashMLA's does, and
    skips the requests the schedule did not cut (deciding on the host would read
    ``num_splits`` back from the device).  ``launches``: the two compiled kernels."""

    def __init__(self, split, combine):
        self.split, self.combine = split, combine
        self.launches = (split, combine)
        self.launcher = split.launcher          # the split kernel's: its copy path, its program

    def __call__(self, q, kv, block_table, cache_seqlens, meta, num_splits, attn_sink, sm_scale, out, lse,
                 o_accum, lse_accum):
        self.split(q, kv, block_table, cache_seqlens, meta, num_splits, attn_sink, sm_scale, out, lse,
                   o_accum, lse_accum)
        self.combine(o_accum, lse_accum, num_splits, attn_sink, out, lse)


def build(backend: str, params: dict) -> Scheduled:
    """The runnable for ``mla_decode_scheduled`` parameters ``params`` (``arch`` and
    ``checks`` may be among them) on ``backend``: the split kernel and the combine
    :func:`~.config.scheduled_combine_params` picks."""
    import kernforge
    from kernforge.kernels.mla_decode import config

    split = kernforge.compile(mla_decode_scheduled, backend=backend, **params)
    options = {k: params[k] for k in ("arch", "checks") if k in params}  # compile options given with the parameters
    combine = kernforge.compile(mla_decode_combine_scheduled, backend=backend, **options,
                                **config.scheduled_combine_params(backend, params["heads"], params.get("seq_q", 1),
                                                                  params.get("dim_v", 512)))
    return Scheduled(split, combine)
