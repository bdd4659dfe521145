"""The Walsh-Hadamard transform (Sylvester order, scaled by n^-1/2), written once in the tile DSL.

The model's ``primitives.hadamard``: the lightning indexer rotates its queries and
its compressed keys with it before the FP4 rounding, so that an outlier channel is
spread over all ``n`` (a power of two: ``index_head_dim``, 128 in V4-Flash).  One
block transforms ``block_rows`` rows: ``log2(n)`` butterfly stages
``(a, b) -> (a + b, a - b)`` ping-ponging between two shared tiles, then one scale.

Each stage is the same self-sorting (Stockham) step ``y[i] = x[2i] + x[2i+1]``,
``y[i + n/2] = x[2i] - x[2i+1]``: ``log2(n)`` of them give ``H_n x`` in Sylvester order, and
stage ``s`` adds exactly the operands that the model's stage at distance ``h = 2^s`` adds (its
partial sums only sit at permuted positions), so the result is bit-identical to the model's
butterflies.  Why not the model's indexing ``lo = (i // h) * 2h + i % h``: at small ``h``
that is a scattered access the CPU compiler cannot vectorise (~5 ns per element at ``n = 64``);
the Stockham step reads pairs (a stride-2 load, two permutes) and writes two contiguous halves.
Stages run in float32 and the result rounds once into the output dtype (the model rounds after
every stage when it runs in bfloat16).
"""
from __future__ import annotations

import kernforge.dsl as T

DTYPES = ("float32", "bfloat16")


@T.tunable(block_rows=[1, 2, 4, 8, 16], threads=[32, 64, 128])
def hadamard(n: int, dtype: str = "float32", block_rows: int = 1, threads: int = 64):
    """``out [rows, n] = H_n x / sqrt(n)`` row by row; ``rows`` is symbolic."""
    if dtype not in DTYPES:
        raise ValueError(f"hadamard: dtype must be one of {DTYPES}, got {dtype!r}")
    if n < 1 or n & (n - 1):
        raise ValueError(f"hadamard: size must be a power of two, got {n}")
    BR = block_rows
    R = T.symbolic("rows")
    half = max(n // 2, 1)
    # float32(n^-1/2), as torch scales a float32 tensor by the Python float n ** -0.5
    scale = n ** -0.5

    @T.prim_func
    def hadamard_kernel(x: T.Tensor((R, n), dtype), out: T.Tensor((R, n), dtype)):
        with T.Kernel(T.ceildiv(R, BR), threads=threads) as bx:
            bufs = (T.alloc_shared((BR, n), "float32"), T.alloc_shared((BR, n), "float32"))
            f = T.alloc_fragment((BR, n), "float32")
            T.copy(x[bx * BR, 0], bufs[0])
            h, src = 1, 0
            while h < n:
                a, b = bufs[src], bufs[1 - src]
                for r, i in T.Parallel(BR, half):
                    b[r, i] = a[r, 2 * i] + a[r, 2 * i + 1]
                    b[r, i + half] = a[r, 2 * i] - a[r, 2 * i + 1]
                h, src = 2 * h, 1 - src
            for r, i in T.Parallel(BR, n):
                f[r, i] = bufs[src][r, i] * T.cast(scale, "float32")
            T.copy(f, out[bx * BR, 0])

    return hadamard_kernel
