"""The lightning indexer's entry scores, written once in the tile DSL.

``scores[s, n] = sum_h relu(q[s, h, :] . keys[n, :]) * (head_weights[s, h] * scale) + 0.0``:
what `kernforge.model.compressor.Indexer` ranks before its top-k (the engine's
``indexer_scores`` step; the top-k is the ``topk`` kernel).

GEMM-shaped, so that the backends' GEMM micro-kernels do the ``S x N x H x D``
multiply-adds: a block scores ``block_S`` queries against ``block_N`` keys; the key tile
goes to shared memory once, and for each head ``h`` the queries' ``q[:, h, :]`` tile is one
``T.gemm`` (``[block_S, D] x [D, block_N]``) whose product is relu'd, weighted and added
to the block's scores, head after head.

Why the orders are fixed: the engine's deterministic rows must not depend on what else
shares the batch.  Each dot is summed in ``T.gemm``'s own K order (on the CPU, FMAs in
order ``0..D-1`` for every output, whatever the tile or ``M``; CUDA's float32 ``T.gemm``
is a scalar loop in the same order), and the heads are added in order ``0..H-1`` to a
cleared (``+0.0``) accumulator, so a score's bits depend on its own inputs and the
backend alone, not on ``S``, ``N``, the tile or the other rows.  That is not the
reference's deterministic order (`nx.tree_sum` over ``D``, `nx.sum_terms` over ``H``):
the scores agree with it, and with its default matmul mode, to float32 rounding.  The
``+0.0`` start is the reference's final ``+ 0.0``: under round-to-nearest a sum that
starts at ``+0.0`` is never ``-0.0`` (``+0 + -0 = +0``, and an exact cancellation gives
``+0``), so every zero score is ``+0.0`` (topk ranks ``-0.0`` below ``+0.0`` by its bits;
the reference's sort calls them a tie).  Rows past ``S`` and keys past ``N`` read 0 and
their scores are never stored.
"""
from __future__ import annotations

import kernforge.dsl as T

DTYPES = ("float32", "bfloat16")


@T.tunable(block_S=[1, 8, 16, 32], block_N=[16, 32, 64, 128], threads=[64, 128, 256])
def indexer_scores(heads: int, dim: int, dtype: str = "float32", block_S: int = 1, block_N: int = 16,
                   threads: int = 128):
    """``q [S, heads, dim]``, ``keys [N, dim]``, ``head_weights [S, heads]`` (all ``dtype``)
    and the float32 ``scale`` -> ``scores float32 [S, N]``; ``S`` and ``N`` are symbolic."""
    if dtype not in DTYPES:
        raise ValueError(f"indexer_scores: dtype must be one of {DTYPES}, got {dtype!r}")
    for name, v in (("heads", heads), ("dim", dim), ("block_S", block_S), ("block_N", block_N)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"indexer_scores: {name} must be a positive int, got {v!r}")
    S = T.symbolic("S")
    N = T.symbolic("N")
    H, D, BS, BN = heads, dim, block_S, block_N

    @T.prim_func
    def indexer_scores_kernel(q: T.Tensor((S, H, D), dtype), keys: T.Tensor((N, D), dtype),
                              head_weights: T.Tensor((S, H), dtype), scores: T.Tensor((S, N), "float32"),
                              scale: T.float32):
        with T.Kernel(T.ceildiv(N, BN), T.ceildiv(S, BS), threads=threads) as (bn, bs):
            q_s = T.alloc_shared((BS, D), "float32")
            k_s = T.alloc_shared((BN, D), "float32")
            w_s = T.alloc_shared((BS, H), "float32")
            dots = T.alloc_fragment((BS, BN), "float32")
            acc = T.alloc_fragment((BS, BN), "float32")
            T.copy(keys[bn * BN, 0], k_s)
            T.copy(head_weights[bs * BS, 0], w_s)
            for i, h in T.Parallel(BS, H):
                w_s[i, h] = w_s[i, h] * scale
            T.clear(acc)
            for h in range(H):  # heads in order (unrolled at trace time)
                T.copy(q[bs * BS:bs * BS + BS, h, 0:D], q_s)
                T.gemm(q_s, k_s, dots, transpose_B=True, clear_accum=True)
                for i, n in T.Parallel(BS, BN):
                    acc[i, n] = acc[i, n] + T.max(dots[i, n], T.float32(0.0)) * w_s[i, h]
            T.copy(acc, scores[bs * BS, bn * BN])

    return indexer_scores_kernel
