"""Rotary position embedding (RoPE, YaRN or plain), written once in the tile DSL.

The model's ``RopeTable.rotate``: the LAST ``rope_dim`` dims of every head are
rotated in interleaved pairs ``(a, b) -> (a cos - b sin, a sin + b cos)`` at the
token's position, the first ``head_dim - rope_dim`` ("nope") dims are copied;
``inverse`` rotates by ``-angle`` (the attention output's de-rotation).  The angles
come from the model's own float64 tables (``RopeTable.cos``/``.sin``, YaRN-blended for
the compressed layers), passed in float32, so a kernel never recomputes a frequency.

Positions are one per token (``positions [tokens]``), so a ragged batch flattened
to tokens, a compressor's entry starts (``k * ratio``) and decode all use one kernel.
A block owns one token and ``block_heads`` heads: the token's cos/sin rows are read
once and shared by its heads.
"""
from __future__ import annotations

import kernforge.dsl as T

DTYPES = ("float32", "bfloat16")
POSITION_DTYPES = ("int32", "int64")


@T.tunable(block_heads=[1, 2, 4, 8, 16], threads=[32, 64, 128])
def rotary_embedding(head_dim: int, rope_dim: int, dtype: str = "float32", position_dtype: str = "int64",
                     inverse: bool = False, block_heads: int = 4, threads: int = 64):
    """``out [tokens, heads, head_dim]`` = ``x`` with its last ``rope_dim`` dims rotated at
    ``positions[token]``, reading ``cos/sin [table_len, rope_dim // 2]`` (float32)."""
    if dtype not in DTYPES:
        raise ValueError(f"rotary_embedding: dtype must be one of {DTYPES}, got {dtype!r}")
    if position_dtype not in POSITION_DTYPES:
        raise ValueError(f"rotary_embedding: position_dtype must be one of {POSITION_DTYPES}, "
                         f"got {position_dtype!r}")
    if rope_dim < 2 or rope_dim % 2 or rope_dim > head_dim:
        raise ValueError(f"rotary_embedding: rope_dim must be even, >= 2 and <= head_dim={head_dim}, "
                         f"got {rope_dim}")
    half, nope, BH = rope_dim // 2, head_dim - rope_dim, block_heads
    sign = -1.0 if inverse else 1.0
    N = T.symbolic("tokens")
    H = T.symbolic("heads")
    P = T.symbolic("table_len")

    @T.prim_func
    def rotary_embedding_kernel(x: T.Tensor((N, H, head_dim), dtype), positions: T.Tensor((N,), position_dtype),
                                cos: T.Tensor((P, half), "float32"), sin: T.Tensor((P, half), "float32"),
                                out: T.Tensor((N, H, head_dim), dtype)):
        with T.Kernel(T.ceildiv(H, BH), N, threads=threads) as (hb, t):
            c = T.alloc_fragment((half,), "float32")
            s = T.alloc_fragment((half,), "float32")
            pos = T.alloc_var("int64", positions[t])
            T.copy(cos[pos, 0], c)
            T.copy(sin[pos, 0], s)
            if nope:
                for i, j in T.Parallel(BH, nope):
                    if hb * BH + i < H:
                        out[t, hb * BH + i, j] = x[t, hb * BH + i, j]
            for i, p in T.Parallel(BH, half):
                if hb * BH + i < H:
                    a = T.cast(x[t, hb * BH + i, nope + 2 * p], "float32")
                    b = T.cast(x[t, hb * BH + i, nope + 2 * p + 1], "float32")
                    out[t, hb * BH + i, nope + 2 * p] = a * c[p] - b * (sign * s[p])
                    out[t, hb * BH + i, nope + 2 * p + 1] = b * c[p] + a * (sign * s[p])

    return rotary_embedding_kernel
