"""The Walsh-Hadamard transform (Sylvester order, scaled by n^-1/2), written once in the tile DSL.

The model's ``primitives.hadamard``: the lightning indexer rotates its queries and
its compressed keys with it before the FP4 rounding, so that an outlier channel is
spread over all ``n`` (a power of two: ``index_head_dim``, 128 in V4-Flash).  One
block transforms ``block_rows`` rows: ``log2(n)`` butterfly stages
``(a, b) -> (a + b, a - b)`` at distance ``h = 1, 2, 4, ...`` (the model's order),
ping-ponging between two shared tiles, then one scale.  Stages run in float32 and
the result rounds once into the output dtype (the model rounds after every stage
when it runs in bfloat16).
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
                    lo = (i // h) * (2 * h) + i % h
                    b[r, lo] = a[r, lo] + a[r, lo + h]
                    b[r, lo + h] = a[r, lo] - a[r, lo + h]
                h, src = 2 * h, 1 - src
            for r, i in T.Parallel(BR, n):
                f[r, i] = bufs[src][r, i] * T.cast(scale, "float32")
            T.copy(f, out[bx * BR, 0])

    return hadamard_kernel
