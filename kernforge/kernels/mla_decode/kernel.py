"""MLA decode attention (FlashMLA-style): many query heads, one latent KV head, paged cache.

DeepSeek's multi-head latent attention, in the "absorbed" decode form, is multi-query
attention: every query head attends to one shared latent vector per token.  A key is
``dim`` wide (512 latent "nope" dims + 64 RoPE dims for V3, 512 for V4), and the value
is the first ``dim_v`` (512) dims of the same cache row, so one KV tile serves both
products.  Decode has few query tokens per request, so the kernel packs
``seq_q x heads-per-kv-head`` query rows into a block of ``block_H`` rows and streams
the request's KV pages through shared memory with an online softmax (running max and
sum; the output accumulator is rescaled whenever the max grows).

Two variants share this structure:

* dense (``mla_decode``): the request's first ``cache_seqlens[b]`` positions, found
  through ``block_table`` pages of ``page_size`` tokens (FlashMLA's paged cache);
  optional causal mask across the ``seq_q`` query tokens (MTP);
* sparse (``mla_decode_sparse``): per query token, ``topk`` cache slots listed in
  ``indices`` (already folded through the block table, ``-1`` = empty), as the
  V3.2/V4 DSA path does; optional ``topk_length``.

Both return the output in the input dtype and the natural-log log-sum-exp of the
scaled scores (``+inf`` for a row with nothing to attend, whose output is 0), and
fold in V4's per-head attention sink: ``out *= 1 / (1 + exp(sink - lse))`` (a sink of
``-inf`` is exactly a no-op, which is what callers without a sink pass).

Only tiles the request uses are read: pages past ``cache_seqlens`` (which may hold
anything, NaN included) are never touched, and rows of the last tile past the end
are zeroed in shared memory before they meet the probabilities.
"""
# no `from __future__ import annotations`: T.Tensor annotations must see the factory's
# parameters as values when the prim_func is traced
import math

import torch

import kernforge.dsl as T
from kernforge.kernels.registry import KernelSpec, Problem, register

LOG2E = math.log2(math.e)


def _check_shape_params(heads: int, heads_kv: int, dim: int, dim_v: int, page_size: int,
                        block_N: int, block_H: int) -> None:
    if heads % heads_kv:
        raise ValueError(f"heads ({heads}) must be a multiple of heads_kv ({heads_kv})")
    if not 0 < dim_v <= dim:
        raise ValueError(f"dim_v ({dim_v}) must be in (0, dim={dim}]: the value is the first dim_v "
                         "dims of the key")
    if page_size % block_N:
        raise ValueError(f"block_N ({block_N}) must divide page_size ({page_size}) so a KV tile "
                         "never straddles two pages")
    if block_H <= 0:
        raise ValueError(f"block_H must be positive, got {block_H}")


@T.tunable(block_N=[16, 32, 64], block_H=[16, 32, 64], num_stages=[1, 2])
def mla_decode(heads: int, heads_kv: int = 1, seq_q: int = 1, dim: int = 576, dim_v: int = 512,
               page_size: int = 64, causal: bool = False, num_splits: int = 1,
               block_N: int = 32, block_H: int = 64, num_stages: int = 2,
               dtype: str = "bfloat16", threads: int = 256):
    """Dense paged MLA decode for ``heads`` query heads over ``heads_kv`` latent heads.

    Parameters of the returned kernel, in order: ``Q [batch, seq_q, heads, dim]``,
    ``KV [num_pages * page_size, heads_kv * dim]`` (the paged cache
    ``[num_pages, page_size, heads_kv, dim]`` viewed flat: token = page * page_size + slot),
    ``block_table int32 [batch, max_pages]``,
    ``cache_seqlens int32 [batch]``, ``attn_sink float32 [heads]`` (``-inf`` = no sink),
    ``sm_scale`` (float32 scalar), outputs ``Out [batch, seq_q, heads, dim_v]`` and
    ``LSE float32 [batch, heads, seq_q]``.

    Split-KV (``num_splits > 1``, FlashMLA's design for batches too small to fill the
    machine): a third grid dimension cuts each request's KV tiles into ``num_splits``
    contiguous ranges, and the outputs become float32 partials ``Out [batch, num_splits,
    seq_q, heads, dim_v]`` (normalised within the split) and ``LSE [batch, num_splits,
    heads, seq_q]`` (``-inf`` for an empty split), merged by :func:`mla_decode_combine`,
    which also applies the sink (``attn_sink`` is not read by the split kernel).
    """
    _check_shape_params(heads, heads_kv, dim, dim_v, page_size, block_N, block_H)
    if num_splits < 1:
        raise ValueError(f"num_splits must be >= 1, got {num_splits}")
    accum = "float32"
    split = num_splits > 1
    dpe = dim - dim_v                     # key-only tail (RoPE dims); 0 when V is all of K
    group = heads // heads_kv             # query heads per latent head
    rows = seq_q * group                  # query rows that share one latent head
    row_blocks = -(-rows // block_H)
    batch = T.symbolic("batch")
    num_tokens = T.symbolic("num_tokens")
    max_pages = T.symbolic("max_pages")
    if split:
        out_shape, out_dtype = (batch, num_splits, seq_q, heads, dim_v), accum
        lse_shape = (batch, num_splits, heads, seq_q)
    else:
        out_shape, out_dtype, lse_shape = (batch, seq_q, heads, dim_v), dtype, (batch, heads, seq_q)

    name = (f"mla_decode_h{heads}_kv{heads_kv}_q{seq_q}_d{dim}_v{dim_v}_p{page_size}"
            f"{'_causal' if causal else ''}{f'_split{num_splits}' if split else ''}"
            f"_N{block_N}_H{block_H}_s{num_stages}_{dtype}_t{threads}")

    @T.prim_func(name=name)
    def main(Q: T.Tensor((batch, seq_q, heads, dim), dtype),
             KV: T.Tensor((num_tokens, heads_kv * dim), dtype),
             block_table: T.Tensor((batch, max_pages), "int32"),
             cache_seqlens: T.Tensor((batch,), "int32"),
             attn_sink: T.Tensor((heads,), accum),
             sm_scale: T.float32,
             Out: T.Tensor(out_shape, out_dtype),
             LSE: T.Tensor(lse_shape, accum)):
        with T.Kernel(batch, heads_kv * row_blocks, num_splits, threads=threads) as (bx, by, bz):
            Q_shared = T.alloc_shared((block_H, dim_v), dtype)
            KV_shared = T.alloc_shared((block_N, dim_v), dtype)
            if dpe > 0:
                Q_pe_shared = T.alloc_shared((block_H, dpe), dtype)
                K_pe_shared = T.alloc_shared((block_N, dpe), dtype)
            P_shared = T.alloc_shared((block_H, block_N), dtype)
            acc_s = T.alloc_fragment((block_H, block_N), accum)
            acc_o = T.alloc_fragment((block_H, dim_v), accum)
            m = T.alloc_fragment((block_H,), accum)
            rescale = T.alloc_fragment((block_H,), accum)
            l = T.alloc_fragment((block_H,), accum)
            limit = T.alloc_fragment((block_H,), "int32")

            kvh = by // row_blocks
            row0 = (by % row_blocks) * block_H
            seqlen = cache_seqlens[bx]
            scale_log2 = sm_scale * LOG2E

            # gather this block's query rows: row r is token r // group, head kvh*group + r % group
            for i, d in T.Parallel(block_H, dim_v):
                r = T.min(row0 + i, rows - 1)
                Q_shared[i, d] = T.if_then_else(row0 + i < rows,
                                                Q[bx, r // group, kvh * group + r % group, d], 0)
            if dpe > 0:
                for i, d in T.Parallel(block_H, dpe):
                    r = T.min(row0 + i, rows - 1)
                    Q_pe_shared[i, d] = T.if_then_else(
                        row0 + i < rows, Q[bx, r // group, kvh * group + r % group, dim_v + d], 0)
            # keys a row may see: all of them, or (causal) up to its own token
            for i in T.Parallel(block_H):
                if causal:
                    limit[i] = seqlen - seq_q + T.min(row0 + i, rows - 1) // group + 1
                else:
                    limit[i] = seqlen
            T.fill(acc_o, 0)
            T.fill(l, 0)
            T.fill(m, -T.infinity(accum))

            n_tiles = T.ceildiv(seqlen, block_N)
            per_split = T.ceildiv(n_tiles, num_splits)
            first = bz * per_split
            for t in T.Pipelined(first, T.max(T.min(first + per_split, n_tiles), first),
                                 num_stages=num_stages):
                pos0 = t * block_N
                token0 = block_table[bx, pos0 // page_size] * page_size + pos0 % page_size
                T.copy(KV[token0, kvh * dim], KV_shared)
                if dpe > 0:
                    T.copy(KV[token0, kvh * dim + dim_v], K_pe_shared)
                if pos0 + block_N > seqlen:
                    # rows past the end may hold anything (NaN): zero them so 0 * v stays 0
                    for j, d in T.Parallel(block_N, dim_v):
                        KV_shared[j, d] = T.if_then_else(pos0 + j < seqlen, KV_shared[j, d], 0)
                T.gemm(Q_shared, KV_shared, acc_s, transpose_B=True, clear_accum=True)
                if dpe > 0:
                    T.gemm(Q_pe_shared, K_pe_shared, acc_s, transpose_B=True)
                for i, j in T.Parallel(block_H, block_N):
                    acc_s[i, j] = T.if_then_else(pos0 + j < limit[i], acc_s[i, j], -T.infinity(accum))
                _online_softmax_step(acc_s, acc_o, m, rescale, l, P_shared, scale_log2, block_H, dim_v)
                T.gemm(P_shared, KV_shared, acc_o)

            if split:
                # partials for mla_decode_combine: normalised within the split, lse -inf if empty
                for i, d in T.Parallel(block_H, dim_v):
                    r = T.min(row0 + i, rows - 1)
                    if row0 + i < rows:
                        Out[bx, bz, r // group, kvh * group + r % group, d] = T.if_then_else(
                            l[i] > 0, acc_o[i, d] / l[i], 0.0)
                for i in T.Parallel(block_H):
                    r = T.min(row0 + i, rows - 1)
                    if row0 + i < rows:
                        LSE[bx, bz, kvh * group + r % group, r // group] = T.if_then_else(
                            l[i] > 0, m[i] * sm_scale + T.log(l[i]), -T.infinity(accum))
            else:
                # normalise, fold in the sink, scatter rows back to [b, s, h]; a row with
                # nothing visible (l == 0) gets output 0 and lse +inf
                for i, d in T.Parallel(block_H, dim_v):
                    r = T.min(row0 + i, rows - 1)
                    lse = m[i] * sm_scale + T.log(l[i])
                    h = kvh * group + r % group
                    sink = T.if_then_else(l[i] > 0, 1.0 / (1.0 + T.exp(attn_sink[h] - lse)), 1.0)
                    if row0 + i < rows:
                        Out[bx, r // group, h, d] = T.if_then_else(
                            l[i] > 0, acc_o[i, d] * sink / l[i], 0.0)
                for i in T.Parallel(block_H):
                    r = T.min(row0 + i, rows - 1)
                    if row0 + i < rows:
                        LSE[bx, kvh * group + r % group, r // group] = T.if_then_else(
                            l[i] > 0, m[i] * sm_scale + T.log(l[i]), T.infinity(accum))

    return main


@T.tunable(block_R=[8, 16, 32, 64])
def mla_decode_combine(heads: int, num_splits: int, seq_q: int = 1, dim_v: int = 512,
                       block_R: int = 16, dtype: str = "bfloat16", threads: int = 128):
    """Merge split-KV partials: ``lse = log(sum_s exp(lse_s))``, ``out = sum_s
    exp(lse_s - lse) * out_s``, then the sink.  Kernel parameters: ``O_partial float32
    [batch, num_splits, seq_q, heads, dim_v]``, ``LSE_partial float32 [batch, num_splits,
    heads, seq_q]``, ``attn_sink float32 [heads]``, outputs ``Out [batch, seq_q, heads,
    dim_v]`` and ``LSE float32 [batch, heads, seq_q]`` (``+inf`` and 0 when every split
    was empty).  A block merges ``block_R`` (token, head) rows of one request."""
    accum = "float32"
    rows = seq_q * heads
    batch = T.symbolic("batch")
    name = f"mla_decode_combine_h{heads}_splits{num_splits}_q{seq_q}_v{dim_v}_R{block_R}_{dtype}_t{threads}"

    @T.prim_func(name=name)
    def main(O_partial: T.Tensor((batch, num_splits, seq_q, heads, dim_v), accum),
             LSE_partial: T.Tensor((batch, num_splits, heads, seq_q), accum),
             attn_sink: T.Tensor((heads,), accum),
             Out: T.Tensor((batch, seq_q, heads, dim_v), dtype),
             LSE: T.Tensor((batch, heads, seq_q), accum)):
        with T.Kernel(batch, T.ceildiv(rows, block_R), threads=threads) as (bx, by):
            lse_s = T.alloc_fragment((block_R, num_splits), accum)
            top = T.alloc_fragment((block_R,), accum)
            total = T.alloc_fragment((block_R,), accum)
            acc = T.alloc_fragment((block_R, dim_v), accum)
            row0 = by * block_R
            for i, sp in T.Parallel(block_R, num_splits):
                r = T.min(row0 + i, rows - 1)
                lse_s[i, sp] = LSE_partial[bx, sp, r % heads, r // heads]
            T.reduce_max(lse_s, top, dim=1)
            for i, sp in T.Parallel(block_R, num_splits):
                shift = T.if_then_else(top[i] == -T.infinity(accum), 0.0, top[i])
                lse_s[i, sp] = T.exp(lse_s[i, sp] - shift)          # split weights
            T.reduce_sum(lse_s, total, dim=1)
            T.fill(acc, 0)
            for sp in T.serial(num_splits):
                for i, d in T.Parallel(block_R, dim_v):
                    r = T.min(row0 + i, rows - 1)
                    acc[i, d] = acc[i, d] + lse_s[i, sp] * O_partial[bx, sp, r // heads, r % heads, d]
            for i, d in T.Parallel(block_R, dim_v):
                r = T.min(row0 + i, rows - 1)
                lse = top[i] + T.log(total[i])
                sink = T.if_then_else(total[i] > 0,
                                      1.0 / (1.0 + T.exp(attn_sink[r % heads] - lse)), 1.0)
                if row0 + i < rows:
                    Out[bx, r // heads, r % heads, d] = T.if_then_else(
                        total[i] > 0, acc[i, d] * sink / total[i], 0.0)
            for i in T.Parallel(block_R):
                r = T.min(row0 + i, rows - 1)
                if row0 + i < rows:
                    LSE[bx, r % heads, r // heads] = T.if_then_else(
                        total[i] > 0, top[i] + T.log(total[i]), T.infinity(accum))

    return main


@T.tunable(block_N=[16, 32, 64], block_H=[16, 32, 64], num_stages=[1, 2])
def mla_decode_sparse(heads: int, topk: int, seq_q: int = 1, dim: int = 576, dim_v: int = 512,
                      fp8_kv: bool = False, block_N: int = 32, block_H: int = 64,
                      num_stages: int = 2, dtype: str = "bfloat16", threads: int = 256):
    """Sparse (index-selected) MLA decode, one latent KV head (V3.2 / V4 DSA).

    Parameters of the returned kernel, in order: ``Q [batch, seq_q, heads, dim]``,
    ``KV [num_tokens, dim]`` (the paged cache viewed flat), ``indices int32
    [batch, seq_q, topk]`` (flat token ids, ``-1`` = empty), ``topk_length int32 [batch]``
    (slots at or past it are ignored whatever they hold), ``attn_sink float32 [heads]``,
    ``sm_scale``, outputs ``Out [batch, seq_q, heads, dim_v]``, ``LSE float32
    [batch, heads, seq_q]``.  Each block owns ``block_H`` heads of one query token and
    gathers that token's selected rows into shared memory tile by tile.

    ``fp8_kv``: the cache is FlashMLA's V3.2 FP8 format, ``KV uint8 [num_tokens, 656]``
    (per token: 512 e4m3 values, 4 float32 scales, one per 128 values, 64 bf16 RoPE
    values; ``dim`` 576, ``dim_v`` 512).  Rows are dequantized (e4m3 x scale, rounded to
    bf16) while they are gathered, and the products run in bf16 as in FlashMLA.
    """
    _check_shape_params(heads, 1, dim, dim_v, block_N, block_N, block_H)
    if fp8_kv and (dim, dim_v) != (576, 512):
        raise ValueError(f"fp8_kv (V3.2 format) needs dim 576 and dim_v 512, got {dim}, {dim_v}")
    accum = "float32"
    dpe = dim - dim_v
    row_blocks = -(-heads // block_H)
    batch = T.symbolic("batch")
    num_tokens = T.symbolic("num_tokens")
    kv_cols, kv_dtype = (V32_BYTES, "uint8") if fp8_kv else (dim, dtype)
    name = (f"mla_decode_sparse_h{heads}_topk{topk}_q{seq_q}_d{dim}_v{dim_v}"
            f"{'_fp8v32' if fp8_kv else ''}_N{block_N}_H{block_H}_s{num_stages}_{dtype}_t{threads}")

    @T.prim_func(name=name)
    def main(Q: T.Tensor((batch, seq_q, heads, dim), dtype),
             KV: T.Tensor((num_tokens, kv_cols), kv_dtype),
             indices: T.Tensor((batch, seq_q, topk), "int32"),
             topk_length: T.Tensor((batch,), "int32"),
             attn_sink: T.Tensor((heads,), accum),
             sm_scale: T.float32,
             Out: T.Tensor((batch, seq_q, heads, dim_v), dtype),
             LSE: T.Tensor((batch, heads, seq_q), accum)):
        with T.Kernel(batch, seq_q * row_blocks, threads=threads) as (bx, by):
            Q_shared = T.alloc_shared((block_H, dim_v), dtype)
            KV_shared = T.alloc_shared((block_N, dim_v), dtype)
            if dpe > 0:
                Q_pe_shared = T.alloc_shared((block_H, dpe), dtype)
                K_pe_shared = T.alloc_shared((block_N, dpe), dtype)
            P_shared = T.alloc_shared((block_H, block_N), dtype)
            acc_s = T.alloc_fragment((block_H, block_N), accum)
            acc_o = T.alloc_fragment((block_H, dim_v), accum)
            m = T.alloc_fragment((block_H,), accum)
            rescale = T.alloc_fragment((block_H,), accum)
            l = T.alloc_fragment((block_H,), accum)
            token = T.alloc_fragment((block_N,), "int32")   # gathered row, -1 = empty slot
            if fp8_kv:
                tile_scale = T.alloc_fragment((block_N, V32_SCALES), accum)

            s = by // row_blocks
            h0 = (by % row_blocks) * block_H
            n_slots = T.min(topk_length[bx], topk)
            scale_log2 = sm_scale * LOG2E
            T.copy(Q[bx, s, h0, 0], Q_shared)
            if dpe > 0:
                T.copy(Q[bx, s, h0, dim_v], Q_pe_shared)
            T.fill(acc_o, 0)
            T.fill(l, 0)
            T.fill(m, -T.infinity(accum))

            for t in T.Pipelined(T.ceildiv(n_slots, block_N), num_stages=num_stages):
                for j in T.Parallel(block_N):
                    slot = T.min(t * block_N + j, topk - 1)
                    token[j] = T.if_then_else(t * block_N + j < n_slots, indices[bx, s, slot], -1)
                if fp8_kv:
                    for j, c in T.Parallel(block_N, V32_SCALES):
                        tile_scale[j, c] = _bytes_as(KV, T.max(token[j], 0), dim_v + 4 * c, 4,
                                                     "uint32", "float32")
                    for j, d in T.Parallel(block_N, dim_v):
                        nope = T.reinterpret("float8_e4m3", KV[T.max(token[j], 0), d])
                        KV_shared[j, d] = T.if_then_else(
                            token[j] >= 0, T.cast(nope, accum) * tile_scale[j, d // V32_TILE], 0)
                    for j, d in T.Parallel(block_N, dpe):
                        rope = _bytes_as(KV, T.max(token[j], 0), V32_ROPE_AT + 2 * d, 2, "uint16",
                                         "bfloat16")
                        K_pe_shared[j, d] = T.if_then_else(token[j] >= 0, rope, 0)
                else:
                    for j, d in T.Parallel(block_N, dim_v):
                        KV_shared[j, d] = T.if_then_else(token[j] >= 0, KV[T.max(token[j], 0), d], 0)
                    if dpe > 0:
                        for j, d in T.Parallel(block_N, dpe):
                            K_pe_shared[j, d] = T.if_then_else(
                                token[j] >= 0, KV[T.max(token[j], 0), dim_v + d], 0)
                T.gemm(Q_shared, KV_shared, acc_s, transpose_B=True, clear_accum=True)
                if dpe > 0:
                    T.gemm(Q_pe_shared, K_pe_shared, acc_s, transpose_B=True)
                for i, j in T.Parallel(block_H, block_N):
                    acc_s[i, j] = T.if_then_else(token[j] >= 0, acc_s[i, j], -T.infinity(accum))
                _online_softmax_step(acc_s, acc_o, m, rescale, l, P_shared, scale_log2, block_H, dim_v)
                T.gemm(P_shared, KV_shared, acc_o)

            for i, d in T.Parallel(block_H, dim_v):
                h = T.min(h0 + i, heads - 1)
                lse = m[i] * sm_scale + T.log(l[i])
                sink = T.if_then_else(l[i] > 0, 1.0 / (1.0 + T.exp(attn_sink[h] - lse)), 1.0)
                if h0 + i < heads:
                    Out[bx, s, h, d] = T.if_then_else(l[i] > 0, acc_o[i, d] * sink / l[i], 0.0)
            for i in T.Parallel(block_H):
                if h0 + i < heads:
                    LSE[bx, h0 + i, s] = T.if_then_else(l[i] > 0, m[i] * sm_scale + T.log(l[i]),
                                                        T.infinity(accum))

    return main


# FlashMLA's V3.2 FP8 cache row: 512 e4m3 | 4 float32 scales (one per 128) | 64 bf16 RoPE
V32_BYTES, V32_TILE, V32_SCALES, V32_ROPE_AT = 656, 128, 4, 528


def _bytes_as(buf, row, col, n: int, bits_dtype: str, dtype: str):
    """The little-endian value of ``n`` bytes ``buf[row, col:col + n]`` read as ``dtype``."""
    bits = T.cast(buf[row, col], bits_dtype)
    for k in range(1, n):
        bits = bits | (T.cast(buf[row, col + k], bits_dtype) << (8 * k))
    return T.reinterpret(dtype, bits)


def quantize_kv_v32(kv: torch.Tensor) -> torch.Tensor:
    """``[..., 576]`` bf16/float -> FlashMLA's V3.2 bytes ``[..., 656]`` uint8.  Scale per
    128 values = ``2^ceil(log2(max(amax / 448, 1e-4)))`` (FlashMLA's reference quantizer)."""
    x = kv.float()
    nope = x[..., :512].unflatten(-1, (V32_SCALES, V32_TILE))
    scale = torch.exp2(torch.ceil(torch.log2((nope.abs().amax(-1) / 448).clamp(min=1e-4))))
    data = (nope / scale[..., None]).to(torch.float8_e4m3fn).flatten(-2)
    parts = [data.view(torch.uint8), scale.contiguous().view(torch.uint8),
             x[..., 512:].bfloat16().contiguous().view(torch.uint8)]
    return torch.cat(parts, dim=-1)


def dequantize_kv_v32(raw: torch.Tensor) -> torch.Tensor:
    """V3.2 bytes ``[..., 656]`` -> ``[..., 576]`` bf16 (e4m3 x scale rounded to bf16)."""
    nope = raw[..., :512].contiguous().view(torch.float8_e4m3fn).float()
    scale = raw[..., 512:V32_ROPE_AT].contiguous().view(torch.float32)
    rope = raw[..., V32_ROPE_AT:].contiguous().view(torch.bfloat16)
    nope = (nope.unflatten(-1, (V32_SCALES, V32_TILE)) * scale[..., None]).flatten(-2)
    return torch.cat([nope.bfloat16(), rope], dim=-1)


def _online_softmax_step(acc_s, acc_o, m, rescale, l, P_shared, scale_log2, block_H, dim_v):
    """Fold one tile of masked scores (``-inf`` = invisible) into the running max ``m``
    and sum ``l``, rescale ``acc_o``, and leave the tile's probabilities in ``P_shared``
    (rounded to the input dtype, as FlashMLA feeds them to the second product).

    The step itself is ``T.online_softmax`` (one tile op: CUDA runs ``kf::online_softmax_step``
    on the accumulator registers); a row that has seen only masked keys keeps ``m = -inf``
    and gets probabilities 0 rather than NaN."""
    T.online_softmax(acc_s, m, l, rescale, scale_log2)
    T.copy(acc_s, P_shared)
    for i, d in T.Parallel(block_H, dim_v):
        acc_o[i, d] = acc_o[i, d] * rescale[i]


# ---------------------------------------------------------------- reference


def reference(q: torch.Tensor, kv_cache: torch.Tensor, block_table: torch.Tensor,
              cache_seqlens: torch.Tensor, attn_sink: torch.Tensor | None, sm_scale: float,
              dim_v: int, causal: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Plain float64 attention over the gathered pages (independent of the DSL).

    q ``[b, s_q, h_q, d]``, kv_cache ``[num_pages, page, h_kv, d]``; returns
    ``out [b, s_q, h_q, dim_v]`` (float64) and ``lse [b, h_q, s_q]`` (float64)."""
    b, s_q, h_q, d = q.shape
    page, h_kv = kv_cache.shape[1], kv_cache.shape[2]
    group = h_q // h_kv
    dev = q.device                      # float64 on the inputs' device (GPU-sized problems)
    out = torch.zeros(b, s_q, h_q, dim_v, dtype=torch.float64, device=dev)
    lse = torch.full((b, h_q, s_q), math.inf, dtype=torch.float64, device=dev)
    for i in range(b):
        n = int(cache_seqlens[i])
        if n == 0:
            continue
        pages = block_table[i, :-(-n // page)].long()
        k = kv_cache[pages].reshape(-1, h_kv, d)[:n].double().repeat_interleave(group, dim=1)
        scores = torch.einsum("shd,lhd->hsl", q[i].double(), k) * sm_scale
        if causal:
            pos = torch.arange(max(n, s_q), device=dev)
            visible = pos[None, :n] < (n - s_q + pos[:s_q] + 1)[:, None]
            scores = scores.masked_fill(~visible[None], -math.inf)
        out[i], lse[i] = _softmax_rows(scores, k[..., :dim_v], attn_sink, h_q)
    return out, lse


def reference_sparse(q: torch.Tensor, kv_flat: torch.Tensor, indices: torch.Tensor,
                     topk_length: torch.Tensor | None, attn_sink: torch.Tensor | None,
                     sm_scale: float, dim_v: int) -> tuple[torch.Tensor, torch.Tensor]:
    """float64 attention of each query token over its listed cache rows.

    q ``[b, s_q, h_q, d]``, kv_flat ``[num_tokens, d]``, indices ``[b, s_q, topk]`` (``-1``
    = empty; only the first ``topk_length[b]`` slots count)."""
    b, s_q, h_q, d = q.shape
    out = torch.zeros(b, s_q, h_q, dim_v, dtype=torch.float64, device=q.device)
    lse = torch.full((b, h_q, s_q), math.inf, dtype=torch.float64, device=q.device)
    for i in range(b):
        n = indices.shape[-1] if topk_length is None else min(int(topk_length[i]), indices.shape[-1])
        for t in range(s_q):
            idx = indices[i, t, :n].long()
            k = kv_flat[idx[idx != -1]].double()[:, None, :]                   # [L, 1, d]
            if k.shape[0] == 0:
                continue
            scores = torch.einsum("hd,lhd->hl", q[i, t].double(), k.expand(-1, h_q, -1))
            o, row_lse = _softmax_rows(scores[:, None, :] * sm_scale,
                                       k[..., :dim_v].expand(-1, h_q, -1), attn_sink, h_q)
            out[i, t], lse[i, :, t] = o[0], row_lse[:, 0]
    return out, lse


def _softmax_rows(scores, v, attn_sink, h_q):
    """softmax(scores) @ v per head, with the sink; rows with nothing visible: 0 and +inf."""
    row_lse = torch.logsumexp(scores, dim=-1)                          # [h, s]
    empty = torch.isneginf(row_lse)
    p = torch.exp(scores - row_lse[..., None]).nan_to_num(0.0)
    o = torch.einsum("hsl,lhd->shd", p, v)
    if attn_sink is not None:
        o = o / (1 + torch.exp(attn_sink.double()[:, None] - row_lse)).T[..., None]
    o = o.masked_fill(empty.T[..., None], 0.0)
    return o, row_lse.masked_fill(empty, math.inf)


# ---------------------------------------------------------------- library entry

# Problem keys that size the inputs but are not compile-time parameters of the kernel.
_RUNTIME_SIZES = ("batch", "seqlens")
UNUSED_BLOCK = 2147480000   # FlashMLA's tests put this in unused block_table slots


def make_cache(seqlens: list[int], page_size: int, heads_kv: int, dim: int, gen: torch.Generator,
               dtype=torch.bfloat16, device="cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """A shuffled paged cache for ``seqlens``: ``(kv_cache [pages, page, h_kv, dim], block_table)``.
    Positions past each request's length are NaN and unused table slots hold
    ``UNUSED_BLOCK``, so a kernel that reads beyond ``cache_seqlens`` shows up as NaN
    or a fault rather than passing by luck."""
    blocks = [-(-n // page_size) for n in seqlens]
    max_blocks = max(max(blocks), 1)
    total = sum(blocks) + 1                                   # one spare page nobody owns
    kv = torch.randn(total, page_size, heads_kv, dim, generator=gen)
    perm = torch.randperm(total, generator=gen)
    table = torch.full((len(seqlens), max_blocks), UNUSED_BLOCK, dtype=torch.int32)
    used = 0
    for i, (n, nb) in enumerate(zip(seqlens, blocks)):
        pages = perm[used:used + nb]
        table[i, :nb] = pages.int()
        flat = kv[pages].reshape(-1, heads_kv, dim)
        flat[n:] = float("nan")
        kv[pages] = flat.reshape(nb, page_size, heads_kv, dim)
        used += nb
    kv[perm[used:]] = float("nan")
    return kv.to(dtype).to(device), table.to(device)


def make_inputs(params: dict, seed: int, device: str = "cpu") -> list:
    g = torch.Generator().manual_seed(seed)
    b, heads, seq_q, dim = params["batch"], params["heads"], params.get("seq_q", 1), params.get("dim", 576)
    dim_v, page, heads_kv = params.get("dim_v", 512), params.get("page_size", 64), params.get("heads_kv", 1)
    seqlens = params["seqlens"]
    kv, table = make_cache(seqlens, page, heads_kv, dim, g, device=device)
    q = torch.randn(b, seq_q, heads, dim, generator=g).bfloat16().to(device)
    sink = torch.randn(heads, generator=g).to(device)
    out = torch.full((b, seq_q, heads, dim_v), float("nan"), dtype=torch.bfloat16, device=device)
    lse = torch.full((b, heads, seq_q), float("nan"), device=device)
    lens = torch.tensor(seqlens, dtype=torch.int32, device=device)
    return [q, kv.view(-1, heads_kv * dim), table, lens, sink, dim ** -0.5, out, lse]


def _reference(inputs: list, params: dict) -> list:
    q, kv, table, lens, sink, scale = inputs[:6]
    page, heads_kv, dim = params.get("page_size", 64), params.get("heads_kv", 1), q.shape[-1]
    out, lse = reference(q, kv.view(-1, page, heads_kv, dim), table, lens, sink, scale,
                         params.get("dim_v", 512), params.get("causal", False))
    return [out, lse]


def tolerances(q: torch.Tensor, kv: torch.Tensor, sm_scale: float, max_len: int,
               dim_v: int) -> tuple[float, float]:
    """Absolute error bounds ``(out, lse)`` for bf16 inputs with float32 accumulation.

    * scores: bf16 x bf16 products are exact in float32, so a d-term dot product is off
      by at most ``d * 2^-24 * sum|q_i k_i| <= d * 2^-24 * |q| |k|`` (Cauchy-Schwarz),
      times ``sm_scale``; the float32 running sum of up to ``max_len`` terms adds a
      relative ``max_len * 2^-24`` to the normaliser, i.e. that much to the lse.
    * output: a score error ``e`` scales a probability by at most ``exp(2e)``; the
      probabilities are rounded to bf16 (relative 2^-8) before P.V and the output is
      rounded to bf16 once more (2^-8 of max|v|), so ``|err| <= (2^-7 + 4e) max|v|``.
    """
    finite = kv[~torch.isnan(kv.float()).any(-1)].float()
    qn = q.float().norm(dim=-1).max().item()
    kn = finite.norm(dim=-1).max().item() if finite.numel() else 0.0
    d = q.shape[-1]
    e_score = sm_scale * d * 2.0 ** -24 * qn * kn
    e_lse = e_score + (max_len + 8) * 2.0 ** -24
    vmax = finite[:, :dim_v].abs().max().item() if finite.numel() else 0.0
    return (2.0 ** -7 + 4 * e_lse) * vmax + 1e-6, e_lse + 1e-6


def assert_close(out, lse, exp_out, exp_lse, tol_out: float, tol_lse: float) -> None:
    """Outputs within ``tol_out``; lse within ``tol_lse`` and +inf exactly where expected."""
    got, exp_out, exp_lse = out.cpu().double(), exp_out.cpu(), exp_lse.cpu()
    assert not torch.isnan(got).any(), "output has NaN (unwritten or poisoned elements)"
    err = (got - exp_out).abs().max().item()
    assert err <= tol_out, f"output differs by {err:.3g} > {tol_out:.3g}"
    gl = lse.cpu().double()
    assert not torch.isnan(gl).any(), "lse has NaN (unwritten or poisoned elements)"
    inf_got, inf_exp = torch.isinf(gl), torch.isinf(exp_lse)
    assert torch.equal(inf_got, inf_exp), "lse is +inf for a different set of rows than expected"
    finite = ~inf_exp
    if finite.any():
        e = (gl[finite] - exp_lse[finite]).abs().max().item()
        assert e <= tol_lse, f"lse differs by {e:.3g} > {tol_lse:.3g}"


def _check(outputs: list, expected: list, inputs: list, params: dict) -> None:
    q, kv, scale = inputs[0], inputs[1], inputs[5]
    tol_out, tol_lse = tolerances(q, kv, scale, max(params["seqlens"]), params.get("dim_v", 512))
    assert_close(outputs[0], outputs[1], expected[0], expected[1], tol_out, tol_lse)


def _flops(p: dict) -> float:
    rows = p["heads"] * p.get("seq_q", 1)
    return sum(2.0 * rows * n * (p.get("dim", 576) + p.get("dim_v", 512)) for n in p["seqlens"])


def _bytes(p: dict) -> float:
    rows = p["heads"] * p.get("seq_q", 1)
    kv = sum(p["seqlens"]) * p.get("heads_kv", 1) * p.get("dim", 576) * 2
    return kv + p["batch"] * rows * (p.get("dim", 576) + p.get("dim_v", 512)) * 2


SPEC = register(KernelSpec(
    name="mla_decode",
    family="mla_decode",
    description="FlashMLA-style dense paged MLA decode: online softmax, bf16 in, fp32 accum, out + lse",
    factory=mla_decode,
    runtime_sizes=_RUNTIME_SIZES,
    problems={
        # V4 tiny test geometry (head_dim 96 = 64 value + 32 rope), MTP with causal mask
        "small": Problem("small", dict(batch=2, seqlens=[37, 5], heads=8, heads_kv=1, seq_q=2,
                                       dim=96, dim_v=64, page_size=16, causal=True,
                                       block_N=16, block_H=16)),
        "demo": Problem("demo", dict(batch=2, seqlens=[700, 333], heads=64, seq_q=1,
                                     dim=576, dim_v=512, block_N=32, block_H=64)),
        # FlashMLA's dense perf shape (b=128, h_q=128, s_q=1, s_k=4096)
        "bench": Problem("bench", dict(batch=128, seqlens=[4096] * 128, heads=128, seq_q=1,
                                       dim=576, dim_v=512, block_N=32, block_H=64)),
    },
    make_inputs=make_inputs,
    outputs=(6, 7),
    reference=_reference,
    check=_check,
    flops=_flops,
    bytes=_bytes,
    tags=("attention", "decode", "paged"),
))


_SPARSE_RUNTIME_SIZES = ("batch", "num_tokens", "topk_lengths")


def make_inputs_sparse(params: dict, seed: int, device: str = "cpu") -> list:
    g = torch.Generator().manual_seed(seed)
    b, heads, seq_q, topk = params["batch"], params["heads"], params.get("seq_q", 1), params["topk"]
    dim, dim_v, num_tokens = params.get("dim", 576), params.get("dim_v", 512), params["num_tokens"]
    lengths = torch.tensor(params["topk_lengths"], dtype=torch.int32)
    kv = torch.randn(num_tokens, dim, generator=g).bfloat16()
    indices = torch.randint(0, num_tokens, (b, seq_q, topk), generator=g, dtype=torch.int32)
    indices[torch.rand(b, seq_q, topk, generator=g) < 0.1] = -1            # empty slots
    for i, n in enumerate(lengths.tolist()):
        indices[i, :, n:] = UNUSED_BLOCK                                    # never read
    q = torch.randn(b, seq_q, heads, dim, generator=g).bfloat16()
    sink = torch.randn(heads, generator=g)
    out = torch.full((b, seq_q, heads, dim_v), float("nan"), dtype=torch.bfloat16)
    lse = torch.full((b, heads, seq_q), float("nan"))
    tensors = [q, kv, indices, lengths, sink]
    return [t.to(device) for t in tensors] + [dim ** -0.5] + [out.to(device), lse.to(device)]


def _reference_sparse(inputs: list, params: dict) -> list:
    q, kv, indices, lengths, sink, scale = inputs[:6]
    return list(reference_sparse(q, kv, indices, lengths, sink, scale, params.get("dim_v", 512)))


def _check_sparse(outputs: list, expected: list, inputs: list, params: dict) -> None:
    tol_out, tol_lse = tolerances(inputs[0], inputs[1], inputs[5], params["topk"],
                                  params.get("dim_v", 512))
    assert_close(outputs[0], outputs[1], expected[0], expected[1], tol_out, tol_lse)


def _flops_sparse(p: dict) -> float:
    rows = p["heads"] * p.get("seq_q", 1)
    return sum(2.0 * rows * min(n, p["topk"]) * (p.get("dim", 576) + p.get("dim_v", 512))
               for n in p["topk_lengths"])


SPEC_SPARSE = register(KernelSpec(
    name="mla_decode_sparse",
    family="mla_decode",
    description="Sparse (index-selected, DSA) MLA decode with topk_length and attention sink",
    factory=mla_decode_sparse,
    runtime_sizes=_SPARSE_RUNTIME_SIZES,
    problems={
        "small": Problem("small", dict(batch=2, num_tokens=90, topk_lengths=[24, 11], heads=8,
                                       topk=24, seq_q=2, dim=96, dim_v=64, block_N=16, block_H=8)),
        # V4 geometry: 64 heads, d = dim_v = 512, index_topk 512
        "demo": Problem("demo", dict(batch=2, num_tokens=4096, topk_lengths=[512, 300], heads=64,
                                     topk=512, dim=512, dim_v=512, block_N=32, block_H=64)),
        # FlashMLA's sparse perf shape (b=148... scaled to b=128, s_q=2, topk=2048, h=128)
        "bench": Problem("bench", dict(batch=128, num_tokens=32768, topk_lengths=[2048] * 128,
                                       heads=128, topk=2048, seq_q=2, dim=576, dim_v=512,
                                       block_N=32, block_H=64)),
    },
    make_inputs=make_inputs_sparse,
    outputs=(6, 7),
    reference=_reference_sparse,
    check=_check_sparse,
    flops=_flops_sparse,
    tags=("attention", "decode", "sparse"),
))
