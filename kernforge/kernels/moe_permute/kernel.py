"""MoE permutation (TileKernels' ``get_fused_mapping`` / ``expand_to_fused`` /
``reduce_fused``), written once in the tile DSL.

The routing ``topk_idx [T, k]`` is read as one flat list of ``T * k`` slots, slot
``f = token * k + j``.  The *fused* (expanded) buffer is expert-major: expert ``e``
owns the segment ``[expert_start[e], expert_end[e])``, its length the number of slots
naming ``e`` rounded up to ``alignment``; valid rows fill the front of the segment
**in flat slot order** (token order, then slot order), padding rows (``-1`` in every
``pos_to_*``) the tail.  The order is a choice: TileKernels' warp-aggregated atomics
leave it unspecified, flat order makes every backend and every run agree bit for bit.

Two kernels build the mapping, a histogram + scan and a scatter:

* :func:`moe_mapping_scan` (one block): per chunk of ``chunk`` slots, a histogram of
  the experts it names (shared atomics, integer: order-free), whose running sum gives
  each chunk's first row inside each expert's segment (``chunk_offset``); then the
  padded lengths, their prefix sum (``expert_start``/``expert_end``) and the valid
  counts.
* :func:`moe_mapping_scatter` (``chunks + E + tail tiles`` blocks): block ``c < chunks``
  walks its chunk in order and hands each slot the next row of its expert (so the
  order inside a segment is flat order whatever the grid); the next ``E`` blocks write
  ``-1`` over their expert's padding rows, the last ones over the rows past the last
  segment.  The three sets of rows are disjoint, so no block waits for another.

Slots naming ``-1`` are skipped (``token_topk_to_pos = -1``); ids outside ``[-1, E)`` are
rejected by the op before launch and skipped here too, so no access leaves its buffer.
A row that would land at or past ``num_expanded_tokens`` (a caller's bound too small)
is dropped the same way rather than written out of bounds.

:func:`expand_to_fused` copies token rows (and optionally their scale factors) to
their rows of the fused buffer and zeroes the padding rows; :func:`reduce_fused` sums a
token's rows back, weighted, in float32, in slot order (deterministic).
"""
from __future__ import annotations

import kernforge.dsl as T

#: slots per chunk of the mapping kernels: one histogram row and one serial scatter run each
DEFAULT_CHUNK = 256


def _check_mapping(num_topk: int, num_experts: int, alignment: int) -> None:
    if num_topk <= 0 or num_experts <= 0:
        raise ValueError(f"moe mapping: num_topk and num_experts must be positive, got {num_topk}, {num_experts}")
    if alignment <= 0:
        raise ValueError(f"moe mapping: alignment must be positive, got {alignment}")


@T.tunable(chunk=[64, 256, 1024])
def moe_mapping_scan(num_topk: int, num_experts: int, alignment: int, chunk: int = DEFAULT_CHUNK,
                     threads: int = 256):
    """Histogram + scan: ``chunk_offset[c, e]`` (rows of expert ``e`` named by chunks
    before ``c``), ``expert_count[e]`` (valid rows), and the padded segments
    ``expert_start``, ``expert_end``, ``num_tokens_per_expert`` (= end - start).

    One block: the histogram of each chunk is counted by the block's threads with
    shared atomics (integer counts, so the order of arrival does not matter), the scans
    over chunks are element-wise over experts."""
    _check_mapping(num_topk, num_experts, alignment)
    K, E = num_topk, num_experts
    NT = T.symbolic("num_tokens")
    C = T.symbolic("num_chunks")

    @T.prim_func
    def moe_mapping_scan_kernel(topk_idx: T.Tensor((NT, K), "int64"),
                                chunk_offset: T.Tensor((C, E), "int32"),
                                expert_count: T.Tensor((E,), "int32"),
                                expert_start: T.Tensor((E,), "int32"),
                                expert_end: T.Tensor((E,), "int32"),
                                num_tokens_per_expert: T.Tensor((E,), "int32")):
        with T.Kernel(1, threads=threads) as _:
            hist = T.alloc_shared((E,), "int32")
            run = T.alloc_fragment((E,), "int32")
            padded = T.alloc_fragment((E,), "int32")
            ends = T.alloc_fragment((E,), "int32")
            T.clear(run)
            for c in T.serial(C):
                T.clear(hist)
                for i in T.Parallel(chunk):
                    if c * chunk + i < NT * K:
                        e = topk_idx[(c * chunk + i) // K, (c * chunk + i) % K]
                        if (e >= 0) & (e < E):
                            T.atomic_add(hist[T.cast(e, "int32")], 1)
                for e in T.Parallel(E):
                    chunk_offset[c, e] = run[e]
                    run[e] = run[e] + hist[e]
            for e in T.Parallel(E):
                padded[e] = (run[e] + (alignment - 1)) // alignment * alignment
            T.cumsum(padded, ends)
            for e in T.Parallel(E):
                expert_count[e] = run[e]
                expert_start[e] = ends[e] - padded[e]
                expert_end[e] = ends[e]
                num_tokens_per_expert[e] = padded[e]

    return moe_mapping_scan_kernel


@T.tunable(chunk=[64, 256, 1024], tail_tile=[256, 1024])
def moe_mapping_scatter(num_topk: int, num_experts: int, alignment: int, chunk: int = DEFAULT_CHUNK,
                        tail_tile: int = 1024, threads: int = 128, fill_tail: bool = False):
    """The mapping itself from :func:`moe_mapping_scan`'s results (see the module
    docstring): blocks ``[0, chunks)`` scatter their chunk's slots in order, blocks
    ``[chunks, chunks + E)`` write ``-1`` over expert ``e``'s padding rows, the rest over
    ``tail_tile`` rows each of the buffer past the last segment when ``fill_tail``.

    Without ``fill_tail`` (the default) those last blocks are left out and the rows past the
    last segment are not written: the op's host-synced path, the common one (the engine's),
    trims the buffer to the segments (at T = 1, E = 256 the worst-case buffer is 32,512
    rows, of which 768 are kept); ``force_no_sync`` asks for the fill."""
    _check_mapping(num_topk, num_experts, alignment)
    K, E = num_topk, num_experts
    NT = T.symbolic("num_tokens")
    C = T.symbolic("num_chunks")
    N = T.symbolic("num_expanded_tokens")

    @T.prim_func
    def moe_mapping_scatter_kernel(topk_idx: T.Tensor((NT, K), "int64"),
                                   chunk_offset: T.Tensor((C, E), "int32"),
                                   expert_count: T.Tensor((E,), "int32"),
                                   expert_start: T.Tensor((E,), "int32"),
                                   expert_end: T.Tensor((E,), "int32"),
                                   pos_to_expert: T.Tensor((N,), "int32"),
                                   pos_to_token: T.Tensor((N,), "int32"),
                                   pos_to_token_topk: T.Tensor((N,), "int32"),
                                   token_topk_to_pos: T.Tensor((NT, K), "int32")):
        with T.Kernel(C + E + (T.ceildiv(N, tail_tile) if fill_tail else 0), threads=threads) as b:
            if b < C:
                cursor = T.alloc_shared((E,), "int32")
                for e in T.Parallel(E):
                    cursor[e] = expert_start[e] + chunk_offset[b, e]
                expert = T.alloc_var("int32", 0)
                pos = T.alloc_var("int32", 0)
                for i in T.serial(chunk):
                    if b * chunk + i < NT * K:
                        f = b * chunk + i
                        e = topk_idx[f // K, f % K]
                        if (e >= 0) & (e < E):
                            expert = T.cast(e, "int32")
                            pos = cursor[expert]
                            cursor[expert] = pos + 1
                            if pos < N:
                                pos_to_expert[pos] = expert
                                pos_to_token[pos] = f // K
                                pos_to_token_topk[pos] = f
                                token_topk_to_pos[f // K, f % K] = pos
                            else:
                                token_topk_to_pos[f // K, f % K] = -1
                        else:
                            token_topk_to_pos[f // K, f % K] = -1
            elif b < C + E:
                # expert b - C: rows [start + count, end) of its segment are padding
                for j in T.Parallel(alignment):
                    p = expert_start[b - C] + expert_count[b - C] + j
                    if (p < expert_end[b - C]) & (p < N):
                        pos_to_expert[p] = -1
                        pos_to_token[p] = -1
                        pos_to_token_topk[p] = -1
            elif fill_tail:
                for j in T.Parallel(tail_tile):
                    p = (b - C - E) * tail_tile + j
                    if (p >= expert_end[E - 1]) & (p < N):
                        pos_to_expert[p] = -1
                        pos_to_token[p] = -1
                        pos_to_token_topk[p] = -1

    return moe_mapping_scatter_kernel


def _hidden_tile(hidden: int, block: int) -> int:
    return min(block, hidden)


#: rows per zeroing block of :func:`expand_to_fused`: one non-temporal run and one fence for a
#: whole tile of padding (64 KB of bf16 at hidden 1024, 448 KB at V4's 7168)
ZERO_ROWS = 32


@T.tunable(block=[256, 1024, 2048])
def expand_to_fused(hidden: int, num_topk: int, dtype: str = "bfloat16", sf_cols: int = 0,
                    sf_dtype: str = "float32", sf_col_major: bool = False, block: int = 1024,
                    threads: int = 128):
    """``expanded_x[token_topk_to_pos[t, j]] = x[t]`` for every slot with a row, and zero
    rows where ``pos_to_expert < 0`` (padding).  Blocks ``[0, ceil(N / R))`` zero the padding
    rows of tile ``b`` (rows ``[b R, b R + R)``, ``R = ZERO_ROWS``); blocks after them copy
    token ``t`` to each of its rows (read once, written ``k`` times), ``block`` columns at a
    time.  Every row is written once: padding by the zeroing blocks, data by the copies.

    The padding is most of the buffer (T = 64, E = 256, alignment 128: 87 MB of padding, 1.5
    MB of data), so the zeroing is shaped for bandwidth: a tile that is padding throughout
    (most are: segments are padding after their first rows) is one contiguous run, which the
    host renderer writes with non-temporal stores (``kf::zero_stream``: no read for
    ownership, no eviction of cached lines); a tile with data rows zeroes its padding rows one
    by one.  Zeroing first: on a host, where the blocks run in order, the data rows are
    written last and are still in cache for the grouped GEMM or ``reduce_fused`` that reads
    them next.

    ``sf_cols > 0`` moves a scale-factor row ``x_sf [T, sf_cols]`` along with each data
    row (float32 scales, or int32 words of four packed UE8M0 exponents: the words are
    copied, not interpreted), into ``expanded_sf [N, sf_cols]`` or, with
    ``sf_col_major``, a column-major ``[N, sf_cols]`` view (the parameter is its
    ``[sf_cols, N]`` transpose with a row stride of its own, TMA-aligned by the op)."""
    if hidden <= 0 or num_topk <= 0:
        raise ValueError(f"expand_to_fused: hidden and num_topk must be positive, got {hidden}, {num_topk}")
    K, R = num_topk, ZERO_ROWS
    BH = _hidden_tile(hidden, block)
    nblk = T.ceildiv(hidden, BH)
    NT = T.symbolic("num_tokens")
    N = T.symbolic("num_expanded_tokens")
    SS = T.symbolic("sf_stride")
    SC = max(sf_cols, 1)
    # without scales the two scale parameters are placeholders of any row count
    ST, SN = (NT, N) if sf_cols else (T.symbolic("x_sf_rows"), T.symbolic("sf_rows"))
    sf_shape = (SC, SN) if sf_col_major else (SN, SC)

    @T.macro
    def zero_sf(expanded_sf, p):
        if sf_cols > 0:
            for s in T.Parallel(sf_cols):
                if sf_col_major:
                    expanded_sf[s, p] = 0
                else:
                    expanded_sf[p, s] = 0

    @T.prim_func
    def expand_to_fused_kernel(x: T.Tensor((NT, hidden), dtype),
                               x_sf: T.Tensor((ST, SC), sf_dtype),
                               token_topk_to_pos: T.Tensor((NT, K), "int32"),
                               pos_to_expert: T.Tensor((N,), "int32"),
                               expanded_x: T.Tensor((N, hidden), dtype),
                               expanded_sf: T.StridedTensor(sf_shape, (SS, 1), sf_dtype)):
        with T.Kernel(T.ceildiv(N, R) + NT, threads=threads) as b:
            row = T.alloc_fragment((BH,), dtype)
            if b < T.ceildiv(N, R):
                # rows past N count as data (not zeroed), so a partial last tile goes row by row
                pe = T.alloc_fragment((R,), "int32")
                top = T.alloc_fragment((1,), "int32")
                for r in T.Parallel(R):
                    if b * R + r < N:
                        pe[r] = pos_to_expert[b * R + r]
                    else:
                        pe[r] = 0
                T.reduce_max(pe, top, dim=0)
                if top[0] < 0:
                    for r, i in T.Parallel(R, hidden):
                        expanded_x[b * R + r, i] = T.cast(0, dtype)
                    if sf_cols > 0:
                        for r in T.serial(R):
                            zero_sf(expanded_sf, b * R + r)
                else:
                    for r in T.serial(R):
                        if pe[r] < 0:
                            for i in T.Parallel(hidden):
                                expanded_x[b * R + r, i] = T.cast(0, dtype)
                            zero_sf(expanded_sf, b * R + r)
            else:
                t = b - T.ceildiv(N, R)
                for j in T.serial(K):
                    if (token_topk_to_pos[t, j] >= 0) & (token_topk_to_pos[t, j] < N):
                        for c in T.serial(nblk):
                            T.copy(x[t, c * BH], row)
                            T.copy(row, expanded_x[token_topk_to_pos[t, j], c * BH])
                        if sf_cols > 0:
                            for s in T.Parallel(sf_cols):
                                if sf_col_major:
                                    expanded_sf[s, token_topk_to_pos[t, j]] = x_sf[t, s]
                                else:
                                    expanded_sf[token_topk_to_pos[t, j], s] = x_sf[t, s]

    return expand_to_fused_kernel


@T.tunable(block=[256, 512, 1024, 2048])
def reduce_fused(hidden: int, num_topk: int, dtype: str = "bfloat16", out_dtype: str = "",
                 with_weights: bool = True, with_x_sf: bool = False, with_sf: bool = False,
                 block: int = 1024, threads: int = 128):
    """``out[t] = sf * sum_j w[t, j] * x_sf[p] * x[p]`` over the slots ``j`` of token ``t``
    with a row ``p = token_topk_to_pos[t, j] >= 0``, in float32, adding in slot order
    (``j = 0, 1, ...``), so every backend and every run gives the same bits.  Each term is
    ``x[p] * s`` with ``s = w * x_sf[p]`` (the factors that are given), as TileKernels
    computes it; ``sf`` (a one-element float32 tensor) scales an e4m3 output.

    One block per token, ``block`` columns at a time; a hidden size that is not a multiple
    of the tile leaves a guarded partial tile (the engine's tiny() has hidden 128).  On a
    host the op asks for 128-column steps, so the slot loop inside walks a token's ``k``
    rows side by side (:func:`~kernforge.kernels.moe_permute.config.choose_reduce`).  Absent
    operands (``with_*`` False) are never read: the op passes one-element placeholders."""
    if hidden <= 0 or num_topk <= 0:
        raise ValueError(f"reduce_fused: hidden and num_topk must be positive, got {hidden}, {num_topk}")
    out_dtype = out_dtype or dtype
    K = num_topk
    BH = _hidden_tile(hidden, block)
    nblk = T.ceildiv(hidden, BH)
    exact = hidden % BH == 0    # every tile whole: no column guard
    NT = T.symbolic("num_tokens")
    N = T.symbolic("num_expanded_tokens")
    # operands left out are placeholders of any row count
    WT = NT if with_weights else T.symbolic("weight_rows")
    SN = N if with_x_sf else T.symbolic("x_sf_rows")

    @T.prim_func
    def reduce_fused_kernel(x: T.Tensor((N, hidden), dtype),
                            topk_weights: T.Tensor((WT, K), "float32"),
                            token_topk_to_pos: T.Tensor((NT, K), "int32"),
                            x_sf: T.Tensor((SN,), "float32"),
                            sf: T.Tensor((1,), "float32"),
                            out: T.Tensor((NT, hidden), out_dtype)):
        with T.Kernel(NT, threads=threads) as t:
            acc = T.alloc_fragment((BH,), "float32")
            s = T.alloc_var("float32", 1.0)
            scale = T.alloc_var("float32", 1.0)
            if with_sf:
                scale = sf[0]
            for c in T.serial(nblk):
                T.clear(acc)
                for j in T.serial(K):
                    if (token_topk_to_pos[t, j] >= 0) & (token_topk_to_pos[t, j] < N):
                        s = 1.0
                        if with_weights:
                            s = topk_weights[t, j]
                        if with_x_sf:
                            s = s * x_sf[token_topk_to_pos[t, j]]
                        p = token_topk_to_pos[t, j]
                        for i in T.Parallel(BH):
                            if exact:   # no guard: the host compiler vectorises the unguarded loop
                                acc[i] = acc[i] + T.cast(x[p, c * BH + i], "float32") * s
                            elif c * BH + i < hidden:
                                acc[i] = acc[i] + T.cast(x[p, c * BH + i], "float32") * s
                for i in T.Parallel(BH):
                    if exact or c * BH + i < hidden:
                        out[t, c * BH + i] = acc[i] * scale if with_sf else acc[i]

    return reduce_fused_kernel
