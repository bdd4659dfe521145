"""Token embedding lookup (a row gather), written once in the tile DSL: the model's ``Embedding``.

One block copies ``block_cols`` columns of one token's row.  The op checks every id
on the host before launch; the kernel also guards its own read, writing a zero row
for an id outside ``[0, vocab)``, so a launch the checks could not see (a CUDA-graph
replay over new ids) never reads outside the table.
"""
from __future__ import annotations

import kernforge.dsl as T

DTYPES = ("float32", "bfloat16")
INDEX_DTYPES = ("int32", "int64")


@T.tunable(block_cols=[256, 512, 1024, 2048, 4096], threads=[64, 128, 256])
def embedding(dim: int, dtype: str = "float32", index_dtype: str = "int64", block_cols: int = 1024,
              threads: int = 128):
    """``out[t, :] = weight[ids[t], :]`` for ``ids [tokens]``, ``weight [vocab, dim]``."""
    if dtype not in DTYPES:
        raise ValueError(f"embedding: dtype must be one of {DTYPES}, got {dtype!r}")
    if index_dtype not in INDEX_DTYPES:
        raise ValueError(f"embedding: index_dtype must be one of {INDEX_DTYPES}, got {index_dtype!r}")
    BC = min(block_cols, dim)
    N = T.symbolic("tokens")
    V = T.symbolic("vocab")

    @T.prim_func
    def embedding_kernel(ids: T.Tensor((N,), index_dtype), weight: T.Tensor((V, dim), dtype),
                         out: T.Tensor((N, dim), dtype)):
        with T.Kernel(T.ceildiv(dim, BC), N, threads=threads) as (cb, t):
            row = T.alloc_fragment((BC,), dtype)
            tok = T.alloc_var("int64", ids[t])
            if (tok >= 0) & (tok < V):
                T.copy(weight[tok, cb * BC], row)
            else:
                T.clear(row)
            T.copy(row, out[t, cb * BC])

    return embedding_kernel
