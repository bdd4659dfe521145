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
               page_size: int = 64, causal: bool = False,
               block_N: int = 64, block_H: int = 64, num_stages: int = 2,
               dtype: str = "bfloat16", threads: int = 256):
    """Dense paged MLA decode for ``heads`` query heads over ``heads_kv`` latent heads.

    Parameters of the returned kernel, in order: ``Q [batch, seq_q, heads, dim]``,
    ``KV [num_pages * page_size, heads_kv * dim]`` (the paged cache
    ``[num_pages, page_size, heads_kv, dim]`` viewed flat: token = page * page_size + slot), ``block_table int32 [batch, max_pages]``,
    ``cache_seqlens int32 [batch]``, ``attn_sink float32 [heads]`` (``-inf`` = no sink),
    ``sm_scale`` (float32 scalar), outputs ``Out [batch, seq_q, heads, dim_v]`` and
    ``LSE float32 [batch, heads, seq_q]``.
    """
    _check_shape_params(heads, heads_kv, dim, dim_v, page_size, block_N, block_H)
    accum = "float32"
    dpe = dim - dim_v                     # key-only tail (RoPE dims); 0 when V is all of K
    group = heads // heads_kv             # query heads per latent head
    rows = seq_q * group                  # query rows that share one latent head
    row_blocks = -(-rows // block_H)
    batch = T.symbolic("batch")
    num_tokens = T.symbolic("num_tokens")
    max_pages = T.symbolic("max_pages")

    @T.prim_func
    def main(Q: T.Tensor((batch, seq_q, heads, dim), dtype),
             KV: T.Tensor((num_tokens, heads_kv * dim), dtype),
             block_table: T.Tensor((batch, max_pages), "int32"),
             cache_seqlens: T.Tensor((batch,), "int32"),
             attn_sink: T.Tensor((heads,), accum),
             sm_scale: T.float32,
             Out: T.Tensor((batch, seq_q, heads, dim_v), dtype),
             LSE: T.Tensor((batch, heads, seq_q), accum)):
        with T.Kernel(batch, heads_kv * row_blocks, threads=threads) as (bx, by):
            Q_shared = T.alloc_shared((block_H, dim_v), dtype)
            KV_shared = T.alloc_shared((block_N, dim_v), dtype)
            if dpe > 0:
                Q_pe_shared = T.alloc_shared((block_H, dpe), dtype)
                K_pe_shared = T.alloc_shared((block_N, dpe), dtype)
            P_shared = T.alloc_shared((block_H, block_N), dtype)
            acc_s = T.alloc_fragment((block_H, block_N), accum)
            acc_o = T.alloc_fragment((block_H, dim_v), accum)
            m = T.alloc_fragment((block_H,), accum)
            m_prev = T.alloc_fragment((block_H,), accum)
            rescale = T.alloc_fragment((block_H,), accum)
            row_sum = T.alloc_fragment((block_H,), accum)
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

            for t in T.Pipelined(T.ceildiv(seqlen, block_N), num_stages=num_stages):
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
                _online_softmax_step(acc_s, acc_o, m, m_prev, rescale, row_sum, l, P_shared,
                                     scale_log2, block_H, block_N, dim_v, accum)
                T.gemm(P_shared, KV_shared, acc_o)

            # normalise, fold in the sink, scatter rows back to [b, s, h]; a row with
            # nothing visible (l == 0) gets output 0 and lse +inf
            for i, d in T.Parallel(block_H, dim_v):
                r = T.min(row0 + i, rows - 1)
                lse = m[i] * sm_scale + T.log(l[i])
                sink = T.if_then_else(l[i] > 0, 1.0 / (1.0 + T.exp(attn_sink[kvh * group + r % group] - lse)), 1.0)
                if row0 + i < rows:
                    Out[bx, r // group, kvh * group + r % group, d] = T.if_then_else(
                        l[i] > 0, acc_o[i, d] * sink / l[i], 0.0)
            for i in T.Parallel(block_H):
                r = T.min(row0 + i, rows - 1)
                if row0 + i < rows:
                    LSE[bx, kvh * group + r % group, r // group] = T.if_then_else(
                        l[i] > 0, m[i] * sm_scale + T.log(l[i]), T.infinity(accum))

    return main


def _online_softmax_step(acc_s, acc_o, m, m_prev, rescale, row_sum, l, P_shared, scale_log2,
                         block_H, block_N, dim_v, accum):
    """Fold one tile of masked scores (``-inf`` = invisible) into the running max ``m``
    and sum ``l``, rescale ``acc_o``, and leave the tile's probabilities in ``P_shared``
    (rounded to the input dtype, as FlashMLA feeds them to the second product).

    A row that has seen only masked keys keeps ``m = -inf``; its shift is taken as 0
    so that ``exp2(-inf - shift)`` is 0 rather than NaN."""
    T.copy(m, m_prev)
    T.reduce_max(acc_s, m, dim=1, clear=False)
    for i in T.Parallel(block_H):
        shift = T.if_then_else(m[i] == -T.infinity(accum), 0.0, m[i])
        rescale[i] = T.exp2((m_prev[i] - shift) * scale_log2)
    for i, j in T.Parallel(block_H, block_N):
        shift = T.if_then_else(m[i] == -T.infinity(accum), 0.0, m[i])
        acc_s[i, j] = T.exp2((acc_s[i, j] - shift) * scale_log2)
    T.reduce_sum(acc_s, row_sum, dim=1)
    for i in T.Parallel(block_H):
        l[i] = l[i] * rescale[i] + row_sum[i]
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
    out = torch.zeros(b, s_q, h_q, dim_v, dtype=torch.float64)
    lse = torch.full((b, h_q, s_q), math.inf, dtype=torch.float64)
    for i in range(b):
        n = int(cache_seqlens[i])
        if n == 0:
            continue
        pages = block_table[i, :-(-n // page)].long().cpu()
        k = kv_cache.cpu()[pages].reshape(-1, h_kv, d)[:n].double().repeat_interleave(group, dim=1)
        scores = torch.einsum("shd,lhd->hsl", q[i].cpu().double(), k) * sm_scale
        if causal:
            visible = torch.arange(n)[None, :] < (n - s_q + torch.arange(s_q) + 1)[:, None]
            scores = scores.masked_fill(~visible[None], -math.inf)
        out[i], lse[i] = _softmax_rows(scores, k[..., :dim_v], attn_sink, h_q)
    return out, lse


def _softmax_rows(scores, v, attn_sink, h_q):
    """softmax(scores) @ v per head, with the sink; rows with nothing visible: 0 and +inf."""
    row_lse = torch.logsumexp(scores, dim=-1)                          # [h, s]
    empty = torch.isneginf(row_lse)
    p = torch.exp(scores - row_lse[..., None]).nan_to_num(0.0)
    o = torch.einsum("hsl,lhd->shd", p, v)
    if attn_sink is not None:
        o = o / (1 + torch.exp(attn_sink.cpu().double()[:, None] - row_lse)).T[..., None]
    o = o.masked_fill(empty.T[..., None], 0.0)
    return o, row_lse.masked_fill(empty, math.inf)
