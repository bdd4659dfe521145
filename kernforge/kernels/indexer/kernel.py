"""The lightning indexer's entry scores, written once in the tile DSL.

``scores[s, n] = sum_h relu(q[s, h, :] . keys[n, :]) * (head_weights[s, h] * scale) + 0.0``:
what `kernforge.model.compressor.Indexer` ranks before its top-k (the engine's
``indexer_scores`` step; the top-k is the ``topk`` kernel).

Why the summation order is spelled out: the reference's deterministic mode
(`kernforge.model.numerics`) sums each dot product as ``nx.tree_sum`` does (halve the
axis, zero-padded to a power of two: element ``j`` meets ``j + half``) and the heads as
``nx.sum_terms`` does (adjacent pairs, an odd last term carried), and the engine's
deterministic rows must not depend on what else shares the batch.  Each score here is one
trace-time expression tree in exactly those orders, so its bits depend on its own inputs
alone (whatever the tile, the row count or the number of keys), and with float32 inputs
on interp and cpu (which never contract ``a * b + c`` into an FMA) they are the
deterministic reference's bits.  Outside deterministic mode the reference sums the dots
with a matmul, which agrees to float32 rounding.  The zero padding of ``tree_sum`` is
left out: ``x + 0`` is ``x`` except for the sign of a zero, and a zero's sign cannot reach
a non-zero sum, while the final ``+ 0.0`` makes a zero score ``+0.0`` either way (topk
ranks ``-0.0`` below ``+0.0`` by its bits; the reference's sort calls them a tie).

A block scores ``block_N`` keys for one query row: the query's ``[H, D]`` and the key
tile go to shared memory once, each (key, head) term is one expression over ``D``
products, and each score one expression over the ``H`` terms.  Keys past ``N`` read 0
and their scores are never stored.
"""
from __future__ import annotations

import kernforge.dsl as T

DTYPES = ("float32", "bfloat16")


def tree_sum(terms: list):
    """``nx.tree_sum``'s order over trace-time expressions: halve, ``x[j] + x[j + half]``
    (a missing ``x[j + half]`` is the zero padding: ``x[j]`` carries)."""
    while len(terms) > 1:
        half = 1 << (len(terms) - 1).bit_length() - 1  # half the padded power of two
        terms = [terms[j] + terms[j + half] if j + half < len(terms) else terms[j] for j in range(half)]
    return terms[0]


def sum_terms(terms: list):
    """``nx.sum_terms``'s order: adjacent pairs, an odd last term carried to the next round."""
    while len(terms) > 1:
        terms = [terms[i] + terms[i + 1] for i in range(0, len(terms) - 1, 2)] + (
            [terms[-1]] if len(terms) % 2 else [])
    return terms[0]


@T.tunable(block_N=[8, 16, 32, 64], threads=[64, 128, 256])
def indexer_scores(heads: int, dim: int, dtype: str = "float32", block_N: int = 16, threads: int = 128):
    """``q [S, heads, dim]``, ``keys [N, dim]``, ``head_weights [S, heads]`` (all ``dtype``)
    and the float32 ``scale`` -> ``scores float32 [S, N]``; ``S`` and ``N`` are symbolic."""
    if dtype not in DTYPES:
        raise ValueError(f"indexer_scores: dtype must be one of {DTYPES}, got {dtype!r}")
    for name, v in (("heads", heads), ("dim", dim), ("block_N", block_N)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"indexer_scores: {name} must be a positive int, got {v!r}")
    S = T.symbolic("S")
    N = T.symbolic("N")
    H, D, BN = heads, dim, block_N

    @T.prim_func
    def indexer_scores_kernel(q: T.Tensor((S, H, D), dtype), keys: T.Tensor((N, D), dtype),
                              head_weights: T.Tensor((S, H), dtype), scores: T.Tensor((S, N), "float32"),
                              scale: T.float32):
        with T.Kernel(T.ceildiv(N, BN), S, threads=threads) as (bn, s):
            q_s = T.alloc_shared((H, D), "float32")
            k_s = T.alloc_shared((BN, D), "float32")
            w_s = T.alloc_shared((H,), "float32")
            terms = T.alloc_shared((BN, H), "float32")
            out = T.alloc_fragment((BN,), "float32")
            T.copy(q[s, 0, 0], q_s)
            T.copy(keys[bn * BN, 0], k_s)
            for h in T.Parallel(H):
                w_s[h] = T.cast(head_weights[s, h], "float32") * scale
            for n, h in T.Parallel(BN, H):
                dot = tree_sum([q_s[h, j] * k_s[n, j] for j in range(D)])
                terms[n, h] = T.max(dot, T.float32(0.0)) * w_s[h]
            for n in T.Parallel(BN):
                out[n] = sum_terms([terms[n, h] for h in range(H)]) + T.float32(0.0)
            T.copy(out, scores[s, bn * BN])

    return indexer_scores_kernel
