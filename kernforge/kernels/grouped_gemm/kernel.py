"""MoE grouped GEMM, DeepGEMM's M-grouped contiguous layout: ``D[r] = A[r] @ B[m_indices[r]]^T``.

After token dispatch, the rows routed to each expert sit together in one tall
matrix ``A [M_sum, K]``; expert ``g``'s weight is ``B[g] [N, K]`` (DeepGEMM's "NT":
both operands K-major).  Each expert's segment starts on a multiple of the layout
alignment (128 in DeepGEMM) and is padded with rows whose index is ``-1``, so a
``block_M``-row tile (``block_M`` divides the alignment) belongs to exactly one
expert, read from its first row.  A tile whose first row is padding is skipped and
stored as zeros; inside a tile, padding rows are stored as zeros too, whatever A
holds there (DeepGEMM leaves that to the caller zeroing A; here it is guaranteed).

The program is a plain tiled GEMM per ``(N tile, M tile)`` block: pipelined
global->shared copies of A and of the expert's B tile, ``T.gemm`` into a float32
fragment, one store.  N and K are compile-time (DeepGEMM's ``compiled_dims="nk"``),
M_sum is symbolic, and ragged N/K edges rely on the copy semantics (reads past the
end give 0, writes past the end are skipped).

The fp8 variant (``m_grouped_fp8_gemm_nt_contiguous``) takes e4m3 operands with
DeepGEMM's default SM90 recipe: per-token 1x128 scales for A (``[M_sum, ceil(K/128)]``)
and per-block 128x128 scales for B (``[G, ceil(N/128), ceil(K/128)]``), applied to
each 128-wide K slice's partial product before it is added to the accumulator.

The masked fp8 variant is the same promotion in the masked layout; the FP8 x FP4
variants (``m_grouped_fp8_fp4_gemm_nt_{contiguous,masked}``) take ``B`` as e2m1
codes, two per int8 (low nibble first), with one float32 scale per 1x32 slice, and
step K by 128, A's scale width: each step widens A's e4m3 tile to bf16 (exact) and
decodes B's codes with their four 1x32 scales folded in, ``bf16(e2m1 * sfb)``
(:func:`decode_scaled_fp4_tile`), so one 128-deep bf16 tile GEMM and one A-scale
promotion run per step.  The fold is exact for power-of-two (UE8M0) scales, the FP4
recipe's; any other float32 scale is rounded once to bf16 (relative error <= 2^-9).
"""
# no `from __future__ import annotations`: T.Tensor annotations must see the factory's
# parameters as values when the prim_func is traced
import kernforge.dsl as T
from kernforge.kernels.gemm.kernel import FP4_GRAN_K, FP8, GRAN_K, fp4_value, sf_block, ue8m0_value


@T.tunable(block_M=[32, 64, 128], block_N=[32, 64, 128], block_K=[32, 64, 128, 256],
           num_stages=[1, 2, 3], row_step=[0, 16], row_tiles=[1, 2], n_splits=[1, 2, 4])
def m_grouped_gemm_nt_contiguous(num_groups: int, N: int, K: int, block_M: int = 64,
                                 block_N: int = 64, block_K: int = 64, num_stages: int = 2,
                                 dtype: str = "bfloat16", out_dtype: str = "bfloat16",
                                 threads: int = 128, row_step: int = 0, row_tiles: int = 1,
                                 n_splits: int = 1, persistent: int = 0, cluster: int = 0):
    """bf16 (or fp16) grouped GEMM.  Kernel parameters: ``A [M, K]``, ``B [num_groups, N, K]``,
    ``m_indices int32 [M]`` (expert of each row, ``-1`` = padding), output ``D [M, N]``.
    ``row_step`` (a host's choice; 0: off) multiplies only the tile's first rows up to its last
    expert row, rounded up to the next of the ladder's row counts (:func:`_row_ladder`).

    ``row_tiles = 2`` (with ``row_step``) gives a block two ``block_M``-row tiles, which may
    belong to two experts: the block's first expert multiplies all its rows (both tiles when its
    segment spans them) in one GEMM per K step, so the B tile, which a host's bf16 nt
    micro-kernel packs per call, is packed once per 256 rows instead of once per 128; a second
    tile that starts another expert gets its own GEMM and B tile.

    ``n_splits`` (:func:`_grid`) orders the grid as that many groups of whole N tiles; ``persistent``
    (:func:`_persistent`) asks GPUs for a persistent L2-grouped tile loop; ``cluster`` (> 1) for
    clusters of adjacent N tiles sharing each A tile by TMA multicast (``kernforge.backends.cuda.cluster``
    reads the factory's ``attrs["cluster"]``; a scheduling request that changes no result)."""
    _check_row_step(row_step, block_M)
    if row_tiles not in (1, 2) or (row_tiles == 2 and not row_step):
        raise ValueError(f"row_tiles ({row_tiles}) must be 1, or 2 with a row_step")
    accum = "float32"
    M = T.symbolic("M")
    rows_per_block = block_M * row_tiles
    name = (f"m_grouped_gemm_nt_contiguous_g{num_groups}_n{N}_k{K}_M{block_M}_N{block_N}"
            f"_K{block_K}_s{num_stages}_{dtype}_{out_dtype}_t{threads}{f'_r{row_step}' if row_step else ''}"
            f"{'_x2' if row_tiles == 2 else ''}{f'_ns{n_splits}' if n_splits > 1 else ''}{f'_p{persistent}' if persistent else ''}"
            f"{f'_c{cluster}' if cluster > 1 else ''}")

    @T.prim_func(name=name)
    def main(A: T.Tensor((M, K), dtype), B: T.Tensor((num_groups, N, K), dtype),
             m_indices: T.Tensor((M,), "int32"), D: T.Tensor((M, N), out_dtype)):
        n_tiles, row_blocks = -(-N // block_N), T.ceildiv(M, rows_per_block)
        with T.Kernel(*_grid(n_tiles, row_blocks, n_splits), threads=threads) as (b0, b1):
            bx, by = _blocks((b0, b1), n_tiles, row_blocks, n_splits)
            _persistent(persistent, n_splits)
            r0 = by * rows_per_block
            A_shared = T.alloc_shared((rows_per_block, block_K), dtype)
            B_shared = T.alloc_shared((block_N, block_K), dtype)
            C = T.alloc_fragment((rows_per_block, block_N), accum)
            expert = m_indices[r0]
            T.clear(C)
            if row_step:
                used = T.alloc_var("int32", 0)  # rows up to the block's last row of its first expert
                for i in T.serial(rows_per_block):
                    if r0 + i < M:
                        if m_indices[r0 + i] == expert:
                            used = i + 1
                if row_tiles == 2:
                    # the second tile's own expert, when it starts one (else its rows are the first
                    # expert's or padding): 0 rows to multiply otherwise
                    B_second = T.alloc_shared((block_N, block_K), dtype)
                    second = T.alloc_var("int32", -1)
                    used2 = T.alloc_var("int32", 0)
                    if r0 + block_M < M:
                        second = m_indices[r0 + block_M]
                    if (second >= 0) & (second != expert):
                        for i in T.serial(block_M):
                            if r0 + block_M + i < M:
                                if m_indices[r0 + block_M + i] == second:
                                    used2 = i + 1
            # the clamp changes no valid id (the ops layer checks them) and proves the B tile in
            # bounds when block_N and block_K divide N and K: the CPU's GEMM then reads the expert's
            # weights in place (its bf16 nt micro-kernel packs them anyway) instead of a copy
            e = T.max(T.min(expert, num_groups - 1), 0)
            # one tile: the K loop runs for an expert's tile only; two: for either tile's expert
            live = expert >= 0 if row_tiles == 1 else (expert >= 0) | (used2 > 0)
            first = True if row_tiles == 1 else expert >= 0
            if live:
                for k in T.Pipelined(T.ceildiv(K, block_K), num_stages=num_stages):
                    if first:
                        if row_step:
                            T.copy(B[e, bx * block_N, k * block_K], B_shared)
                            for fewer, rows in _row_ladder(rows_per_block, row_step):
                                if (used > fewer) & (used <= rows):
                                    T.copy(A[r0, k * block_K], A_shared[0:rows, :])
                                    T.gemm(A_shared[0:rows, :], B_shared, C[0:rows, :], transpose_B=True)
                        else:
                            T.copy(A[r0, k * block_K], A_shared)
                            T.copy(B[e, bx * block_N, k * block_K], B_shared)
                            T.gemm(A_shared, B_shared, C, transpose_B=True)
                    if row_tiles == 2:
                        if used2 > 0:
                            T.copy(B[T.max(T.min(second, num_groups - 1), 0), bx * block_N, k * block_K], B_second)
                            for fewer, rows in _row_ladder(block_M, row_step):
                                if (used2 > fewer) & (used2 <= rows):
                                    T.copy(A[r0 + block_M, k * block_K], A_shared[block_M:block_M + rows, :])
                                    T.gemm(A_shared[block_M:block_M + rows, :], B_second,
                                           C[block_M:block_M + rows, :], transpose_B=True)
            for i, j in T.Parallel(rows_per_block, block_N):
                row = T.min(r0 + i, M - 1)
                C[i, j] = T.if_then_else(m_indices[row] >= 0, C[i, j], 0.0)
            T.copy(C, D[r0, bx * block_N])

    return main


def _row_ladder(block_M: int, row_step: int) -> list:
    """The row counts a host tile may multiply, each with the largest count below it, as
    ``(fewer, rows)`` pairs: the powers of two from 2 below ``row_step``, then ``row_step``,
    ``2 row_step``, ... ``block_M``.  One GEMM of the smallest that holds the tile's used rows
    runs per K step, so padding rows (a ragged expert's last tile, a masked group's rows past
    ``masked_m``) cost at most ``row_step - 1`` rows of work, and a decode-sized tile (1 to 8
    used rows) at most as many again, while the B tile is still read, and packed by the CPU's
    micro-kernel, once per ``block_M`` rows.  (The CPU's few-row bf16 GEMM, ``kf/gemm_rows.h``,
    costs about the row count: 9 rows in a 16-row GEMM took 1.6x the time of 9.)"""
    small = [r for r in (2, 4, 8, 16, 32, 64) if r < row_step]
    sizes = small + list(range(row_step, block_M + 1, row_step))
    return list(zip([0] + sizes[:-1], sizes))


def _grid(n_tiles: int, rows, n_splits: int, groups: int = 0) -> tuple:
    """The grid: ``(N tiles, row tiles[, groups])``, or with ``n_splits > 1`` the N tiles in
    ``n_splits`` runs, ``(N tiles / n_splits, row tiles[, groups] x n_splits)``, each run's index
    the slowest-moving part of the last dimension (:func:`_blocks` maps blocks back).

    The CPU runs the grid as one collapsed OpenMP loop, last dimension outermost, with a guided
    schedule: the first chunk is ``1 / threads`` of the iterations.  With one run, row tiles (and
    groups) outermost, that chunk holds whole experts of whatever size (G 4 x [512, 0, 77, 300]
    rows at 2 threads: one thread got 57% of the work; masked [200, 9, 128, 0]: 64%).  With
    ``n_splits`` = threads each run holds every expert's rows against ``1 / threads`` of the N
    tiles, so the first chunk is exactly its share and the rest adapt; inside a run the row tiles
    stay outermost, so a block's A rows are reused across its N tiles (N tiles outermost
    throughout cost 3-9% at one thread).  GPUs keep one run (``blockIdx.x`` = N tile), their
    rendering unchanged."""
    if n_splits == 1:
        return (n_tiles, rows, groups) if groups else (n_tiles, rows)
    if n_splits < 1 or n_tiles % n_splits:
        raise ValueError(f"n_splits ({n_splits}) must be >= 1 and divide the {n_tiles} N tiles")
    return (n_tiles // n_splits, rows, groups * n_splits) if groups else (n_tiles // n_splits, rows * n_splits)


def _blocks(ids: tuple, n_tiles: int, rows, n_splits: int, groups: int = 0) -> tuple:
    """``(N tile, row tile[, group])`` of the block :func:`_grid`'s grid numbers ``ids``."""
    if n_splits == 1:
        return ids
    per = n_tiles // n_splits
    if groups:
        inner, by, outer = ids
        return (outer // groups) * per + inner, by, outer % groups
    inner, outer = ids
    return (outer // rows) * per + inner, outer % rows


def _persistent(l2_group: int, n_splits: int, live_rows=None, block_rows: int = 0) -> None:
    """``persistent = G > 0``: ``T.persistent`` with L2 groups of ``G`` row tiles per N tile (the
    grid's ``bx`` must be the N tiles, so not with ``n_splits > 1``, a host's choice); the masked
    layouts pass ``masked_m``, so the CUDA scheduler hands out only a group's tiles below it,
    which every masked kernel here leaves untouched past ``masked_m``.  GPUs only: the
    interpreter and host backends run every tile as before (``kernforge.backends.cuda.persistent``)."""
    if not l2_group:
        return
    if n_splits > 1:
        raise ValueError("persistent (a GPU schedule over N tiles first) and n_splits > 1 exclude each other")
    T.persistent(l2_group, live_rows, block_rows)


def _check_row_step(row_step: int, block_M: int) -> None:
    if row_step < 0 or (row_step and block_M % row_step):
        raise ValueError(f"row_step ({row_step}) must be 0 or divide block_M ({block_M})")


@T.tunable(block_M=[32, 64, 128], block_N=[32, 64, 128], num_stages=[1, 2, 3])
def m_grouped_fp8_gemm_nt_contiguous(num_groups: int, N: int, K: int, block_M: int = 64,
                                     block_N: int = 128, num_stages: int = 2,
                                     out_dtype: str = "bfloat16", threads: int = 128, persistent: int = 0,
                                     sf_format: str = "float32", cluster: int = 0, gran_n: int = 128):
    """fp8 e4m3 grouped GEMM with 1x128 (A) / 128x128 (B) float32 block scales.
    Kernel parameters: ``A [M, K]`` e4m3, ``SFA [M, ceil(K/128)]``, ``B [num_groups, N, K]``
    e4m3, ``SFB [num_groups, ceil(N/128), ceil(K/128)]``, ``m_indices int32 [M]``,
    output ``D [M, N]``.  ``block_N`` divides 128, so a tile sees one SFB row; ``persistent``:
    :func:`_persistent`.  ``sf_format="ue8m0"``: the scales are UE8M0 packed four per int32
    along K instead (``SFA int32 [M, ceil(K/512)]``, ``SFB int32 [G, ceil(N/128), ceil(K/512)]``),
    which sm_100a applies on the tensor cores (as ``gemm.fp8_gemm``'s).  ``cluster``: as
    :func:`m_grouped_gemm_nt_contiguous`'s (adjacent N tiles share each A tile by TMA multicast).
    ``gran_n=1``: per-row B scales (``SFB [G, N, ...]``, DeepGEMM's SM100 1D1D recipe ``(1, 1, 128)``)."""
    if gran_n not in (1, 128):
        raise ValueError(f"gran_n must be 1 or 128, got {gran_n}")
    if gran_n == 128 and 128 % block_N:
        raise ValueError(f"block_N ({block_N}) must divide the 128-wide B scale block")
    if sf_format not in ("float32", "ue8m0"):
        raise ValueError(f"sf_format must be 'float32' or 'ue8m0', got {sf_format!r}")
    ue8m0 = sf_format == "ue8m0"
    accum = "float32"
    gran = 128
    k_blocks = -(-K // gran)
    n_blocks = -(-N // gran_n)
    sf_cols, sf_dtype = (-(-k_blocks // 4), "int32") if ue8m0 else (k_blocks, accum)
    M = T.symbolic("M")
    name = (f"m_grouped_fp8_gemm_nt_contiguous_g{num_groups}_n{N}_k{K}_M{block_M}_N{block_N}"
            f"_s{num_stages}_{out_dtype}_t{threads}{f'_p{persistent}' if persistent else ''}"
            f"{'_ue8m0' if ue8m0 else ''}{f'_c{cluster}' if cluster > 1 else ''}{'_g1' if gran_n == 1 else ''}")

    @T.prim_func(name=name)
    def main(A: T.Tensor((M, K), "float8_e4m3"), SFA: T.Tensor((M, sf_cols), sf_dtype),
             B: T.Tensor((num_groups, N, K), "float8_e4m3"),
             SFB: T.Tensor((num_groups, n_blocks, sf_cols), sf_dtype),
             m_indices: T.Tensor((M,), "int32"), D: T.Tensor((M, N), out_dtype)):
        with T.Kernel(T.ceildiv(N, block_N), T.ceildiv(M, block_M), threads=threads) as (bx, by):
            _persistent(persistent, 1)
            A_shared = T.alloc_shared((block_M, gran), "float8_e4m3")
            B_shared = T.alloc_shared((block_N, gran), "float8_e4m3")
            partial = T.alloc_fragment((block_M, block_N), accum)
            C = T.alloc_fragment((block_M, block_N), accum)
            expert = m_indices[by * block_M]
            sb_block = sf_block(bx, block_N, gran, N, cluster)
            T.clear(C)
            if expert >= 0:
                for k in T.Pipelined(k_blocks, num_stages=num_stages):
                    T.copy(A[by * block_M, k * gran], A_shared)
                    T.copy(B[expert, bx * block_N, k * gran], B_shared)
                    T.gemm(A_shared, B_shared, partial, transpose_B=True, clear_accum=True)
                    for i, j in T.Parallel(block_M, block_N):
                        row = T.min(by * block_M + i, M - 1)
                        col = sb_block if gran_n == 128 else T.min(bx * block_N + j, N - 1)
                        if ue8m0:
                            sa = ue8m0_value(SFA[row, k // 4], k % 4)
                            sb = ue8m0_value(SFB[expert, col, k // 4], k % 4)
                        else:
                            sa, sb = SFA[row, k], SFB[expert, col, k]
                        C[i, j] = C[i, j] + partial[i, j] * sa * sb
            for i, j in T.Parallel(block_M, block_N):
                row = T.min(by * block_M + i, M - 1)
                C[i, j] = T.if_then_else(m_indices[row] >= 0, C[i, j], 0.0)
            T.copy(C, D[by * block_M, bx * block_N])

    return main


@T.tunable(block_M=[32, 64, 128, 256], block_N=[32, 64, 128], block_K=[32, 64, 128, 256],
           num_stages=[1, 2, 3], row_step=[0, 16], n_splits=[1, 2, 4])
def m_grouped_gemm_nt_masked(num_groups: int, N: int, K: int, block_M: int = 64,
                             block_N: int = 64, block_K: int = 64, num_stages: int = 2,
                             dtype: str = "bfloat16", out_dtype: str = "bfloat16",
                             threads: int = 128, row_step: int = 0, n_splits: int = 1,
                             persistent: int = 0, cluster: int = 0):
    """DeepGEMM's masked layout (decode, CUDA-graph friendly): ``D[g, r] = A[g, r] @ B[g]^T``
    for ``r < masked_m[g]``.  Kernel parameters: ``A [num_groups, max_m, K]``,
    ``B [num_groups, N, K]``, ``masked_m int32 [num_groups]``, ``D [num_groups, max_m, N]``.
    Rows at or past ``masked_m[g]`` are neither computed nor written; with ``row_step`` (a
    host's choice) a tile multiplies only its rows below ``masked_m``, rounded up to a
    multiple of ``row_step`` (:func:`_row_ladder`); ``n_splits``: as the contiguous kernel's;
    ``persistent`` (:func:`_persistent`): a persistent tile loop that walks each group's live row tiles;
    ``cluster``: as the contiguous kernel's (adjacent N tiles share each A tile by TMA multicast)."""
    _check_row_step(row_step, block_M)
    accum = "float32"
    max_m = T.symbolic("max_m")
    name = (f"m_grouped_gemm_nt_masked_g{num_groups}_n{N}_k{K}_M{block_M}_N{block_N}"
            f"_K{block_K}_s{num_stages}_{dtype}_{out_dtype}_t{threads}{f'_r{row_step}' if row_step else ''}"
            f"{f'_ns{n_splits}' if n_splits > 1 else ''}{f'_p{persistent}' if persistent else ''}"
            f"{f'_c{cluster}' if cluster > 1 else ''}")

    @T.prim_func(name=name)
    def main(A: T.Tensor((num_groups, max_m, K), dtype), B: T.Tensor((num_groups, N, K), dtype),
             masked_m: T.Tensor((num_groups,), "int32"),
             D: T.Tensor((num_groups, max_m, N), out_dtype)):
        n_tiles, row_tiles = -(-N // block_N), T.ceildiv(max_m, block_M)
        with T.Kernel(*_grid(n_tiles, row_tiles, n_splits, num_groups), threads=threads) as (b0, b1, b2):
            bx, by, bz = _blocks((b0, b1, b2), n_tiles, row_tiles, n_splits, num_groups)
            _persistent(persistent, n_splits, masked_m, block_M)
            A_shared = T.alloc_shared((block_M, block_K), dtype)
            B_shared = T.alloc_shared((block_N, block_K), dtype)
            C = T.alloc_fragment((block_M, block_N), accum)
            rows = masked_m[bz]
            if by * block_M < rows:
                T.clear(C)
                used = rows - by * block_M
                for k in T.Pipelined(T.ceildiv(K, block_K), num_stages=num_stages):
                    if row_step:
                        T.copy(B[bz, bx * block_N, k * block_K], B_shared)
                        for fewer, tile_rows in _row_ladder(block_M, row_step):
                            # the last size also takes the rows past the tile (used > block_M)
                            fits = used > fewer
                            if tile_rows < block_M:
                                fits = fits & (used <= tile_rows)
                            if fits:
                                T.copy(A[bz, by * block_M, k * block_K], A_shared[0:tile_rows, :])
                                T.gemm(A_shared[0:tile_rows, :], B_shared, C[0:tile_rows, :], transpose_B=True)
                    else:
                        T.copy(A[bz, by * block_M, k * block_K], A_shared)
                        T.copy(B[bz, bx * block_N, k * block_K], B_shared)
                        T.gemm(A_shared, B_shared, C, transpose_B=True)
                for i, j in T.Parallel(block_M, block_N):
                    if (by * block_M + i < rows) & (bx * block_N + j < N):
                        D[bz, by * block_M + i, bx * block_N + j] = C[i, j]

    return main


@T.tunable(block_M=[32, 64, 128], block_N=[32, 64, 128], num_stages=[1, 2, 3])
def m_grouped_fp8_gemm_nt_masked(num_groups: int, N: int, K: int, block_M: int = 64,
                                 block_N: int = 128, num_stages: int = 2,
                                 out_dtype: str = "bfloat16", threads: int = 128, persistent: int = 0,
                                 sf_format: str = "float32", cluster: int = 0, gran_n: int = 128):
    """fp8 e4m3 masked layout with 1x128 (A) / 128x128 (B) float32 scales:
    ``D[g, r] = (A[g, r] * sfa) @ (B[g] * sfb)^T`` for ``r < masked_m[g]``.  Kernel
    parameters: ``A [G, max_m, K]`` e4m3, ``SFA float32 [G, max_m, ceil(K/128)]`` in
    DeepGEMM's per-group MN-major layout (strides ``(sfa_group, 1, sfa_ld)``),
    ``B [G, N, K]`` e4m3, ``SFB [G, ceil(N/128), ceil(K/128)]``, ``masked_m int32 [G]``,
    ``D [G, max_m, N]``.  Rows at or past ``masked_m[g]`` are neither computed nor written;
    ``persistent``: :func:`_persistent` (the walk skips each group's rows past ``masked_m``).
    ``sf_format="ue8m0"``: UE8M0 scales packed four per int32 along K (``SFA int32 [G, max_m,
    ceil(K/512)]``, same strides; ``SFB int32 [G, ceil(N/128), ceil(K/512)]``), which sm_100a
    applies on the tensor cores (as ``gemm.fp8_gemm``'s).  ``cluster``, ``gran_n``: as the contiguous
    kernel's."""
    if gran_n not in (1, 128):
        raise ValueError(f"gran_n must be 1 or 128, got {gran_n}")
    if gran_n == 128 and 128 % block_N:
        raise ValueError(f"block_N ({block_N}) must divide the 128-wide B scale block")
    if sf_format not in ("float32", "ue8m0"):
        raise ValueError(f"sf_format must be 'float32' or 'ue8m0', got {sf_format!r}")
    ue8m0 = sf_format == "ue8m0"
    accum = "float32"
    gran = 128
    k_blocks = -(-K // gran)
    sf_cols, sf_dtype = (-(-k_blocks // 4), "int32") if ue8m0 else (k_blocks, accum)
    max_m = T.symbolic("max_m")
    sfa_group, sfa_ld = T.symbolic("sfa_group"), T.symbolic("sfa_ld")
    name = (f"m_grouped_fp8_gemm_nt_masked_g{num_groups}_n{N}_k{K}_M{block_M}_N{block_N}"
            f"_s{num_stages}_{out_dtype}_t{threads}{f'_p{persistent}' if persistent else ''}"
            f"{'_ue8m0' if ue8m0 else ''}{f'_c{cluster}' if cluster > 1 else ''}{'_g1' if gran_n == 1 else ''}")

    @T.prim_func(name=name)
    def main(A: T.Tensor((num_groups, max_m, K), FP8),
             SFA: T.StridedTensor((num_groups, max_m, sf_cols), (sfa_group, 1, sfa_ld), sf_dtype),
             B: T.Tensor((num_groups, N, K), FP8),
             SFB: T.Tensor((num_groups, -(-N // gran_n), sf_cols), sf_dtype),
             masked_m: T.Tensor((num_groups,), "int32"),
             D: T.Tensor((num_groups, max_m, N), out_dtype)):
        with T.Kernel(T.ceildiv(N, block_N), T.ceildiv(max_m, block_M), num_groups,
                      threads=threads) as (bx, by, bz):
            _persistent(persistent, 1, masked_m, block_M)
            A_shared = T.alloc_shared((block_M, gran), FP8)
            B_shared = T.alloc_shared((block_N, gran), FP8)
            partial = T.alloc_fragment((block_M, block_N), accum)
            C = T.alloc_fragment((block_M, block_N), accum)
            rows = masked_m[bz]
            sb_block = sf_block(bx, block_N, gran, N, cluster)
            if by * block_M < rows:
                T.clear(C)
                for k in T.Pipelined(k_blocks, num_stages=num_stages):
                    T.copy(A[bz, by * block_M, k * gran], A_shared)
                    T.copy(B[bz, bx * block_N, k * gran], B_shared)
                    T.gemm(A_shared, B_shared, partial, transpose_B=True, clear_accum=True)
                    for i, j in T.Parallel(block_M, block_N):
                        row = T.min(by * block_M + i, max_m - 1)
                        col = sb_block if gran_n == 128 else T.min(bx * block_N + j, N - 1)
                        if ue8m0:
                            sa = ue8m0_value(SFA[bz, row, k // 4], k % 4)
                            sb = ue8m0_value(SFB[bz, col, k // 4], k % 4)
                        else:
                            sa, sb = SFA[bz, row, k], SFB[bz, col, k]
                        C[i, j] = C[i, j] + partial[i, j] * sa * sb
                for i, j in T.Parallel(block_M, block_N):
                    if (by * block_M + i < rows) & (bx * block_N + j < N):
                        D[bz, by * block_M + i, bx * block_N + j] = C[i, j]

    return main


def decode_scaled_fp4_tile(packed, SFB, out, rows: int, group, col0, k, N: int, K: int, k_outer: bool):
    """``out[r, c] = bf16(e2m1(code) * SFB[group, col0 + r, 4k + c // 32])`` for the
    ``rows x 128`` tile of K step ``k``; ``packed[r, c // 2]`` (int8) holds the even
    element in its low nibble, the odd one in its high nibble.  Columns past ``N`` read
    the last row's scales (their codes are zero: the copy reads past the end as 0), and
    scale columns past ``K`` are never read (those elements are stored as 0), so a
    non-finite scale cannot leak into the padding of a ragged tile.

    ``k_outer`` walks K in the outer loop: the host's GEMM keeps B K-major by N, so the
    inner loop then stores contiguously (0.82x the kernel's time at G 8, N 512, K 2048
    on AVX-512) instead of scattering one element per row; ``False`` is the row-major
    walk, the natural thread order for a GPU's shared-memory tile."""
    k_scales = -(-K // FP4_GRAN_K)
    for a, b in T.Parallel(GRAN_K, rows) if k_outer else T.Parallel(rows, GRAN_K):
        r, c = (b, a) if k_outer else (a, b)
        byte = T.cast(packed[r, c // 2], "int32")
        s = k * (GRAN_K // FP4_GRAN_K) + c // FP4_GRAN_K
        col = T.min(col0 + r, N - 1)
        out[r, c] = T.if_then_else(s < k_scales, fp4_value((byte >> ((c % 2) * 4)) & 15) *
                                   SFB[group, col, T.min(s, k_scales - 1)], 0.0)


@T.tunable(block_M=[32, 64, 128], block_N=[32, 64, 128], num_stages=[1, 2, 3], decode_k_outer=[True, False])
def m_grouped_fp8_fp4_gemm_nt_contiguous(num_groups: int, N: int, K: int, block_M: int = 64,
                                         block_N: int = 128, num_stages: int = 2,
                                         out_dtype: str = "bfloat16", threads: int = 128,
                                         decode_k_outer: bool = True, persistent: int = 0):
    """FP8 A x FP4 B, contiguous layout.  Kernel parameters: ``A [M, K]`` e4m3,
    ``SFA float32 [M, ceil(K/128)]`` MN-major (strides ``(1, sfa_ld)``), ``B int8
    [G, N, K/2]`` (two e2m1 codes per byte, low nibble first), ``SFB float32
    [G, N, ceil(K/32)]``, ``m_indices int32 [M]`` (``-1`` = padding), ``D [M, N]``.
    The K loop steps by 128 with B's scales folded into its bf16 tile (module
    docstring); padding tiles and rows are stored as zeros, as in the bf16 kernel."""
    if K % 2:
        raise ValueError(f"K ({K}) must be even: FP4 packs two codes per byte")
    accum = "float32"
    M = T.symbolic("M")
    sfa_ld = T.symbolic("sfa_ld")
    name = (f"m_grouped_fp8_fp4_gemm_nt_contiguous_g{num_groups}_n{N}_k{K}_M{block_M}_N{block_N}"
            f"_s{num_stages}_{out_dtype}_t{threads}{'' if decode_k_outer else '_dn'}"
            f"{f'_p{persistent}' if persistent else ''}")

    @T.prim_func(name=name)
    def main(A: T.Tensor((M, K), FP8), SFA: T.StridedTensor((M, -(-K // GRAN_K)), (1, sfa_ld), accum),
             B: T.Tensor((num_groups, N, K // 2), "int8"),
             SFB: T.Tensor((num_groups, N, -(-K // FP4_GRAN_K)), accum),
             m_indices: T.Tensor((M,), "int32"), D: T.Tensor((M, N), out_dtype)):
        with T.Kernel(T.ceildiv(N, block_N), T.ceildiv(M, block_M), threads=threads) as (bx, by):
            _persistent(persistent, 1)
            A_shared = T.alloc_shared((block_M, GRAN_K), "bfloat16")
            B_packed = T.alloc_shared((block_N, GRAN_K // 2), "int8")
            B_shared = T.alloc_shared((block_N, GRAN_K), "bfloat16")
            partial = T.alloc_fragment((block_M, block_N), accum)
            C = T.alloc_fragment((block_M, block_N), accum)
            expert = m_indices[by * block_M]
            T.clear(C)
            if expert >= 0:
                for k in T.Pipelined(T.ceildiv(K, GRAN_K), num_stages=num_stages):
                    T.copy(A[by * block_M, k * GRAN_K], A_shared)
                    T.copy(B[expert, bx * block_N, k * (GRAN_K // 2)], B_packed)
                    decode_scaled_fp4_tile(B_packed, SFB, B_shared, block_N, expert, bx * block_N, k, N, K,
                                           decode_k_outer)
                    T.gemm(A_shared, B_shared, partial, transpose_B=True, clear_accum=True)
                    for i, j in T.Parallel(block_M, block_N):
                        row = T.min(by * block_M + i, M - 1)
                        C[i, j] = C[i, j] + partial[i, j] * SFA[row, k]
            for i, j in T.Parallel(block_M, block_N):
                row = T.min(by * block_M + i, M - 1)
                C[i, j] = T.if_then_else(m_indices[row] >= 0, C[i, j], 0.0)
            T.copy(C, D[by * block_M, bx * block_N])

    return main


@T.tunable(block_M=[32, 64, 128], block_N=[32, 64, 128], num_stages=[1, 2, 3], decode_k_outer=[True, False])
def m_grouped_fp8_fp4_gemm_nt_masked(num_groups: int, N: int, K: int, block_M: int = 64,
                                     block_N: int = 128, num_stages: int = 2,
                                     out_dtype: str = "bfloat16", threads: int = 128,
                                     decode_k_outer: bool = True, persistent: int = 0):
    """FP8 A x FP4 B, masked layout.  Kernel parameters: ``A [G, max_m, K]`` e4m3,
    ``SFA float32 [G, max_m, ceil(K/128)]`` (per-group MN-major, as
    :func:`m_grouped_fp8_gemm_nt_masked`), ``B int8 [G, N, K/2]``, ``SFB float32
    [G, N, ceil(K/32)]``, ``masked_m int32 [G]``, ``D [G, max_m, N]``.  Rows at or past
    ``masked_m[g]`` are neither computed nor written; K steps as the contiguous kernel."""
    if K % 2:
        raise ValueError(f"K ({K}) must be even: FP4 packs two codes per byte")
    accum = "float32"
    max_m = T.symbolic("max_m")
    sfa_group, sfa_ld = T.symbolic("sfa_group"), T.symbolic("sfa_ld")
    name = (f"m_grouped_fp8_fp4_gemm_nt_masked_g{num_groups}_n{N}_k{K}_M{block_M}_N{block_N}"
            f"_s{num_stages}_{out_dtype}_t{threads}{'' if decode_k_outer else '_dn'}"
            f"{f'_p{persistent}' if persistent else ''}")

    @T.prim_func(name=name)
    def main(A: T.Tensor((num_groups, max_m, K), FP8),
             SFA: T.StridedTensor((num_groups, max_m, -(-K // GRAN_K)), (sfa_group, 1, sfa_ld), accum),
             B: T.Tensor((num_groups, N, K // 2), "int8"),
             SFB: T.Tensor((num_groups, N, -(-K // FP4_GRAN_K)), accum),
             masked_m: T.Tensor((num_groups,), "int32"),
             D: T.Tensor((num_groups, max_m, N), out_dtype)):
        with T.Kernel(T.ceildiv(N, block_N), T.ceildiv(max_m, block_M), num_groups,
                      threads=threads) as (bx, by, bz):
            _persistent(persistent, 1, masked_m, block_M)
            A_shared = T.alloc_shared((block_M, GRAN_K), "bfloat16")
            B_packed = T.alloc_shared((block_N, GRAN_K // 2), "int8")
            B_shared = T.alloc_shared((block_N, GRAN_K), "bfloat16")
            partial = T.alloc_fragment((block_M, block_N), accum)
            C = T.alloc_fragment((block_M, block_N), accum)
            rows = masked_m[bz]
            if by * block_M < rows:
                T.clear(C)
                for k in T.Pipelined(T.ceildiv(K, GRAN_K), num_stages=num_stages):
                    T.copy(A[bz, by * block_M, k * GRAN_K], A_shared)
                    T.copy(B[bz, bx * block_N, k * (GRAN_K // 2)], B_packed)
                    decode_scaled_fp4_tile(B_packed, SFB, B_shared, block_N, bz, bx * block_N, k, N, K,
                                           decode_k_outer)
                    T.gemm(A_shared, B_shared, partial, transpose_B=True, clear_accum=True)
                    for i, j in T.Parallel(block_M, block_N):
                        row = T.min(by * block_M + i, max_m - 1)
                        C[i, j] = C[i, j] + partial[i, j] * SFA[bz, row, k]
                for i, j in T.Parallel(block_M, block_N):
                    if (by * block_M + i < rows) & (bx * block_N + j < N):
                        D[bz, by * block_M + i, bx * block_N + j] = C[i, j]

    return main
