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
scaled scores (``+inf`` for a row with nothing to attend, whose output is 0; NaN, in
output and lse, for a row whose query or visible keys hold a NaN, as in torch), and
fold in V4's per-head attention sink: ``out *= 1 / (1 + exp(sink - lse))`` (a sink of
``-inf`` is exactly a no-op, which is what callers without a sink pass).

Only tiles the request uses are read: pages past ``cache_seqlens`` (which may hold
anything, NaN included) are never touched, and rows of the last tile past the end
are zeroed in shared memory before they meet the probabilities.

The pieces the kernels share are written once, as ``T.macro`` helpers the kernels call
while they are traced: the block's tiles and softmax state (:func:`_alloc_attention`,
:func:`_init_softmax`), the query rows and their visible keys (:func:`_load_rows`), the
paged KV loop of the dense kernels (:func:`_attend_pages`, also the balanced schedule's),
one KV tile's attention step (:func:`_attend_tile`), and the epilogue that normalises
rows, folds in the sink and scatters out + lse (:func:`_write_rows`, also the split-KV
combine's epilogue).
"""
# no `from __future__ import annotations`: T.Tensor annotations must see the factory's
# parameters as values when the prim_func is traced
import math
from types import SimpleNamespace

import kernforge.dsl as T

LOG2E = math.log2(math.e)


def rows_are_tiles(group: int, seq_q: int, heads_kv: int, block_H: int) -> bool:
    """Whether every block of ``block_H`` query rows (row r: token ``r // group``, head
    ``kvh * group + r % group``) is one tile of ``Out [.., seq_q, heads, dim_v]``: consecutive
    heads of one token, with any rows past the end past ``heads`` (so a tile copy, which skips
    what falls outside ``Out``, drops them).  True when blocks never straddle a token or a
    latent head's group (``group % block_H == 0``) or there is one of each (``seq_q == 1``,
    ``heads_kv == 1``); otherwise rows are scattered one by one."""
    return group % block_H == 0 or (seq_q == 1 and heads_kv == 1)


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
    tile_rows = rows_are_tiles(group, seq_q, heads_kv, block_H)
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
            st = _alloc_attention(block_H, block_N, dim_v, dpe, dtype, accum)
            limit = T.alloc_fragment((block_H,), "int32")

            kvh = by // row_blocks
            row0 = (by % row_blocks) * block_H
            seqlen = cache_seqlens[bx]
            scale_log2 = sm_scale * LOG2E

            _load_rows(st, Q, bx, row0, rows, group, kvh, limit, seqlen, seq_q, causal)
            _init_softmax(st)

            n_tiles = T.ceildiv(seqlen, block_N)
            per_split = T.ceildiv(n_tiles, num_splits)
            first = bz * per_split
            _attend_pages(st, KV, block_table, bx, kvh, dim, page_size, seqlen, limit, scale_log2,
                          first, T.max(T.min(first + per_split, n_tiles), first), num_stages)

            # block row i is query row r = row0 + i (clamped): token r // group, head h
            def row_of(i):
                r = T.min(row0 + i, rows - 1)
                return r, kvh * group + r % group

            def lse_of(i):
                return st.m[i] * sm_scale + T.log(st.l[i])

            # the block's rows as one tile of Out (token s0, heads h0..), where they are one
            s0, h0 = row0 // group, kvh * group + row0 % group
            if split:
                # partials for mla_decode_combine: normalised within the split, lse -inf if empty
                _write_rows(block_H, dim_v, st.acc_o, st.l, lse_of, row_of, lambda i: row0 + i < rows,
                            Out, lambda rh, i, d: (bx, bz, rh[0] // group, rh[1], d),
                            LSE, lambda rh, i: (bx, bz, rh[1], rh[0] // group),
                            sink_of=None, empty_lse=-math.inf,
                            out_tile=Out[bx, bz, s0, h0, 0] if tile_rows else None)
            else:
                # normalise, fold in the sink, write rows back to [b, s, h]; a row with
                # nothing visible (l == 0) gets output 0 and lse +inf
                _write_rows(block_H, dim_v, st.acc_o, st.l, lse_of, row_of, lambda i: row0 + i < rows,
                            Out, lambda rh, i, d: (bx, rh[0] // group, rh[1], d),
                            LSE, lambda rh, i: (bx, rh[1], rh[0] // group),
                            sink_of=lambda rh: attn_sink[rh[1]], empty_lse=math.inf,
                            out_tile=Out[bx, s0, h0, 0] if tile_rows else None)

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
            # block row i is (token, head) row r = row0 + i (clamped): token r // heads, head r % heads
            _write_rows(block_R, dim_v, acc, total, lambda i: top[i] + T.log(total[i]),
                        lambda i: T.min(row0 + i, rows - 1), lambda i: row0 + i < rows,
                        Out, lambda r, i, d: (bx, r // heads, r % heads, d),
                        LSE, lambda r, i: (bx, r % heads, r // heads),
                        sink_of=lambda r: attn_sink[r % heads], empty_lse=math.inf)

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
            st = _alloc_attention(block_H, block_N, dim_v, dpe, dtype, accum)
            token = T.alloc_fragment((block_N,), "int32")   # gathered row, -1 = empty slot
            if fp8_kv:
                tile_scale = T.alloc_fragment((block_N, V32_SCALES), accum)

            s = by // row_blocks
            h0 = (by % row_blocks) * block_H
            n_slots = T.min(topk_length[bx], topk)
            scale_log2 = sm_scale * LOG2E
            T.copy(Q[bx, s, h0, 0], st.Q_shared)
            if dpe > 0:
                T.copy(Q[bx, s, h0, dim_v], st.Q_pe_shared)
            _init_softmax(st)

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
                        st.KV_shared[j, d] = T.if_then_else(
                            token[j] >= 0, T.cast(nope, accum) * tile_scale[j, d // V32_TILE], 0)
                    for j, d in T.Parallel(block_N, dpe):
                        rope = _bytes_as(KV, T.max(token[j], 0), V32_ROPE_AT + 2 * d, 2, "uint16",
                                         "bfloat16")
                        st.K_pe_shared[j, d] = T.if_then_else(token[j] >= 0, rope, 0)
                else:
                    for j, d in T.Parallel(block_N, dim_v):
                        st.KV_shared[j, d] = T.if_then_else(token[j] >= 0, KV[T.max(token[j], 0), d], 0)
                    if dpe > 0:
                        for j, d in T.Parallel(block_N, dpe):
                            st.K_pe_shared[j, d] = T.if_then_else(
                                token[j] >= 0, KV[T.max(token[j], 0), dim_v + d], 0)
                _attend_tile(st, lambda i, j: token[j] >= 0, scale_log2)

            # block row i is head h0 + i (clamped) of query token s
            _write_rows(block_H, dim_v, st.acc_o, st.l, lambda i: st.m[i] * sm_scale + T.log(st.l[i]),
                        lambda i: T.min(h0 + i, heads - 1), lambda i: h0 + i < heads,
                        Out, lambda h, i, d: (bx, s, h, d), LSE, lambda h, i: (bx, h0 + i, s),
                        sink_of=lambda h: attn_sink[h], empty_lse=math.inf, out_tile=Out[bx, s, h0, 0])

    return main


# FlashMLA's V3.2 FP8 cache row: 512 e4m3 | 4 float32 scales (one per 128) | 64 bf16 RoPE
V32_BYTES, V32_TILE, V32_SCALES, V32_ROPE_AT = 656, 128, 4, 528


def _bytes_as(buf, row, col, n: int, bits_dtype: str, dtype: str):
    """The little-endian value of ``n`` bytes ``buf[row, col:col + n]`` read as ``dtype``."""
    bits = T.cast(buf[row, col], bits_dtype)
    for k in range(1, n):
        bits = bits | (T.cast(buf[row, col + k], bits_dtype) << (8 * k))
    return T.reinterpret(dtype, bits)


# a plain helper, not a T.macro: its loop keeps the tracer's default names (i0, i1), which the
# generated sources carry; as a macro they would become (i, d)
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


# ---------------------------------------------------------------- shared pieces (macros)


@T.macro
def _alloc_attention(block_H, block_N, dim_v, dpe, dtype, accum):
    """One block's tiles: ``block_H`` query rows (``Q_shared``, the key-only tail in
    ``Q_pe_shared`` when ``dpe > 0``), a ``block_N``-token KV tile (``KV_shared``,
    ``K_pe_shared``), the tile's scores ``acc_s`` and probabilities ``P_shared``, the
    output accumulator ``acc_o`` and the online-softmax state (max ``m``, sum ``l``,
    ``rescale``).  Returned as one namespace with the sizes, for the other macros."""
    Q_shared = T.alloc_shared((block_H, dim_v), dtype)
    KV_shared = T.alloc_shared((block_N, dim_v), dtype)
    Q_pe_shared = None
    K_pe_shared = None
    if dpe > 0:
        Q_pe_shared = T.alloc_shared((block_H, dpe), dtype)
        K_pe_shared = T.alloc_shared((block_N, dpe), dtype)
    P_shared = T.alloc_shared((block_H, block_N), dtype)
    acc_s = T.alloc_fragment((block_H, block_N), accum)
    acc_o = T.alloc_fragment((block_H, dim_v), accum)
    m = T.alloc_fragment((block_H,), accum)
    rescale = T.alloc_fragment((block_H,), accum)
    l = T.alloc_fragment((block_H,), accum)
    return SimpleNamespace(Q_shared=Q_shared, KV_shared=KV_shared, Q_pe_shared=Q_pe_shared,
                           K_pe_shared=K_pe_shared, P_shared=P_shared, acc_s=acc_s, acc_o=acc_o, m=m,
                           rescale=rescale, l=l, block_H=block_H, block_N=block_N, dim_v=dim_v, dpe=dpe,
                           accum=accum)


@T.macro
def _init_softmax(st):
    """Empty accumulator, zero sums, running maxima at ``-inf``."""
    T.fill(st.acc_o, 0)
    T.fill(st.l, 0)
    T.fill(st.m, -T.infinity(st.accum))


@T.macro
def _load_rows(st, Q, b, row0, rows, group, kvh, limit, seqlen, seq_q, causal):
    """Gather the block's query rows of request ``b`` into ``st.Q_shared`` (and ``Q_pe_shared``):
    block row i is query row ``r = row0 + i`` (clamped), token ``r // group``, head
    ``kvh * group + r % group``; rows past ``rows`` are zero.  ``limit[i]``: the keys the row may
    see, all ``seqlen`` of them or (``causal``) up to its own token."""
    for i, d in T.Parallel(st.block_H, st.dim_v):
        r = T.min(row0 + i, rows - 1)
        st.Q_shared[i, d] = T.if_then_else(row0 + i < rows,
                                           Q[b, r // group, kvh * group + r % group, d], 0)
    if st.dpe > 0:
        for i, d in T.Parallel(st.block_H, st.dpe):
            r = T.min(row0 + i, rows - 1)
            st.Q_pe_shared[i, d] = T.if_then_else(
                row0 + i < rows, Q[b, r // group, kvh * group + r % group, st.dim_v + d], 0)
    for i in T.Parallel(st.block_H):
        if causal:
            limit[i] = seqlen - seq_q + T.min(row0 + i, rows - 1) // group + 1
        else:
            limit[i] = seqlen


@T.macro
def _attend_tile(st, visible, scale_log2):
    """One KV tile, already in ``st.KV_shared`` (and ``st.K_pe_shared``): scores
    ``Q K^T``, masked to ``-inf`` where ``visible(i, j)`` (block row i, tile token j) is
    false, folded into the online softmax, then ``acc_o += P V``."""
    T.gemm(st.Q_shared, st.KV_shared, st.acc_s, transpose_B=True, clear_accum=True)
    if st.dpe > 0:
        T.gemm(st.Q_pe_shared, st.K_pe_shared, st.acc_s, transpose_B=True)
    for i, j in T.Parallel(st.block_H, st.block_N):
        st.acc_s[i, j] = T.if_then_else(visible(i, j), st.acc_s[i, j], -T.infinity(st.accum))
    _online_softmax_step(st.acc_s, st.acc_o, st.m, st.rescale, st.l, st.P_shared, scale_log2, st.block_H,
                         st.dim_v)
    T.gemm(st.P_shared, st.KV_shared, st.acc_o)


@T.macro
def _attend_pages(st, KV, block_table, b, kvh, dim, page_size, seqlen, limit, scale_log2, first, last,
                  num_stages):
    """KV tiles ``first .. last - 1`` of request ``b``'s paged cache (latent head ``kvh``), each
    found through ``block_table`` and attended (:func:`_attend_tile`), in a ``T.Pipelined`` loop:
    the loop every dense kernel runs, and the one CUDA's sm_90a seesaw schedules
    (``backends/cuda/seesaw.py``).  Rows of the last tile past ``seqlen`` may hold anything (NaN):
    they are zeroed in shared memory so that ``0 * v`` stays 0."""
    for t in T.Pipelined(first, last, num_stages=num_stages):
        pos0 = t * st.block_N
        token0 = block_table[b, pos0 // page_size] * page_size + pos0 % page_size
        T.copy(KV[token0, kvh * dim], st.KV_shared)
        if st.dpe > 0:
            T.copy(KV[token0, kvh * dim + st.dim_v], st.K_pe_shared)
        if pos0 + st.block_N > seqlen:
            for j, d in T.Parallel(st.block_N, st.dim_v):
                st.KV_shared[j, d] = T.if_then_else(pos0 + j < seqlen, st.KV_shared[j, d], 0)
        _attend_tile(st, lambda i, j: pos0 + j < limit[i], scale_log2)


@T.macro
def _write_rows(n_rows, dim_v, acc, total, lse_of, row_of, valid, Out, out_at, LSE, lse_at, sink_of,
                empty_lse, out_tile=None, accum="float32"):
    """The epilogue: normalise ``n_rows`` accumulated rows, fold in the attention sink,
    and write them to ``Out`` and their log-sum-exp to ``LSE``.

    ``acc [n_rows, dim_v]`` holds unnormalised outputs and ``total[i]`` the row's softmax
    sum (0: nothing was visible: output 0, lse ``empty_lse``).  The test is ``!= 0``, not
    ``> 0``: a NaN score (a NaN in ``Q`` or in a visible KV row) leaves ``total`` NaN, and
    that row must come out NaN, as torch's softmax gives, never as the "nothing to attend"
    answer (0, ``empty_lse``), which a split partial would even drop silently in the
    combine.  ``lse_of(i)`` is the row's natural-log lse.  ``row_of(i)`` computes the row's
    coordinates once per loop body (the index expressions share them); ``valid(i)``: block
    row i exists; ``out_at(row, i, d)`` and ``lse_at(row, i)``: its indices into ``Out`` and
    ``LSE``.  ``sink_of(row)``: its sink logit (``out *= 1 / (1 + exp(sink - lse))``), or
    ``None`` for split partials.

    The row's factor ``sink / total`` is computed once per row, not per element (per element,
    the sink's ``exp`` and ``log`` were a third of a short sparse decode on a host backend),
    with ``T.rcp`` (on CUDA one ``rcp.approx.ftz.f32`` each, within an ulp of float32 of the
    quotient, far below the bf16 output's rounding, where an IEEE division is a
    multi-instruction sequence with a called slow path), and ``acc`` is scaled in place.  ``out_tile``: the ``Out`` region of the whole block (``Out[b, s, h0,
    0]``) when the block's rows are consecutive rows of ``Out`` and rows past the end fall
    outside ``Out``'s row dimension (the copy skips them): then one ``T.copy`` writes the
    tile, which sm_90a lowers to the STSM + TMA-store epilogue
    (``kernforge/backends/cuda/tma_store.py``); otherwise rows are scattered through
    ``out_at``."""
    factor = T.alloc_fragment((n_rows,), accum)
    for i in T.Parallel(n_rows):
        if sink_of is None:
            factor[i] = T.if_then_else(total[i] != 0, T.rcp(total[i]), 0.0)
        else:
            factor[i] = T.if_then_else(
                total[i] != 0, T.rcp(total[i]) * T.rcp(1.0 + T.exp(sink_of(row_of(i)) - lse_of(i))), 0.0)
    for i, d in T.Parallel(n_rows, dim_v):
        acc[i, d] = T.if_then_else(total[i] != 0, acc[i, d] * factor[i], 0.0)
    if out_tile is not None:
        T.copy(acc, out_tile)
    else:
        for i, d in T.Parallel(n_rows, dim_v):
            rw = row_of(i)
            if valid(i):
                Out[out_at(rw, i, d)] = acc[i, d]
    for i in T.Parallel(n_rows):
        rw = row_of(i)
        if valid(i):
            LSE[lse_at(rw, i)] = T.if_then_else(
                total[i] != 0, lse_of(i), T.infinity(accum) if empty_lse > 0 else -T.infinity(accum))
